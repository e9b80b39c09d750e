"""A store copied to another root is complete and valid there: manifests, pointers and the checkpoint pointer
name what lies below the store by store-relative key, and the root is in no fingerprint. A store built
through the real stages (tiny models) is copied (a folder with ``shutil.copytree``; an S3 prefix object by
object to another prefix); every stage rerun on the copy with the same params skips, ``hpd search`` answers
from the copy, a changed param rebuilds in the copy only, and the original stays byte-identical."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from tasks import cli
from tasks.core import catalog, config, manifest, storage
from tasks.core.catalog import IndexPointer, Pointer, Stage
from tasks.ml import segments, vector_index
from tasks.ml.hits import Hit
from tasks.stages import build_index, drift, encode_teacher, fit_pca, gc, stage_corpus, validate
from tests.support.projected_store import corpus_lines, distill_tiny, projected_store
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)
LINES = corpus_lines(160)
SHARD_ROWS = 80
QUERY = LINES[7]
RUN = (
    Stage.STAGE_CORPUS,
    Stage.ENCODE_TEACHER,
    Stage.FIT_PCA,
    Stage.DISTILL,
    Stage.VALIDATE,
    Stage.BUILD_INDEX,
    Stage.DRIFT,
)


# -- the stages, with the params the original was built with ------------------------------------------------
def _corpus(prepared: dict[str, str], store: str, **changed: Any) -> manifest.StageResult:
    values = {"store": store, "source": prepared["source"], "ingest_date": DAY, "shard_rows": SHARD_ROWS}
    return stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, {**values, **changed}))


def _encode(prepared: dict[str, str], store: str) -> manifest.StageResult:
    values = {"store": store, "teacher": prepared["teacher"], "ingest_date": DAY, "teacher_sample": 0}  # as encoded
    return encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, values))


def _pca(prepared: dict[str, str], store: str) -> manifest.StageResult:
    return fit_pca.run(config.parse(fit_pca.FitPCAParams, {"store": store, "teacher": prepared["teacher"], "k": 8}))


def _distill(prepared: dict[str, str], store: str, max_steps: int = 2) -> manifest.StageResult:
    return distill_tiny({**prepared, "store": store}, "tiny", max_steps=max_steps)


def _validate(store: str) -> manifest.StageResult:
    values = {"store": store, "model_run": "tiny", "retrieval_sample": 100, "max_regression": 100.0}
    return validate.run(config.parse(validate.ValidateParams, values))


def _index(store: str, **changed: Any) -> manifest.StageResult:
    values = {"store": store, "model_run": "tiny", "index_type": "flat", "name": "tiny", **changed}
    return build_index.run(config.parse(build_index.BuildIndexParams, values))


def _drift(store: str) -> manifest.StageResult:
    """The staged partition against the promoted model's training data: itself."""
    return drift.run(config.parse(drift.DriftParams, {"store": store, "ingest_date": DAY}))


def _rerun_every_stage(prepared: dict[str, str], store: str) -> dict[str, bool]:
    """Whether each stage, rerun on ``store`` with the original's params, skipped."""
    results = {
        Stage.STAGE_CORPUS: _corpus(prepared, store),
        Stage.ENCODE_TEACHER: _encode(prepared, store),
        Stage.FIT_PCA: _pca(prepared, store),
        Stage.DISTILL: _distill(prepared, store),
        Stage.VALIDATE: _validate(store),
        Stage.BUILD_INDEX: _index(store),
        Stage.DRIFT: _drift(store),
    }
    return {str(stage): result.skipped for stage, result in results.items()}


def _searched(store: str, capsys: pytest.CaptureFixture[str]) -> list[Hit]:
    """The hits of ``hpd search`` on ``store`` (the CLI, then the function for the hits themselves)."""
    capsys.readouterr()
    assert cli.main(["search", QUERY, "-k", "2", "--store", store]) == 0
    assert QUERY in capsys.readouterr().out
    return vector_index.search(store, QUERY, k=2)


def _assert_resolved_into(store: str) -> None:
    """Every manifest and pointer of ``store`` names objects of ``store`` (or the raw file outside it)."""
    for stage in Stage:
        for key in manifest.list_keys(store, stage):
            published = manifest.read(store, stage, key)
            assert published is not None
            assert all(o.uri.startswith(store + "/") for o in published.outputs)
            assert all(i.uri.startswith(store + "/") or i.uri.endswith("/raw.txt") for i in published.inputs)
    index, _ = catalog.read_pointer(store, Pointer.INDEX)
    assert index is not None and all(u.startswith(store + "/") for u in (index.index, index.manifest))
    assert all(o.uri.startswith(store + "/") for s in segments.read_table(store, index.index)[1] for o in s.outputs)


