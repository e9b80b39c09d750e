"""Settings that can carry credentials (a URI's ``user:secret@``) never show them: the URI settings refuse them,
naming the variable; the tracking URI, which MLflow reads as it is, reaches no log line or error with them; and a
tracking server that is down costs seconds, not MLflow's four minutes of retries."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time

import pytest

from tasks import cli
from tasks.core import settings
from tasks.core.config import ConfigError
from tasks.core.settings import SettingsError
from tasks.stages import tracking

SECRET = "topsecret"
URI_SETTINGS = {
    "HPD_STORE": f"s3://AKIAEXAMPLE:{SECRET}@bucket/store",
    "HPD_DEFAULT_SOURCE": f"s3://AKIAEXAMPLE:{SECRET}@bucket/raw/{{ingest_date}}.txt",
    "HPD_DEFAULT_TEACHER": f"https://user:{SECRET}@models.example.com/teacher",
    "HPD_DEFAULT_STUDENT": f"https://user:{SECRET}@models.example.com/student",
    "HPD_SERVE_URL": f"http://user:{SECRET}@search.example.com:8765",
}


@pytest.mark.parametrize("variable", sorted(URI_SETTINGS))
def test_a_uri_setting_with_credentials_is_refused_naming_it_without_them(variable, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(variable, URI_SETTINGS[variable])
    with pytest.raises(SettingsError, match=f"{variable}=.*credentials do not belong in a URI") as err:
        settings.current()
    assert SECRET not in str(err.value)
    assert cli.main(["search", "a query", "--store", str(tmp_path / "store")]) == 2
    captured = capsys.readouterr()
    assert variable in captured.err and "Traceback" not in captured.err
    assert SECRET not in captured.err + captured.out


def test_a_wrong_setting_is_named_without_the_credentials_of_its_value():
    with pytest.raises(SettingsError, match="HPD_S3_MAX_ATTEMPTS='http://host/'") as err:
        settings.current({"HPD_S3_MAX_ATTEMPTS": f"http://user:{SECRET}@host/"})
    assert SECRET not in str(err.value)


def _closed_port() -> int:
    """A local port nothing listens on: a tracking server that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_tracking_uri_is_shown_without_its_credentials_when_mlflow_is_missing(monkeypatch):
    monkeypatch.setenv(tracking.TRACKING_URI, f"http://user:{SECRET}@mlflow.example.com:5000")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"HPD_TRACKING_URI is set \(http://mlflow.example.com:5000\)") as err:
        tracking.tracker()
    assert SECRET not in str(err.value)


def test_a_tracking_server_down_is_a_redacted_warning_within_seconds(monkeypatch, caplog):
    for name in tracking.HTTP_LIMITS:
        monkeypatch.delenv(name, raising=False)
    port = _closed_port()
    report = tracking.Report(stage="distill", name="x", params={"lr": "0.001"}, metrics={"val_mse": 0.5})
    start = time.monotonic()
    with caplog.at_level(logging.DEBUG):  # every logger: MLflow's, urllib3's and ours
        assert tracking.Tracker(f"http://user:{SECRET}@127.0.0.1:{port}").log(report) is None
    assert time.monotonic() - start < 30  # MLflow's defaults: about 4 minutes
    assert f"distill x: not reported to MLflow at http://127.0.0.1:{port}: " in caplog.text
    assert SECRET not in caplog.text
    assert not any(name in os.environ for name in tracking.HTTP_LIMITS)  # bounded for our calls only


def test_retry_limits_the_environment_sets_are_kept(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "5")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    with tracking.bounded_http():
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == tracking.HTTP_LIMITS["MLFLOW_HTTP_REQUEST_TIMEOUT"]
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5" and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
