"""
### hpd_retrain — fit the projection, distil the student, validate, promote

Weekly and on manual trigger (params below): fit the PCA over the selected partitions' teacher
embeddings (writing the projected targets), distil the student (queue `gpu` when the deployment has
one, in a pod asking for `nvidia.com/gpu` under the KubernetesExecutor; CPU otherwise), validate it
(STS, fidelity, retrieval, quality gate, HTML report) and, when the gate passes, promote it to
`models/current.json` and update the `hpd_promoted_model` Asset, which schedules `hpd_index`.
The logic lives in `tasks/`; this file only wires it. Params come from the stages' own parameter
models; where this DAG's default differs, the param's description says why.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import (
    DEFAULT_ARGS,
    DEFAULT_K,
    DEFAULT_STUDENT,
    DEFAULT_TEACHER,
    DEPLOYMENT,
    GPU_QUEUE,
    PROMOTED_MODEL,
    STORE_PARAM,
    gpu_executor_config,
)
from tasks.stages.params import DistillParams, FitPCAParams, ValidateParams


@dag(
    dag_id="hpd_retrain",
    schedule="@weekly",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "retrain"],
    doc_md=__doc__,
    params={
        "store": STORE_PARAM,
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
        "min_stsb": stage_param(ValidateParams, "min_stsb"),
        "min_sickr": stage_param(ValidateParams, "min_sickr"),
        "max_regression": stage_param(ValidateParams, "max_regression"),
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
    @task
    def fit_pca(**context) -> str:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = context["params"]
        values = runtime.pick(p, "teacher", "partitions", "k", "mode", "max_rows")
        params = runtime.stage_params(Stage.FIT_PCA, values, p)
        runtime.run_stage(Stage.FIT_PCA, params)
        return params.name

    @task(queue=GPU_QUEUE, executor_config=gpu_executor_config(), execution_timeout=pendulum.duration(hours=12))
    def distill(pca_name: str, **context) -> str:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = context["params"]
        values = runtime.pick(
            p, "teacher", "partitions", "student", "student_layers", "epochs", "max_steps", "batch_size", "lr", "amp"
        )
        values.update(pca_name=pca_name, name=p["name"] or runtime.run_name(context))
        params = runtime.stage_params(Stage.DISTILL, values, p)
        runtime.run_stage(Stage.DISTILL, params)
        return params.name

    @task
    def validate(model_run: str, **context) -> bool:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = context["params"]
        values = {"model_run": model_run, **runtime.pick(p, "min_stsb", "min_sickr", "max_regression")}
        result = runtime.run_stage(Stage.VALIDATE, runtime.stage_params(Stage.VALIDATE, values, p))
        return result.stats["gate"]["passed"]

    @task.short_circuit
    def gate_passed(passed: bool) -> bool:
        return passed

    @task(outlets=[PROMOTED_MODEL])
    def announce_promotion(model_run: str) -> str:
        return model_run

    model_run = distill(fit_pca())
    gate_passed(validate(model_run)) >> announce_promotion(model_run)


hpd_retrain()