def _later_runs_change_nothing_the_pointers_name(prepared: dict[str, str], store: str, hits: list[Hit]) -> None:
    """Under the promoted names: a new distill run, a rebuild with other params and a forced rebuild with the
    same ones, none promoted. The pointers, and every object they name, stay byte for byte; search answers as
    before (the student that encoded the index encodes the query); gc keeps all of it, and deletes the
    rebuild that nothing names any longer."""
    index = catalog.read_pointer(store, Pointer.INDEX)[0]
    assert isinstance(index, IndexPointer) and index.model is not None
    pointers = {p: storage.read_bytes(catalog.pointer_uri(store, p)) for p in Pointer}
    served = manifest.read_at(store, index.model)
    listed = [o.uri for segment in segments.read_table(store, index.index)[1] for o in segment.outputs]
    named = [index.index, index.manifest, index.model, *listed, *(o.uri for o in served.outputs)]
    before = {uri: storage.read_bytes(uri) for uri in named}
    assert not _distill(prepared, store, max_steps=3).skipped
    other = _index(store, index_type="hnsw", promote=False).manifest
    forced = build_index.run(
        config.parse(
            build_index.BuildIndexParams,
            {"store": store, "model_run": "tiny", "index_type": "flat", "name": "tiny", "promote": False},
        ),
        force=True,
    ).manifest
    assert manifest.read(store, Stage.BUILD_INDEX, "tiny") == forced and forced.run_id != index.run_id
    assert {p: storage.read_bytes(catalog.pointer_uri(store, p)) for p in Pointer} == pointers
    assert {uri: storage.read_bytes(uri) for uri in named} == before
    assert vector_index.search(store, QUERY, k=2) == hits
    gc.run(config.parse(gc.GCParams, {"store": store, "retention_hours": 0}))
    assert {uri: storage.read_bytes(uri) for uri in named} == before
    assert vector_index.search(store, QUERY, k=2) == hits
    assert not any(storage.exists(uri) for uri in [other.version_uri(store), *(o.uri for o in other.outputs)])
    assert all(storage.exists(o.uri) for o in forced.outputs)


# -- the file store -----------------------------------------------------------------------------------------
def _file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file below ``folder`` (hidden ones too), by relative path."""
    hashes = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = Path(dirpath) / name
            hashes[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A file store through every stage: staged (2 shards), encoded, projected (k=8), distilled ('tiny'),
    validated (and promoted), indexed (and promoted), scored for drift."""
    root = tmp_path_factory.mktemp("original")
    prepared = {**projected_store(root, LINES, DAY, SHARD_ROWS), "source": str(root / "raw.txt")}
    _distill(prepared, prepared["store"])
    assert _validate(prepared["store"]).stats["gate"]["passed"]
    _index(prepared["store"])
    _drift(prepared["store"])
    return {**prepared, "folder": str(root / "store")}


def _copied(original: dict[str, str], tmp_path: Path) -> tuple[Path, str]:
    target = tmp_path / "elsewhere" / "store"
    shutil.copytree(original["folder"], target)
    return target, storage.to_uri(str(target))


@contextmanager
def _moved_away(folder: Path) -> Iterator[None]:
    """``folder`` renamed for the duration: whatever still reads or writes the original finds nothing there."""
    hidden = folder.with_name(folder.name + ".moved-away")
    folder.rename(hidden)
    try:
        yield
    finally:
        hidden.rename(folder)


def test_a_rerun_on_a_copy_leaves_the_original_whole(original, tmp_path):
    """The defect as reported: stage-corpus rerun on ``cp -a store copy`` deleted the original's shards."""
    folder = Path(original["folder"])
    before = _file_hashes(folder)
    _, copy = _copied(original, tmp_path)
    result = _corpus(original, copy)
    assert _file_hashes(folder) == before
    assert result.skipped
    assert manifest.read(original["store"], Stage.STAGE_CORPUS, catalog.partition_key(DAY)) is not None
    assert [o.uri for o in result.outputs] == [
        f"{copy}/sentences/ingest_date=2026-11-01/{name}"
        for name in sorted(p.name for p in (folder / "sentences" / "ingest_date=2026-11-01").iterdir())
    ]


def test_every_stage_skips_on_a_copy_that_needs_nothing_of_the_original(original, tmp_path, capsys):
    folder = Path(original["folder"])
    before = _file_hashes(folder)
    hits = _searched(original["store"], capsys)
    target, copy = _copied(original, tmp_path)
    with _moved_away(folder):
        assert _rerun_every_stage(original, copy) == {str(stage): True for stage in RUN}
        _assert_resolved_into(copy)
        assert _searched(copy, capsys) == hits
        promoted = catalog.read_pointer(copy, Pointer.MODEL)[0]
        validated = manifest.read(copy, Stage.VALIDATE, "tiny")
        assert promoted is not None and validated is not None and promoted.validation == validated.version_uri(copy)
        assert _file_hashes(target) == before  # a skip writes nothing
    assert _file_hashes(folder) == before


