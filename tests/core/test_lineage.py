import json
import re
from datetime import date
from pathlib import Path

import faiss
import numpy as np
import pytest

from tasks import cli
from tasks.core import catalog, config, lineage, storage
from tasks.core.catalog import Stage
from tasks.stages import build_index
from tests.support.projected_store import corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY1, DAY2 = date(2026, 11, 1), date(2026, 11, 2)


# -- hpd lineage: back from an artifact, forward from a partition ----------------------------------------------
@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """A tiny store: one partition (2 shards) staged from raw.txt, encoded, projected, distilled as 'tiny',
    indexed and promoted as 'tiny', and indexed again as 'spare' (not promoted)."""
    root = tmp_path_factory.mktemp("trace")
    prepared = projected_store(root, corpus_lines(40), DAY1, shard_rows=20)
    distill_tiny(prepared, "tiny", max_steps=2)
    for name, promote in (("tiny", True), ("spare", False)):
        values = {"store": prepared["store"], "model_run": "tiny", "index_type": "flat", "name": name}
        build_index.run(config.parse(build_index.BuildIndexParams, {**values, "promote": promote}))
    return prepared["store"], root


def _objects(traced, kind="object"):
    return {catalog.store_key(traced.store, n.uri) or n.uri: n for n in traced.root.walk() if n.kind == kind}


def test_lineage_of_the_index_reaches_the_staged_partition_and_its_source(indexed):
    store, root = indexed
    traced = lineage.trace(store, "indexes/current.json")
    raw = storage.to_uri(str(root / "raw.txt"))
    assert traced.partitions == ["2026-11-01"] and traced.sources == {raw: lineage.VERIFIED}
    objects = _objects(traced)
    staged = [key for key in objects if key.startswith("sentences/ingest_date=2026-11-01/")]
    assert len(staged) == 2 and all(n.status == lineage.VERIFIED for n in objects.values())
    assert any(key.startswith("teacher/") for key in objects) and any(key.startswith("targets/") for key in objects)
    runs = {(n.stage, n.key) for n in traced.root.walk() if n.kind == "manifest"}
    assert {("build_index", "tiny"), ("distill", "tiny"), ("stage_corpus", "ingest_date=2026-11-01")} <= runs
    tree = traced.render()
    assert tree.startswith("indexes/current.json\n  indexes/tiny/") and "\n    build_index tiny\n" in tree
    assert (
        f"      distill tiny  fingerprint {traced.root.children[0].children[0].children[0].sha256[:8]} verified" in tree
    )
    assert "stage_corpus ingest_date=2026-11-01\n" in tree and f"{raw}  " in tree
    assert tree.endswith(f"partitions: 2026-11-01\nsource: {raw} (verified)")


def test_the_lineage_of_a_model_says_which_rows_the_teacher_saw(tmp_path):
    """A model learns from the teacher's sample of each partition: its lineage names each sample's rows (25 of
    the 40 staged here) beside the encode run of each shard, the shards' sentence ids in the teacher's shards."""
    prepared = projected_store(tmp_path, corpus_lines(40), DAY1, shard_rows=20, teacher_sample=25)
    distill_tiny(prepared, "sampled", max_steps=1)
    traced = lineage.trace(prepared["store"], "sampled")
    notes = [n.note for n in traced.root.walk() if n.stage == "encode_teacher" and not n.seen]
    seen = [int(re.fullmatch(r"the teacher saw (\d+) of 20 rows", note).group(1)) for note in notes]
    assert len(seen) == 2 and sum(seen) == 25
    assert all(f"({note})" in traced.render() for note in notes)
    assert traced.to_dict()["root"]["note"] is None  # a distill run's node: nothing to say of its inputs


@pytest.mark.parametrize(
    ("target", "first"),
    [
        ("tiny", "distill tiny"),  # a model run
        ("manifests/build_index/spare.json", "build_index spare"),
        ("manifests/fit_pca/teacher/k8-uncentered.json", "fit_pca teacher/k8-uncentered"),
    ],
)
def test_lineage_starts_from_a_model_run_or_a_manifest(indexed, target, first):
    traced = lineage.trace(indexed[0], target)
    assert traced.render().splitlines()[0] == first and traced.partitions == ["2026-11-01"]


