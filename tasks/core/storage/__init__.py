"""One object-storage interface for ``file://`` folders and ``s3://`` buckets.

Every function takes a URI and dispatches on its scheme to a backend (:mod:`.local`, :mod:`.s3`). Objects are
published atomically: a reader sees either the previous complete object or the new complete object, never a
partial one. Local URIs are ``file://`` followed by an absolute path, used verbatim (no percent-encoding);
S3 URIs are ``s3://bucket/key`` (the client, its retries and tuning: :mod:`.s3`).

Verified reads (:mod:`.verified`): ``read_bytes`` and ``read_parquet`` take the ``sha256`` a manifest records
for the object. The bytes are hashed as they arrive and a mismatch raises :class:`IntegrityError` before
anything is parsed.
"""

from __future__ import annotations

import io
import json
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.storage import local, objects, s3, verified
from tasks.core.storage.local import LocalBackend
from tasks.core.storage.objects import (
    LOCK_PREFIX,
    TMP_PREFIX,
    IntegrityError,
    ListedObject,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    hidden,
)
from tasks.core.storage.s3 import S3Backend, reset_s3_clients, s3_client
from tasks.core.storage.verified import HashingReader
from tasks.core.uris import StorageError, join, to_uri

__all__ = [
    "LOCK_PREFIX",
    "TMP_PREFIX",
    "HashingReader",
    "IntegrityError",
    "ListedObject",
    "ObjectInfo",
    "ObjectNotFound",
    "PreconditionFailed",
    "StorageError",
    "compare_and_swap",
    "delete",
    "exists",
    "head",
    "hidden",
    "join",
    "list_objects",
    "list_uris",
    "objects",
    "open_read",
    "put_if_absent",
    "read_bytes",
    "read_json_versioned",
    "read_parquet",
    "reset_s3_clients",
    "s3",
    "s3_client",
    "sha256_of",
    "size",
    "to_uri",
    "verified",
    "write_bytes",
    "write_parquet",
]

_BACKENDS: dict[str, LocalBackend | S3Backend] = {"file": LocalBackend(), "s3": S3Backend()}


def _backend(uri: str) -> LocalBackend | S3Backend:
    if "://" not in uri:
        raise StorageError(uri, "not a URI; convert local paths with to_uri()")
    scheme = uri.split("://", 1)[0]
    if scheme not in _BACKENDS:
        raise StorageError(uri, f"unsupported scheme '{scheme}'; expected file:// or s3://")
    return _BACKENDS[scheme]


def read_bytes(uri: str, sha256: str | None = None) -> bytes:
    """Return the whole object; raises ObjectNotFound.

    With ``sha256`` (the digest a manifest records), the bytes are hashed as they are read and
    :class:`IntegrityError` (naming the URI, the expected and the actual digest) is raised on a mismatch.
    """
    backend = _backend(uri)
    if sha256 is None:
        return backend.read_bytes(uri)
    return bytes(verified.read(uri, sha256))


def write_bytes(uri: str, data: bytes | BinaryIO) -> ObjectInfo:
    """Publish ``data`` (bytes or a readable binary stream) atomically, replacing any previous object.

    On S3, bytes above ``HPD_S3_MULTIPART_THRESHOLD`` and streams longer than one part go up as a
    multipart upload (aborted on error), which becomes visible only when it completes.
    """
    return _backend(uri).write_bytes(uri, data)


def put_if_absent(uri: str, data: bytes) -> bool:
    """Create the object only if it does not exist; True if this call created it."""
    return _backend(uri).put_if_absent(uri, data)


def compare_and_swap(uri: str, data: bytes, expected_etag: str | None) -> ObjectInfo:
    """Replace the object only if its etag is ``expected_etag`` (None: only if absent).

    Raises PreconditionFailed when the expectation is stale.  Locally only compare_and_swap
    callers serialise on the lock; a plain write_bytes does not take it.
    """
    return _backend(uri).compare_and_swap(uri, data, expected_etag)


def head(uri: str) -> ObjectInfo:
    """Return size and etag of the object; raises ObjectNotFound. (Locally the etag is the content's
    sha256: this reads the file; :func:`size` does not.)"""
    return _backend(uri).head(uri)


def size(uri: str) -> int:
    """The object's size in bytes, without reading it; raises ObjectNotFound."""
    return _backend(uri).size(uri)


def read_json_versioned(uri: str) -> tuple[Any, str | None]:
    """A JSON document and its etag (to pass to :func:`compare_and_swap` later), or ``(None, None)``."""
    try:
        info = head(uri)
        return json.loads(read_bytes(uri)), info.etag
    except ObjectNotFound:
        return None, None


def exists(uri: str) -> bool:
    """Whether a published object exists at ``uri``."""
    return _backend(uri).exists(uri)


def list_uris(prefix: str) -> list[str]:
    """Sorted URIs of all published objects under the folder ``prefix``, recursively."""
    return _backend(prefix).list_uris(prefix)


def delete(uri: str) -> None:
    """Delete the object; a missing object is fine."""
    _backend(uri).delete(uri)


def list_objects(prefix: str) -> list[ListedObject]:
    """Every object under the folder ``prefix``, recursively, sorted by URI, with its size and last-modified
    time and version; unlike :func:`list_uris` it includes the hidden temp and lock files (of writers in
    progress, or killed). For garbage collection: an object's time is when it was last written (locally the file's
    mtime, on S3 the object's LastModified, in the server's clock)."""
    return sorted(_backend(prefix).list_objects(prefix), key=lambda o: o.uri)


def open_read(uri: str) -> BinaryIO:
    """The object as a buffered binary stream, read front to back without a whole copy in memory; the caller
    closes it. Local files are seekable; S3 bodies are not, and resume after a dropped connection."""
    return _backend(uri).open_read(uri)


def sha256_of(uri: str) -> str:
    """The object's sha256, streamed through in chunks (memory does not follow its size)."""
    with open_read(uri) as stream:
        hashing = HashingReader(stream)
        hashing.drain()
    return hashing.hexdigest()


def read_parquet(uri: str, columns: list[str] | None = None, sha256: str | None = None) -> pa.Table:
    """Read a Parquet object, optionally only ``columns``.

    With ``sha256`` the whole object is read once and verified as in :func:`read_bytes`, whatever
    ``columns`` asks for; no table is returned from bytes that fail the check.
    """
    backend = _backend(uri)
    if sha256 is not None:
        return verified.read_parquet(uri, columns, sha256)
    data = local.read_whole(uri, None) if isinstance(backend, LocalBackend) else backend.read_bytes(uri)
    return verified.parse_parquet(uri, data, columns)


def write_parquet(uri: str, table: pa.Table) -> ObjectInfo:
    """Serialise ``table`` as zstd Parquet in memory, then publish it atomically."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return write_bytes(uri, sink.getvalue())