def test_later_runs_under_the_promoted_names_change_nothing_a_pointer_names(original, tmp_path, capsys):
    hits = _searched(original["store"], capsys)
    _, copy = _copied(original, tmp_path)
    _later_runs_change_nothing_the_pointers_name({**original, "store": copy}, copy, hits)


def test_a_changed_param_on_a_copy_rebuilds_in_the_copy_only(original, tmp_path, capsys):
    folder = Path(original["folder"])
    before = _file_hashes(folder)
    target, copy = _copied(original, tmp_path)
    with _moved_away(folder):
        shards_before = {p.name for p in (target / "sentences" / "ingest_date=2026-11-01").iterdir()}
        restaged = _corpus(original, copy, shard_rows=50)
        assert not restaged.skipped and len(restaged.outputs) == 4
        assert all(o.uri.startswith(f"{copy}/sentences/") for o in restaged.outputs)
        shards_after = {p.name for p in (target / "sentences" / "ingest_date=2026-11-01").iterdir()}
        written = {o.name for o in restaged.outputs}
        assert written <= shards_after and not written & shards_before  # whatever becomes of the replaced ones
        # the change flows down the chain, every stage rebuilding in the copy
        rebuilt = [_encode(original, copy), _pca(original, copy), _distill(original, copy), _index(copy)]
        assert [r.skipped for r in rebuilt] == [False] * 4
        assert all(o.uri.startswith(copy + "/") for r in rebuilt for o in r.outputs)
        _assert_resolved_into(copy)
        assert _searched(copy, capsys)[0].text == QUERY
    assert _file_hashes(folder) == before


# -- an S3 prefix copied to another prefix ------------------------------------------------------------------
def _s3_hashes(bucket: str, prefix: str) -> dict[str, str]:
    client, hashes = storage.s3_client(), {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            hashes[item["Key"][len(prefix) + 1 :]] = hashlib.sha256(body).hexdigest()
    return hashes


def _copy_prefix(bucket: str, source: str, target: str) -> None:
    client = storage.s3_client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=source + "/"):
        for item in page.get("Contents", []):
            destination = target + item["Key"][len(source) :]
            client.copy_object(Bucket=bucket, Key=destination, CopySource={"Bucket": bucket, "Key": item["Key"]})


@contextmanager
def _s3_requests() -> Iterator[list[str]]:
    """``bucket/key-or-prefix`` of every S3 request made meanwhile (a botocore event hook; a bucket-level
    request, e.g. HeadBucket, shows as ``bucket/``)."""
    seen: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        seen.append(f"{params.get('Bucket')}/{params.get('Key', params.get('Prefix', ''))}")

    events = storage.s3_client().meta.events
    events.register("before-parameter-build.s3", record, unique_id="copied-store-test")
    try:
        yield seen
    finally:
        events.unregister("before-parameter-build.s3", unique_id="copied-store-test")


@pytest.mark.s3
def test_a_store_copied_to_another_s3_prefix_is_complete_there(s3_bucket, tmp_path, capsys):
    """The original under ``s3://bucket/root``, the copy under ``s3://bucket/root-copy`` (a prefix that
    starts with the original's): built through the stages on S3, copied object by object."""
    store, copy = f"s3://{s3_bucket}/root", f"s3://{s3_bucket}/root-copy"
    (tmp_path / "raw.txt").write_text("\n".join(LINES))
    prepared = {
        "store": store,
        "source": str(tmp_path / "raw.txt"),
        "teacher": str(build_sentence_model(tmp_path / "teacher", hidden=48, seed=1)),
        "student": str(build_sentence_model(tmp_path / "student", hidden=32, seed=2)),
    }
    for build in (_corpus, _encode, _pca, _distill):
        build(prepared, store)
    assert _validate(store).stats["gate"]["passed"]
    _index(store)
    _drift(store)
    hits = _searched(store, capsys)
    before = _s3_hashes(s3_bucket, "root")
    _copy_prefix(s3_bucket, "root", "root-copy")
    with _s3_requests() as requests:
        assert _rerun_every_stage(prepared, copy) == {str(stage): True for stage in RUN}
        _assert_resolved_into(copy)
        assert _searched(copy, capsys) == hits
        assert not _corpus(prepared, copy, shard_rows=50).skipped
        assert not _encode(prepared, copy).skipped
    assert [r for r in requests if r.startswith(f"{s3_bucket}/root/")] == []  # no request reached the original
    assert len([r for r in requests if r.startswith(f"{s3_bucket}/root-copy/")]) > 20
    assert _s3_hashes(s3_bucket, "root") == before
    assert _s3_hashes(s3_bucket, "root-copy").keys() != before.keys()  # the rebuild happened in the copy
    _later_runs_change_nothing_the_pointers_name(prepared, store, hits)
