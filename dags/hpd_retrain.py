"""
### hpd_retrain — fit the projection, distil the student, validate, promote

On new data (the `hpd_corpus_updated` events `hpd_ingest` and a drift flag emit; their store is the
run's store) and on manual trigger (params below). Its first task, `plan`, decides the day once
(`tasks/orchestration/day_plan.py`) and pushes the plan as its `plan` XCom, which every later task reads:
whether to retrain and why (forced: `force`, partitions named, a backfill run; nothing promoted; drift flagged
on a partition the promoted model has not seen; the rows staged since its training reach `retrain_fraction` of
the rows it has learned from; new rows and a model older than `max_model_age_days`), the partitions it learns
from (the new ones, then a replay sample of older ones, while their teacher rows fit in `max_train_rows`: the
teacher encodes a bounded sample of each partition at ingest), the model run it starts from (the promoted
student with `warm_start`, keeping the PCA basis that student learned; a backfill's run starts from the base
model and selects from every partition, so its model does not depend on the order the days came in) and the
model run's name. Without a reason it ends there, green, training nothing (the index still takes the new
partitions: `hpd_index`). Otherwise it fits the PCA over the plan's teacher rows (or projects them on the kept
basis), writing the projected targets, distils the student (on the GPU workers' queue, or its executor, where the
deployment has them; in a pod asking for `nvidia.com/gpu` under the KubernetesExecutor; CPU otherwise) once the
great-expectations suites passed on every partition it learns from (sentences, teacher embeddings, projected
targets: the quality stage `hpd_quality_report` runs; a failure fails the run before distilling), and validates
it (STS, fidelity, retrieval, quality gate, HTML report). A failed gate fails the run at once (red, with the
reasons, scores and report in the log and the alert) and promotes nothing; a passing student becomes
`models/current.json` and an `hpd_promoted_model` event (store, model run, scores, report) schedules
`hpd_index`. Either way the `validate` task's **Validation report** and **Model card** links open them (the
Airflow plugin serving the store's reports), and its `validation_report` XCom holds the report's URI. A
warm-started student that exports the promoted one unchanged skips `validate`: the run is green, nothing promoted.
Errors another try cannot mend (bad params, bad input, a failed check) fail their task on the first try;
the others (the store unreachable, a lost race) are retried twice.
The logic lives in `tasks/`; this file only wires it. Params come from the stages' own parameter
models, grouped in the trigger form as Data, Projection, Student and Quality gate; where this DAG's default
differs, the param's description says why.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import XComArg, dag, task

from tasks.orchestration.assets import CORPUS_UPDATED, PROMOTED_MODEL
from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import (
    DATA,
    DEFAULT_ARGS,
    DEFAULT_K,
    DEFAULT_STUDENT,
    DEFAULT_TEACHER,
    DEPLOYMENT,
    DISTILL_EXECUTOR,
    GPU_QUEUE,
    PLAN_XCOM,
    PROJECTION,
    STORE_PARAM,
    STUDENT,
    ModelCardLink,
    ValidationReportLink,
    gate_param,
    gpu_executor_config,
)
from tasks.orchestration.run_records import RetrainParams
from tasks.stages.params import DistillParams, FitPCAParams


@dag(
    dag_id="hpd_retrain",
    dag_display_name="Retrain: projection, student, quality gate",
    description="Decide whether new data is worth a retrain; fit the PCA, distil the student, validate, promote",
    schedule=[CORPUS_UPDATED],
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "retrain"],
    doc_md=__doc__,
    params={
        # Data: what the run learns from, and whether it trains at all (the retrain policy).
        "store": STORE_PARAM,
        "force": stage_param(RetrainParams, "force", title="Force a retrain", section=DATA),
        "partitions": stage_param(FitPCAParams, "partitions", title="Partitions to learn from", section=DATA),
        "retrain_fraction": stage_param(
            RetrainParams, "retrain_fraction", title="New rows that warrant a retrain (share)", section=DATA
        ),
        "max_model_age_days": stage_param(
            RetrainParams, "max_model_age_days", title="Largest model age (days)", section=DATA
        ),
        "max_train_rows": stage_param(RetrainParams, "max_train_rows", title="Rows to learn from", section=DATA),
        # Projection: the teacher and its PCA.
        "teacher": stage_param(
            FitPCAParams, "teacher", DEFAULT_TEACHER, DEPLOYMENT, title="Teacher model(s)", section=PROJECTION
        ),
        "k": stage_param(FitPCAParams, "k", DEFAULT_K, DEPLOYMENT, title="Projected dimension k", section=PROJECTION),
        "mode": stage_param(FitPCAParams, "mode", title="Projection mode", section=PROJECTION),
        "max_rows": stage_param(
            FitPCAParams,
            "max_rows",
            40000,
            "HPD fitted its PCA on 40k sentences",
            title="Rows the PCA is fitted on",
            section=PROJECTION,
        ),
        # Student: the model distilled and how it trains.
        "student": stage_param(
            DistillParams, "student", DEFAULT_STUDENT, DEPLOYMENT, title="Student base model", section=STUDENT
        ),
        "student_layers": stage_param(DistillParams, "student_layers", title="Student layers", section=STUDENT),
        "warm_start": stage_param(
            RetrainParams, "warm_start", title="Start from the promoted student", section=STUDENT
        ),
        "epochs": stage_param(DistillParams, "epochs", title="Epochs", section=STUDENT),
        "max_steps": stage_param(DistillParams, "max_steps", title="Most optimizer steps", section=STUDENT),
        "batch_size": stage_param(DistillParams, "batch_size", title="Batch size", section=STUDENT),
        "lr": stage_param(DistillParams, "lr", title="Learning rate", section=STUDENT),
        "amp": stage_param(DistillParams, "amp", title="Mixed precision", section=STUDENT),
        "onnx": stage_param(
            DistillParams,
            "onnx",
            "int8",
            "the service encodes queries with the ONNX graph",
            title="ONNX export",
            section=STUDENT,
        ),
        "name": stage_param(
            DistillParams,
            "name",
            None,
            "empty: the Airflow run id names the model run; a rerun "
            "with the same name and params skips the finished stages",
            title="Model run name",
            section=STUDENT,
        ),
        # Quality gate: what a student must score to be promoted.
        "min_stsb": gate_param("min_stsb"),
        "min_sickr": gate_param("min_sickr"),
        "max_regression": gate_param("max_regression"),
        "max_dev_regression": gate_param("max_dev_regression"),
    },
)
def hpd_retrain():
    @task.short_circuit
    def plan(**context) -> bool:
        from tasks.orchestration import runtime

        return runtime.plan_day(context)  # pushes the plan (XCom "plan"); False ends the run here, green

    @task
    def fit_pca(day_plan: dict, **context) -> str:
        from tasks.orchestration import runtime

        return runtime.fit_pca(context, day_plan)

    @task
    def training_partitions(day_plan: dict) -> list[str]:
        from tasks.orchestration import runtime

        return runtime.training_partitions(day_plan)

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
    def distill(day_plan: dict, pca_name: str, **context) -> str:
        from tasks.orchestration import runtime

        return runtime.distill(context, day_plan, pca_name)

    @task
    def validate(model_run: str, **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.validate(context, model_run)  # a failed gate raises: the run is red, nothing promoted

    @task(outlets=[PROMOTED_MODEL])
    def announce_promotion(model_run: str, verdict: dict, **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.announce_promotion(context, model_run, verdict)

    day_plan = XComArg(plan().operator, key=PLAN_XCOM)  # the plan every later task reads
    pca_name = fit_pca(day_plan)
    checked = check_quality.partial(pca_name=pca_name).expand(day=training_partitions(day_plan))
    model_run = distill(day_plan, pca_name)
    checked >> model_run
    verdict = validate(model_run)
    verdict.operator.operator_extra_links = [ValidationReportLink(), ModelCardLink()]  # the gate passed or not
    announce_promotion(model_run, verdict)


hpd_retrain()
