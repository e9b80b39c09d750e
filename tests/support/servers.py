"""The server processes a test harness starts: a free port on 127.0.0.1 for each, their logs, and their end, by
their PID, as a process group (each was started in a session of its own), never anything else."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

from tasks.orchestration.local_airflow import stop_groups


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal ``process``'s group, then wait; SIGKILL the group if it has not exited in ``timeout`` s."""
    stop_groups([process], sig, timeout)


def log_tail(path, lines: int = 40) -> str:
    """The last ``lines`` lines of a service's log file (empty when it has none yet)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return ""


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """The ASGI ``app`` in uvicorn on a free 127.0.0.1 port, in a thread of this process; its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def s3_settings(endpoint: str, tmp_path_factory: Any) -> dict[str, str]:
    """The AWS_* variables that point boto3's default chain at ``endpoint`` (test credentials and region, no
    config files; an external ``HPD_TEST_S3_ENDPOINT`` keeps its own credentials and region)."""
    external = bool(os.environ.get("HPD_TEST_S3_ENDPOINT"))
    no_files = str(tmp_path_factory.getbasetemp() / "no-aws-config")
    settings = {"AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": no_files, "AWS_SHARED_CREDENTIALS_FILE": no_files}
    if not (external and os.environ.get("AWS_ACCESS_KEY_ID")):
        settings |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    if not (external and os.environ.get("AWS_DEFAULT_REGION")):
        settings["AWS_DEFAULT_REGION"] = "us-east-1"
    return settings
