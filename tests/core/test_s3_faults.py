"""S3 faults on the wire: the storage functions the stages use, and a few real stages, behind a fault-injecting
HTTP proxy (tests/support/fault_proxy.py) in front of the moto server. Faults: bursts of 503 SlowDown, a
connection reset in the middle of a GET's body, 409 ConditionalRequestConflict on a conditional PUT."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.retries.standard import ExponentialBackoff

from tasks.core import config, storage
from tasks.stages import encode_teacher, fit_pca, stage_corpus
from tests.support.fault_proxy import CONFLICT, RESET, SLOW_DOWN, FaultPlan, FaultProxy
from tests.support.projected_store import corpus_lines
from tests.support.tiny_models import build_sentence_model

pytestmark = [pytest.mark.s3, pytest.mark.models, pytest.mark.timeout(120)]

MIB = 1024 * 1024
DAY = date(2026, 11, 30)


@pytest.fixture
def retries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Backoffs shrunk to ~5 ms (botocore's standard mode and storage's own); returns who backed off, in order."""
    backed_off: list[str] = []

    def botocore_delay(self: ExponentialBackoff, context: Any) -> float:
        backed_off.append("botocore")
        return 0.005

    def storage_pause(seconds: float) -> None:
        backed_off.append("storage")

    monkeypatch.setattr(ExponentialBackoff, "delay_amount", botocore_delay)
    monkeypatch.setattr(storage.s3, "pause", storage_pause)
    return backed_off


@pytest.fixture
def proxy(
    s3_bucket: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, retries: list[str]
) -> Iterator[FaultProxy]:
    """The fault proxy in front of the S3 endpoint, with the storage clients pointed at it for one test."""
    if not s3_endpoint.startswith("http://"):
        pytest.skip("the fault proxy forwards plain http:// only")
    fault_proxy = FaultProxy(s3_endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.url)
    storage.reset_s3_clients()
    yield fault_proxy
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # s3_bucket empties its bucket directly afterwards
    storage.reset_s3_clients()
    fault_proxy.stop()


