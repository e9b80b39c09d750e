"""The third-party libraries the stage tasks import, for the processes tasks fork from to load once: the scheduler's
forkserver under the LocalExecutor (``make airflow``) and each Celery worker before it forks its pool. A task then
starts with them loaded instead of spending seconds importing them. The project's own modules are left out, so each
task imports them fresh (an edit to ``tasks/`` needs no restart)."""

TASK_LIBRARIES = (
    "airflow.sdk",
    "airflow.sdk.execution_time.task_runner",
    "torch",
    "transformers",
    "sentence_transformers",
    "great_expectations",
    "faiss",
    "polars",
    "pyarrow.parquet",
)
