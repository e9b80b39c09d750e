"""
### hpd_retrain — fit the projection, distil the student, validate, promote

Weekly and on manual trigger (params below): fit the PCA over the selected partitions' teacher
embeddings (writing the projected targets), distil the student (queue `gpu` when the deployment has
one, in a pod asking for `nvidia.com/gpu` under the KubernetesExecutor; CPU otherwise), validate it
(STS, fidelity, retrieval, quality gate, HTML report) and, when the gate passes, promote it to
`models/current.json` and update the `hpd_promoted_model` Asset, which schedules `hpd_index`.
The logic lives in `tasks/`; this file only wires it.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, dag, task

from tasks.dag_defaults import (
    DEFAULT_ARGS,
    DEFAULT_K,
    DEFAULT_STUDENT,
    DEFAULT_TEACHER,
    PROMOTED_MODEL,
    gpu_executor_config,
)

GPU_QUEUE = os.environ.get("HPD_GPU_QUEUE", "default")


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
        "store": Param(None, type=["null", "string"], description="store root URI (default: $HPD_STORE)"),
        "partitions": Param(None, type=["null", "array"], items={"type": "string", "format": "date"},
                            description="ingest dates to train on (default: all)"),
        "teacher": Param(DEFAULT_TEACHER, type="string"),
        "k": Param(DEFAULT_K, type="integer", minimum=1),
        "mode": Param("uncentered", enum=["uncentered", "centered"]),
        "max_rows": Param(40000, type=["null", "integer"], minimum=2),
        "student": Param(DEFAULT_STUDENT, type="string"),
        "student_layers": Param(None, type=["null", "integer"], minimum=1),
        "epochs": Param(5, type="integer", minimum=1),
        "max_steps": Param(None, type=["null", "integer"], minimum=1),
        "batch_size": Param(256, type="integer", minimum=1),
        "lr": Param(1e-4, type="number", exclusiveMinimum=0),
        "amp": Param("auto", enum=["auto", "off", "bf16", "fp16"]),
        "min_stsb": Param(None, type=["null", "number"]),
        "min_sickr": Param(None, type=["null", "number"]),
        "max_regression": Param(1.0, type="number", minimum=0),
        "name": Param(None, type=["null", "string"], pattern=r"^[A-Za-z0-9_.=-]+$",
                      description="model run name (default: the Airflow run id); a rerun with the same name "
                                  "and params skips the finished stages"),
    },
)
def hpd_retrain():
    @task
    def fit_pca(**context) -> str:
        from tasks import config, orchestration
        from tasks import fit_pca as stage

        p = context["params"]
        values = {"teacher": p["teacher"], "partitions": p["partitions"], "k": p["k"], "mode": p["mode"],
                  "max_rows": p["max_rows"]}
        params = config.parse(stage.FitPCAParams, orchestration.with_store(values, p))
        stage.run(params)
        return params.name

    @task(queue=GPU_QUEUE, executor_config=gpu_executor_config(), execution_timeout=pendulum.duration(hours=12))
    def distill(pca_name: str, **context) -> str:
        from tasks import config, orchestration
        from tasks import distill as stage

        p = context["params"]
        values = {"teacher": p["teacher"], "pca_name": pca_name, "partitions": p["partitions"],
                  "student": p["student"], "student_layers": p["student_layers"], "epochs": p["epochs"],
                  "max_steps": p["max_steps"], "batch_size": p["batch_size"], "lr": p["lr"], "amp": p["amp"],
                  "name": p["name"] or orchestration.run_name(context)}
        params = config.parse(stage.DistillParams, orchestration.with_store(values, p))
        stage.run(params)
        return params.name

    @task
    def validate(model_run: str, **context) -> bool:
        from tasks import config, orchestration
        from tasks import validate as stage

        p = context["params"]
        values = {"model_run": model_run, "min_stsb": p["min_stsb"], "min_sickr": p["min_sickr"],
                  "max_regression": p["max_regression"]}
        result = stage.run(config.parse(stage.ValidateParams, orchestration.with_store(values, p)))
        return result.manifest["stats"]["gate"]["passed"]

    @task.short_circuit
    def gate_passed(passed: bool) -> bool:
        return passed

    @task(outlets=[PROMOTED_MODEL])
    def announce_promotion(model_run: str) -> str:
        return model_run

    model_run = distill(fit_pca())
    gate_passed(validate(model_run)) >> announce_promotion(model_run)


hpd_retrain()