@pytest.fixture
def root(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/root"


@contextmanager
def injected(proxy: FaultProxy, kind: str, count: int) -> Iterator[FaultPlan]:
    """Arm faults on the plan yielded; afterwards exactly ``count`` faults of ``kind`` were injected and the
    plan is used up (so the operation inside really met them)."""
    before = len(proxy.injected)
    yield proxy.plan
    assert [f.kind for f in proxy.injected[before:]] == [kind] * count, proxy.injected[before:]
    assert proxy.plan.pending() == 0


def direct_objects(endpoint: str, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` read straight from the S3 endpoint (no proxy, no storage code)."""
    client = boto3.client("s3", endpoint_url=endpoint)
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
        for o in page.get("Contents", [])
    ]
    return {k[len(prefix) + 1 :]: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parquet_bytes(rows: int) -> tuple[pa.Table, bytes]:
    table = pa.table({"id": list(range(rows)), "text": [f"sentence {i} " * 8 for i in range(rows)]})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return table, sink.getvalue()


@pytest.fixture
def objects(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """The payloads: small, big (a 3-part multipart upload: 5 + 5 + 1 MiB) and a Parquet table."""
    monkeypatch.setenv("HPD_S3_MULTIPART_THRESHOLD", str(6 * MIB))
    monkeypatch.setenv("HPD_S3_PART_SIZE", str(5 * MIB))
    return {"small": os.urandom(300_000), "big": os.urandom(11 * MIB), "t.parquet": parquet_bytes(20_000)[1]}


# -------------------------------------------------------------------------------- 503 SlowDown


def test_every_operation_survives_slow_down_bursts(
    proxy: FaultProxy, root: str, objects: dict[str, bytes], s3_endpoint: str, s3_bucket: str
) -> None:
    with injected(proxy, SLOW_DOWN, 3) as plan:
        plan.slow_down(3, "PUT", "/small$")
        storage.write_bytes(f"{root}/small", objects["small"])
    with injected(proxy, SLOW_DOWN, 5) as plan:  # create, parts 1 and 2, complete
        plan.slow_down(1, "POST", r"/big\?uploads")
        plan.slow_down(2, "PUT", r"/big\?uploadId=.*&partNumber=1$")
        plan.slow_down(1, "PUT", r"/big\?uploadId=.*&partNumber=2$")
        plan.slow_down(1, "POST", r"/big\?uploadId=[^&]*$")
        assert storage.write_bytes(f"{root}/big", objects["big"]).size == 11 * MIB
    with injected(proxy, SLOW_DOWN, 2) as plan:
        plan.slow_down(2, "PUT", r"/t\.parquet$")
        storage.write_bytes(f"{root}/t.parquet", objects["t.parquet"])
    for name, data in objects.items():
        with injected(proxy, SLOW_DOWN, 3) as plan:
            plan.slow_down(3, "GET", f"/{name}$")
            assert storage.read_bytes(f"{root}/{name}") == data
        with injected(proxy, SLOW_DOWN, 2) as plan:
            plan.slow_down(2, "GET", f"/{name}$")
            assert storage.read_bytes(f"{root}/{name}", sha(data)) == data
    table = pq.read_table(pa.BufferReader(objects["t.parquet"]))
    with injected(proxy, SLOW_DOWN, 4) as plan:
        plan.slow_down(4, "GET", r"/t\.parquet$")
        assert storage.read_parquet(f"{root}/t.parquet", ["text"]).equals(table.select(["text"]))
        assert storage.read_parquet(f"{root}/t.parquet", sha256=sha(objects["t.parquet"])).equals(table)
    with injected(proxy, SLOW_DOWN, 3) as plan:
        plan.slow_down(3, "GET", "list-type=2")
        assert storage.list_uris(root) == sorted(f"{root}/{n}" for n in objects)
    with injected(proxy, SLOW_DOWN, 2) as plan:
        plan.slow_down(2, "HEAD", "/small$")
        assert storage.head(f"{root}/small").size == len(objects["small"])
    with injected(proxy, SLOW_DOWN, 6) as plan:
        plan.slow_down(6, "PUT", "/doc$")
        first = storage.compare_and_swap(f"{root}/doc", b"v1", None)
        storage.compare_and_swap(f"{root}/doc", b"v2", first.etag)
        assert storage.put_if_absent(f"{root}/once", b"x") and not storage.put_if_absent(f"{root}/once", b"y")
    assert direct_objects(s3_endpoint, s3_bucket, "root") == {**objects, "doc": b"v2", "once": b"x"}


# ------------------------------------------------------------------------- reset mid-GET body


def test_every_read_survives_a_connection_reset_mid_body(
    proxy: FaultProxy, root: str, objects: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, data in objects.items():
        storage.write_bytes(f"{root}/{name}", data)
    storage.write_bytes(f"{root}/doc.json", json.dumps({"a": list(range(500))}).encode())
    for name, data in objects.items():
        with injected(proxy, RESET, 2) as plan:
            plan.reset_get(2, f"/{name}$", fraction=0.3)
            assert storage.read_bytes(f"{root}/{name}") == data
        with injected(proxy, RESET, 2) as plan:  # the re-read goes further than the first: hashed once each
            plan.reset_get(1, f"/{name}$", fraction=0.3)
            plan.reset_get(1, f"/{name}$", fraction=0.7)
            assert storage.read_bytes(f"{root}/{name}", sha(data)) == data
    assert all(0 < f.sent < len(objects[f.target.rsplit("/", 1)[1]]) for f in proxy.injected)
    table = pq.read_table(pa.BufferReader(objects["t.parquet"]))
    with injected(proxy, RESET, 2) as plan:
        plan.reset_get(2, r"/t\.parquet$")
        assert storage.read_parquet(f"{root}/t.parquet", ["id"]).equals(table.select(["id"]))
        assert storage.read_parquet(f"{root}/t.parquet", sha256=sha(objects["t.parquet"])).equals(table)
    with injected(proxy, RESET, 1) as plan:
        plan.reset_get(1, r"/doc\.json$")
        assert storage.read_json_versioned(f"{root}/doc.json")[0] == {"a": list(range(500))}


def test_a_streamed_read_resumes_where_a_reset_broke_it(
    proxy: FaultProxy, root: str, objects: dict[str, bytes]
) -> None:
    for name, data in objects.items():
        storage.write_bytes(f"{root}/{name}", data)
    for name, data in objects.items():
        with injected(proxy, RESET, 2) as plan:  # the first GET and the ranged one resuming it both break off
            plan.reset_get(1, f"/{name}$", fraction=0.3)
            plan.reset_get(1, f"/{name}$", fraction=0.5)
            with storage.open_read(f"{root}/{name}") as stream:
                assert b"".join(iter(lambda s=stream: s.read(100_000), b"")) == data
        with injected(proxy, RESET, 1) as plan:
            plan.reset_get(1, f"/{name}$", fraction=0.6)
            assert storage.sha256_of(f"{root}/{name}") == sha(data)


def test_read_retries_are_bounded(proxy: FaultProxy, root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(200_000)
    storage.write_bytes(f"{root}/obj", data)
    monkeypatch.setenv("HPD_S3_MAX_ATTEMPTS", "3")
    with injected(proxy, RESET, 3) as plan:
        plan.reset_get(3, "/obj$")
        with pytest.raises(storage.StorageError) as err:
            storage.read_bytes(f"{root}/obj", sha(data))
    assert not isinstance(err.value, storage.IntegrityError) and str(err.value).startswith(f"{root}/obj")


# ------------------------------------------------------------------ 409 ConditionalRequestConflict


def test_conditional_writes_retry_a_conflict_and_do_not_count_it_as_lost(
    proxy: FaultProxy, root: str, retries: list[str], s3_endpoint: str, s3_bucket: str
) -> None:
    doc = f"{root}/doc"
    with injected(proxy, CONFLICT, 2) as plan:
        plan.conflict(2, "/doc$")
        first = storage.compare_and_swap(doc, b"v1", None)
    with injected(proxy, CONFLICT, 3) as plan:
        plan.conflict(3, "/doc$")
        second = storage.compare_and_swap(doc, b"v2", first.etag)
    with injected(proxy, CONFLICT, 1) as plan:
        plan.conflict(1, "/once$")
        assert storage.put_if_absent(f"{root}/once", b"x") is True
    assert retries.count("storage") == 6, "each 409 is retried after a backoff"
    # A real loss (412) is still a loss, at once.
    assert storage.put_if_absent(f"{root}/once", b"y") is False
    with pytest.raises(storage.PreconditionFailed):
        storage.compare_and_swap(doc, b"v3", first.etag)
    assert direct_objects(s3_endpoint, s3_bucket, "root") == {"doc": b"v2", "once": b"x"}
    assert storage.head(doc).etag == second.etag


def test_conflict_retries_are_bounded_and_not_a_lost_swap(
    proxy: FaultProxy, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = storage.compare_and_swap(f"{root}/doc", b"v1", None)
    monkeypatch.setenv("HPD_S3_MAX_ATTEMPTS", "2")
    with injected(proxy, CONFLICT, 2) as plan:
        plan.conflict(2, "/doc$")
        with pytest.raises(storage.StorageError, match="ConditionalRequestConflict") as err:
            storage.compare_and_swap(f"{root}/doc", b"v2", info.etag)
    assert not isinstance(err.value, storage.PreconditionFailed)
    assert storage.read_bytes(f"{root}/doc") == b"v1"


# --------------------------------------------------------------------------- stages, end to end


def run_stages(store: str, raw: Path, teacher: str) -> None:
    """stage-corpus (4 shards), encode-teacher, fit-pca (k=8, with the projected targets)."""
    stage_corpus.run(
        config.parse(
            stage_corpus.StageCorpusParams, {"store": store, "source": str(raw), "ingest_date": DAY, "shard_rows": 15}
        )
    )
    encode_teacher.run(
        config.parse(
            encode_teacher.EncodeTeacherParams,
            {"store": store, "teacher": teacher, "ingest_date": DAY, "threads": 1, "device": "cpu"},
        )
    )
    fit_pca.run(config.parse(fit_pca.FitPCAParams, {"store": store, "teacher": teacher, "k": 8}))


def arm_all_kinds(plan: FaultPlan, prefix: str) -> None:
    """Faults of all three kinds, spread over the three stages' reads, writes and listings."""
    plan.slow_down(2, "PUT", rf"^/[^/]+/{prefix}/.*\.parquet$")  # a shard write
    plan.slow_down(2, "GET", rf"list-type=2.*prefix={prefix}/")  # a listing
    plan.slow_down(1, "HEAD", rf"^/[^/]+/{prefix}/")
    plan.reset_get(1, rf"^/[^/]+/{prefix}/sentences/.*\.parquet$")  # encode-teacher reads a sentences shard
    plan.reset_get(2, rf"^/[^/]+/{prefix}/teacher/.*\.parquet$")  # fit-pca reads teacher embeddings
    plan.reset_get(1, rf"^/[^/]+/{prefix}/manifests/")  # a manifest read
    for stage in ("stage_corpus", "encode_teacher", "fit_pca"):  # each stage's first manifest write
        plan.conflict(1, rf"^/[^/]+/{prefix}/manifests/{stage}/")


def manifest_outputs(document: bytes) -> dict[str, str]:
    return {o["key"]: o["sha256"] for o in json.loads(document)["outputs"]}


def test_stages_under_all_faults_publish_the_same_bytes_as_a_fault_free_run(
    proxy: FaultProxy, s3_bucket: str, s3_endpoint: str, tmp_path: Path
) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text("\n".join(corpus_lines(60)))
    teacher = str(build_sentence_model(tmp_path / "teacher", hidden=48, seed=1))
    run_stages(f"s3://{s3_bucket}/clean", raw, teacher)
    assert proxy.injected == []
    arm_all_kinds(proxy.plan, "faulty")
    run_stages(f"s3://{s3_bucket}/faulty", raw, teacher)
    assert proxy.plan.pending() == 0, proxy.plan.rules
    assert proxy.kinds() == {SLOW_DOWN: 5, RESET: 4, CONFLICT: 3}

    clean = direct_objects(s3_endpoint, s3_bucket, "clean")
    faulty = direct_objects(s3_endpoint, s3_bucket, "faulty")
    assert sorted(faulty) == sorted(clean)
    manifests = {k for k in clean if k.startswith("manifests/")}
    assert len(manifests) >= 3 and len(clean) > len(manifests)
    for key in sorted(set(clean) - manifests):
        assert faulty[key] == clean[key], key
    for key in sorted(manifests):
        outputs, clean_outputs = manifest_outputs(faulty[key]), manifest_outputs(clean[key])
        assert outputs.keys() == clean_outputs.keys(), key
        for output, digest in outputs.items():
            assert sha(faulty[output]) == digest, output  # what the faulty run published is what it recorded
            assert digest == clean_outputs[output], output
