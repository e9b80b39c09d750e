"""tasks.core.storage: one suite for the local-folder and the S3 backend (moto server on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError
from botocore.retries.standard import ExponentialBackoff

from tasks.core import storage, uris
from tests.support.paths import REPO, SUPPORT

pytestmark = pytest.mark.timeout(60)

WRITER = SUPPORT / "stalling_writer.py"
MIB = 1024 * 1024


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Shrink botocore's standard-mode backoff to 10 ms; returns the attempt numbers it was asked for."""
    asked: list[int] = []

    def delay_amount(self: ExponentialBackoff, context) -> float:
        asked.append(context.attempt_number)
        return 0.01

    monkeypatch.setattr(ExponentialBackoff, "delay_amount", delay_amount)
    return asked


class _Raw:
    """The minimal ``raw`` object botocore reads an injected response body from."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: object) -> Iterator[bytes]:
        yield self.body


def _slow_down(request) -> AWSResponse:
    body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
    return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Raw(body))


def _endpoint_down(request) -> AWSResponse:
    raise EndpointConnectionError(endpoint_url=request.url)


def _connection_closed(request) -> AWSResponse:
    raise ConnectionClosedError(endpoint_url=request.url)


@pytest.fixture
def inject() -> Iterator[Callable[[str, list], dict[str, int]]]:
    """Register a before-send hook that fails the first calls of an operation with the given faults."""
    registered = []

    def install(operation: str, faults: list) -> dict[str, int]:
        counts = {"calls": 0, "injected": 0}

        def hook(request, **_: object) -> AWSResponse | None:
            counts["calls"] += 1
            if counts["injected"] < len(faults):
                counts["injected"] += 1
                return faults[counts["injected"] - 1](request)
            return None

        event = f"before-send.s3.{operation}"
        storage.s3_client().meta.events.register(event, hook)
        registered.append((event, hook))
        return counts

    yield install
    for event, hook in registered:
        storage.s3_client().meta.events.unregister(event, hook)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------ URIs


def test_to_uri_and_join_normalise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert storage.to_uri("var/store/") == f"file://{tmp_path}/var/store"
    assert storage.to_uri(str(tmp_path / "a" / ".." / "b")) == f"file://{tmp_path}/b"
    assert storage.to_uri("file:///data/x/") == "file:///data/x"
    assert storage.to_uri("s3://bucket/some/prefix/") == "s3://bucket/some/prefix"
    assert storage.to_uri("s3://bucket/") == "s3://bucket"
    assert storage.join("s3://bucket/root/", "a", "/b/", "c.parquet") == "s3://bucket/root/a/b/c.parquet"
    assert storage.join("file:///data", "x/y") == "file:///data/x/y"


@pytest.mark.parametrize("call", [storage.read_bytes, storage.exists, storage.list_uris, storage.delete])
def test_unknown_scheme_names_the_uri(call: Callable[[str], object]) -> None:
    with pytest.raises(storage.StorageError, match="unsupported scheme 'gs'") as err:
        call("gs://bucket/key")
    assert str(err.value).startswith("gs://bucket/key")
    with pytest.raises(storage.StorageError) as err:
        storage.to_uri("ftp://host/x")
    assert str(err.value).startswith("ftp://host/x")


# --------------------------------------------------------------------------- both backends


def test_bytes_round_trip_and_etag(store_root: str) -> None:
    uri = storage.join(store_root, "a", "blob.bin")
    first = storage.write_bytes(uri, b"hello")
    assert first == storage.head(uri) == storage.ObjectInfo(uri, 5, first.etag)
    assert storage.read_bytes(uri) == b"hello"
    assert storage.exists(uri)

    second = storage.write_bytes(uri, io.BytesIO(b"hello, again"))  # file-like source
    assert second.size == 12 and second.etag != first.etag
    assert storage.head(uri).etag == second.etag
    assert storage.read_bytes(uri) == b"hello, again"

    empty = storage.join(store_root, "empty")
    assert storage.write_bytes(empty, b"").size == 0
    assert storage.read_bytes(empty) == b""


def test_parquet_round_trip(store_root: str) -> None:
    uri = storage.join(store_root, "t.parquet")
    table = pa.table({"id": [1, 2, 3], "text": ["a", "b", None], "score": [0.5, 1.5, 2.5]})
    info = storage.write_parquet(uri, table)
    assert info.size == len(storage.read_bytes(uri))
    assert storage.read_parquet(uri).equals(table)
    assert storage.read_parquet(uri, columns=["text"]).equals(table.select(["text"]))
    with pytest.raises(storage.StorageError) as err:
        storage.read_parquet(uri, columns=["nope"])
    assert str(err.value).startswith(uri)


def _flip_bit(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def test_verified_read_passes_intact_bytes_and_names_altered_ones(store_root: str) -> None:
    uri = storage.join(store_root, "v", "blob.bin")
    body = os.urandom(2 * MIB + 123)  # several read chunks
    storage.write_bytes(uri, body)
    recorded = hashlib.sha256(body).hexdigest()
    assert storage.read_bytes(uri, sha256=recorded) == body

    altered = _flip_bit(body, len(body) - 5)  # one bit, same size
    storage.write_bytes(uri, altered)
    assert storage.read_bytes(uri) == altered  # unverified: nothing notices
    with pytest.raises(storage.IntegrityError) as err:
        storage.read_bytes(uri, sha256=recorded)
    actual = hashlib.sha256(altered).hexdigest()
    assert (err.value.uri, err.value.expected, err.value.actual) == (uri, recorded, actual)
    assert str(err.value).startswith(f"{uri}: sha256 mismatch: expected {recorded}, read {actual}")
    assert isinstance(err.value, storage.StorageError)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)

    empty = storage.join(store_root, "v", "empty")
    storage.write_bytes(empty, b"")
    assert storage.read_bytes(empty, sha256=hashlib.sha256(b"").hexdigest()) == b""
    with pytest.raises(storage.ObjectNotFound):
        storage.read_bytes(storage.join(store_root, "v", "missing"), sha256=recorded)


@pytest.mark.parametrize("parallel", [False, True], ids=["hashed-while-read", "hashed-beside-the-parse"])
def test_verified_parquet_read_hashes_the_whole_object_before_parsing(
    store_root: str, parallel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small objects are hashed as they are read; large local ones while the parser runs. Either way no table
    comes back from altered bytes, and the integrity error wins over the parse error it would cause."""
    if parallel:
        monkeypatch.setattr(storage.verified, "PARALLEL_VERIFY_BYTES", 0)
    uri = storage.join(store_root, "v", "t.parquet")
    table = pa.table({"id": list(range(1000)), "text": [f"sentence {i}" for i in range(1000)]})
    storage.write_parquet(uri, table)
    body = storage.read_bytes(uri)
    recorded = hashlib.sha256(body).hexdigest()
    assert storage.read_parquet(uri, sha256=recorded).equals(table)
    assert storage.read_parquet(uri, columns=["id"], sha256=recorded).equals(table.select(["id"]))

    # One bit of the footer's magic: the Parquet reader would trip over it; the check must come first,
    # and it covers the whole object, not only the columns asked for.
    storage.write_bytes(uri, _flip_bit(body, len(body) - 1))
    with pytest.raises(storage.StorageError, match="cannot read Parquet"):
        storage.read_parquet(uri)
    with pytest.raises(storage.IntegrityError, match=f"^{re.escape(uri)}: sha256 mismatch: expected {recorded}"):
        storage.read_parquet(uri, columns=["id"], sha256=recorded)


