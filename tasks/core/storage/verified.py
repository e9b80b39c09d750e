"""Verified reads: an object's bytes hashed (sha256) as they arrive, chunk by chunk with no second pass, and
compared with the digest its manifest records before anything is parsed.

Local files this process has hashed to their recorded sha256 are remembered with the version they had then
(size, mtime, inode, device): a re-read of the same unchanged version (fit-pca reads each shard twice) is not
hashed again. Any change of the file, or another expected sha256, is hashed in full; a file that changes while
it is re-read is hashed from the bytes read; a file modified within the last ``RACY_NS`` is never remembered.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.storage import local, objects, s3
from tasks.core.storage.objects import CHUNK, MIB, IntegrityError
from tasks.core.uris import StorageError

PARALLEL_VERIFY_BYTES = 16 * MIB  # a local Parquet object this large is hashed while another thread parses it
VERIFIED_LOCAL_MAX = 100_000
_verified_local: dict[str, tuple[str, tuple[int, ...]]] = {}


class HashingReader(io.RawIOBase):
    """Passes a binary stream through, hashing (sha256) and counting its bytes in the order they are read."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self._digest = hashlib.sha256()
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._inner.readinto(buffer)  # type: ignore[attr-defined]
        if count:
            self._digest.update(memoryview(buffer)[:count])
            self.bytes_read += count
        return count or 0

    def drain(self) -> None:
        """Read (and hash) the rest of the stream."""
        while self.read(CHUNK):
            pass

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def forget() -> None:
    """Forget which local files were verified: the next verified read of each hashes it, as the first read in
    a fresh process does (tests and benchmarks start from nothing)."""
    _verified_local.clear()


def remembered(uri: str) -> bool:
    """Whether a verified read of the local file ``uri`` would skip hashing it now."""
    return uri in _verified_local


def read(uri: str, sha256: str) -> Any:
    """The object's bytes (bytes or an Arrow buffer) once they hash to ``sha256``; else IntegrityError."""
    digest = hashlib.sha256()
    if uri.startswith("s3://"):
        data = s3.read_whole(uri, digest.update)
        _check_digest(uri, sha256, digest.hexdigest())
        return data
    version = local.version(uri)
    if _seen(uri, sha256, version):
        return _reread(uri, sha256, version, local.read_whole(uri, None))
    data = local.read_whole(uri, digest)
    _check_digest(uri, sha256, digest.hexdigest())
    _remember(uri, sha256, version)
    return data


def read_parquet(uri: str, columns: list[str] | None, sha256: str) -> pa.Table:
    """A large local Parquet object is parsed while another thread hashes the same bytes (both release the
    GIL, so the check costs little wall time); the table is returned only once the digest matches, and a
    digest mismatch wins over any parse error. Small objects (where a thread costs more than it saves, and
    Arrow's decoding already uses the cores) and S3 objects are hashed as they are read, before parsing."""
    version = None if uri.startswith("s3://") else local.version(uri)
    if version is None or version[0] < PARALLEL_VERIFY_BYTES:  # version[0]: the file's size
        return parse_parquet(uri, read(uri, sha256), columns)
    data = local.read_whole(uri, None)
    if _seen(uri, sha256, version):
        return parse_parquet(uri, _reread(uri, sha256, version, data), columns)
    digest = hashlib.sha256()
    hasher = threading.Thread(target=digest.update, args=(memoryview(data),), name="hpd-verify")
    hasher.start()
    try:
        table = parse_parquet(uri, data, columns)
    finally:
        hasher.join()
        _check_digest(uri, sha256, digest.hexdigest())
    _remember(uri, sha256, version)
    return table


def parse_parquet(uri: str, data: Any, columns: list[str] | None) -> pa.Table:
    try:
        return pq.read_table(pa.BufferReader(data), columns=columns)
    except (pa.ArrowException, KeyError) as exc:
        raise StorageError(uri, f"cannot read Parquet: {exc}") from exc


def _seen(uri: str, sha256: str, version: tuple[int, ...]) -> bool:
    return _verified_local.get(uri) == (sha256.lower(), version)


def _remember(uri: str, sha256: str, version: tuple[int, ...]) -> None:
    if local.version(uri) != version or time.time_ns() - version[1] < objects.RACY_NS:
        return  # changed while it was read, or too recently to tell a later change by its mtime
    if len(_verified_local) >= VERIFIED_LOCAL_MAX:
        _verified_local.clear()
    _verified_local[uri] = (sha256.lower(), version)


def _reread(uri: str, sha256: str, version: tuple[int, ...], data: Any) -> Any:
    """``data``, re-read from a file verified before at ``version``: hashed only if the file changed meanwhile."""
    if local.version(uri) != version:
        _verified_local.pop(uri, None)
        _check_digest(uri, sha256, hashlib.sha256(memoryview(data)).hexdigest())
    return data


def _check_digest(uri: str, expected: str, actual: str) -> None:
    if actual != expected.lower():
        raise IntegrityError(uri, expected, actual)
