"""Real Airflow 3 services for integration tests: api-server on 127.0.0.1, scheduler, dag-processor, triggerer.

The metadata database is a PostgreSQL server of the harness's own, as a deployment has it (SQLite's one writer
lock stalls the services on a loaded machine); the LocalExecutor by default, a small parallelism, log serving off;
``extra_env`` overrides any of it (``tests/support/celery_services.py`` runs the CeleryExecutor). The harness
creates the teacher-encoding pool the DAGs use. Processes are started and ended by PID. A wait that runs out, or a
service that exits, raises with the services' log tails and the run's task states, so a failure in CI says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.paths import REPO as ROOT
from tests.support.postgres import Postgres
from tests.support.servers import free_port, log_tail, stop_groups

SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")


class ServicesFailed(RuntimeError):
    """A wait ran out or a service exited; the message carries what the services logged."""


class AirflowServices:
    def __init__(self, home: Path, extra_env: dict) -> None:
        self.home, self.port, self.postgres = home, free_port(), Postgres(home)
        self.url = f"http://127.0.0.1:{self.port}"
        self.airflow = str(Path(sys.executable).parent / "airflow")
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url,
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",  # the DAG files do not change under a test
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "15",
            # A restarted scheduler adopts the dead one's tasks after it has missed heartbeats for this long, at
            # its next check for orphans (defaults: 30 s, then checks every 300 s).
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
            "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1",
            "NO_PROXY": "127.0.0.1,localhost",  # the execution API and REST calls stay on loopback
            "no_proxy": "127.0.0.1,localhost",
            **extra_env,
        }
        self.processes: dict[str, subprocess.Popen] = {}
        self.token = ""

    def start(self) -> None:
        self.postgres.start()
        migrated = subprocess.run(
            [self.airflow, "db", "migrate"], env=self.env, capture_output=True, text=True, timeout=300
        )
        if migrated.returncode:
            raise RuntimeError(f"airflow db migrate failed: {(migrated.stdout + migrated.stderr)[-3000:]}")
        self.start_services()
        self.wait_healthy()
        self.create_encode_pool()

    def start_services(self) -> None:
        self.start_one("api-server", ["api-server", "-H", "127.0.0.1", "-p", str(self.port)])
        self.start_one("scheduler", ["scheduler", "--skip-serve-logs"])
        self.start_one("dag-processor", ["dag-processor"])
        self.start_one("triggerer", ["triggerer", "--skip-serve-logs"])  # for deferred tasks (hpd_ingest's sensor)

    def wait_healthy(self) -> None:
        """Wait for the api-server's health endpoint, then log in (the simple auth manager's admin)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                self.check_alive()
                time.sleep(1)
        else:
            raise self.failure(f"api-server on {self.url} did not answer")
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        self.token = self.request(
            "POST", "/auth/token", {"username": "admin", "password": passwords["admin"]}, auth=False
        )["access_token"]

    def create_encode_pool(self) -> dict:
        """The pool the teacher-encoding tasks take a slot of (``tasks.orchestration.defaults``), as a deployment
        creates it; the services' ``HPD_ENCODE_POOL`` / ``HPD_ENCODE_POOL_SLOTS`` override the defaults."""
        from tasks.orchestration import defaults

        body = {
            "name": self.env.get("HPD_ENCODE_POOL") or defaults.ENCODE_POOL,
            "slots": int(self.env.get("HPD_ENCODE_POOL_SLOTS") or defaults.ENCODE_POOL_SLOTS),
            "description": defaults.ENCODE_POOL_DESCRIPTION,
        }
        return self.request("POST", "/api/v2/pools", body)

    def start_one(self, name: str, args: list[str], env: dict | None = None) -> None:
        with open(self.home / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [self.airflow, *args],
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.home,
            )

    def kill(self, name: str) -> None:
        """SIGKILL a service and everything it started (its process group)."""
        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        try:
            stop_groups(list(self.processes.values()))
            self.processes.clear()
        finally:
            self.postgres.stop()

    def check_alive(self) -> None:
        """Raise if a service this harness started has exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise self.failure(f"{name} exited with {process.returncode}")

    def failure(self, what: str, dag_id: str = "", run_id: str = "") -> ServicesFailed:
        """``what`` went wrong, with the run's task states and each service's log tail."""
        parts = [what]
        if run_id:
            parts.append(f"task states of {dag_id} {run_id}: {self.task_states(dag_id, run_id)}")
        for name in sorted({*SERVICES, *self.processes}):
            parts.append(f"--- {name}.log (last lines) ---\n{log_tail(self.home / f'{name}.log')}")
        return ServicesFailed("\n".join(parts))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str] | str:
        try:
            path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances"
            return {t["task_id"]: t["state"] for t in self.request("GET", path)["task_instances"]}
        except (RuntimeError, OSError) as exc:
            return f"unavailable ({exc})"

    def request(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> dict:
        """One REST call to the api-server."""
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None
        return json.loads(text) if text else {}

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
            time.sleep(0.5)
        raise self.failure(f"{dag_id}.{task_id} was not {state} in {timeout} s", dag_id, run_id)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            self.check_alive()
            time.sleep(0.5)
        raise self.failure(f"{dag_id} run {run_id} did not finish in {timeout} s", dag_id, run_id)
