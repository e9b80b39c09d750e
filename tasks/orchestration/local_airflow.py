"""A local Airflow 3 on 127.0.0.1 (``make airflow``): the API server with its UI, the scheduler, the DAG processor
and the triggerer, with the project's DAGs and the embedded store, the LocalExecutor and SQLite in its home
(``--database`` names another). It creates the teacher-encoding pool the DAGs use, prints the URL and the login
(the simple auth manager's ``admin``; its password is generated once into the home, or ``HPD_AIRFLOW_PASSWORD``),
and stays in the foreground until Ctrl-C, then stops every process it started (each in a session of its own, ended
by its PID). The live-service tests start the same services through :class:`LocalAirflow`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import tenacity
from pydantic import BaseModel

from tasks.core import settings, storage
from tasks.orchestration.task_libraries import TASK_LIBRARIES

USER = "admin"
# Settings a user's environment may override: a few task processes at once (SQLite has one writer), tasks forked
# with their libraries loaded (Airflow's ``mp_start_method`` and ``mp_forkserver_preload``: the LocalExecutor's
# workers fork from the forkserver, each task process from a worker).
TUNABLE = {
    "AIRFLOW__CORE__PARALLELISM": "4",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__SCHEDULER__MP_START_METHOD": "forkserver",
    "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD": ",".join(TASK_LIBRARIES),
}
UNAVAILABLE_RETRY_PAUSES = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds before each new try of a call answered 503


class AirflowFailed(RuntimeError):
    """A service exited or did not answer in time; the message carries the services' log tails."""


class _Unavailable(AirflowFailed):
    """The API server answered 503: nothing was done, the call may be sent again."""


def service_env(home: Path, url: str, checkout: Path, store: Path, database: str | None, extra_env: dict) -> dict:
    """The services' environment: the defaults (the store ``store``), then this process's environment, then the
    settings that make it this home's Airflow on ``url`` with ``checkout``'s DAGs, then ``extra_env``."""
    return {
        **TUNABLE,
        "HPD_STORE": storage.to_uri(str(store)),
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(checkout / "dags"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        **({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database} if database else {}),
        "PYTHONPATH": str(checkout),
        "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost",  # the execution API and REST calls stay on loopback
        "no_proxy": "127.0.0.1,localhost",
        **extra_env,
    }


class _Token(BaseModel):
    access_token: str


class LocalAirflow:
    """The four Airflow services of one home, on 127.0.0.1:``port``, with the DAGs of ``checkout`` (default: the
    working directory), run from ``workdir`` (default: the checkout, where relative paths in the DAGs' defaults
    resolve); the store is ``$HPD_STORE``, else ``var/store`` there. ``extra_env`` overrides any setting."""

    def __init__(
        self,
        home: Path,
        port: int,
        database: str | None = None,
        extra_env: dict | None = None,
        checkout: Path | None = None,
        workdir: Path | None = None,
    ) -> None:
        checkout = (checkout or Path.cwd()).resolve()
        self.home, self.port, self.workdir = home, port, workdir or checkout
        self.url = f"http://127.0.0.1:{port}"
        self.airflow = str(Path(sys.executable).parent / "airflow")
        self.env = service_env(home, self.url, checkout, self.workdir / "var" / "store", database, extra_env or {})
        self.store = self.env.get("HPD_STORE", "")
        self.processes: dict[str, subprocess.Popen] = {}
        self.token = ""

    def start(self) -> None:
        """Migrate the metadata database, start the services, log in and create the encoding pool."""
        self.home.mkdir(parents=True, exist_ok=True)
        if password := settings.current().airflow_password:  # kept by the auth manager, which adds no other
            self.passwords_file.write_text(json.dumps({USER: password}) + "\n")
        migrated = subprocess.run(
            [self.airflow, "db", "migrate"], env=self.env, capture_output=True, text=True, timeout=300, cwd=self.home
        )
        if migrated.returncode:
            raise AirflowFailed(f"airflow db migrate failed: {(migrated.stdout + migrated.stderr)[-3000:]}")
        self.start_services()
        self.wait_healthy()
        self.create_encode_pool()

    def service_args(self) -> dict[str, list[str]]:
        """Each service's ``airflow`` arguments, by name, in the order they start."""
        return {
            "api-server": ["api-server", "-H", "127.0.0.1", "-p", str(self.port)],
            "scheduler": ["scheduler", "--skip-serve-logs"],
            "dag-processor": ["dag-processor"],
            "triggerer": ["triggerer", "--skip-serve-logs"],  # for deferred tasks (hpd_ingest's sensor)
        }

    def start_services(self) -> None:
        for name, args in self.service_args().items():
            self.start_one(name, args)

    def start_one(self, name: str, args: list[str], env: dict | None = None) -> None:
        """Start ``airflow ARGS`` in a session of its own, its output in ``<home>/<name>.log``."""
        with open(self.home / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [self.airflow, *args],
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.workdir,
            )

    @property
    def passwords_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json.generated"

    def password(self) -> str:
        return json.loads(self.passwords_file.read_text())[USER]

    def wait_healthy(self, timeout: float = 120) -> None:
        """Wait for the API server's health endpoint, then log in."""
        answered = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(httpx.HTTPError),  # no answer yet, or not a healthy one
            wait=tenacity.wait_fixed(1),
            stop=tenacity.stop_after_delay(timeout),
            before_sleep=lambda _: self.check_alive(),
        )
        try:
            answered(lambda: httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).raise_for_status())
        except tenacity.RetryError:
            raise self.failure(f"api-server on {self.url} did not answer") from None
        body = {"username": USER, "password": self.password()}
        self.token = _Token.model_validate(self.request("POST", "/auth/token", body, auth=False)).access_token

    def create_encode_pool(self) -> None:
        """The pool the teacher-encoding tasks take a slot of (``tasks.orchestration.defaults``; without it they
        are never scheduled), or its size updated; ``HPD_ENCODE_POOL`` / ``HPD_ENCODE_POOL_SLOTS`` as the DAGs."""
        from tasks.orchestration import defaults

        name = self.env.get("HPD_ENCODE_POOL") or defaults.ENCODE_POOL
        slots = int(self.env.get("HPD_ENCODE_POOL_SLOTS") or defaults.ENCODE_POOL_SLOTS)
        body = {"name": name, "slots": slots, "description": defaults.ENCODE_POOL_DESCRIPTION}
        try:
            self.request("POST", "/api/v2/pools", body)
        except AirflowFailed as exc:
            if " 409 " not in str(exc):
                raise
            self.request("PATCH", f"/api/v2/pools/{name}", body)

    def request(self, method: str, path: str, body: dict | None = None, auth: bool = True) -> dict:
        """One REST call to the API server (logged in, unless ``auth`` is false)."""
        return rest_call(f"{self.url}{path}", method, body, self.token if auth else "")

    def check_alive(self) -> None:
        """Raise if a service started here has exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise self.failure(f"{name} exited with {process.returncode}")

    def failure(self, what: str) -> AirflowFailed:
        """``what`` went wrong, with each service's log tail."""
        parts = [what]
        for name in sorted({*self.service_args(), *self.processes}):
            parts.append(f"--- {name}.log (last lines) ---\n{_tail(self.home / f'{name}.log')}")
        return AirflowFailed("\n".join(parts))

    def stop(self) -> None:
        stop_groups(list(self.processes.values()))
        self.processes.clear()


