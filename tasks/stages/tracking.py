"""Optional experiment tracking: distill and validate report their parameters and metrics to MLflow.

Off by default; on when ``HPD_TRACKING_URI`` names a tracking server or store (``http://mlflow:5000``,
``sqlite:///mlflow.db``, ``file:///path/mlruns``), into the experiment ``HPD_TRACKING_EXPERIMENT``
(``hpd-pipeline``). MLflow is the optional extra ``tracking`` and imported only when tracking is on: without
it, a stage with tracking on fails at once with a :class:`~tasks.core.config.ConfigError` that says so.

A run is reported once it is published (a skipped run reports nothing), as one MLflow run named
``<stage>/<run name>``, tagged with the stage run's id and manifest key, with its files as artifacts (validate's
report and model card). A validated student becomes a version of the registered model ``HPD_TRACKING_MODEL``
(``hpd-student``) whose source is the store's verified copy of its folder (nothing is copied into MLflow), and the
alias ``champion`` moves to it when, and only when, it is promoted. Parameters never carry a local path:
the store is left out and a path-like value is named by its last segment. Reporting is a side channel: a
tracking server that fails is logged as a warning and fails nothing, the run being published already; MLflow's
HTTP retries and timeout are bounded for these calls (:data:`HTTP_LIMITS`, unless the environment sets them), so a
server that is down costs seconds. The tracking URI is never shown with its credentials (user-info removed).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel

from tasks.core import settings
from tasks.core.config import ConfigError
from tasks.core.uris import redact

TRACKING_URI = "HPD_TRACKING_URI"
EXPERIMENT = "HPD_TRACKING_EXPERIMENT"
DEFAULT_EXPERIMENT = "hpd-pipeline"
DEFAULT_MODEL = "hpd-student"
CHAMPION = "champion"  # the registry alias of the promoted student
HIDDEN_PARAMS = frozenset({"store"})  # the store root is a deployment detail (and may be a local path)
BATCH = 1000  # metrics per MLflow log_batch call (its limit)
# MLflow's HTTP client retries a request 7 times with a backoff, each attempt waiting up to 120 s: a server that is
# down would hold a finished run about 4 minutes. For our calls: 2 retries, 1 s backoff factor, 10 s per attempt.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    """What one stage run reports: its parameters, final metrics, metric histories (name -> (step, value)
    pairs) and tags."""

    stage: str
    name: str
    params: dict[str, str]
    metrics: dict[str, float]
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)  # file name -> text
    model_source: str | None = None  # the store URI of a student folder to register as a version of the model


@dataclass(frozen=True)
class Logged:
    """Where a report went: its MLflow run, and the registered model version it made (None: none)."""

    run_id: str
    version: str | None = None


@dataclass(frozen=True)
class Tracker:
    """An MLflow tracking store (``uri``) and the experiment the runs go to."""

    uri: str
    experiment: str = DEFAULT_EXPERIMENT
    model: str = DEFAULT_MODEL

    def log(self, report: Report) -> Logged | None:
        """Report ``report`` as one finished MLflow run (registering its student); where it went, or None (warned)
        when the store fails."""
        try:
            with bounded_http():
                run_id = self._logged(report)
                version = self._registered(report, run_id) if report.model_source else None
                return Logged(run_id, version)
        except Exception as exc:  # noqa: BLE001 - any failure of the tracking store is reported, not raised
            self._warn(f"{report.stage} {report.name}: not reported", exc)
            return None

    def crown(self, logged: Logged) -> None:
        """Point the alias ``champion`` at the version ``logged`` registered: its student was promoted."""
        if logged.version is None:
            return
        try:
            with bounded_http():
                from mlflow.tracking import MlflowClient

                MlflowClient(tracking_uri=self.uri).set_registered_model_alias(self.model, CHAMPION, logged.version)
        except Exception as exc:  # noqa: BLE001 - as in log: reported, not raised
            self._warn(f"{self.model} version {logged.version}: alias {CHAMPION} not moved", exc)
            return
        log.info("MLflow: %s version %s is the %s", self.model, logged.version, CHAMPION)

    def _warn(self, what: str, exc: Exception) -> None:
        log.warning("%s to MLflow at %s: %s", what, redact(self.uri), redact(str(exc)))

    def _registered(self, report: Report, run_id: str) -> str:
        """A new version of the registered model, its source the store's copy of the student; its number."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        try:
            client.create_registered_model(self.model, description="hpd-pipeline's distilled students")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        tags = {"hpd.run_name": report.name, **report.tags}
        made = client.create_model_version(self.model, str(report.model_source), run_id=run_id, tags=tags)
        log.info("%s %s: registered as %s version %s", report.stage, report.name, self.model, made.version)
        return str(made.version)

    def _logged(self, report: Report) -> str:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(self.experiment)
        tags = {"hpd.stage": report.stage, "hpd.run_name": report.name, **report.tags}
        run_id = client.create_run(experiment_id, run_name=f"{report.stage}/{report.name}", tags=tags).info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, 0) for name, value in report.metrics.items() if math.isfinite(value)]
        for name, points in report.history.items():
            metrics += [Metric(name, value, now, step) for step, value in points if math.isfinite(value)]
        params = [Param(name, value) for name, value in report.params.items()]
        client.log_batch(run_id, params=params, tags=[RunTag(k, v) for k, v in tags.items()])
        for start in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + BATCH])
        for name, text in report.artifacts.items():
            client.log_text(run_id, text, name)
        client.set_terminated(run_id)
        log.info("%s %s: reported to MLflow, experiment %s, run %s", report.stage, report.name, self.experiment, run_id)
        return run_id


def tracker() -> Tracker | None:
    """The configured tracker, or None when tracking is off (``HPD_TRACKING_URI`` unset or empty); a
    :class:`ConfigError` when it is on and MLflow is not installed."""
    configured = settings.current()
    uri = (configured.tracking_uri or "").strip()
    if not uri:
        return None
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"{TRACKING_URI} is set ({redact(uri)}) but MLflow is not installed: install the extra "
            "`pip install 'hpd-pipeline[tracking]'`, or unset it to turn tracking off"
        ) from None
    experiment = configured.tracking_experiment.strip() or DEFAULT_EXPERIMENT
    return Tracker(uri, experiment, configured.tracking_model.strip() or DEFAULT_MODEL)


@contextlib.contextmanager
def bounded_http() -> Iterator[None]:
    """MLflow's HTTP retries and timeout bounded (:data:`HTTP_LIMITS`) while in the block, where the environment
    does not set them; MLflow reads them at each request."""
    unset = [name for name in HTTP_LIMITS if name not in os.environ]
    os.environ.update({name: HTTP_LIMITS[name] for name in unset})
    try:
        yield
    finally:
        for name in unset:
            os.environ.pop(name, None)


def params_of(params: BaseModel) -> dict[str, str]:
    """A stage's parameters as MLflow parameters: set ones only, readable values, no store and no local path."""
    shown = {}
    for name in type(params).model_fields:
        value = getattr(params, name)
        if name not in HIDDEN_PARAMS and value is not None:
            shown[name] = _value(value)
    return shown


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(_value(item) for item in value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if text.startswith(("/", "~", "file:")):
        return PurePosixPath(text.removeprefix("file://")).name
    return text


def metric_name(*parts: str) -> str:
    """An MLflow metric name from ``parts`` (``sts.student.stsb_test``): lower case, words joined by ``_``."""
    return ".".join(re.sub(r"[^0-9a-z]+", "_", part.lower()).strip("_") for part in parts)
