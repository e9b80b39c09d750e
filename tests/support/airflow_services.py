"""Real Airflow 3 services for integration tests: api-server on 127.0.0.1, scheduler, dag-processor, triggerer,
started as ``make airflow`` starts them (``tasks.orchestration.local_airflow``), on a free port.

The metadata database is a PostgreSQL server of the harness's own, as a deployment has it (SQLite's one writer
lock stalls the services on a loaded machine); the LocalExecutor by default, a small parallelism, log serving off,
Airflow's timings at a test's scale; ``extra_env`` overrides any of it (``tests/support/celery_services.py`` runs
the CeleryExecutor). The harness creates the teacher-encoding pool the DAGs use. Processes are started and ended by
PID. A wait that runs out, or a service that exits, raises with the services' log tails and the run's task states,
so a failure in CI says why.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tasks.orchestration.local_airflow import LocalAirflow
from tests.support.paths import REPO as ROOT
from tests.support.postgres import Postgres
from tests.support.servers import free_port

# Airflow's timings at a test run's scale; the DAG files do not change under a test, so each is parsed once.
TEST_SETTINGS = {
    "AIRFLOW__CORE__PARALLELISM": "2",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "15",
    # A restarted scheduler adopts the dead one's tasks after it has missed heartbeats for this long, at
    # its next check for orphans (defaults: 30 s, then checks every 300 s).
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    # A scheduler loop that found nothing to do (nothing queued, no task finished) sleeps 2 s, not 1: each loop
    # re-examines every running DAG run; one that finds work runs the next at once (the services module alone:
    # 228 -> 199 CPU-s, 244 -> 222 s).
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "2",
}


POLL_S = 1.0  # between a wait's requests: each costs the api-server a query, and a run's task takes seconds


class ServicesFailed(RuntimeError):
    """A wait ran out or a service exited; the message carries what the services logged."""


class AirflowServices(LocalAirflow):
    """``make airflow``'s services (:class:`LocalAirflow`) on a free port, with the harness's PostgreSQL, the repo's
    DAGs, ``TEST_SETTINGS`` and ``extra_env``, run from ``home``."""

    def __init__(self, home: Path, extra_env: dict) -> None:
        self.postgres = Postgres(home)
        super().__init__(home, free_port(), self.postgres.url, {**TEST_SETTINGS, **extra_env}, ROOT, workdir=home)

    def start(self) -> None:
        self.postgres.start()
        super().start()

    def kill(self, name: str) -> None:
        """SIGKILL a service and everything it started (its process group)."""
        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.postgres.stop()

    def failure(self, what: str, dag_id: str = "", run_id: str = "") -> ServicesFailed:
        """``what`` went wrong, with the run's task states and each service's log tail."""
        if run_id:
            what += f"\ntask states of {dag_id} {run_id}: {self.task_states(dag_id, run_id)}"
        return ServicesFailed(str(super().failure(what)))

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """The run's task instances, as the REST API reports them."""
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str] | str:
        try:
            return {t["task_id"]: t["state"] for t in self.task_instances(dag_id, run_id)}
        except (RuntimeError, OSError) as exc:  # AirflowFailed is a RuntimeError
            return f"unavailable ({exc})"

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.request("GET", f"/api/v2/dags/{dag_id}")
                return
            except RuntimeError:
                self.check_alive()
                time.sleep(0.5)
        raise self.failure(f"{dag_id} was not parsed in {timeout} s")

    def wait_for_task_state(self, dag_id: str, run_id: str, task_id: str, state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.task_states(dag_id, run_id)  # a string while the run does not exist yet
            if isinstance(states, dict) and states.get(task_id) == state:
                return
            self.check_alive()
            time.sleep(POLL_S)
        raise self.failure(f"{dag_id}.{task_id} was not {state} in {timeout} s", dag_id, run_id)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            self.check_alive()
            time.sleep(POLL_S)
        raise self.failure(f"{dag_id} run {run_id} did not finish in {timeout} s", dag_id, run_id)
