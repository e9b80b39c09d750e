"""
### hpd_quality_report — great-expectations checks and drift of a partition's data

Once per corpus partition `hpd_ingest` announces (a partitioned `hpd_corpus_partition` event: the run's
partition key is its ingest date and the event names its store), after its teacher shards are written;
on demand with a partition key. Runs the expectation suites on the partition's sentences and the
teacher's embeddings, and on a PCA run's targets when named. A failure fails the task (red, alerted)
with every failing expectation and sample rows in the log.

Then `drift` scores the partition against the promoted model's training data (embedding norms, mean
direction, reconstruction error under its PCA; text length and vocabulary; `hpd drift`); a score at or above
`drift_threshold` is flagged: a warning in the log, and `announce_drift` emits an `hpd_corpus_updated` event
with reason `drift`, which schedules `hpd_retrain` (otherwise it is skipped and emits nothing). With no
promoted model the drift task says so and succeeds.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import PartitionedAssetTimetable, dag, task

from tasks.orchestration.assets import CORPUS_PARTITION, CORPUS_UPDATED
from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import DEFAULT_ARGS, DEFAULT_TEACHER, DEPLOYMENT, STORE_PARAM, DataDocsLink
from tasks.stages.params import DriftParams, QualityParams

CHECKS, DRIFT = "Checks", "Drift"


@dag(
    dag_id="hpd_quality_report",
    dag_display_name="Quality report: checks and drift of a partition",
    description="Great-expectations checks of a partition, then its drift from the promoted model's training data",
    schedule=PartitionedAssetTimetable(assets=CORPUS_PARTITION),
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "quality"],
    doc_md=__doc__,
    params={
        "store": STORE_PARAM,
        "teacher": stage_param(
            QualityParams, "teacher", DEFAULT_TEACHER, DEPLOYMENT, title="Teacher model(s)", section=CHECKS
        ),
        "pca_name": stage_param(QualityParams, "pca_name", title="PCA run to check", section=CHECKS),
        "drift_threshold": stage_param(DriftParams, "threshold", title="Drift threshold", section=DRIFT),
    },
)
def hpd_quality_report():
    @task
    def check_partition(**context) -> dict:
        from tasks.orchestration import runtime

        pca_name = runtime.run_params(context).get("pca_name")
        return runtime.check_quality(context, runtime.partition_date(context), pca_name)

    @task
    def drift(checks: dict, **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.partition_drift(context)

    @task(outlets=[CORPUS_UPDATED])
    def announce_drift(drift: dict, **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.announce_drift(context, drift)

    checks = check_partition()
    checks.operator.operator_extra_links = [DataDocsLink()]  # passed: its Data Docs
    announce_drift(drift(checks))


hpd_quality_report()
