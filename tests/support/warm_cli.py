"""``hpd`` commands as real processes that start with their libraries loaded: a zygote process imports them once
(``PRELOADED``), and a small ``hpd`` executable asks it, over a Unix socket, to fork a process that runs
``tasks.cli.main`` with the caller's arguments, environment, working directory and standard streams (passed as file
descriptors); the caller exits with the command's exit status. What a command does and prints is the console
script's; only the seconds of imports (torch, transformers and the like) are paid once
(:mod:`tests.support.forked_warmup`).

A command dies with its caller: when the executable ends first (killed, or by a signal), the command is killed. The
zygote never runs a torch operation or starts a thread, so forking it is safe; it starts with the test process's
environment, so the Hugging Face settings read at import (offline mode, caches) are the commands' own. The project's
modules read no environment at import."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import REPO
from tests.support.servers import stop_group

PRELOADED = ("tests.support.forked_warmup", "tasks.cli")
_REQUEST_LIMIT = 1 << 20  # bytes: argv, environment and working directory, as JSON

# The executable a script calls as `hpd`: sends fds 0-2 and its argv, environment and working directory (as JSON, led
# by its length and a newline), then exits with the status the zygote reports (255 if the connection ends without one).
_CLIENT = """#!{python} -IS
import json, os, socket, sys
with socket.socket(socket.AF_UNIX) as zygote:
    zygote.connect({socket!r})
    request = json.dumps({{"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}}).encode()
    socket.send_fds(zygote, [b"%d\\n" % len(request) + request], [0, 1, 2])
    status = zygote.makefile().read()
sys.exit(int(status) if status.strip() else 255)
"""


@contextlib.contextmanager
def warm_hpd(folder: Path) -> Iterator[Path]:
    """A zygote serving ``folder/hpd`` (created here) for the ``with`` block; the executable's path."""
    folder.mkdir(parents=True, exist_ok=True)
    address = str(folder / ".hpd.sock")
    zygote = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tests.support.warm_cli import serve; serve(sys.argv[1])", address],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert zygote.stdout is not None and zygote.stdout.readline() == b"ready\n", "the hpd zygote did not start"
        client = folder / "hpd"
        client.write_text(_CLIENT.format(python=sys.executable, socket=address))
        client.chmod(0o755)
        yield client
    finally:
        stop_group(zygote)


def serve(address: str) -> None:
    """The zygote: import ``PRELOADED``, say ``ready`` on stdout, then fork a command for each connection."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    gc.freeze()  # what the imports made lives as long as the zygote: the commands' collections skip it
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the commands' parents are reaped without a wait
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        listener.listen()
        print("ready", flush=True)
        while True:
            connection, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _answer(connection)
            connection.close()


def _answer(connection: socket.socket) -> None:
    """In a forked parent of the command: run it in a child of its own, then send its exit status back; kill it
    should the caller end first."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    received, fds, _, _ = socket.recv_fds(connection, _REQUEST_LIMIT, 3)
    size, _, payload = received.partition(b"\n")
    while len(payload) < int(size):
        if not (chunk := connection.recv(_REQUEST_LIMIT)):  # the caller ended before its request did
            os._exit(0)
        payload += chunk
    request = json.loads(payload)
    command = os.fork()
    if command == 0:
        connection.close()
        _run(request, fds)
    for fd in fds:
        os.close(fd)
    ended = os.pidfd_open(command)
    if connection in select.select([connection, ended], [], [])[0]:  # the caller sends nothing more: it is gone
        os.kill(command, signal.SIGKILL)
    _, status = os.waitpid(command, 0)
    with contextlib.suppress(OSError):
        connection.sendall(str(os.waitstatus_to_exitcode(status) % 256).encode())
    os._exit(0)


def _run(request: dict, fds: list[int]) -> None:
    """In the command's process: take the caller's streams, directory, environment and arguments; run the CLI."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    for stream in (sys.stdout, sys.stderr):  # as a fresh process would buffer the caller's streams
        stream.reconfigure(line_buffering=stream.isatty())
    code = 1
    try:
        from tasks.cli import main

        code = main() or 0
    except SystemExit as exit_:  # as the interpreter exits on it
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
