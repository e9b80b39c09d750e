"""Stopping the services a launcher started (``local_airflow.stop_groups``): nothing of a group outlives it."""

import subprocess
import sys
import textwrap
import time

import psutil

from tasks.orchestration.local_airflow import stop_groups

# A leader that ends on SIGTERM, with a child of its group that ignores it (as an idle LocalExecutor worker does).
LEADER = textwrap.dedent(
    """
    import os, signal, time
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(os.getpid(), flush=True)
    time.sleep(60)
    """
)


def _ends(pid: int, timeout: float = 5) -> bool:
    """Whether process ``pid`` ends (or is left a zombie) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_child_that_ignores_the_signal_does_not_outlive_its_leader():
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    stop_groups([leader], timeout=10)
    assert leader.returncode is not None
    assert _ends(child)
