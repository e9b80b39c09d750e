"""One object-storage interface for ``file://`` folders and ``s3://`` buckets.

Every function takes a URI and dispatches on its scheme.  Objects are published atomically: a
reader sees either the previous complete object or the new complete object, never a partial one.

Local URIs are ``file://`` followed by an absolute path, used verbatim (no percent-encoding).
S3 URIs are ``s3://bucket/key``.  The S3 client comes from the Airflow connection named by
``HPD_AWS_CONN_ID`` when set, else from boto3's default chain (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_DEFAULT_REGION`` ...).  botocore's "standard" retry mode backs off and
retries throttling, 5xx and connection errors; this module adds what it does not retry: a 409
``ConditionalRequestConflict`` on a write (sent again after a backoff, never taken for a lost
compare-and-swap) and a connection that drops in the middle of a GET's body (the object is read
again from the start).  Tuning: ``HPD_S3_MAX_ATTEMPTS`` (total attempts per
request, default 8), ``HPD_S3_MULTIPART_THRESHOLD`` (default 64 MiB) and ``HPD_S3_PART_SIZE``
(default 8 MiB, min 5 MiB).

Verified reads: ``read_bytes`` and ``read_parquet`` take the ``sha256`` a manifest records for the
object. The bytes are hashed as they arrive (chunk by chunk, no second pass) and a mismatch raises
:class:`IntegrityError` before anything is parsed.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
)

from tasks.core.uris import StorageError, join, to_uri

__all__ = [
    "HashingReader",
    "IntegrityError",
    "ObjectInfo",
    "ObjectNotFound",
    "PreconditionFailed",
    "StorageError",
    "compare_and_swap",
    "delete",
    "exists",
    "head",
    "join",
    "list_uris",
    "open_read",
    "put_if_absent",
    "read_bytes",
    "read_parquet",
    "reset_s3_clients",
    "s3_client",
    "sha256_of",
    "to_uri",
    "write_bytes",
    "write_parquet",
]

_MIB = 1024 * 1024
_PARALLEL_VERIFY_BYTES = 16 * _MIB
_CHUNK = _MIB
TMP_PREFIX = ".tmp-"
LOCK_PREFIX = ".lock-"


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


Data = bytes | bytearray | memoryview


# ----------------------------------------------------------------------------------- local backend


def _local_path(uri: str) -> str:
    return to_uri(uri)[len("file://") :]


def hidden(uri_or_name: str) -> bool:
    """Whether an object is one of storage's own temp or lock files (hidden from :func:`list_uris`)."""
    return uri_or_name.rsplit("/", 1)[-1].startswith((TMP_PREFIX, LOCK_PREFIX))


def _chunks(data: Data | BinaryIO, size: int) -> Iterator[bytes]:
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


