"""Defaults shared by the DAG files; imports little beyond the Task SDK, so DAG files parse fast."""

from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import urlsplit

from airflow.sdk import BaseOperatorLink, RetryDecision, RetryPolicy

from tasks.core import settings
from tasks.core.config import StageParams
from tasks.orchestration.alerts import failure_notifiers
from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.openlineage import forget_earlier_tasks

# Errors another try cannot mend, by class (a subclass inherits its class's kind; the nearest class listed decides):
# bad params, bad input, a failed check, a stored object that is not what its manifest records.
PERMANENT_ERRORS = frozenset(
    {
        "pydantic_core._pydantic_core.ValidationError",
        "tasks.core.catalog.PointerError",
        "tasks.core.config.ConfigError",
        "tasks.core.contracts.ContractError",
        "tasks.core.finite.NonFiniteError",
        "tasks.core.lineage.LineageError",
        "tasks.core.manifest.ManifestError",
        "tasks.core.settings.SettingsError",
        "tasks.core.sources.CorpusInputError",
        "tasks.core.stage_records.RecordError",
        "tasks.core.storage.objects.IntegrityError",
        "tasks.ml.models.ModelError",
        "tasks.ml.projection.PCAError",
        "tasks.ml.segments.SegmentTableError",
        "tasks.ml.student.StudentError",
        "tasks.ml.sts.STSDataError",
        "tasks.ml.vector_index.IndexBuildError",
        "tasks.ml.wordnet.WordNetMissing",
        "tasks.stages.augment.AugmentError",
        "tasks.stages.data_docs.DataDocsError",
        "tasks.stages.distill.checkpoints.CheckpointError",
        "tasks.stages.distill.data.DistillDataError",
        "tasks.stages.distill.errors.DistillError",
        "tasks.stages.encode_teacher.EncodeError",
        "tasks.stages.profiles.DriftError",
        "tasks.stages.quality.QualityError",
        "tasks.stages.validate.errors.ValidateError",
    }
)
# Errors the next try may not meet: the store unreachable, throttled or failing (S3 5xx: botocore's own retries
# spent), a write or pointer move that lost a race, the ID hasher's helper process gone.
TRANSIENT_ERRORS = frozenset(
    {
        "tasks.core.catalog.PointerMoved",
        "tasks.core.manifest.ConcurrentPublish",
        "tasks.core.uris.StorageError",
        "tasks.stages.build_index.PromotionConflict",
        "tasks.stages.stage_corpus.id_hasher.HasherError",
    }
)


def error_kind(error: BaseException) -> str | None:
    """``"permanent"``, ``"transient"`` or None (not classified) for ``error``: its nearest class listed in
    :data:`PERMANENT_ERRORS` or :data:`TRANSIENT_ERRORS`."""
    for cls in type(error).__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in PERMANENT_ERRORS:
            return "permanent"
        if name in TRANSIENT_ERRORS:
            return "transient"
    return None


class FailPermanentErrors(RetryPolicy):
    """Every task's retry policy: a permanent error fails the task on this try; a transient one, or one not
    classified, is retried up to the task's ``retries``. (A failed quality gate and a sensor's timeout raise
    Airflow's own fail-at-once exceptions.)"""

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> RetryDecision:
        kind = error_kind(exception)
        if kind == "permanent":
            return RetryDecision.fail(f"{type(exception).__name__} is permanent: another try would fail alike")
        if kind == "transient":
            return RetryDecision.retry(reason=f"{type(exception).__name__} is transient")
        return RetryDecision.default()


DEFAULT_ARGS = {
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "retry_policy": FailPermanentErrors(),
    "on_failure_callback": failure_notifiers(),
    "on_execute_callback": forget_earlier_tasks,  # each task reports only its own lineage (openlineage.py)
}

