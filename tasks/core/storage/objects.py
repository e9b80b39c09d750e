"""What both storage backends speak: the errors, the records of a published or listed object, and the pieces
a payload is written in."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO

from tasks.core.uris import StorageError

MIB = 1024 * 1024
CHUNK = MIB  # the piece in which payloads are written, hashed and read
TMP_PREFIX = ".tmp-"
LOCK_PREFIX = ".lock-"
# A local file modified within the last RACY_NS has no version yet (as git does with its index): the file
# system's clock may not tick between two writes that close.
RACY_NS = 2_000_000_000

Data = bytes | bytearray | memoryview


class ObjectNotFound(StorageError):
    """The object does not exist."""


class PreconditionFailed(StorageError):
    """A conditional write lost: the object exists already, or its etag is stale."""


class IntegrityError(StorageError):
    """The object's bytes do not hash to the sha256 recorded for it: altered since it was published."""

    def __init__(self, uri: str, expected: str, actual: str) -> None:
        super().__init__(
            uri, f"sha256 mismatch: expected {expected}, read {actual}; the object is not what its manifest records"
        )
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> tuple[type[IntegrityError], tuple[str, str, str]]:
        return type(self), (self.uri, self.expected, self.actual)


@dataclass(frozen=True)
class ObjectInfo:
    """A published object: its URI, size in bytes and opaque version token."""

    uri: str
    size: int
    etag: str


@dataclass(frozen=True)
class ListedObject:
    """An object as a listing sees it, hidden ones (``.tmp-*``, ``.lock-*``) included: its URI, size in
    bytes, last-modified time (timezone-aware, UTC) and a version token that changes whenever the object is
    written (on S3 its ETag; locally its size and mtime, which a copy that keeps times keeps too, None while
    the mtime is too recent to tell a later write by: see ``RACY_NS``)."""

    uri: str
    size: int
    modified: datetime
    version: str | None


def hidden(uri_or_name: str) -> bool:
    """Whether an object is one of storage's own temp or lock files (hidden from ``list_uris``)."""
    return uri_or_name.rsplit("/", 1)[-1].startswith((TMP_PREFIX, LOCK_PREFIX))


def chunks(data: Data | BinaryIO, size: int) -> Iterator[bytes]:
    """Yield ``data`` in pieces of exactly ``size`` bytes (the last one may be shorter, never empty)."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for start in range(0, len(view), size):
            yield bytes(view[start : start + size])
        return
    while True:
        buf = bytearray()
        while len(buf) < size:
            piece = data.read(size - len(buf))
            if not piece:
                break
            buf += piece
        if buf:
            yield bytes(buf)
        if len(buf) < size:
            return
