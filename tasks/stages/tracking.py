"""Optional experiment tracking: distill and validate report their parameters and metrics to MLflow.

Off by default; on when ``HPD_TRACKING_URI`` names a tracking server or store (``http://mlflow:5000``,
``sqlite:///mlflow.db``, ``file:///path/mlruns``), into the experiment ``HPD_TRACKING_EXPERIMENT``
(``hpd-pipeline``). MLflow is the optional extra ``tracking`` and imported only when tracking is on: without
it, a stage with tracking on fails at once with a :class:`~tasks.core.config.ConfigError` that says so.

A run is reported once it is published (a skipped run reports nothing), as one MLflow run named
``<stage>/<run name>``, tagged with the stage run's id and manifest key. Parameters never carry a local path:
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


@dataclass(frozen=True)
class Tracker:
    """An MLflow tracking store (``uri``) and the experiment the runs go to."""

    uri: str
    experiment: str = DEFAULT_EXPERIMENT

    def log(self, report: Report) -> str | None:
        """Report ``report`` as one finished MLflow run; its id, or None (warned) when the store fails."""
        try:
            with bounded_http():
                return self._logged(report)
        except Exception as exc:  # noqa: BLE001 - any failure of the tracking store is reported, not raised
            where, why = redact(self.uri), redact(str(exc))
            log.warning("%s %s: not reported to MLflow at %s: %s", report.stage, report.name, where, why)
            return None

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
    return Tracker(uri, configured.tracking_experiment.strip() or DEFAULT_EXPERIMENT)


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
