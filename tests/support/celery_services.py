"""Distributed Airflow 3 for integration tests: the CeleryExecutor with Redis (the broker) and PostgreSQL (the
metadata database and Celery's result backend) from Debian's packages, and Celery workers, each with its own
Celery hostname and queues. Everything listens on 127.0.0.1 only.

PostgreSQL runs from a fresh ``initdb`` in a temp folder (its unix socket there too), as the ``postgres`` user
when the tests run as root (the server refuses to run as root); Redis keeps nothing on disk. Every process is
started here and stopped by its PID at teardown. :class:`ProcessTree` records which worker each process descends
from, so a task instance's ``pid`` can be traced to the worker that ran it after the task has exited.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from tests.support.airflow_services import AirflowServices, free_port

HOSTNAME_CALLABLE = "tests.support.worker_hostname.hostname"


def postgres_bindir() -> Path | None:
    """The newest installed PostgreSQL server's bin folder (Debian: /usr/lib/postgresql/N/bin), else PATH's."""
    debian = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/postgres") if p.parts[-3].isdigit()]
    if debian:
        return max(debian, key=lambda bindir: int(bindir.parent.name))
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path and (Path(on_path).parent / "initdb").exists() else None


def missing_servers() -> list[str]:
    """The servers this harness needs that are not installed (``make venv`` installs both)."""
    missing = [] if shutil.which("redis-server") else ["redis-server (Debian package redis-server)"]
    if postgres_bindir() is None:
        missing.append("postgres and initdb (Debian package postgresql)")
    return missing


def _stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal a process started here (its process group: it was started in a session of its own), then wait;
    SIGKILL the group if it has not exited in ``timeout`` s."""
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


class Postgres:
    """A throwaway PostgreSQL server on 127.0.0.1 (trust authentication) holding the database ``airflow``."""

    def __init__(self, log_dir: Path) -> None:
        self.bindir, self.port, self.log = postgres_bindir(), free_port(), log_dir / "postgres.log"
        self.dir = Path(tempfile.mkdtemp(prefix="hpd-postgres-"))  # readable by the server user, unlike pytest's
        self.process: subprocess.Popen | None = None
        self.url = f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/airflow"

    def _as_server_user(self, args: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return args
        user = "postgres" if "postgres" in {u.pw_name for u in pwd.getpwall()} else "nobody"
        shutil.chown(self.dir, user)
        return ["runuser", "-u", user, "--", *args]

    def start(self) -> None:
        data = str(self.dir / "data")
        initdb = [str(self.bindir / "initdb"), "-D", data, "-U", "airflow", "--auth=trust", "-E", "UTF8", "--no-sync"]
        subprocess.run(self._as_server_user(initdb), check=True, capture_output=True, timeout=120, cwd=self.dir)
        server = [
            str(self.bindir / "postgres"),
            "-D",
            data,
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-k",
            str(self.dir),
        ]
        for setting in ("fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=200"):
            server += ["-c", setting]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self._as_server_user(server), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir
            )
        self._create_database()

    def _create_database(self, timeout: float = 60) -> None:
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            try:
                connection = psycopg2.connect(host="127.0.0.1", port=self.port, user="airflow", dbname="postgres")
                break
            except psycopg2.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.3)
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("CREATE DATABASE airflow")
        connection.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, whose PID the data folder records), then remove the folder."""
        try:
            if self.process is not None and self.process.poll() is None:
                pid_file = self.dir / "data" / "postmaster.pid"
                if pid_file.exists():
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
                    try:
                        self.process.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        pass
                _stop(self.process)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


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
                _stop(self.process)
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
        parents = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    stat = Path(entry.path, "stat").read_text()
                except OSError:  # exited meanwhile
                    continue
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the field after (comm) state
        with self._lock:
            for pid in parents:
                ancestor, hops = pid, 0
                while ancestor in parents and ancestor not in self.roots and hops < 64:
                    ancestor, hops = parents[ancestor], hops + 1
                if ancestor in self.roots:
                    self.seen[pid].add(self.roots[ancestor])

    def owners(self, pid: int) -> set[str]:
        """The roots ``pid`` was seen under (empty: never seen; two: the PID was reused across roots)."""
        with self._lock:
            return set(self.seen.get(pid, ()))


class CeleryAirflowServices(AirflowServices):
    """The Airflow services (api-server, scheduler, dag-processor) with the CeleryExecutor, on PostgreSQL and
    Redis started here, and one Celery worker per entry of ``workers`` (Celery hostname -> comma-separated
    queues), each with concurrency 1. ``extra_env`` overrides the configuration (e.g. several executors)."""

    def __init__(self, home: Path, extra_env: dict, workers: dict[str, str]) -> None:
        self.postgres, self.redis, self.workers = Postgres(home), Redis(home), workers
        self.tree: ProcessTree | None = None
        celery = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url,
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.postgres.url}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "21600",
            # Only the runs a test triggers: no run for the latest interval when a DAG is unpaused.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        }
        super().__init__(home, {**celery, **extra_env})

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()
        super().start()
        self.wait_for_workers()

    def start_services(self) -> None:
        super().start_services()
        self.start_one("triggerer", ["triggerer", "--skip-serve-logs"])  # for deferred tasks (hpd_ingest's sensor)
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
            try:
                self.redis.stop()
            finally:
                self.postgres.stop()