def test_one_flipped_byte_in_a_teacher_shard_fails_naming_it(indexed, capsys):
    store, _ = indexed
    shard = next(u for u in storage.list_uris(f"{store}/teacher") if u.endswith(".parquet"))
    path = Path(shard.removeprefix("file://"))
    body = path.read_bytes()
    path.write_bytes(body[:100] + bytes([body[100] ^ 1]) + body[101:])
    try:
        with pytest.raises(lineage.LineageError, match=re.escape(shard) + r": sha256 mismatch"):
            lineage.trace(store, "indexes/current.json")
        capsys.readouterr()
        assert cli.main(["lineage", "--store", store]) == 1
        err = capsys.readouterr().err
        assert shard in err and "manifests/fit_pca/" in err and "Traceback" not in err
    finally:
        path.write_bytes(body)


def _another_faiss_index(path: Path) -> bytes:
    """A valid FAISS index (8-d, other vectors) in place of the one at ``path``."""
    index = faiss.IndexFlatIP(8)
    index.add(np.random.default_rng(0).standard_normal((40, 8)).astype("float32"))
    return faiss.serialize_index(index).tobytes()


def _flipped(path: Path) -> bytes:
    body = path.read_bytes()
    return body[:100] + bytes([body[100] ^ 1]) + body[101:]


@pytest.mark.parametrize(
    ("file", "replacement"),
    [
        ("segments/*/index.faiss", _another_faiss_index),
        ("segments/*/ids-*", _flipped),
        ("student_embeddings/*", _flipped),
    ],
)
def test_a_segment_file_replaced_under_the_promoted_index_fails_naming_it(indexed, capsys, file, replacement):
    """``hpd search`` refuses an index whose segment files are not what its table records; so does the audit."""
    store, _ = indexed
    pointer, _ = catalog.read_pointer(store, catalog.Pointer.INDEX)
    folder = Path(pointer.index.removeprefix("file://")).parent
    path = sorted(folder.glob(file))[0]
    body = path.read_bytes()
    path.write_bytes(replacement(path))
    try:
        uri = storage.to_uri(str(path))
        with pytest.raises(lineage.LineageError, match=re.escape(uri) + r": sha256 mismatch.*segments\.json"):
            lineage.trace(store, "indexes/current.json")
        capsys.readouterr()
        assert cli.main(["lineage", "--store", store]) == 1
        err = capsys.readouterr().err
        assert uri in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    finally:
        path.write_bytes(body)
    assert {catalog.store_key(store, storage.to_uri(str(path)))} <= set(
        _objects(lineage.trace(store, "indexes/current.json"))
    )


def test_a_segment_file_the_table_and_its_manifest_record_differently_fails_naming_it(indexed):
    store, _ = indexed
    built = Path(catalog.manifest_uri(store, Stage.BUILD_INDEX, "tiny").removeprefix("file://"))
    body = built.read_text()
    record = json.loads(body)
    faiss_file = next(o for o in record["outputs"] if o["key"].endswith("/index.faiss"))
    built.write_text(body.replace(faiss_file["sha256"], "0" * 64))
    try:
        with pytest.raises(lineage.LineageError, match=re.escape(faiss_file["key"]) + r": sha256 .* in the segment"):
            lineage.trace(store, "indexes/current.json")
    finally:
        built.write_text(body)


def test_a_source_gone_is_unavailable_and_a_changed_one_fails(indexed):
    store, root = indexed
    raw = root / "raw.txt"
    body = raw.read_bytes()
    raw.unlink()
    try:
        traced = lineage.trace(store, "tiny")
        assert traced.sources == {storage.to_uri(str(raw)): lineage.UNAVAILABLE}
        assert traced.render().endswith("(unavailable, it is gone)")
        raw.write_bytes(body + b"\nan extra line")
        with pytest.raises(lineage.LineageError, match=re.escape(storage.to_uri(str(raw))) + r": sha256 mismatch"):
            lineage.trace(store, "tiny")
    finally:
        raw.write_bytes(body)