class _Local:
    """Objects are files; temp and lock files are hidden siblings."""

    def _fail(self, uri: str, exc: OSError) -> StorageError:
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFound(uri, "object does not exist")
        if isinstance(exc, IsADirectoryError):
            return ObjectNotFound(uri, "is a folder, not an object")
        return StorageError(uri, f"{type(exc).__name__}: {exc.strerror or exc}")

    def _write_temp(self, uri: str, data: Data | BinaryIO) -> tuple[str, int, str]:
        """Write ``data`` completely to a fsynced hidden temp file; return (temp path, size, etag)."""
        path = _local_path(uri)
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f"{TMP_PREFIX}{name}-{secrets.token_hex(6)}")
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "xb") as fh:
                for chunk in _chunks(data, _CHUNK):
                    fh.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp, size, digest.hexdigest()

    def _publish(self, uri: str, data: Data | BinaryIO) -> ObjectInfo:
        tmp, size, etag = self._write_temp(uri, data)
        try:
            os.replace(tmp, _local_path(uri))
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_folder(os.path.dirname(_local_path(uri)))
        return ObjectInfo(uri, size, etag)

    def _link(self, uri: str, data: Data) -> ObjectInfo | None:
        """Publish only if absent (hard link of a complete temp file); None when it existed."""
        tmp, size, etag = self._write_temp(uri, data)
        try:
            os.link(tmp, _local_path(uri))
        except FileExistsError:
            return None
        finally:
            _unlink_quietly(tmp)
        _fsync_folder(os.path.dirname(_local_path(uri)))
        return ObjectInfo(uri, size, etag)

    def read_bytes(self, uri: str) -> bytes:
        try:
            with open(_local_path(uri), "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise self._fail(uri, exc) from exc

    def write_bytes(self, uri: str, data: Data | BinaryIO) -> ObjectInfo:
        try:
            return self._publish(uri, data)
        except OSError as exc:
            raise self._fail(uri, exc) from exc

    def put_if_absent(self, uri: str, data: Data) -> bool:
        try:
            return self._link(uri, data) is not None
        except OSError as exc:
            raise self._fail(uri, exc) from exc

    def compare_and_swap(self, uri: str, data: Data, expected_etag: str | None) -> ObjectInfo:
        try:
            if expected_etag is None:
                info = self._link(uri, data)
                if info is None:
                    raise PreconditionFailed(uri, "object already exists")
                return info
            folder, name = os.path.split(_local_path(uri))
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{LOCK_PREFIX}{name}"), "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                try:
                    current = self.head(uri).etag
                except ObjectNotFound:
                    current = None
                if current != expected_etag:
                    raise PreconditionFailed(uri, "etag is stale" if current else "object does not exist")
                return self._publish(uri, data)
        except OSError as exc:
            raise self._fail(uri, exc) from exc

    def size(self, uri: str) -> int:
        try:
            return os.stat(_local_path(uri)).st_size
        except OSError as exc:
            raise self._fail(uri, exc) from exc

    def head(self, uri: str) -> ObjectInfo:
        digest, size = hashlib.sha256(), 0
        try:
            with open(_local_path(uri), "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise self._fail(uri, exc) from exc
        return ObjectInfo(uri, size, digest.hexdigest())

    def exists(self, uri: str) -> bool:
        return os.path.isfile(_local_path(uri))

    def list_uris(self, prefix: str) -> list[str]:
        root = _local_path(prefix)
        found = []
        for folder, _dirs, files in os.walk(root):
            found += ["file://" + os.path.join(folder, f) for f in files if not hidden(f)]
        return sorted(found)

    def delete(self, uri: str) -> None:
        try:
            os.unlink(_local_path(uri))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fail(uri, exc) from exc


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


# -------------------------------------------------------------------------------------- S3 backend

_AWS_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
_REJECTED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "403")
_clients: dict[tuple[str | None, ...], Any] = {}
_clients_lock = threading.Lock()


def _s3_settings() -> tuple[str | None, ...]:
    conn_id = os.environ.get("HPD_AWS_CONN_ID") or None
    names = _AWS_ENV + ((f"AIRFLOW_CONN_{conn_id.upper()}",) if conn_id else ())
    return (conn_id, os.environ.get("HPD_S3_MAX_ATTEMPTS"), *(os.environ.get(n) for n in names))


def s3_client() -> Any:
    """Return the boto3 S3 client for the current environment settings (cached per settings)."""
    settings = _s3_settings()
    with _clients_lock:
        if settings not in _clients:
            conn_id, attempts = settings[0], int(settings[1] or 8)
            config = Config(retries={"mode": "standard", "total_max_attempts": attempts})
            if conn_id:
                from airflow.providers.amazon.aws.hooks.s3 import S3Hook

                _clients[settings] = S3Hook(aws_conn_id=conn_id, config=config).get_conn()
            else:
                _clients[settings] = boto3.session.Session().client("s3", config=config)
        return _clients[settings]


def reset_s3_clients() -> None:
    """Forget cached S3 clients (tests change the environment between cases)."""
    with _clients_lock:
        _clients.clear()


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = to_uri(uri)[len("s3://") :].partition("/")
    return bucket, key


def _int_env(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


class _S3:
    """Objects are S3 keys; conditional writes use If-None-Match / If-Match."""

    def _fail(self, uri: str, exc: Exception) -> StorageError:
        """Translate a boto error into a StorageError naming the URI (never the credentials)."""
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                return StorageError(uri, f"bucket '{_split_s3(uri)[0]}' does not exist")
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(uri, "object does not exist")
            if code in ("PreconditionFailed", "412"):
                return PreconditionFailed(uri, f"conditional write lost ({code})")
            if code in _REJECTED or status == 403:
                return StorageError(uri, f"credentials rejected by S3 ({code or status})")
            return StorageError(uri, f"S3 error {code or status}: {error.get('Message', '')}".rstrip(": "))
        if isinstance(exc, NoCredentialsError):
            return StorageError(uri, "no AWS credentials found")
        if isinstance(exc, ConnectionError):
            return StorageError(
                uri, f"cannot reach the S3 endpoint {s3_client().meta.endpoint_url} ({type(exc).__name__})"
            )
        return StorageError(uri, f"S3 request failed: {exc}")

    def _object(self, uri: str) -> tuple[str, str]:
        bucket, key = _split_s3(uri)
        if not key:
            raise StorageError(uri, "an S3 object URI needs a key: s3://bucket/key")
        return bucket, key

    def _put(self, uri: str, data: Data, **conditions: str) -> ObjectInfo:
        bucket, key = self._object(uri)
        try:
            resp = _retry_conflicts(
                lambda: s3_client().put_object(Bucket=bucket, Key=key, Body=bytes(data), **conditions)
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(uri, exc) from exc
        return ObjectInfo(uri, len(data), resp["ETag"])

    def _multipart(self, uri: str, parts: Iterator[bytes]) -> ObjectInfo:
        """Upload ``parts`` as one multipart upload; the object appears only on completion."""
        bucket, key = self._object(uri)
        client = s3_client()
        try:
            upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(uri, exc) from exc
        try:
            done, size = [], 0
            for number, body in enumerate(parts, start=1):
                resp = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)
                done.append({"PartNumber": number, "ETag": resp["ETag"]})
                size += len(body)
            resp = client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
            )
        except BaseException as exc:
            try:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            except (ClientError, BotoCoreError):
                pass
            if isinstance(exc, ClientError | BotoCoreError):
                raise self._fail(uri, exc) from exc
            raise
        return ObjectInfo(uri, size, resp["ETag"])

    def read_bytes(self, uri: str) -> bytes:
        return _get_object(uri, None)

    def write_bytes(self, uri: str, data: Data | BinaryIO) -> ObjectInfo:
        part_size = max(_int_env("HPD_S3_PART_SIZE", 8 * _MIB), 5 * _MIB)
        if isinstance(data, bytes | bytearray | memoryview):
            if len(data) <= _int_env("HPD_S3_MULTIPART_THRESHOLD", 64 * _MIB):
                return self._put(uri, data)
            return self._multipart(uri, _chunks(data, part_size))
        parts = _chunks(data, part_size)
        first = next(parts, b"")
        if len(first) < part_size:
            return self._put(uri, first)
        return self._multipart(uri, _prepend(first, parts))

    def put_if_absent(self, uri: str, data: Data) -> bool:
        try:
            self._put(uri, data, IfNoneMatch="*")
        except PreconditionFailed:
            return False
        return True

    def compare_and_swap(self, uri: str, data: Data, expected_etag: str | None) -> ObjectInfo:
        try:
            if expected_etag is None:
                return self._put(uri, data, IfNoneMatch="*")
            return self._put(uri, data, IfMatch=expected_etag)
        except ObjectNotFound as exc:
            raise PreconditionFailed(uri, "object does not exist") from exc

    def head(self, uri: str) -> ObjectInfo:
        bucket, key = self._object(uri)
        client = s3_client()
        try:
            resp = client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            error = self._fail(uri, exc)
            if isinstance(error, ObjectNotFound):
                # HEAD has no error body: tell a missing bucket from a missing key.
                try:
                    client.head_bucket(Bucket=bucket)
                except ClientError as bucket_exc:
                    if bucket_exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket"):
                        raise StorageError(uri, f"bucket '{bucket}' does not exist") from exc
            raise error from exc
        except BotoCoreError as exc:
            raise self._fail(uri, exc) from exc
        return ObjectInfo(uri, resp["ContentLength"], resp["ETag"])

    def exists(self, uri: str) -> bool:
        try:
            self.head(uri)
        except ObjectNotFound:
            return False
        return True

    def list_uris(self, prefix: str) -> list[str]:
        bucket, key = _split_s3(prefix)
        folder = f"{key}/" if key else ""
        found = []
        try:
            for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
                found += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(prefix, exc) from exc
        return sorted(u for u in found if not u.endswith("/"))

    def delete(self, uri: str) -> None:
        bucket, key = self._object(uri)
        try:
            s3_client().delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            error = self._fail(uri, exc)
            if not isinstance(error, ObjectNotFound):
                raise error from exc


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


# 409s that S3 documents as "a conflicting operation was in progress, nothing was written: try again".
_CONFLICTS = ("ConditionalRequestConflict", "OperationAborted", "409")
# Failures while a response body streams in: botocore retries requests, never the reading of a body.
_BODY_ERRORS = (HTTPClientError, IncompleteReadError)
_BACKOFF_BASE_S, _BACKOFF_CAP_S = 0.1, 5.0


def _attempts() -> int:
    return max(_int_env("HPD_S3_MAX_ATTEMPTS", 8), 1)


def _pause(attempt: int) -> None:
    """Sleep before retrying after failed ``attempt`` (1, 2, ...): full-jitter exponential backoff."""
    time.sleep(random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**attempt)))


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _retry_conflicts(request: Callable[[], Any]) -> Any:
    """Send a write; a 409 conflict (S3 gives ConditionalRequestConflict when another operation on the key was
    in flight and this one did not happen) is sent again after a backoff, up to ``HPD_S3_MAX_ATTEMPTS``
    times in all. It is never a lost compare-and-swap: only a 412 is; an exhausted retry is a StorageError."""
    attempts, attempt = _attempts(), 1
    while True:
        try:
            return request()
        except ClientError as exc:
            if attempt >= attempts or _error_code(exc) not in _CONFLICTS:
                raise
        _pause(attempt)
        attempt += 1