def rest_call(url: str, method: str, body: dict | None, token: str) -> dict:
    """``method`` on ``url`` with a JSON body and a bearer token (where given); the JSON answer. A 503 (with SQLite,
    a backfill created while the scheduler writes: "Database is locked", nothing created) is tried again a few times
    after the pauses of :data:`UNAVAILABLE_RETRY_PAUSES` before it is raised."""
    tries = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_Unavailable),
        wait=tenacity.wait_chain(*map(tenacity.wait_fixed, UNAVAILABLE_RETRY_PAUSES)),
        stop=tenacity.stop_after_attempt(len(UNAVAILABLE_RETRY_PAUSES) + 1),
        reraise=True,
    )
    return tries(_call_once, url, method, body, token)


def _call_once(url: str, method: str, body: dict | None, token: str) -> dict:
    """One try of :func:`rest_call`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = _http().request(method, url, json=body, headers=headers)
    if response.is_error:
        failed = _Unavailable if response.status_code == 503 else AirflowFailed
        raise failed(f"{method} {url}: {response.status_code} {response.content[:500]!r}")
    return response.json() if response.content else {}


@functools.cache
def _http() -> httpx.Client:
    """The process's client for REST calls: its TLS context and connections are reused (a client per call costs
    tens of milliseconds). An idle connection is dropped after 2 s, before the API server's (uvicorn's 5 s) could
    close it under a request."""
    return httpx.Client(timeout=30, limits=httpx.Limits(keepalive_expiry=2))


def stop_groups(processes: list[subprocess.Popen], sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal every process's group at once (each was started in a session of its own); SIGKILL each group still
    running ``timeout`` s later, and what is left of a group once its leader has ended (a worker the leader forked
    that ignores ``sig``, such as an idle LocalExecutor worker)."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        os.killpg(process.pid, sig)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(ProcessLookupError):  # no process is left in the group
            os.killpg(process.pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return ""


def serve(home: Path, port: int, database: str | None, echo: Callable[..., None] = print) -> None:
    """Start the local Airflow, print where it is, and keep it up until SIGINT or SIGTERM (or a service exits)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    airflow = LocalAirflow(home, port, database)
    try:
        airflow.start()
        echo(f"Airflow is up: {airflow.url}\n  login: {USER} / {airflow.password()}", flush=True)
        echo(f"  store: {airflow.store}\n  logs: {airflow.home}/*.log\nCtrl-C stops it.", flush=True)
        while True:
            airflow.check_alive()
            time.sleep(1)
    except KeyboardInterrupt:
        echo("stopping Airflow ...", flush=True)
    finally:
        airflow.stop()
    echo("stopped.", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.orchestration.local_airflow", description=__doc__)
    parser.add_argument("--home", type=Path, default=Path("var/airflow"), help="AIRFLOW_HOME (default: var/airflow)")
    parser.add_argument("--port", type=int, default=8080, help="the API server's port on 127.0.0.1 (default: 8080)")
    parser.add_argument("--database", help="SQLAlchemy URL of the metadata database (default: SQLite in --home)")
    args = parser.parse_args(argv)
    try:
        serve(args.home.resolve(), args.port, args.database)
    except AirflowFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
