"""Distributed Airflow 3 for integration tests: the CeleryExecutor with Redis (the broker) and the harness's
PostgreSQL (the metadata database, and Celery's result backend) from Debian's packages, and Celery workers, each
with its own Celery hostname and queues. Everything listens on 127.0.0.1 only.

Redis keeps nothing on disk. Every process is started here and stopped by its PID at teardown.
:class:`ProcessTree` records which worker each process descends from, so a task instance's ``pid`` can be
traced to the worker that ran it after the task has exited.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from tasks.orchestration.celery_config import CELERY_CONFIG_ENV
from tests.support import process_libraries
from tests.support.airflow_services import AirflowServices
from tests.support.postgres import postgres_bindir
from tests.support.servers import free_port, stop_group

HOSTNAME_CALLABLE = "tests.support.worker_hostname.hostname"


def missing_servers() -> list[str]:
    """The servers this harness needs that are not installed (``make venv`` installs both)."""
    missing = [] if shutil.which("redis-server") else ["redis-server (Debian package redis-server)"]
    if postgres_bindir() is None:
        missing.append("postgres and initdb (Debian package postgresql)")
    return missing


class Redis:
    """A throwaway Redis on 127.0.0.1 without persistence."""

    def __init__(self, log_dir: Path) -> None:
        self.port, self.log = free_port(), log_dir / "redis.log"
        self.dir = Path(tempfile.mkdtemp(prefix="hpd-redis-"))
        self.process: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30) -> None:
        import redis

        args = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--protected-mode", "yes"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client, deadline = redis.Redis(host="127.0.0.1", port=self.port), time.monotonic() + timeout
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Redis did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        client.close()

    def stop(self) -> None:
        try:
            if self.process is not None:
                stop_group(self.process)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class ProcessTree(threading.Thread):
    """Samples /proc every ``interval`` s and records, for each process seen, which of ``roots`` (name -> PID)
    it descends from. A task process lives seconds at least (it parses the DAG file and imports the stage), so
    a task instance's ``pid`` can be looked up here after the task has finished."""

    def __init__(self, roots: dict[str, int], interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.roots, self.interval = {pid: name for name, pid in roots.items()}, interval
        self.seen: dict[int, set[str]] = defaultdict(set)
        self._stopping, self._lock = threading.Event(), threading.Lock()

    def run(self) -> None:
        while not self._stopping.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)

    def sample(self) -> None:
        parents = process_libraries.parents()
        with self._lock:
            for pid in parents:
                if (root := process_libraries.root_of(pid, parents, self.roots)) is not None:
                    self.seen[pid].add(self.roots[root])

    def owners(self, pid: int) -> set[str]:
        """The roots ``pid`` was seen under (empty: never seen; two: the PID was reused across roots)."""
        with self._lock:
            return set(self.seen.get(pid, ()))


class CeleryAirflowServices(AirflowServices):
    """The Airflow services (api-server, scheduler, dag-processor; no triggerer) with the CeleryExecutor, Redis
    started here, and one Celery worker per entry of ``workers`` (Celery hostname -> comma-separated queues), each
    with concurrency 1. ``extra_env`` overrides the configuration (e.g. several executors)."""

    def __init__(self, home: Path, extra_env: dict, workers: dict[str, str]) -> None:
        self.redis, self.workers = Redis(home), workers
        self.tree: ProcessTree | None = None
        super().__init__(home, extra_env)
        celery = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.postgres.url}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "21600",
            # Only the runs a test triggers: no run for the latest interval when a DAG is unpaused.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            **CELERY_CONFIG_ENV,  # the deployments' configuration: workers load the tasks' libraries before forking
        }
        self.env.update({**celery, **extra_env})

    def start(self) -> None:
        self.redis.start()
        super().start()
        self.wait_for_workers()

    def service_args(self) -> dict[str, list[str]]:
        """The services but the triggerer: the chain's raw files are there when its runs start, so no sensor defers."""
        return {name: args for name, args in super().service_args().items() if name != "triggerer"}

    def start_services(self) -> None:
        super().start_services()
        for name, queues in self.workers.items():
            args = ["celery", "worker", "--celery-hostname", name, "--queues", queues, "--concurrency", "1"]
            env = {"HPD_TEST_WORKER_HOSTNAME": name, "AIRFLOW__CORE__HOSTNAME_CALLABLE": HOSTNAME_CALLABLE}
            self.start_one(f"worker-{name}", [*args, "--skip-serve-logs"], env)
        roots = {name: self.processes[f"worker-{name}"].pid for name in self.workers}
        self.tree = ProcessTree({**roots, "scheduler": self.processes["scheduler"].pid})
        self.tree.start()

    def wait_for_workers(self, timeout: float = 120) -> None:
        """Wait until every worker answers a Celery ping through the broker (it consumes its queues then)."""
        from celery import Celery

        app, deadline = Celery(broker=self.redis.url), time.monotonic() + timeout
        try:
            while True:
                answered = {node.split("@", 1)[1] for reply in app.control.ping(timeout=1.0) for node in reply}
                if set(self.workers) <= answered:
                    return
                for name in self.workers:
                    if self.processes[f"worker-{name}"].poll() is not None or time.monotonic() > deadline:
                        log = (self.home / f"worker-{name}.log").read_text()[-3000:]
                        raise RuntimeError(f"Celery worker {name} is not up: {log}")
        finally:
            app.close()

    def stop(self) -> None:
        try:
            if self.tree is not None:
                self.tree.stop()
            super().stop()
        finally:
            self.redis.stop()