def _get_object(uri: str, on_chunk: Callable[[bytes], object] | None) -> bytes:
    """The whole object. botocore retries the GET request but not the reading of its body: when the connection
    drops mid-body, the object is read again from the start (up to ``HPD_S3_MAX_ATTEMPTS`` reads in all). A
    re-read asks for the version read first (If-Match its ETag) and skips the bytes already taken, so
    ``on_chunk`` (a verifying hash) sees every byte once, in order; a plain read whose object was replaced
    in between starts over on the new version."""
    backend = _BACKENDS["s3"]
    assert isinstance(backend, _S3)
    bucket, key = backend._object(uri)
    parts: list[bytes] = []
    etag: str | None = None
    attempts = _attempts()
    for attempt in range(1, attempts + 1):
        try:
            resp = s3_client().get_object(Bucket=bucket, Key=key, **({"IfMatch": etag} if etag else {}))
        except ClientError as exc:
            if etag is None or _error_code(exc) not in ("PreconditionFailed", "412"):
                raise backend._fail(uri, exc) from exc
            if on_chunk is not None:
                raise StorageError(uri, "the object was replaced while it was being read") from exc
            parts, etag = [], None
            continue
        except BotoCoreError as exc:
            raise backend._fail(uri, exc) from exc
        etag = resp["ETag"]
        try:
            _take(resp["Body"], parts, on_chunk)
            return b"".join(parts)
        except _BODY_ERRORS as exc:
            if attempt == attempts:
                raise backend._fail(uri, exc) from exc
        _pause(attempt)
    raise StorageError(uri, f"no complete read in {attempts} attempts")


