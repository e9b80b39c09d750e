"""Sentence ids (``sentences.sentence_id``: blake2b-128 of the UTF-8 text, hex) computed in a helper process.

hashlib holds the GIL for short inputs, so hashing every staged sentence in the staging process serialises
it with the reading and normalising threads. :class:`IdHasher` hands each batch's texts, as their Arrow
buffers (offsets and UTF-8 bytes, no Python objects), to a Python process that runs this file as a script
(:mod:`.id_hasher_process`) and needs nothing but hashlib; the digests come back as one buffer.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl
import pyarrow as pa

from tasks.stages.stage_corpus.id_hasher_process import DIGEST_BYTES, HEADER

_PROCESS = Path(__file__).with_name("id_hasher_process.py")


class HasherError(RuntimeError):
    """The helper process died or answered short."""


class IdHasher:
    """A helper process computing sentence ids, for the life of the ``with`` block."""

    def __enter__(self) -> IdHasher:
        command = [sys.executable, "-I", str(_PROCESS)]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self._process.stdin, self._process.stdout):
            if stream:
                with contextlib.suppress(BrokenPipeError):  # the process died: what is unsent is moot
                    stream.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def digests(self, texts: pl.Series) -> pl.Series:
        """The sentence id of each of ``texts`` (no nulls) as its 16 raw bytes: ``sentences.sentence_id`` is
        their hex."""
        offsets, data = _buffers(texts)
        count = len(offsets) - 1
        stdin, stdout = self._pipes()
        try:
            stdin.write(HEADER.pack(count, len(data)))
            stdin.write(offsets.tobytes())
            stdin.write(data)
            stdin.flush()
            digests = stdout.read(count * DIGEST_BYTES)
        except BrokenPipeError:
            digests = b""
        if len(digests) != count * DIGEST_BYTES:
            status = self._process.poll()
            raise HasherError(
                f"sentence-id helper process (pid {self._process.pid}, exit status {status}) answered "
                f"{len(digests)} of {count * DIGEST_BYTES} bytes"
            )
        raw = pa.FixedSizeBinaryArray.from_buffers(pa.binary(DIGEST_BYTES), count, [None, pa.py_buffer(digests)])
        return pl.Series("raw_id", raw, pl.Binary)

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        if self._process.stdin is None or self._process.stdout is None:
            raise HasherError("the sentence-id helper process is not running")
        return self._process.stdin, self._process.stdout


def _buffers(texts: pl.Series) -> tuple[np.ndarray, Any]:
    """``texts`` as Arrow's int64 offsets (from 0) and the UTF-8 bytes they index."""
    if texts.null_count():
        raise ValueError("sentence ids of null texts")
    array = texts.to_arrow().cast(pa.large_string())
    array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    start, end = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    data = memoryview(data_buffer)[start:end] if data_buffer is not None else b""
    return (offsets - start) if len(offsets) else np.zeros(1, np.int64), data
