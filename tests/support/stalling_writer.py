"""Subprocess writer for the kill test: ``stalling_writer.py URI TOTAL_BYTES READY_AFTER``.

Publishes URI with ``storage.write_bytes`` from a file-like source that hands out READY_AFTER
bytes, then, on the next read (so everything handed out so far has been consumed), prints
``ready`` and blocks until the parent kills the process.
"""

from __future__ import annotations

import sys
import threading

from tasks.core import storage

_PIECE = 64 * 1024


class StallingSource:
    """A readable stream that stalls forever once ``ready_after`` bytes were read."""

    def __init__(self, total: int, ready_after: int) -> None:
        self.total, self.ready_after, self.pos = total, ready_after, 0

    def read(self, size: int = -1) -> bytes:
        if self.pos >= self.ready_after:
            print("ready", flush=True)
            threading.Event().wait()
        size = min(size if size > 0 else _PIECE, _PIECE, self.total - self.pos)
        self.pos += size
        return b"x" * size


if __name__ == "__main__":
    uri, total, ready_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    storage.write_bytes(uri, StallingSource(total, ready_after))
    print("finished", flush=True)
