"""A throwaway PostgreSQL server for integration tests: Airflow's metadata database (and Celery's result backend),
as a deployment has it, instead of SQLite, whose single writer lock stalls Airflow's processes under load.

It runs from a fresh ``initdb`` in a temp folder (its unix socket there too) on 127.0.0.1, as the ``postgres``
user when the tests run as root (the server refuses to run as root), and is stopped by its PID.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.servers import free_port, stop_group


def postgres_bindir() -> Path | None:
    """The newest installed PostgreSQL server's bin folder (Debian: /usr/lib/postgresql/N/bin), else PATH's."""
    debian = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/postgres") if p.parts[-3].isdigit()]
    if debian:
        return max(debian, key=lambda bindir: int(bindir.parent.name))
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path and (Path(on_path).parent / "initdb").exists() else None


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
                stop_group(self.process)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
