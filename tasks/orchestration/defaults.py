"""Defaults shared by the DAG files; imports little beyond the Task SDK, so DAG files parse fast."""

import os
from datetime import timedelta
from typing import Any

from tasks.core.config import StageParams
from tasks.orchestration.alerts import failure_notifiers
from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.openlineage import forget_earlier_tasks

DEFAULT_ARGS = {
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "on_failure_callback": failure_notifiers(),
    "on_execute_callback": forget_earlier_tasks,  # each task reports only its own lineage (openlineage.py)
}

# Deployment-level defaults of the DAGs' params (a run's conf still overrides them).
DEFAULT_SOURCE = os.environ.get("HPD_DEFAULT_SOURCE", "data/corpus/sentences.tsv.gz")
DEFAULT_TEACHER = os.environ.get("HPD_DEFAULT_TEACHER", "all-mpnet-base-v2+all-MiniLM-L6-v2")  # a composite teacher
DEFAULT_STUDENT = os.environ.get("HPD_DEFAULT_STUDENT", "all-MiniLM-L6-v2")
DEFAULT_K = int(os.environ.get("HPD_DEFAULT_K", "128"))
DEPLOYMENT = "the deployment's default (HPD_DEFAULT_* variables)"
# Where the distillation task runs: the Celery queue of the GPU workers, where the deployment has them.
GPU_QUEUE = os.environ.get("HPD_GPU_QUEUE", "default")
# The executor that runs the distillation task where the deployment configures several
# (`[core] executor = KubernetesExecutor,CeleryExecutor`): e.g. CeleryExecutor, whose workers on the GPU queue
# take it. Empty: the default executor (the first one listed). It must be one of the configured executors,
# else the DAG fails to import.
DISTILL_EXECUTOR = os.environ.get("HPD_DISTILL_EXECUTOR") or None
# The Airflow pool the teacher-encoding tasks take a slot of, bounding how many run at once across all
# hpd_ingest runs and backfills. Deployments create it (`airflow pools set NAME SLOTS DESCRIPTION`, with
# ENCODE_POOL_SLOTS; docker/compose.yaml and infra/helm do): tasks of a pool that does not exist are
# never scheduled.
ENCODE_POOL = os.environ.get("HPD_ENCODE_POOL", "hpd_teacher_encode")
ENCODE_POOL_SLOTS = int(os.environ.get("HPD_ENCODE_POOL_SLOTS", "4"))
ENCODE_POOL_DESCRIPTION = "hpd_ingest teacher encodings running at once (each uses a worker's cores or its GPU)"
STORE_PARAM = stage_param(StageParams, "store", None, "empty: $HPD_STORE, else ./var/store")


def gpu_executor_config() -> dict:
    """The distillation task's ``executor_config``. Under the KubernetesExecutor its pod asks for
    ``$HPD_GPU_COUNT`` (default 1) ``nvidia.com/gpu`` with 8 CPUs and 32-64 GiB, tolerates GPU node taints,
    and starts from the pod template ``$HPD_GPU_POD_TEMPLATE`` (image, node selector) when the deployment
    mounts one (infra/helm). Other executors ignore it."""
    from kubernetes.client import models as k8s

    gpus = os.environ.get("HPD_GPU_COUNT", "1")
    resources = k8s.V1ResourceRequirements(
        requests={"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": gpus},
        limits={"memory": "64Gi", "nvidia.com/gpu": gpus},
    )
    pod = k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="base", resources=resources)],
            tolerations=[k8s.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        )
    )
    template = os.environ.get("HPD_GPU_POD_TEMPLATE")
    return {"pod_override": pod, **({"pod_template_file": template} if template else {})}


def gate_param(name: str) -> Any:
    """A quality-gate param of ``hpd_retrain`` (min_stsb, min_sickr, max_regression): the deployment's threshold
    (``HPD_DEFAULT_MIN_STSB`` ...) where it sets one, else the validate stage's default."""
    from tasks.stages.params import ValidateParams

    value = os.environ.get(f"HPD_DEFAULT_{name.upper()}")
    if not value:
        return stage_param(ValidateParams, name)
    return stage_param(ValidateParams, name, float(value), DEPLOYMENT)