def test_impacted_by_a_partition_lists_targets_student_and_indexes_with_promotion(indexed, capsys):
    store, _ = indexed
    runs = {(r.stage, r.key): r for r in lineage.impacted(store, "ingest_date=2026-11-01")}
    assert [k[0] for k in runs] == ["stage_corpus", "encode_teacher", "encode_teacher", "fit_pca", "distill"] + [
        "build_index"
    ] * 2
    targets = [o for o in runs["fit_pca", "teacher/k8-uncentered"].outputs if o.startswith("targets/")]
    assert len(targets) == 2
    assert runs["distill", "tiny"].promoted == ("indexes/current.json",)
    assert runs["build_index", "tiny"].promoted == ("indexes/current.json",)
    assert runs["build_index", "spare"].promoted == () and runs["fit_pca", "teacher/k8-uncentered"].promoted == ()
    assert "indexes/tiny/" in runs["build_index", "tiny"].outputs[-1] and runs["build_index", "tiny"].outputs[
        -1
    ].endswith("/segments.json")
    assert lineage.impacted(store, "2026-11-01") == list(runs.values())
    assert cli.main(["lineage", "--impacted", "2026-11-01", "--store", store]) == 0
    out = capsys.readouterr().out
    assert "\nbuild_index tiny  PROMOTED (indexes/current.json)\n" in out and "\nbuild_index spare\n" in out
    assert out.rstrip().endswith("7 run(s) impacted, 30 artifact(s), 2 promoted")


def test_impacted_by_one_shard_leaves_out_the_other_shards_runs(indexed):
    store, _ = indexed
    shard = sorted(storage.list_uris(f"{store}/teacher"))[0]
    stages = [r.stage for r in lineage.impacted(store, shard)]
    assert stages == ["fit_pca", "distill", "build_index", "build_index"]


def test_json_round_trips(indexed, capsys):
    store, _ = indexed
    capsys.readouterr()
    assert cli.main(["lineage", "indexes/current.json", "-o", "json", "--store", store]) == 0
    record = json.loads(capsys.readouterr().out)
    assert lineage.Lineage.from_dict(record) == lineage.trace(store, "indexes/current.json")
    assert record["partitions"] == ["2026-11-01"]
    assert cli.main(["lineage", "--impacted", "ingest_date=2026-11-01", "-o", "json", "--store", store]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [lineage.Impacted.from_dict(r) for r in record["runs"]] == lineage.impacted(store, "2026-11-01")


@pytest.mark.parametrize(
    ("argv", "code", "named"),
    [
        (["tiny", "--impacted", "2026-11-01"], 2, "not both"),
        (["students/nope/x.json"], 1, "students/nope/x.json: no manifest in the store"),
        (["--impacted", "2026-11-02"], 1, "no partition ingest_date=2026-11-02 is staged"),
        (["--impacted", "2026-13-01"], 1, "'2026-13-01': not a partition"),
        (["--impacted", "/nowhere/raw.txt"], 1, "file:///nowhere/raw.txt: no manifest in the store"),
        (["manifests/../x.json"], 1, "not a store-relative key"),
    ],
)
def test_cli_errors(indexed, capsys, argv, code, named):
    capsys.readouterr()
    assert cli.main(["lineage", *argv, "--store", indexed[0]]) == code
    captured = capsys.readouterr()
    assert named in captured.err and "Traceback" not in captured.err and captured.out == ""


def test_nothing_promoted_is_an_error(tmp_path):
    store = storage.to_uri(str(tmp_path / "empty"))
    with pytest.raises(lineage.LineageError, match=r"indexes/current\.json: nothing is promoted"):
        lineage.trace(store, "indexes/current.json")
