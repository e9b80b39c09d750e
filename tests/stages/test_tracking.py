"""Experiment tracking: distill and validate report to MLflow when HPD_TRACKING_URI is set, and only then; read
back through MLflow's client from a local SQLite tracking store (MLflow 3 refuses its file store by default)."""

import json
import logging
import socket
import sys
import time
from datetime import date

import pytest

from tasks.core import catalog, config, manifest, storage
from tasks.core.catalog import Stage
from tasks.stages import tracking, validate
from tests.support.projected_store import corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 3)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A store with one distillation run before tracking is on ('untracked'), then, tracked into a SQLite store,
    a distillation ('tracked') and its validation."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("tracking")
    prepared = projected_store(root, corpus_lines(160), DAY, shard_rows=80)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment("hpd-test", artifact_location=(root / "artifacts").as_uri())
    with pytest.MonkeyPatch.context() as env:
        env.delenv(tracking.TRACKING_URI, raising=False)
        distill_tiny(prepared, "untracked", max_steps=2, blend_initial=[])
        env.setenv(tracking.TRACKING_URI, uri)
        env.setenv(tracking.EXPERIMENT, "hpd-test")
        distilled = distill_tiny(prepared, "tracked", max_steps=4, select_on="sts_dev", blend_initial=[0.5])
        values = {"store": prepared["store"], "model_run": "tracked", "retrieval_sample": 100, "max_regression": 100}
        validated = validate.run(config.parse(validate.ValidateParams, values))
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("hpd-test")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    found = {"client": client, "runs": runs, "distill": distilled, "validate": validated, "uri": uri}
    return {**prepared, "root": root, **found}


def test_only_the_runs_made_with_tracking_on_are_reported(tracked):
    assert set(tracked["runs"]) == {"distill/tracked", "validate/tracked"}
    assert all(run.info.status == "FINISHED" for run in tracked["runs"].values())


def test_distill_reports_its_params_metrics_and_histories(tracked):
    run, stats = tracked["runs"]["distill/tracked"], tracked["distill"].stats
    params, metrics = run.data.params, run.data.metrics
    assert params["max_steps"] == "4" and params["select_on"] == "sts_dev" and params["blend_initial"] == "0.5"
    assert params["student"] == "student" and params["teacher"] == "teacher"  # local folders, by their name
    assert "store" not in params and "dropout" not in params  # the store root and unset params are left out
    assert not any(value.startswith(("/", "file:")) for value in params.values())
    assert metrics["val_mse"] == pytest.approx(stats["exported"]["val_mse"])
    assert metrics["sts_dev"] == pytest.approx(stats["exported"]["sts_dev"])
    assert metrics["steps"] == stats["steps"] == 4 and metrics["train_rows"] == stats["train_rows"]
    losses = tracked["client"].get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in losses) == [1, 2, 3, 4]
    evaluations = tracked["client"].get_metric_history(run.info.run_id, "eval.val_mse")
    published_metrics = next(o.uri for o in tracked["distill"].outputs if o.uri.endswith("/metrics.json"))
    recorded = json.loads(storage.read_bytes(published_metrics))["evals"]
    expected = [(e["step"], pytest.approx(e["val_mse"])) for e in recorded]
    assert len(expected) >= 2 and sorted((m.step, m.value) for m in evaluations) == expected
    published = manifest.read(tracked["store"], Stage.DISTILL, "tracked")
    assert run.data.tags["hpd.run_id"] == published.run_id
    assert run.data.tags["hpd.manifest"] == catalog.store_key(tracked["store"], tracked["distill"].manifest_uri)


def test_validate_reports_the_sts_table_retrieval_and_gate(tracked):
    run, stats = tracked["runs"]["validate/tracked"], tracked["validate"].stats
    metrics = run.data.metrics
    assert metrics["sts.student.sts_b_test"] == pytest.approx(stats["sts"]["student"]["STS-B test"])
    assert metrics["sts.teacher_pca.sick_r_test"] == pytest.approx(stats["sts"]["teacher + PCA"]["SICK-R test"])
    assert metrics["retrieval.mrr_stsb_ge4"] == pytest.approx(stats["retrieval"]["mrr_stsb_ge4"])
    assert metrics["gate.passed"] == float(stats["gate"]["passed"])
    assert metrics["fidelity.val_mse"] == pytest.approx(stats["fidelity"]["val_mse"])
    assert run.data.params["model_run"] == "tracked" and run.data.params["max_regression"] == "100"
    assert run.data.tags["hpd.gate"] == ("passed" if stats["gate"]["passed"] else "failed")