def _take(body: Any, parts: list[bytes], on_chunk: Callable[[bytes], object] | None) -> None:
    """Append ``body``'s bytes to ``parts``, skipping as many as ``parts`` holds already (an earlier read of the
    same version that broke off)."""
    skip = sum(len(p) for p in parts)
    for chunk in body.iter_chunks(_CHUNK):
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        chunk, skip = chunk[skip:], 0
        if on_chunk is not None:
            on_chunk(chunk)
        parts.append(chunk)


# ---------------------------------------------------------------------------------- streamed reads


class _S3Body(io.RawIOBase):
    """An S3 object read front to back. When the connection drops in the middle of the body, the read resumes
    where it broke off: a ranged GET of the same version (If-Match its ETag), up to ``HPD_S3_MAX_ATTEMPTS``
    times; a version replaced in between is a StorageError, never a splice of two versions."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        self._uri = uri
        self._bucket, self._key = _split_s3(uri)
        self._position, self._failures = 0, 0
        self._etag: str | None = None
        self._body: Any = None
        self._get()

    def readable(self) -> bool:
        return True

    def _get(self) -> None:
        resume = {"IfMatch": self._etag, "Range": f"bytes={self._position}-"} if self._etag else {}
        try:
            resp = s3_client().get_object(Bucket=self._bucket, Key=self._key, **resume)
        except ClientError as exc:
            if resume and _error_code(exc) in ("PreconditionFailed", "412"):
                raise StorageError(self._uri, "the object was replaced while it was being read") from exc
            raise _BACKENDS["s3"]._fail(self._uri, exc) from exc
        except BotoCoreError as exc:
            raise _BACKENDS["s3"]._fail(self._uri, exc) from exc
        self._etag, self._body = resp["ETag"], resp["Body"]

    def readinto(self, buffer: Any) -> int:
        while True:
            try:
                data = self._body.read(len(buffer))
            except _BODY_ERRORS as exc:
                self._failures += 1
                if self._failures >= _attempts():
                    raise _BACKENDS["s3"]._fail(self._uri, exc) from exc
                _pause(self._failures)
                self._get()
                continue
            buffer[: len(data)] = data
            self._position += len(data)
            return len(data)

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
        super().close()


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
        while self.read(_CHUNK):
            pass

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def open_read(uri: str) -> BinaryIO:
    """The object as a buffered binary stream, read front to back without a whole copy in memory; the caller
    closes it. Local files are seekable; S3 bodies are not, and resume after a dropped connection."""
    backend = _backend(uri)
    if isinstance(backend, _Local):
        try:
            return open(_local_path(uri), "rb")  # noqa: SIM115 - the caller owns the stream
        except OSError as exc:
            raise backend._fail(uri, exc) from exc
    return io.BufferedReader(_S3Body(uri), _CHUNK)


def sha256_of(uri: str) -> str:
    """The object's sha256, streamed through in chunks (memory does not follow its size)."""
    with open_read(uri) as stream:
        hashing = HashingReader(stream)
        hashing.drain()
    return hashing.hexdigest()


