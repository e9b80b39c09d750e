"""A demo chain's DAGs through ``dag.test()``, one after the other in one Python process: what ``airflow dags test``
runs for each DAG, without a process (and its imports of torch, transformers and great-expectations) per DAG.
tests/dags/test_dag_runs.py keeps one chain through ``airflow dags test`` itself, the demo's path."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

from tasks import demo
from tests.support.paths import REPO


def run_in_one_process(plan: demo.DemoPlan) -> dict[str, str]:
    """Migrate ``plan``'s metadata database, then run each of its DAGs with its conf through ``dag.test()`` in one
    child process with the environment ``airflow dags test`` gets; each DAG run's state, in the order they ran."""
    env = plan.airflow_env()
    plan.airflow_home.mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    states = plan.airflow_home / "dag-states.json"
    arguments = json.dumps([str(plan.dags_folder), plan.day.isoformat(), plan.confs(), str(states)])
    call = "import sys; from tests.support.dag_chain import run_dags; run_dags(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-c", call, arguments], env=env, cwd=REPO, capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(states.read_text())


def run_dags(arguments: str) -> None:
    """In the child: ``dag.test()`` of each DAG of ``[dags folder, day, {dag id: conf}, states file]`` for that
    logical date; writes each run's state to the states file, as JSON (Airflow's logs go to stdout)."""
    from airflow.dag_processing.dagbag import DagBag

    folder, day, confs, written = json.loads(arguments)
    bag = DagBag(folder)
    logical_date = datetime.combine(date.fromisoformat(day), datetime.min.time(), UTC)
    states: dict[str, str] = {}
    for dag_id, conf in confs.items():
        states[dag_id] = str(bag.get_dag(dag_id).test(logical_date=logical_date, run_conf=conf).state)
        if states[dag_id] != "success":
            break  # as the demo stops at a DAG that fails
    Path(written).write_text(json.dumps(states))
