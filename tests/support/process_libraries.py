"""Live processes from /proc: their parents and descendants, and whether a shared library is mapped into one, to
tell that a process tasks fork from has loaded their libraries (``tasks.orchestration.task_libraries``)."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

TORCH = "libtorch_cpu.so"  # torch's native library, mapped once torch is imported


def parents() -> dict[int, int]:
    """Each live process's parent, by PID."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # exited meanwhile
                continue
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the field after (comm) state
    return found


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (empty: none, or ``pid`` exited)."""
    try:
        threads = [entry.path for entry in os.scandir(f"/proc/{pid}/task")]
        return [int(child) for thread in threads for child in Path(thread, "children").read_text().split()]
    except OSError:  # exited meanwhile
        return []


def started(pid: int) -> float | None:
    """When ``pid``'s process started, in clock ticks since boot (None: it exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return float(stat.rsplit(")", 1)[1].split()[19])  # starttime, the 22nd field; the first after (comm) is 3rd


def root_of(pid: int, parents_of: dict[int, int], roots: Collection[int]) -> int | None:
    """``pid`` itself or its nearest ancestor among ``roots`` (None: neither)."""
    hops = 0
    while pid not in roots and pid in parents_of and hops < 64:
        pid, hops = parents_of[pid], hops + 1
    return pid if pid in roots else None


def descendants(root: int) -> list[int]:
    """The live processes below ``root``."""
    parents_of = parents()
    return [pid for pid, parent in parents_of.items() if root_of(parent, parents_of, {root}) == root]


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
