"""``hpd_retrain`` decides through Airflow whether to train: a run with nothing worth training ends green with every
training task skipped, and a forced, a volume-triggered and a drift-flagged run each go on to train, their reason
in the ``plan`` task's log. The ``airflow`` executable runs the whole DAG; the forced, volume-triggered and
drift-flagged plans run in one process as ``hpd demo`` runs its commands (the drift-flagged one on a copy of the
store where drift was flagged on the new partition). The training tasks themselves run in
tests/dags/test_dag_runs.py."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import demo
from tasks.core import config, manifest, storage
from tasks.core.catalog import Stage
from tasks.stages import drift
from tests.support import airflow_commands
from tests.support.policy_store import NEW, promoted_store, stage_new_partition

pytestmark = [pytest.mark.models, pytest.mark.dags]

PLANS = ("forced", "volume", "drift")
TRAINING_TASKS = ("fit_pca", "training_partitions", "check_quality", "distill", "validate", "announce_promotion")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A promoted model, a new partition of 12 rows (15% of its 80 training rows), a migrated Airflow home, and the
    ``plan`` task's log line of a forced, a volume-triggered and a drift-flagged run (the four commands in one Airflow
    process)."""
    root = tmp_path_factory.mktemp("decisions")
    prepared = promoted_store(root)
    stage_new_partition(prepared, rows=12)
    drifted = _drift_flagged_copy(root / "store", root / "drifted")
    plan = demo.DemoPlan(store=prepared["store"], airflow_home=root / "airflow", day=NEW)
    env = plan.airflow_env()
    (root / "airflow").mkdir()
    commands = {
        "migrate": ["db", "migrate"],
        "forced": _plan_command(prepared["store"], prepared["teacher"], "2026-11-11", force=True),
        "volume": _plan_command(prepared["store"], prepared["teacher"], "2026-11-12", retrain_fraction=0.1),
        "drift": _plan_command(drifted, prepared["teacher"], "2026-11-13"),
    }
    outputs = airflow_commands.run(commands, env)
    return {**prepared, "env": env, "plans": {name: _plan_line(outputs[name]) for name in PLANS}}


def _drift_flagged_copy(store: Path, folder: Path) -> str:
    """A copy of the store folder ``store`` in ``folder`` whose new partition is flagged as drifted."""
    shutil.copytree(store, folder)
    copy = storage.to_uri(str(folder))
    drift.run(config.parse(drift.DriftParams, {"store": copy, "ingest_date": NEW, "threshold": 1e-6}))
    return copy


def _airflow(args: list[str], env: dict[str, str]) -> str:
    """The output of the ``airflow`` executable run with ``args``; asserts that it succeeded."""
    command = [str(Path(sys.executable).parent / "airflow"), *args]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def _plan_command(store: str, teacher: str, day: str, **params) -> list[str]:
    """``airflow tasks test`` of the ``plan`` task of a new ``hpd_retrain`` run for ``day`` on ``store`` with
    ``params``."""
    conf = {"store": store, "teacher": teacher, **params}
    return ["tasks", "test", "hpd_retrain", "plan", day, "-t", json.dumps(conf)]


def _plan_line(output: str) -> str:
    """The ``plan`` task's decision in a ``tasks test`` output."""
    (line,) = [line for line in output.splitlines() if "retraining" in line and "tasks.orchestration.runtime" in line]
    return line


def test_a_run_not_worth_training_ends_green_training_nothing(prepared):
    conf = {"store": prepared["store"], "teacher": prepared["teacher"]}
    out = _airflow(["dags", "test", "hpd_retrain", "2026-11-10", "--conf", json.dumps(conf)], prepared["env"])
    assert "not retraining: not worth a retrain: 12 new rows in 1 partition(s), 15.0% of the 80" in out
    assert "DagRun Finished: dag_id=hpd_retrain" in out and "state=success" in out
    assert not any(f"[DAG TEST] starting task_id={task}" in out for task in TRAINING_TASKS)
    assert manifest.list_keys(prepared["store"], Stage.DISTILL) == ["tiny"]


def test_forced_volume_and_drift_runs_train_and_say_why(prepared):
    assert "retraining (forced): forced by the run's params (force=True" in prepared["plans"]["forced"]
    volume = prepared["plans"]["volume"]
    assert "retraining (volume): 12 new rows" in volume and "at least retrain_fraction 10.0%" in volume
    assert f"retraining (drift): drift flagged on {NEW.isoformat()}" in prepared["plans"]["drift"]
