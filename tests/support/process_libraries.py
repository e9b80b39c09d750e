"""What a live process has loaded: its descendants (from /proc) and whether a shared library is mapped into it, to
tell that a process tasks fork from has loaded their libraries (``tasks.orchestration.task_libraries``)."""

from __future__ import annotations

import os
from pathlib import Path

TORCH = "libtorch_cpu.so"  # torch's native library, mapped once torch is imported


def descendants(root: int) -> list[int]:
    """The live processes below ``root``."""
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # exited meanwhile
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    below, hops = [], 0
    for pid in parents:
        ancestor, hops = parents[pid], 0
        while ancestor in parents and ancestor != root and hops < 64:
            ancestor, hops = parents[ancestor], hops + 1
        if ancestor == root:
            below.append(pid)
    return below


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def mapped(pid: int, library: str) -> bool:
    """Whether ``library`` (a file name) is mapped into ``pid``."""
    try:
        return any(line.rstrip().endswith("/" + library) for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    except OSError:
        return False