# --------------------------------------------------------------------------------- verified reads


def _readinto_hashing(fh: io.FileIO, view: memoryview, digest: Any | None) -> int:
    """Fill ``view`` from ``fh`` chunk by chunk, hashing each chunk (if ``digest``) while it is still in cache;
    bytes read."""
    got = 0
    while got < len(view):
        count = fh.readinto(view[got : got + _CHUNK])
        if not count:
            break
        if digest is not None:
            digest.update(view[got : got + count])
        got += count
    return got


def _read_local_hashing(uri: str, digest: Any | None) -> Any:
    """The whole file in one buffer from Arrow's memory pool (no zero-fill, no copy), hashed as it is read
    when ``digest`` is given."""
    try:
        with open(_local_path(uri), "rb", buffering=0) as fh:
            buffer = pa.allocate_buffer(os.fstat(fh.fileno()).st_size)
            got = _readinto_hashing(fh, memoryview(buffer), digest)
            tail = fh.read()  # only if the file grew since fstat; published objects never do
    except OSError as exc:
        raise _BACKENDS["file"]._fail(uri, exc) from exc
    if tail or got < buffer.size:
        if digest is not None:
            digest.update(tail)
        return memoryview(buffer)[:got].tobytes() + tail
    return buffer


def _read_s3_hashing(uri: str, digest: Any) -> bytes:
    """The whole object, hashed chunk by chunk as it streams in (once each, even when a read is retried)."""
    return _get_object(uri, digest.update)


