"""The server processes a test harness starts: a free port on 127.0.0.1 for each, their logs, and their end, by
their PID, as a process group (each was started in a session of its own), never anything else."""

from __future__ import annotations

import signal
import socket
import subprocess

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
