"""The ``s3://`` backend: objects are keys; a create-if-absent is ``If-None-Match: *``, a compare-and-swap
``If-Match`` the etag read; payloads above a threshold go up as a multipart upload, visible on completion.

The client comes from the Airflow connection named by ``HPD_AWS_CONN_ID`` when set, else from boto3's default
chain. botocore's "standard" retry mode backs off and retries throttling, 5xx and connection errors; tenacity
retries what botocore does not: a 409 ``ConditionalRequestConflict`` on a write (sent again after a backoff,
never taken for a lost compare-and-swap). A connection that drops in the middle of a GET's body is resumed
here, on the same version of the object (``If-Match`` its ETag), since a resumed read must not splice two
versions. Tuning: ``HPD_S3_MAX_ATTEMPTS`` (total attempts per request, default 8),
``HPD_S3_MULTIPART_THRESHOLD`` (default 64 MiB) and ``HPD_S3_PART_SIZE`` (default 8 MiB, min 5 MiB).
"""

from __future__ import annotations

import functools
import io
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import boto3
import botocore.session
import tenacity
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
)

from tasks.core.settings import current as current_settings
from tasks.core.storage.objects import (
    CHUNK,
    MIB,
    Data,
    ListedObject,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    chunks,
    hidden,
)
from tasks.core.storage.s3_responses import Got, Head, Page, Upload, Written
from tasks.core.uris import StorageError, to_uri

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
# 409s that S3 documents as "a conflicting operation was in progress, nothing was written: try again".
_CONFLICTS = ("ConditionalRequestConflict", "OperationAborted", "409")
# Failures while a response body streams in: botocore retries requests, never the reading of a body.
_BODY_ERRORS = (HTTPClientError, IncompleteReadError)
_STALE = ("PreconditionFailed", "412")
_BACKOFF_BASE_S, _BACKOFF_CAP_S = 0.1, 5.0
_clients: dict[tuple[str | None, ...], Any] = {}
_clients_lock = threading.Lock()


def _settings() -> tuple[str | None, ...]:
    hpd = current_settings()
    conn_id = hpd.aws_conn_id
    names = _AWS_ENV + ((f"AIRFLOW_CONN_{conn_id.upper()}",) if conn_id else ())
    return (conn_id, str(max(hpd.s3_max_attempts, 1)), *(os.environ.get(n) for n in names))


def s3_client() -> Any:
    """The boto3 S3 client for the current environment settings (cached per settings)."""
    settings = _settings()
    with _clients_lock:
        if settings not in _clients:
            conn_id, attempts = settings[0], int(settings[1] or 1)
            config = Config(retries={"mode": "standard", "total_max_attempts": attempts})
            if conn_id:
                from airflow.providers.amazon.aws.hooks.s3 import S3Hook

                _clients[settings] = S3Hook(aws_conn_id=conn_id, config=config).get_conn()
            else:
                _clients[settings] = _session().client("s3", config=config)
        return _clients[settings]


@functools.cache
def _data_loader() -> Any:
    """botocore's loader of its data files (the S3 service model, endpoints, partitions), for every session of this
    process: a session's own would parse them again (tens of milliseconds of JSON per client)."""
    return botocore.session.get_session().get_component("data_loader")


def _session() -> boto3.session.Session:
    """A new session (credentials and settings as the environment has them now) sharing :func:`_data_loader`."""
    core = botocore.session.get_session()
    core.register_component("data_loader", _data_loader())
    return boto3.session.Session(botocore_session=core)


def reset_s3_clients() -> None:
    """Forget cached S3 clients (tests change the environment between cases)."""
    with _clients_lock:
        _clients.clear()


