"""
### hpd_retrain — fit the projection, distil the student, validate, promote

On new data (the `hpd_corpus_updated` events `hpd_ingest` and a drift flag emit; their store is the
run's store) and on manual trigger (params below). It first decides whether a retrain is worth running
(`tasks/orchestration/retrain_policy.py`): when forced (`force`, partitions named, a backfill run), when
nothing is promoted, when drift is flagged on a partition the promoted model has not seen, when the rows
staged since its training reach `retrain_fraction` of its training rows, or when there are new rows and
the model is older than `max_model_age_days`. Otherwise it ends there, green, training nothing (the index
still takes the new partitions: `hpd_index`); the `decide` task's log and its `decision` XCom say why.
Then it learns from a bounded set: the new partitions plus a replay sample of older ones, up to
`max_train_rows`, starting from the promoted student (`warm_start`; a backfill's run starts from the base
model and selects from every partition, so its model does not depend on the order the days came in). It fits
the PCA over their teacher embeddings (writing the projected targets), distils the student (on the GPU
workers' queue, or its executor, where the deployment has them; in a pod asking for `nvidia.com/gpu` under the
KubernetesExecutor; CPU otherwise) once the great-expectations suites passed on every partition it learns from
(sentences, teacher embeddings, projected targets: the quality stage `hpd_quality_report` runs; a failure
fails the run before distilling), validate it (STS, fidelity, retrieval, quality gate, HTML report). A failed
gate fails the run (red, with the reasons, scores and report in the log and the alert) and promotes nothing; a
passing student becomes `models/current.json` and an `hpd_promoted_model` event (store, model run) schedules
`hpd_index`.
The logic lives in `tasks/`; this file only wires it. Params come from the stages' own parameter
models; where this DAG's default differs, the param's description says why.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from tasks.orchestration.assets import CORPUS_UPDATED, PROMOTED_MODEL
from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import (
    DEFAULT_ARGS,
    DEFAULT_K,
    DEFAULT_STUDENT,
    DEFAULT_TEACHER,
    DEPLOYMENT,
    DISTILL_EXECUTOR,
    GPU_QUEUE,
    STORE_PARAM,
    gate_param,
    gpu_executor_config,
)
from tasks.orchestration.run_records import RetrainParams
from tasks.stages.params import DistillParams, FitPCAParams


@dag(
    dag_id="hpd_retrain",
    schedule=[CORPUS_UPDATED],
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "retrain"],
    doc_md=__doc__,
    params={
        "store": STORE_PARAM,
        "force": stage_param(RetrainParams, "force"),
        "retrain_fraction": stage_param(RetrainParams, "retrain_fraction"),
        "max_model_age_days": stage_param(RetrainParams, "max_model_age_days"),
        "max_train_rows": stage_param(RetrainParams, "max_train_rows"),
        "warm_start": stage_param(RetrainParams, "warm_start"),
        "partitions": stage_param(FitPCAParams, "partitions"),
        "teacher": stage_param(FitPCAParams, "teacher", DEFAULT_TEACHER, DEPLOYMENT),
        "k": stage_param(FitPCAParams, "k", DEFAULT_K, DEPLOYMENT),
        "mode": stage_param(FitPCAParams, "mode"),
        "max_rows": stage_param(FitPCAParams, "max_rows", 40000, "HPD fitted its PCA on 40k sentences"),
        "student": stage_param(DistillParams, "student", DEFAULT_STUDENT, DEPLOYMENT),
        "student_layers": stage_param(DistillParams, "student_layers"),
        "epochs": stage_param(DistillParams, "epochs"),
        "max_steps": stage_param(DistillParams, "max_steps"),
        "batch_size": stage_param(DistillParams, "batch_size"),
        "lr": stage_param(DistillParams, "lr"),
        "amp": stage_param(DistillParams, "amp"),
        "onnx": stage_param(DistillParams, "onnx", "int8", "the service encodes queries with the ONNX graph"),
        "min_stsb": gate_param("min_stsb"),
        "min_sickr": gate_param("min_sickr"),
        "max_regression": gate_param("max_regression"),
        "name": stage_param(
            DistillParams,
            "name",
            None,
            "empty: the Airflow run id names the model run; a rerun "
            "with the same name and params skips the finished stages",
        ),
    },
)
def hpd_retrain():
    @task.short_circuit
    def decide(**context) -> bool:
        from tasks.orchestration import runtime

        return runtime.decide_retrain(context)

    @task
    def fit_pca(**context) -> str:
        from tasks.orchestration import runtime

        return runtime.fit_pca(context)

    @task
    def training_partitions(pca_name: str, **context) -> list[str]:
        from tasks.orchestration import runtime

        return runtime.pca_partitions(context, pca_name)

    @task
    def check_quality(day: str, pca_name: str, **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.check_quality(context, day, pca_name)

    @task(
        queue=GPU_QUEUE,
        executor=DISTILL_EXECUTOR,
        executor_config=gpu_executor_config(),
        execution_timeout=pendulum.duration(hours=12),
    )
    def distill(pca_name: str, **context) -> str:
        from tasks.orchestration import runtime

        return runtime.distill(context, pca_name)

    @task
    def validate(model_run: str, **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.validate(context, model_run)  # a failed gate raises: the run is red, nothing promoted

    @task(outlets=[PROMOTED_MODEL])
    def announce_promotion(model_run: str, verdict: dict, **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.announce_promotion(context, model_run, verdict)

    pca_name = fit_pca()
    decide() >> pca_name
    checked = check_quality.partial(pca_name=pca_name).expand(day=training_partitions(pca_name))
    model_run = distill(pca_name)
    checked >> model_run
    announce_promotion(model_run, validate(model_run))


hpd_retrain()