def _read_verified(uri: str, sha256: str) -> Any:
    """The object's bytes (bytes or an Arrow buffer) once they hash to ``sha256``; else IntegrityError."""
    if not isinstance(_backend(uri), _Local):
        digest = hashlib.sha256()
        data = _read_s3_hashing(uri, digest)
        _check_digest(uri, sha256, digest.hexdigest())
        return data
    version = _local_version(uri)
    if _seen_verified(uri, sha256, version):
        return _reread_verified(uri, sha256, version, _read_local_hashing(uri, None))
    digest = hashlib.sha256()
    data = _read_local_hashing(uri, digest)
    _check_digest(uri, sha256, digest.hexdigest())
    _remember_verified(uri, sha256, version)
    return data


# Local files this process has hashed to their recorded sha256, with the version they had then (size, mtime,
# inode, device): a re-read of the same unchanged version (fit-pca reads each shard twice) is not hashed again.
# Any change of the file, or another expected sha256, is hashed in full; a file that changes while it is
# re-read is hashed from the bytes read. As git does with its index, a file modified within the last
# RACY_NS is never remembered: the file system's clock may not tick between two writes that close.
_VERIFIED_LOCAL: dict[str, tuple[str, tuple[int, ...]]] = {}
_VERIFIED_LOCAL_MAX = 100_000
RACY_NS = 2_000_000_000


def _local_version(uri: str) -> tuple[int, ...]:
    try:
        st = os.stat(_local_path(uri))
    except OSError as exc:
        raise _BACKENDS["file"]._fail(uri, exc) from exc
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _seen_verified(uri: str, sha256: str, version: tuple[int, ...]) -> bool:
    return _VERIFIED_LOCAL.get(uri) == (sha256.lower(), version)


def _remember_verified(uri: str, sha256: str, version: tuple[int, ...]) -> None:
    if _local_version(uri) != version or time.time_ns() - version[1] < RACY_NS:
        return  # changed while it was read, or too recently to tell a later change by its mtime
    if len(_VERIFIED_LOCAL) >= _VERIFIED_LOCAL_MAX:
        _VERIFIED_LOCAL.clear()
    _VERIFIED_LOCAL[uri] = (sha256.lower(), version)


def _reread_verified(uri: str, sha256: str, version: tuple[int, ...], data: Any) -> Any:
    """``data``, re-read from a file verified before at ``version``: hashed only if the file changed meanwhile."""
    if _local_version(uri) != version:
        _VERIFIED_LOCAL.pop(uri, None)
        _check_digest(uri, sha256, hashlib.sha256(memoryview(data)).hexdigest())
    return data


def _check_digest(uri: str, expected: str, actual: str) -> None:
    if actual != expected.lower():
        raise IntegrityError(uri, expected, actual)