def split(uri: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://`` URI."""
    bucket, _, key = to_uri(uri)[len("s3://") :].partition("/")
    return bucket, key


def _object(uri: str) -> tuple[str, str]:
    bucket, key = split(uri)
    if not key:
        raise StorageError(uri, "an S3 object URI needs a key: s3://bucket/key")
    return bucket, key


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def failure(uri: str, exc: Exception) -> StorageError:
    """A boto error as a StorageError naming the URI (never the credentials)."""
    if isinstance(exc, ClientError):
        error, code = exc.response.get("Error", {}), _error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return StorageError(uri, f"bucket '{split(uri)[0]}' does not exist")
        if code in ("NoSuchKey", "404", "NotFound"):
            return ObjectNotFound(uri, "object does not exist")
        if code in _STALE:
            return PreconditionFailed(uri, f"conditional write lost ({code})")
        if code in _REJECTED or status == 403:
            return StorageError(uri, f"credentials rejected by S3 ({code or status})")
        return StorageError(uri, f"S3 error {code or status}: {error.get('Message', '')}".rstrip(": "))
    if isinstance(exc, NoCredentialsError):
        return StorageError(uri, "no AWS credentials found")
    if isinstance(exc, ConnectionError):
        return StorageError(uri, f"cannot reach the S3 endpoint {s3_client().meta.endpoint_url} ({type(exc).__name__})")
    return StorageError(uri, f"S3 request failed: {exc}")


def attempts() -> int:
    return max(current_settings().s3_max_attempts, 1)


def pause(seconds: float) -> None:
    """Sleep before a retry (tests shorten it)."""
    time.sleep(seconds)


def _backoff(attempt: int) -> float:
    """Full-jitter exponential backoff after failed ``attempt`` (1, 2, ...)."""
    return random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**attempt))


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and _error_code(exc) in _CONFLICTS


