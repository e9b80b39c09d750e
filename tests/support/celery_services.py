"""Distributed Airflow 3 for integration tests: the CeleryExecutor with Redis (the broker) and the harness's
PostgreSQL (the metadata database, and Celery's result backend) from Debian's packages, and Celery workers, each
with its own Celery hostname and queues. Everything listens on 127.0.0.1 only.

Redis keeps nothing on disk. Every process is started here and stopped by its PID at teardown.
:class:`ProcessTree` records which worker each process descends from, so a task instance's ``pid`` can be
traced to the worker that ran it after the task has exited.
"""

from __future__ import annotations

import os
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
    """Walks the process trees below ``roots`` (name -> PID) every ``interval`` s and records, for each process
    seen, which root it descends from. A task process lives longer than that (it parses the DAG file and runs the
    stage), so a task instance's ``pid`` can be looked up here after the task has finished; a PID used again later
    (a long run wraps PIDs) is told apart by when its process started."""

    def __init__(self, roots: dict[str, int], interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.roots, self.interval = roots, interval
        self.seen: dict[int, dict[float, str]] = defaultdict(dict)  # PID -> its processes' start ticks -> root
        self._stopping, self._lock = threading.Event(), threading.Lock()
        self._tick, self._booted = os.sysconf("SC_CLK_TCK"), _boot_time()

    def run(self) -> None:
        while not self._stopping.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)

    def sample(self) -> None:
        for name, root in self.roots.items():
            below = process_libraries.children(root)
            while below:
                pid = below.pop()
                if (start := process_libraries.started(pid)) is not None:
                    with self._lock:
                        self.seen[pid][start] = name
                below += process_libraries.children(pid)

    def owner(self, pid: int, ended: float) -> str | None:
        """The root of the last process with ``pid`` that started by ``ended`` (seconds since the epoch; None:
        never seen)."""
        latest = (ended + 1 - self._booted) * self._tick
        with self._lock:
            starts = [(start, root) for start, root in self.seen.get(pid, {}).items() if start <= latest]
        return max(starts)[1] if starts else None


def _boot_time() -> int:
    """When the machine booted, in seconds since the epoch."""
    with open("/proc/stat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("btime "))


class CeleryAirflowServices(AirflowServices):
    """The Airflow services (api-server, scheduler, dag-processor, triggerer) with the CeleryExecutor, Redis
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
            **CELERY_CONFIG_ENV,  # the deployments' configuration: workers load the tasks' libraries before forking
        }
        self.env.update({**celery, **extra_env})

    def start(self) -> None:
        self.redis.start()
        super().start()
        self.wait_for_workers()

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