def _read_parquet_verified(uri: str, columns: list[str] | None, sha256: str) -> pa.Table:
    """A large local Parquet object is parsed while another thread hashes the same bytes (both release the
    GIL, so the check costs little wall time); the table is returned only once the digest matches, and a
    digest mismatch wins over any parse error. Small objects (where a thread costs more than it saves, and
    Arrow's decoding already uses the cores) and S3 objects are hashed as they are read, before parsing."""
    if not isinstance(_backend(uri), _Local) or size(uri) < _PARALLEL_VERIFY_BYTES:
        return _parse_parquet(uri, _read_verified(uri, sha256), columns)
    version = _local_version(uri)
    data = _read_local_hashing(uri, None)
    if _seen_verified(uri, sha256, version):
        return _parse_parquet(uri, _reread_verified(uri, sha256, version, data), columns)
    digest = hashlib.sha256()
    hasher = threading.Thread(target=digest.update, args=(memoryview(data),), name="hpd-verify")
    hasher.start()
    try:
        table = _parse_parquet(uri, data, columns)
    finally:
        hasher.join()
        _check_digest(uri, sha256, digest.hexdigest())
    _remember_verified(uri, sha256, version)
    return table


def _parse_parquet(uri: str, data: Any, columns: list[str] | None) -> pa.Table:
    try:
        return pq.read_table(pa.BufferReader(data), columns=columns)
    except (pa.ArrowException, KeyError) as exc:
        raise StorageError(uri, f"cannot read Parquet: {exc}") from exc


# --------------------------------------------------------------------------------------- dispatch

_BACKENDS: dict[str, _Local | _S3] = {"file": _Local(), "s3": _S3()}


def _backend(uri: str) -> _Local | _S3:
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
    if sha256 is None:
        return _backend(uri).read_bytes(uri)
    return bytes(_read_verified(uri, sha256))


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
    backend = _backend(uri)
    return backend.size(uri) if isinstance(backend, _Local) else backend.head(uri).size


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


def _stat_version(stat: os.stat_result) -> str | None:
    if time.time_ns() - stat.st_mtime_ns < RACY_NS:
        return None
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def _list_local_objects(prefix: str) -> list[ListedObject]:
    found = []
    for folder, _dirs, files in os.walk(_local_path(prefix)):
        for name in files:
            path = os.path.join(folder, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:  # deleted, or renamed into place, since the walk saw it
                continue
            modified = datetime.fromtimestamp(stat.st_mtime, UTC)
            found.append(ListedObject("file://" + path, stat.st_size, modified, _stat_version(stat)))
    return found


def _list_s3_objects(prefix: str) -> list[ListedObject]:
    bucket, key = _split_s3(prefix)
    folder = f"{key}/" if key else ""
    found = []
    try:
        for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
            found += [
                ListedObject(f"s3://{bucket}/{o['Key']}", o["Size"], o["LastModified"].astimezone(UTC), o["ETag"])
                for o in page.get("Contents", [])
                if not o["Key"].endswith("/")
            ]
    except (ClientError, BotoCoreError) as exc:
        raise _BACKENDS["s3"]._fail(prefix, exc) from exc
    return found


def list_objects(prefix: str) -> list[ListedObject]:
    """Every object under the folder ``prefix``, recursively, sorted by URI, with its size and last-modified
    time and version; unlike :func:`list_uris` it includes the hidden temp and lock files (of writers in
    progress, or killed). For garbage collection: an object's time is when it was last written (locally the file's
    mtime, on S3 the object's LastModified, in the server's clock)."""
    backend = _backend(prefix)
    listed = _list_local_objects(prefix) if isinstance(backend, _Local) else _list_s3_objects(prefix)
    return sorted(listed, key=lambda o: o.uri)


def read_parquet(uri: str, columns: list[str] | None = None, sha256: str | None = None) -> pa.Table:
    """Read a Parquet object, optionally only ``columns``.

    With ``sha256`` the whole object is read once and verified as in :func:`read_bytes`, whatever
    ``columns`` asks for; no table is returned from bytes that fail the check.
    """
    if sha256 is None:
        local = isinstance(_backend(uri), _Local)
        return _parse_parquet(uri, _read_local_hashing(uri, None) if local else read_bytes(uri), columns)
    return _read_parquet_verified(uri, columns, sha256)


def write_parquet(uri: str, table: pa.Table) -> ObjectInfo:
    """Serialise ``table`` as zstd Parquet in memory, then publish it atomically."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return write_bytes(uri, sink.getvalue())