def _retry_conflicts(request: Callable[[], Any]) -> Any:
    """Send a write; a 409 conflict (the write did not happen) is sent again after a backoff, up to
    ``HPD_S3_MAX_ATTEMPTS`` times in all. It is never a lost compare-and-swap: only a 412 is."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts()),
        wait=tenacity.wait_random_exponential(multiplier=_BACKOFF_BASE_S, max=_BACKOFF_CAP_S),
        retry=tenacity.retry_if_exception(_is_conflict),
        sleep=lambda seconds: pause(seconds),
        reraise=True,
    )
    return retrying(request)


class S3Backend:
    """Objects are S3 keys; conditional writes use If-None-Match / If-Match."""

    def _put(self, uri: str, data: Data, **conditions: str) -> ObjectInfo:
        bucket, key = _object(uri)
        try:
            resp = _retry_conflicts(
                lambda: s3_client().put_object(Bucket=bucket, Key=key, Body=bytes(data), **conditions)
            )
        except (ClientError, BotoCoreError) as exc:
            raise failure(uri, exc) from exc
        return ObjectInfo(uri, len(data), Written.model_validate(resp).etag)

    def read_bytes(self, uri: str) -> bytes:
        return read_whole(uri, None)

    def write_bytes(self, uri: str, data: Data | BinaryIO) -> ObjectInfo:
        hpd = current_settings()
        part_size = max(hpd.s3_part_size, 5 * MIB)
        if isinstance(data, bytes | bytearray | memoryview):
            if len(data) <= hpd.s3_multipart_threshold:
                return self._put(uri, data)
            return _multipart(uri, chunks(data, part_size))
        parts = chunks(data, part_size)
        first = next(parts, b"")
        if len(first) < part_size:
            return self._put(uri, first)
        return _multipart(uri, _prepend(first, parts))

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
        bucket, key = _object(uri)
        try:
            resp = s3_client().head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            error = failure(uri, exc)
            if isinstance(error, ObjectNotFound) and not _bucket_exists(bucket):
                raise StorageError(uri, f"bucket '{bucket}' does not exist") from exc
            raise error from exc
        except BotoCoreError as exc:
            raise failure(uri, exc) from exc
        return Head.model_validate(resp).info(uri)

    def size(self, uri: str) -> int:
        return self.head(uri).size

    def exists(self, uri: str) -> bool:
        try:
            self.head(uri)
        except ObjectNotFound:
            return False
        return True

    def list_uris(self, prefix: str) -> list[str]:
        """Hidden names too stay out: this backend writes none, but a folder store copied here carries its own."""
        return sorted(o.uri for o in self.list_objects(prefix) if not hidden(o.uri))

    def list_objects(self, prefix: str) -> list[ListedObject]:
        bucket, key = split(prefix)
        found = []
        try:
            pages = (
                s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key}/" if key else "")
            )
            for page in pages:
                found += [o.listed(bucket) for o in Page.model_validate(page).contents if not o.key.endswith("/")]
        except (ClientError, BotoCoreError) as exc:
            raise failure(prefix, exc) from exc
        return found

    def delete(self, uri: str) -> None:
        bucket, key = _object(uri)
        try:
            s3_client().delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            error = failure(uri, exc)
            if not isinstance(error, ObjectNotFound):
                raise error from exc

    def open_read(self, uri: str) -> BinaryIO:
        return io.BufferedReader(_Body(uri), CHUNK)


def _bucket_exists(bucket: str) -> bool:
    """HEAD has no error body: whether a 404 is the bucket's or the key's."""
    try:
        s3_client().head_bucket(Bucket=bucket)
    except ClientError as exc:
        return _error_code(exc) not in ("404", "NoSuchBucket")
    return True


def _multipart(uri: str, parts: Iterator[bytes]) -> ObjectInfo:
    """Upload ``parts`` as one multipart upload; the object appears only on completion."""
    bucket, key = _object(uri)
    client = s3_client()
    try:
        upload_id = Upload.model_validate(client.create_multipart_upload(Bucket=bucket, Key=key)).upload_id
    except (ClientError, BotoCoreError) as exc:
        raise failure(uri, exc) from exc
    try:
        done, size = [], 0
        for number, body in enumerate(parts, start=1):
            resp = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)
            done.append({"PartNumber": number, "ETag": Written.model_validate(resp).etag})
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
            raise failure(uri, exc) from exc
        raise
    return ObjectInfo(uri, size, Written.model_validate(resp).etag)


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def read_whole(uri: str, on_chunk: Callable[[bytes], object] | None) -> bytes:
    """The whole object. When the connection drops mid-body, the object is read again from the start (up to
    ``HPD_S3_MAX_ATTEMPTS`` reads in all). A re-read asks for the version read first (If-Match its ETag) and
    skips the bytes already taken, so ``on_chunk`` (a verifying hash) sees every byte once, in order; a plain
    read whose object was replaced in between starts over on the new version."""
    bucket, key = _object(uri)
    parts: list[bytes] = []
    etag: str | None = None
    for attempt in range(1, attempts() + 1):
        try:
            resp = s3_client().get_object(Bucket=bucket, Key=key, **({"IfMatch": etag} if etag else {}))
        except ClientError as exc:
            if etag is None or _error_code(exc) not in _STALE:
                raise failure(uri, exc) from exc
            if on_chunk is not None:
                raise StorageError(uri, "the object was replaced while it was being read") from exc
            parts, etag = [], None
            continue
        except BotoCoreError as exc:
            raise failure(uri, exc) from exc
        got = Got.model_validate(resp)
        etag = got.etag
        try:
            _take(got.body, parts, on_chunk)
            return b"".join(parts)
        except _BODY_ERRORS as exc:
            if attempt == attempts():
                raise failure(uri, exc) from exc
        pause(_backoff(attempt))
    raise StorageError(uri, f"no complete read in {attempts()} attempts")


def _take(body: Any, parts: list[bytes], on_chunk: Callable[[bytes], object] | None) -> None:
    """Append ``body``'s bytes to ``parts``, skipping as many as ``parts`` holds already (an earlier read of the
    same version that broke off)."""
    skip = sum(len(p) for p in parts)
    for chunk in body.iter_chunks(CHUNK):
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        chunk, skip = chunk[skip:], 0
        if on_chunk is not None:
            on_chunk(chunk)
        parts.append(chunk)


class _Body(io.RawIOBase):
    """An S3 object read front to back. When the connection drops in the middle of the body, the read resumes
    where it broke off: a ranged GET of the same version (If-Match its ETag), up to ``HPD_S3_MAX_ATTEMPTS``
    times; a version replaced in between is a StorageError, never a splice of two versions."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        self._uri = uri
        self._bucket, self._key = split(uri)
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
            if resume and _error_code(exc) in _STALE:
                raise StorageError(self._uri, "the object was replaced while it was being read") from exc
            raise failure(self._uri, exc) from exc
        except BotoCoreError as exc:
            raise failure(self._uri, exc) from exc
        got = Got.model_validate(resp)
        self._etag, self._body = got.etag, got.body

    def readinto(self, buffer: Any) -> int:
        while True:
            try:
                data = self._body.read(len(buffer))
            except _BODY_ERRORS as exc:
                self._failures += 1
                if self._failures >= attempts():
                    raise failure(self._uri, exc) from exc
                pause(_backoff(self._failures))
                self._get()
                continue
            buffer[: len(data)] = data
            self._position += len(data)
            return len(data)

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
        super().close()