@pytest.mark.parametrize("parallel", [False, True], ids=["hashed-while-read", "hashed-beside-the-parse"])
def test_a_local_file_verified_once_is_not_hashed_again_until_it_changes(
    tmp_path: Path, parallel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if parallel:
        monkeypatch.setattr(storage.verified, "PARALLEL_VERIFY_BYTES", 0)
    storage.verified.forget()
    hashed: list[int] = []
    real_sha256 = hashlib.sha256

    class CountingSha256:
        def __init__(self, data: bytes = b"") -> None:
            self._digest = real_sha256(data)
            hashed.append(len(data))

        def update(self, data: object) -> None:
            hashed.append(len(memoryview(data)))  # type: ignore[arg-type]
            self._digest.update(data)  # type: ignore[arg-type]

        def hexdigest(self) -> str:
            return self._digest.hexdigest()

    monkeypatch.setattr(storage.verified.hashlib, "sha256", CountingSha256)
    uri = storage.to_uri(str(tmp_path / "t.parquet"))
    table = pa.table({"id": list(range(1000)), "text": [f"sentence {i}" for i in range(1000)]})
    storage.write_parquet(uri, table)
    body = (tmp_path / "t.parquet").read_bytes()
    recorded = real_sha256(body).hexdigest()
    os.utime(tmp_path / "t.parquet", ns=(1_700_000_000_000_000_000,) * 2)  # written long ago
    hashed.clear()  # (writing hashes too)

    assert storage.read_parquet(uri, sha256=recorded).equals(table)
    assert sum(hashed) == len(body)
    assert storage.read_parquet(uri, sha256=recorded).equals(table)
    assert storage.read_bytes(uri, sha256=recorded) == body
    assert sum(hashed) == len(body)  # the unchanged file was not hashed again

    (tmp_path / "t.parquet").write_bytes(_flip_bit(body, len(body) - 1))  # same size, a new mtime
    with pytest.raises(storage.IntegrityError):
        storage.read_parquet(uri, sha256=recorded)
    fresh = storage.to_uri(str(tmp_path / "fresh.bin"))
    storage.write_bytes(fresh, b"just written")
    hashed.clear()
    for _ in range(2):  # modified a moment ago: its mtime cannot vouch for it yet, so every read hashes
        storage.read_bytes(fresh, sha256=real_sha256(b"just written").hexdigest())
    assert hashed.count(len(b"just written")) == 2


def test_list_is_sorted_recursive_and_scoped(store_root: str) -> None:
    names = ["a/z.bin", "a/b/c/deep.bin", "a/b/1.bin", "a/0.bin", "ab/sibling.bin", "top.bin"]
    for name in names:
        storage.write_bytes(storage.join(store_root, name), name.encode())
    # A compare_and_swap leaves the local backend's lock file next to the object: it must stay hidden.
    z = storage.join(store_root, "a", "z.bin")
    storage.compare_and_swap(z, b"z2", storage.head(z).etag)
    if store_root.startswith("s3://"):  # a folder store copied to S3 (aws s3 sync) brings its lock and temp files
        bucket, key = store_root.removeprefix("s3://").split("/", 1)
        for hidden in ("a/.lock-z.bin", "a/b/.tmp-1.bin-0a1b2c"):
            storage.s3_client().put_object(Bucket=bucket, Key=f"{key}/{hidden}", Body=b"")

    under_a = storage.list_uris(storage.join(store_root, "a"))
    assert under_a == [storage.join(store_root, n) for n in ["a/0.bin", "a/b/1.bin", "a/b/c/deep.bin", "a/z.bin"]]
    assert storage.list_uris(store_root + "/") == sorted(storage.join(store_root, n) for n in names)
    assert storage.list_uris(storage.join(store_root, "missing")) == []


def test_exists_head_delete(store_root: str) -> None:
    uri = storage.join(store_root, "x", "gone.bin")
    storage.write_bytes(uri, b"data")
    assert storage.exists(uri)
    storage.delete(uri)
    assert not storage.exists(uri)
    storage.delete(uri)  # deleting a missing object is fine
    assert storage.list_uris(store_root) == []


@pytest.mark.parametrize("call", [storage.read_bytes, storage.head, storage.read_parquet])
def test_missing_object_raises_object_not_found(store_root: str, call: Callable[[str], object]) -> None:
    uri = storage.join(store_root, "no", "such.bin")
    with pytest.raises(storage.ObjectNotFound) as err:
        call(uri)
    assert str(err.value).startswith(uri)
    assert err.value.uri == uri
    assert not storage.exists(uri)


def test_killed_writer_leaves_no_visible_object(store_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL a writer after 6 MiB of a 12 MiB stream; on S3 that is mid-multipart (5 MiB parts)."""
    monkeypatch.setenv("HPD_S3_PART_SIZE", str(5 * MIB))
    monkeypatch.setenv("HPD_S3_MULTIPART_THRESHOLD", str(5 * MIB))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    uri = storage.join(store_root, "big", "object.bin")
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), uri, str(12 * MIB), str(6 * MIB)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = writer.stdout.readline()
        assert line == b"ready\n", writer.stderr.read().decode()
        assert _bytes_in_flight(uri) >= 5 * MIB  # the kill really lands mid-write
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
        writer.stderr.close()

    assert not storage.exists(uri)
    assert storage.list_uris(store_root) == []
    with pytest.raises(storage.ObjectNotFound):
        storage.read_bytes(uri)


def _bytes_in_flight(uri: str) -> int:
    """Bytes of an unpublished write that already reached the store (temp file or uploaded parts)."""
    if uri.startswith("file://"):
        folder = Path(uri[len("file://") :]).parent
        return sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith(".tmp-"))
    bucket, key = uri[len("s3://") :].split("/", 1)
    client = storage.s3_client()
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])
    return sum(
        part["Size"]
        for upload in uploads
        for part in client.list_parts(Bucket=bucket, Key=key, UploadId=upload["UploadId"]).get("Parts", [])
    )


def test_racing_put_if_absent_has_one_winner(store_root: str) -> None:
    contenders = 4
    for round_ in range(5):
        uri = storage.join(store_root, "race", f"marker-{round_}")
        barrier = threading.Barrier(contenders)
        won: dict[int, bool] = {}

        def contend(i: int, uri: str = uri, barrier: threading.Barrier = barrier, won: dict = won) -> None:
            barrier.wait()
            won[i] = storage.put_if_absent(uri, f"writer {i} ".encode() * 1000)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [i for i, ok in won.items() if ok]
        assert len(won) == contenders and len(winners) == 1, won
        assert storage.read_bytes(uri) == f"writer {winners[0]} ".encode() * 1000
        assert storage.put_if_absent(uri, b"late") is False
    assert all("/.tmp-" not in u for u in storage.list_uris(store_root))


def test_compare_and_swap(store_root: str) -> None:
    uri = storage.join(store_root, "state.json")
    created = storage.compare_and_swap(uri, b"v1", None)
    assert storage.read_bytes(uri) == b"v1"
    with pytest.raises(storage.PreconditionFailed) as err:
        storage.compare_and_swap(uri, b"v1-again", None)  # must not exist
    assert str(err.value).startswith(uri)

    current = storage.write_bytes(uri, b"v2")
    with pytest.raises(storage.PreconditionFailed):
        storage.compare_and_swap(uri, b"v3", created.etag)  # stale
    assert storage.read_bytes(uri) == b"v2"

    swapped = storage.compare_and_swap(uri, b"v3", current.etag)
    assert storage.read_bytes(uri) == b"v3"
    assert storage.head(uri).etag == swapped.etag != current.etag

    with pytest.raises(storage.PreconditionFailed):
        storage.compare_and_swap(storage.join(store_root, "absent"), b"x", swapped.etag)
    assert not storage.exists(storage.join(store_root, "absent"))


def test_compare_and_swap_loses_no_update_under_contention(store_root: str) -> None:
    uri = storage.join(store_root, "counter")
    storage.write_bytes(uri, b"0")
    workers, increments = 3, 4

    def bump() -> None:
        for _ in range(increments):
            while True:
                info = storage.head(uri)
                value = int(storage.read_bytes(uri))
                try:
                    storage.compare_and_swap(uri, str(value + 1).encode(), info.etag)
                    break
                except storage.PreconditionFailed:
                    continue

    threads = [threading.Thread(target=bump) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert int(storage.read_bytes(uri)) == workers * increments


# ------------------------------------------------------------------------------- S3 only


@pytest.mark.s3
def test_put_object_retries_transient_failures(s3_bucket: str, inject, fast_backoff: list[int]) -> None:
    uri = f"s3://{s3_bucket}/retried.bin"
    payload = os.urandom(256 * 1024)
    counts = inject("PutObject", [_slow_down, _endpoint_down, _connection_closed])
    info = storage.write_bytes(uri, payload)
    assert counts == {"calls": 4, "injected": 3}
    assert fast_backoff == [1, 2, 3]
    assert storage.read_bytes(uri) == payload
    assert storage.head(uri).etag == info.etag


@pytest.mark.s3
def test_multipart_upload_retries_failed_part(
    s3_bucket: str, inject, fast_backoff: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPD_S3_MULTIPART_THRESHOLD", str(5 * MIB))
    monkeypatch.setenv("HPD_S3_PART_SIZE", str(5 * MIB))
    uri = f"s3://{s3_bucket}/multipart.bin"
    payload = os.urandom(12 * MIB)
    puts = inject("PutObject", [])
    parts = inject("UploadPart", [_slow_down, _connection_closed])
    info = storage.write_bytes(uri, payload)
    assert parts == {"calls": 5, "injected": 2}  # 3 parts + 2 retries
    assert puts["calls"] == 0
    assert info.size == 12 * MIB and info.etag.endswith('-3"')
    assert storage.read_bytes(uri) == payload
    assert storage.s3_client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.mark.s3
def test_multipart_upload_gives_up_and_aborts(
    s3_bucket: str, inject, fast_backoff: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPD_S3_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("HPD_S3_PART_SIZE", str(5 * MIB))
    uri = f"s3://{s3_bucket}/doomed.bin"
    parts = inject("UploadPart", [_slow_down] * 100)
    with pytest.raises(storage.StorageError) as err:
        storage.write_bytes(uri, io.BytesIO(os.urandom(11 * MIB)))
    assert str(err.value).startswith(uri) and "SlowDown" in str(err.value)
    assert parts["calls"] == 2
    assert not storage.exists(uri)
    assert storage.s3_client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.mark.s3
@pytest.mark.parametrize("call", [storage.read_bytes, storage.head, storage.exists, storage.list_uris])
def test_missing_bucket_is_named(s3_env: str, call: Callable[[str], object]) -> None:
    uri = "s3://hpd-no-such-bucket/some/key"
    with pytest.raises(storage.StorageError, match="bucket 'hpd-no-such-bucket' does not exist") as err:
        call(uri)
    assert str(err.value).startswith(uri)


@pytest.mark.s3
def test_rejected_credentials_are_named_without_secrets(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import moto.settings

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAHPDBOGUSKEY00000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hpd-bogus-secret-value")
    uri = f"s3://{s3_bucket}/secret.bin"
    with (
        monkeypatch.context() as strict,
        pytest.raises(storage.StorageError, match="credentials rejected") as err,
    ):
        strict.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks keys from now on
        storage.write_bytes(uri, b"x")
    assert str(err.value).startswith(uri)
    for text in (str(err.value), caplog.text):
        assert "hpd-bogus-secret-value" not in text and "AKIAHPDBOGUSKEY00000" not in text


@pytest.mark.s3
def test_unreachable_endpoint_is_named(
    s3_env: str, monkeypatch: pytest.MonkeyPatch, inject, fast_backoff: list[int]
) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("HPD_S3_MAX_ATTEMPTS", "3")
    attempts = inject("GetObject", [])
    uri = "s3://any-bucket/key"
    with pytest.raises(storage.StorageError, match=f"cannot reach the S3 endpoint {endpoint}") as err:
        storage.read_bytes(uri)
    assert str(err.value).startswith(uri)
    assert attempts["calls"] == 3  # retried with backoff before giving up


@pytest.mark.s3
def test_airflow_connection_round_trip(s3_bucket: str, s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    login, password = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("HPD_AWS_CONN_ID", "hpd_s3")
    extra = {"endpoint_url": s3_env, "region_name": "us-east-1"}
    conn = {"conn_type": "aws", "login": login, "password": password, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_HPD_S3", json.dumps(conn))

    client = storage.s3_client()
    assert client.meta.endpoint_url == s3_env  # came from the connection, not the environment
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 8}
    uri = f"s3://{s3_bucket}/via-airflow.bin"
    storage.write_bytes(uri, b"through the airflow connection")
    assert storage.read_bytes(uri) == b"through the airflow connection"
    assert storage.list_uris(f"s3://{s3_bucket}") == [uri]


def test_links_that_stay_in_a_store_are_followed_and_links_out_of_it_refused(tmp_path):
    store = uris.store_root(storage.to_uri(str(tmp_path / "store")))
    storage.write_bytes(f"{store}/a/real.bin", b"inside")
    (tmp_path / "store" / "a" / "alias.bin").symlink_to(tmp_path / "store" / "a" / "real.bin")
    assert storage.read_bytes(f"{store}/a/alias.bin") == b"inside"
    (tmp_path / "outside.bin").write_bytes(b"outside")
    (tmp_path / "store" / "out.bin").symlink_to(tmp_path / "outside.bin")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "store" / "folder").symlink_to(tmp_path / "elsewhere")
    refused = "resolves to {}, outside the store " + store + ", through a link; refused"
    for read in (storage.read_bytes, storage.head, storage.size, storage.exists, storage.open_read):
        with pytest.raises(
            storage.StorageError, match=re.escape(f"{store}/out.bin: " + refused.format(tmp_path / "outside.bin"))
        ):
            read(f"{store}/out.bin")
    with pytest.raises(storage.StorageError, match=re.escape(refused.format(tmp_path / "elsewhere" / "new.bin"))):
        storage.write_bytes(f"{store}/folder/new.bin", b"escaped")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert storage.read_bytes(storage.to_uri(str(tmp_path / "outside.bin"))) == b"outside"  # no store's: a raw source