_SETTINGS = settings.current()  # read as the DAG files are parsed
# Deployment-level defaults of the DAGs' params (a run's conf still overrides them).
DEFAULT_SOURCE = _SETTINGS.default_source
DEFAULT_TEACHER = _SETTINGS.default_teacher  # a composite teacher
DEFAULT_STUDENT = _SETTINGS.default_student
DEFAULT_K = _SETTINGS.default_k
DEPLOYMENT = "the deployment's default (HPD_DEFAULT_* variables)"
# Where the distillation task runs: the Celery queue of the GPU workers, where the deployment has them.
GPU_QUEUE = _SETTINGS.gpu_queue
# The executor that runs the distillation task where the deployment configures several
# (`[core] executor = KubernetesExecutor,CeleryExecutor`): e.g. CeleryExecutor, whose workers on the GPU queue
# take it. Empty: the default executor (the first one listed). It must be one of the configured executors,
# else the DAG fails to import.
DISTILL_EXECUTOR = _SETTINGS.distill_executor
# The Airflow pool the teacher-encoding tasks take a slot of, bounding how many run at once across all
# hpd_ingest runs and backfills. Deployments create it (`airflow pools set NAME SLOTS DESCRIPTION`, with
# ENCODE_POOL_SLOTS; docker/compose.yaml and infra/helm do): tasks of a pool that does not exist are
# never scheduled.
ENCODE_POOL = _SETTINGS.encode_pool
ENCODE_POOL_SLOTS = _SETTINGS.encode_pool_slots
ENCODE_POOL_DESCRIPTION = "hpd_ingest teacher encodings running at once (each uses a worker's cores or its GPU)"
# The sections of the trigger forms (Param ``section``).
DATA, PROJECTION, STUDENT, GATE = "Data", "Projection", "Student", "Quality gate"
STORE_PARAM = stage_param(
    StageParams, "store", None, "empty: $HPD_STORE, else ./var/store", title="Store", section=DATA
)
# The XCom keys of the report objects' URIs a task pushes: hpd_retrain's validate task its report and validated model
# card, a quality task its Data Docs index. Their links open them as the report plugin serves them.
REPORT_XCOM = "validation_report"
CARD_XCOM = "model_card"
DATA_DOCS_XCOM = "data_docs"
PLAN_XCOM = "plan"  # hpd_retrain's plan of the day (tasks.orchestration.day_plan), pushed by its first task


class _ReportLink(BaseOperatorLink):
    """A task's button to the report object whose URI it pushed as XCom ``uri_key``, in the API server's report
    plugin (:mod:`tasks.serve.report_plugin`); none when the task pushed none."""

    uri_key: ClassVar[str]

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        uri = XCom.get_value(ti_key=ti_key, key=self.uri_key)
        return report_url(uri) if uri else ""


class ValidationReportLink(_ReportLink):
    name = "Validation report"
    uri_key = REPORT_XCOM


class ModelCardLink(_ReportLink):
    name = "Model card"
    uri_key = CARD_XCOM


class DataDocsLink(_ReportLink):
    name = "Data Docs"
    uri_key = DATA_DOCS_XCOM


def report_url(uri: str) -> str:
    """Where the API server serves the report object ``uri`` (below ``[api] base_url``'s path); "" when it is none."""
    from airflow.configuration import conf

    from tasks.core.reports import report_path

    path = report_path(uri)
    return urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/") + path if path else ""


def gpu_executor_config() -> dict:
    """The distillation task's ``executor_config``. Where the KubernetesExecutor runs distill, its pod asks for
    ``$HPD_GPU_COUNT`` (default 1) ``nvidia.com/gpu`` with 8 CPUs and 32-64 GiB, tolerates GPU node taints,
    and starts from the pod template ``$HPD_GPU_POD_TEMPLATE`` (image, node selector) when the deployment
    mounts one (infra/helm). Other executors ignore a pod, so none is built for them: the Kubernetes client it
    needs costs half a second of imports wherever the DAG file is parsed (each task process included)."""
    if not distill_runs_on_kubernetes():
        return {}
    from kubernetes.client import models as k8s

    hpd = settings.current()
    gpus = str(hpd.gpu_count)
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
    template = hpd.gpu_pod_template
    return {"pod_override": pod, **({"pod_template_file": template} if template else {})}


def distill_runs_on_kubernetes() -> bool:
    """Whether the executor that runs distill (``HPD_DISTILL_EXECUTOR``, found as Airflow finds a task's executor:
    by alias, module path or class name; else the default, the first of ``[core] executor``) is the
    KubernetesExecutor. An executor the deployment lacks is left to the task's own check, which fails the import."""
    from airflow.exceptions import UnknownExecutorException
    from airflow.executors.executor_loader import ExecutorLoader

    try:
        runner = (
            ExecutorLoader.lookup_executor_name_by_str(DISTILL_EXECUTOR, validate_teams=False)
            if DISTILL_EXECUTOR
            else ExecutorLoader.get_default_executor_name()
        )
    except UnknownExecutorException:
        return False
    return (runner.module_path or "").rsplit(".", 1)[-1] == "KubernetesExecutor"


def gate_param(name: str) -> Any:
    """A quality-gate param of ``hpd_retrain`` (min_stsb, min_sickr, max_regression, max_dev_regression): the
    deployment's threshold
    (``HPD_DEFAULT_MIN_STSB`` ...) where it sets one, else the validate stage's default."""
    from tasks.stages.params import ValidateParams

    shown = {"title": _GATE_TITLES[name], "section": GATE}
    value = getattr(settings.current(), f"default_{name}")
    if value is None:
        return stage_param(ValidateParams, name, **shown)
    return stage_param(ValidateParams, name, value, DEPLOYMENT, **shown)


_GATE_TITLES = {
    "min_stsb": "Minimum STS-B score",
    "min_sickr": "Minimum SICK-R score",
    "max_regression": "Largest regression allowed",
    "max_dev_regression": "Largest regression on the dev sets against the promoted model",
}
