"""The ``file://`` backend: objects are files, published by rename of a fsynced hidden temp file; a
create-if-absent is a hard link, a compare-and-swap holds a hidden lock file's ``flock``."""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import time
from datetime import UTC, datetime
from typing import Any, BinaryIO

import pyarrow as pa

from tasks.core.storage import objects
from tasks.core.storage.objects import (
    CHUNK,
    LOCK_PREFIX,
    TMP_PREFIX,
    Data,
    ListedObject,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    chunks,
    hidden,
)
from tasks.core.uris import StorageError, escape_of, to_uri


def path_of(uri: str) -> str:
    """The file of ``uri``; a :class:`StorageError` naming it when it lies in a store but a link leads it out."""
    path = to_uri(uri)[len("file://") :]
    if escaped := escape_of(path):
        real, root = escaped
        raise StorageError(uri, f"resolves to {real}, outside the store file://{root}, through a link; refused")
    return path


def failure(uri: str, exc: OSError) -> StorageError:
    """An OS error as a StorageError naming the URI."""
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFound(uri, "object does not exist")
    if isinstance(exc, IsADirectoryError):
        return ObjectNotFound(uri, "is a folder, not an object")
    return StorageError(uri, f"{type(exc).__name__}: {exc.strerror or exc}")


class LocalBackend:
    """Objects are files; temp and lock files are hidden siblings."""

    def read_bytes(self, uri: str) -> bytes:
        try:
            with open(path_of(uri), "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise failure(uri, exc) from exc

    def write_bytes(self, uri: str, data: Data | BinaryIO) -> ObjectInfo:
        try:
            return _publish(uri, data)
        except OSError as exc:
            raise failure(uri, exc) from exc

    def put_if_absent(self, uri: str, data: Data) -> bool:
        try:
            return _link(uri, data) is not None
        except OSError as exc:
            raise failure(uri, exc) from exc

    def compare_and_swap(self, uri: str, data: Data, expected_etag: str | None) -> ObjectInfo:
        try:
            if expected_etag is None:
                info = _link(uri, data)
                if info is None:
                    raise PreconditionFailed(uri, "object already exists")
                return info
            folder, name = os.path.split(path_of(uri))
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{LOCK_PREFIX}{name}"), "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                try:
                    current = self.head(uri).etag
                except ObjectNotFound:
                    current = None
                if current != expected_etag:
                    raise PreconditionFailed(uri, "etag is stale" if current else "object does not exist")
                return _publish(uri, data)
        except OSError as exc:
            raise failure(uri, exc) from exc

    def size(self, uri: str) -> int:
        try:
            return os.stat(path_of(uri)).st_size
        except OSError as exc:
            raise failure(uri, exc) from exc

    def head(self, uri: str) -> ObjectInfo:
        """Size and etag, the content's sha256: this reads the file."""
        digest, size = hashlib.sha256(), 0
        try:
            with open(path_of(uri), "rb") as fh:
                while chunk := fh.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise failure(uri, exc) from exc
        return ObjectInfo(uri, size, digest.hexdigest())

    def exists(self, uri: str) -> bool:
        return os.path.isfile(path_of(uri))

    def list_uris(self, prefix: str) -> list[str]:
        found = []
        for folder, _dirs, files in os.walk(path_of(prefix)):
            found += ["file://" + os.path.join(folder, f) for f in files if not hidden(f)]
        return sorted(found)

    def delete(self, uri: str) -> None:
        try:
            os.unlink(path_of(uri))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise failure(uri, exc) from exc

    def open_read(self, uri: str) -> BinaryIO:
        try:
            return open(path_of(uri), "rb")  # noqa: SIM115 - the caller owns the stream
        except OSError as exc:
            raise failure(uri, exc) from exc

    def list_objects(self, prefix: str) -> list[ListedObject]:
        found = []
        for folder, _dirs, files in os.walk(path_of(prefix)):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    stat = os.stat(path)
                except FileNotFoundError:  # deleted, or renamed into place, since the walk saw it
                    continue
                modified = datetime.fromtimestamp(stat.st_mtime, UTC)
                found.append(ListedObject("file://" + path, stat.st_size, modified, _stat_version(stat)))
        return found


def _write_temp(path: str, data: Data | BinaryIO) -> tuple[str, int, str]:
    """Write ``data`` completely to a fsynced hidden temp file beside ``path``; return (temp path, size, etag)."""
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"{TMP_PREFIX}{name}-{secrets.token_hex(6)}")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "xb") as fh:
            for chunk in chunks(data, CHUNK):
                fh.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp, size, digest.hexdigest()


def _publish(uri: str, data: Data | BinaryIO) -> ObjectInfo:
    path = path_of(uri)
    tmp, size, etag = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    _fsync_folder(os.path.dirname(path))
    return ObjectInfo(uri, size, etag)


def _link(uri: str, data: Data) -> ObjectInfo | None:
    """Publish only if absent (hard link of a complete temp file); None when it existed."""
    path = path_of(uri)
    tmp, size, etag = _write_temp(path, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return None
    finally:
        _unlink_quietly(tmp)
    _fsync_folder(os.path.dirname(path))
    return ObjectInfo(uri, size, etag)


def read_whole(uri: str, digest: Any | None) -> Any:
    """The whole file in one buffer from Arrow's memory pool (no zero-fill, no copy), hashed as it is read
    when ``digest`` is given."""
    try:
        with open(path_of(uri), "rb", buffering=0) as fh:
            buffer = pa.allocate_buffer(os.fstat(fh.fileno()).st_size)
            got = _readinto_hashing(fh, memoryview(buffer), digest)
            tail = fh.read()  # only if the file grew since fstat; published objects never do
    except OSError as exc:
        raise failure(uri, exc) from exc
    if tail or got < buffer.size:
        if digest is not None:
            digest.update(tail)
        return memoryview(buffer)[:got].tobytes() + tail
    return buffer


def _readinto_hashing(fh: Any, view: memoryview, digest: Any | None) -> int:
    """Fill ``view`` from ``fh`` chunk by chunk, hashing each chunk (if ``digest``) while it is still in cache;
    bytes read."""
    got = 0
    while got < len(view):
        count = fh.readinto(view[got : got + CHUNK])
        if not count:
            break
        if digest is not None:
            digest.update(view[got : got + count])
        got += count
    return got


def version(uri: str) -> tuple[int, ...]:
    """The file's version: size, mtime, inode and device."""
    try:
        st = os.stat(path_of(uri))
    except OSError as exc:
        raise failure(uri, exc) from exc
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _stat_version(stat: os.stat_result) -> str | None:
    if time.time_ns() - stat.st_mtime_ns < objects.RACY_NS:
        return None
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