def test_tracking_on_without_mlflow_fails_before_training(tracked, monkeypatch):
    monkeypatch.setenv(tracking.TRACKING_URI, "sqlite:///unused.db")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the extra were not installed
    with pytest.raises(config.ConfigError, match=r"HPD_TRACKING_URI is set .* MLflow is not installed"):
        distill_tiny(tracked, "never", max_steps=1)
    assert manifest.read(tracked["store"], Stage.DISTILL, "never") is None
    monkeypatch.delenv(tracking.TRACKING_URI)
    assert tracking.tracker() is None  # off: MLflow is not needed


def test_a_failing_tracking_store_is_a_warning(caplog):
    report = tracking.Report(stage="distill", name="x", params={"lr": "0.001"}, metrics={"val_mse": 0.5})
    with caplog.at_level(logging.WARNING, logger="tasks.stages.tracking"):
        assert tracking.Tracker("unsupported-scheme://nowhere").log(report) is None
    assert "distill x: not reported to MLflow at unsupported-scheme://nowhere" in caplog.text


def test_a_tracking_server_down_after_a_finished_distill_is_a_redacted_warning(tracked, monkeypatch, caplog):
    """The run is published: the stage succeeds, warns without the URI's password, and waits seconds, not minutes."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(tracking.TRACKING_URI, f"http://user:topsecret@127.0.0.1:{port}")
    start = time.monotonic()
    with caplog.at_level(logging.DEBUG):
        distilled = distill_tiny(tracked, "server-down", max_steps=1)
    assert time.monotonic() - start < 60 and not distilled.skipped
    assert manifest.read(tracked["store"], Stage.DISTILL, "server-down") is not None
    assert f"distill server-down: not reported to MLflow at http://127.0.0.1:{port}: " in caplog.text
    assert "topsecret" not in caplog.text


def test_parameters_never_carry_a_local_path():
    params = config.parse(
        validate.ValidateParams, {"store": "/srv/store", "model_run": "m", "pair_files": ["/data/pairs.csv"]}
    )
    shown = tracking.params_of(params)
    assert "store" not in shown and shown["pair_files"] == "pairs.csv" and shown["promote"] == "true"
    assert "min_stsb" not in shown


def test_validate_logs_its_report_and_card_and_registers_the_promoted_student_as_champion(tracked):
    """The report and the validated card are the run's artifacts, as published; the student is a version of the
    registered model whose source is its folder in the store, and the promotion moved the alias champion to it."""
    from tasks.ml import student

    client, run = tracked["client"], tracked["runs"]["validate/tracked"]
    published = tracked["validate"].manifest
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"report.html", "model_card.md"}
    for name in ("report.html", "model_card.md"):
        logged = client.download_artifacts(run.info.run_id, name, str(tracked["root"] / "downloaded"))
        assert open(logged, "rb").read() == storage.read_bytes(published.output_named(name).uri)
    champion = client.get_model_version_by_alias(tracking.DEFAULT_MODEL, tracking.CHAMPION)
    assert champion.run_id == run.info.run_id and champion.tags["hpd.run_name"] == "tracked"
    assert champion.source == student.model_folder(tracked["distill"].manifest)


def test_a_failed_gate_registers_the_student_but_leaves_the_champion(tracked, monkeypatch):
    monkeypatch.setenv(tracking.TRACKING_URI, tracked["uri"])
    monkeypatch.setenv(tracking.EXPERIMENT, "hpd-test")
    client = tracked["client"]
    before = client.get_model_version_by_alias(tracking.DEFAULT_MODEL, tracking.CHAMPION).version
    values = {"store": tracked["store"], "model_run": "untracked", "retrieval_sample": 100, "min_stsb": 99.0}
    failed = validate.run(config.parse(validate.ValidateParams, values))
    assert failed.stats["gate"]["passed"] is False
    versions = client.search_model_versions(f"name='{tracking.DEFAULT_MODEL}'")
    assert {v.tags["hpd.run_name"]: v.tags["hpd.gate"] for v in versions} == {
        "tracked": "passed",
        "untracked": "failed",
    }
    assert client.get_model_version_by_alias(tracking.DEFAULT_MODEL, tracking.CHAMPION).version == before
