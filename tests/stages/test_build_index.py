import logging
import re
import threading
from datetime import date

import faiss
import numpy as np
import pytest

from tasks import cli
from tasks.core import catalog, config, contracts, manifest, storage
from tasks.core.catalog import IndexPointer, ModelPointer, Pointer, Stage
from tasks.core.finite import NonFiniteError
from tasks.core.progress import format_bytes
from tasks.ml import segments, vector_index
from tasks.stages import build_index
from tests.support import faults
from tests.support.projected_store import distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)
TEXTS = [
    f"sentence {i} about {topic} and {i % 13}"
    for i, topic in enumerate(["cats", "markets", "rain", "music", "football", "trains"] * 50)
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with 300 staged sentences and a distilled tiny student (k=8) published as run 'tiny'."""
    prepared = projected_store(tmp_path_factory.mktemp("index"), TEXTS, DAY, shard_rows=120)
    distill_tiny(prepared, "tiny", max_steps=2)
    return prepared["store"]


def _build(store, **extra):
    return build_index.run(config.parse(build_index.BuildIndexParams, {"store": store, "model_run": "tiny", **extra}))


def test_flat_index_is_exact_promoted_and_searchable(store, capsys, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    result = _build(store, index_type="flat", name="flat")
    stats, built = result.stats, result.stats["built"]
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.stages.build_index"]
    assert lines[0] == "build_index flat: 1 partition(s) wanted: 0 in 0 kept segment(s), 1 to encode"
    assert lines[1].startswith("build_index flat encode: finished 300/300 rows (100.0%) in ")
    assert lines[2] == "build_index flat: a flat index (Flat) over 300 vectors"
    assert lines[3].startswith("build_index flat: built Flat over 300 vectors of dim 8 in ")
    assert f", {format_bytes(stats['bytes'])}; queries_per_s_batch1 " in lines[3] and lines[3].endswith(
        "recall_at_10 1.0"
    )
    table = result.manifest.output_named(segments.TABLE_FILE).uri
    assert lines[4] == f"build_index flat: promoted; {catalog.pointer_uri(store, Pointer.INDEX)} names {table}"
    assert stats["rows"] == 300 and stats["dim"] == 8 and stats["recall_at_10"] == 1.0
    assert (stats["segments"], stats["segments_kept"], stats["rows_encoded"]) == (1, 0, 300)
    assert built[0]["segment"] == DAY.isoformat() and built[0]["factory"] == "Flat"
    assert built[0]["queries_per_s_batch1"] > 0 and stats["bytes"] >= 300 * 8 * 4
    pointer, _ = catalog.read_pointer(store, Pointer.INDEX)  # store-relative keys, resolved against the store
    assert pointer.manifest == result.manifest.version_uri(store) and pointer.index == table and pointer.ids is None
    assert storage.read_bytes(pointer.manifest) == storage.read_bytes(result.manifest_uri)  # the version: a copy
    _, (segment,) = segments.read_table(store, table)
    ids = storage.read_parquet(segment.ids.uri)
    assert contracts.identify(ids.schema) == ("index_ids", 1) and ids.num_rows == 300
    assert segment.partitions.keys() == {DAY.isoformat()} and segment.embeddings
    embeddings = [o for o in result.outputs if o.contract == "student_embeddings"]
    assert sum(o.rows for o in embeddings) == 300 and set(embeddings) == set(segment.embeddings)
    hits = vector_index.search(store, TEXTS[7], k=3)
    assert hits[0].text == TEXTS[7] and hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert vector_index.load_current(store).query_encoder == "torch"  # the student exported no ONNX graph
    assert cli.main(["search", TEXTS[7], "-k", "2", "--store", store]) == 0
    assert TEXTS[7] in capsys.readouterr().out
    assert _build(store, index_type="flat", name="flat").skipped


def test_each_shards_published_embeddings_are_its_own_sentences_encoded(store, tmp_path):
    """The pending shards are encoded in one pass (sorted by length across shards) and published per shard: each
    row of a shard's embeddings is the student's encoding of that row's sentence alone."""
    from tasks.ml import student
    from tasks.ml.encoder import SentenceEncoder

    result = _build(store, index_type="flat", name="per-shard", promote=False)
    _, (segment,) = segments.read_table(store, result.manifest.output_named(segments.TABLE_FILE).uri)
    ids = storage.read_parquet(segment.ids.uri)
    text_of = dict(zip(ids.column("sentence_id").to_pylist(), ids.column("text").to_pylist(), strict=True))
    encoder = SentenceEncoder.load(str(student.fetch_published(manifest.read(store, Stage.DISTILL, "tiny"), tmp_path)))
    assert len(segment.embeddings) == 3
    for shard in segment.embeddings:
        table = storage.read_parquet(shard.uri)
        stored = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
        alone = np.concatenate([encoder.encode([text_of[s]]) for s in table.column("sentence_id").to_pylist()])
        assert np.allclose(stored, alone, atol=1e-5)


@pytest.mark.parametrize(
    ("index_type", "extra", "factory"),
    [
        ("hnsw", {"hnsw_m": 8}, "HNSW8,Flat"),
        ("ivf_flat", {"nlist": 4, "nprobe": 4}, "IVF4,Flat"),
        ("ivf_pq", {"nlist": 4, "nprobe": 4, "pq_m": 4, "pq_bits": 4}, "IVF4,PQ4x4,RFlat"),
        ("ivf_pq", {"nlist": 4, "nprobe": 4, "pq_m": 4, "pq_bits": 4, "refine": "sq8"}, "IVF4,PQ4x4,Refine(SQ8)"),
        ("ivf_pq", {"nlist": 4, "nprobe": 4, "pq_m": 4, "pq_bits": 4, "refine": "none"}, "IVF4,PQ4x4"),
        ("flat", {"sq8": True}, "SQ8"),
    ],
)
def test_index_types(store, index_type, extra, factory):
    result = _build(
        store, index_type=index_type, name=f"t-{index_type}-{len(extra)}", promote=False, min_recall=0, **extra
    )
    stats = result.stats["built"][0]
    assert stats["factory"] == factory
    assert 0.3 <= stats["recall_at_10"] <= 1.0


def test_the_ivf_pq_re_rank_recalls_more_than_pq_distances_alone(store):
    settings = {"index_type": "ivf_pq", "nlist": 4, "nprobe": 4, "pq_m": 4, "pq_bits": 4, "promote": False}
    recall = {
        refine: _build(store, name=f"rerank-{refine}", refine=refine, min_recall=0, **settings).stats["recall_at_10"]
        for refine in ("none", "sq8", "flat")
    }
    assert recall["flat"] >= recall["sq8"] > recall["none"]


def test_ivf_search_breadth_is_raised_until_the_target_recall_and_saved_in_the_index(store):
    settings = {"index_type": "ivf_flat", "nlist": 16, "nprobe": 1, "promote": False, "min_recall": 0}
    as_given = _build(store, name="breadth-given", target_recall=0, **settings).stats["built"][0]
    tuned = _build(store, name="breadth-tuned", target_recall=0.99, **settings)
    assert as_given["nprobe"] == 1 and as_given["recall_at_10"] < 0.99
    assert tuned.stats["built"][0]["nprobe"] > 1 and tuned.stats["recall_at_10"] >= 0.99
    body = storage.read_bytes(tuned.manifest.output_named(build_index.INDEX_FILE).uri)
    loaded = faiss.deserialize_index(np.frombuffer(body, dtype=np.uint8))
    assert faiss.extract_index_ivf(loaded).nprobe == tuned.stats["built"][0]["nprobe"]


def test_hnsw_tuning_doubles_ef_search_until_the_recall_is_reached():
    vectors = np.random.default_rng(3).standard_normal((3000, 32), dtype=np.float32)
    faiss.normalize_L2(vectors)
    index = vector_index.build(vectors, "HNSW4,Flat", nprobe=1, ef_search=8)
    sample = vector_index.RecallSample.of(vectors)
    before = sample.recall(index)
    breadth = vector_index.tune_search(index, sample, target=0.99)
    assert before < 0.99 and breadth["ef_search"] in (16, 32, 64, 128, 256, 512, 1024)
    assert sample.recall(index) >= 0.99 or breadth["ef_search"] == vector_index.MAX_EF_SEARCH
    assert vector_index.tune_search(vector_index.build(vectors, "Flat", nprobe=1), sample, target=0.99) == {}


def test_tuning_stops_where_a_wider_search_no_longer_recalls_more():
    vectors = np.random.default_rng(5).standard_normal((4000, 16), dtype=np.float32)
    faiss.normalize_L2(vectors)
    coarse = vector_index.build(vectors, "IVF64,PQ2x4", nprobe=4)  # 1 byte a vector: the codes bound the recall
    sample = vector_index.RecallSample.of(vectors)
    breadth = vector_index.tune_search(coarse, sample, target=0.99)
    kept = sample.recall(coarse)
    assert kept < 0.99 and breadth["nprobe"] < 64
    faiss.extract_index_ivf(coarse).nprobe = 2 * breadth["nprobe"]
    assert sample.recall(coarse) - kept < vector_index.MIN_RECALL_GAIN


def test_the_recall_sample_leaves_each_query_out_of_its_own_neighbours():
    vectors = np.random.default_rng(4).standard_normal((500, 16), dtype=np.float32)
    faiss.normalize_L2(vectors)
    sample = vector_index.RecallSample.of(vectors, k=5)
    assert all(len(truth) == 5 and own not in truth for truth, own in zip(sample.truth, sample.rows, strict=True))
    assert sample.recall(vector_index.build(vectors, "Flat", nprobe=1)) == 1.0
    one_list = vector_index.build(vectors, "IVF50,Flat", nprobe=1)  # finds each query, misses most of the rest
    assert sample.recall(one_list) < 0.9


def test_auto_picks_by_size():
    assert build_index.choose_type("auto", 50_000) == "flat"
    assert build_index.choose_type("auto", 100_001) == "hnsw"
    assert build_index.choose_type("auto", 5_000_000) == "hnsw"
    assert build_index.choose_type("auto", 5_000_001) == "ivf_pq"
    assert build_index.choose_type("hnsw", 10) == "hnsw"


def test_concurrent_promotions_have_one_winner(store):
    _, seen = catalog.read_pointer(store, Pointer.INDEX)
    published = [_build(store, index_type="flat", name=f"race-{i}", promote=False) for i in range(2)]
    barrier, outcomes = threading.Barrier(2), []

    def promote(result):
        barrier.wait()
        try:
            outcomes.append(build_index.promote(store, result.manifest, seen).run_id)
        except build_index.PromotionConflict as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=promote, args=(r,)) for r in published]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if isinstance(o, str)]
    assert len(winners) == 1 and sum(isinstance(o, build_index.PromotionConflict) for o in outcomes) == 1
    pointer, _ = catalog.read_pointer(store, Pointer.INDEX)
    assert pointer.run_id == winners[0] and storage.exists(pointer.index)


def _promoted_run(store: str) -> str | None:
    pointer, _ = catalog.read_pointer(store, Pointer.INDEX)
    return None if pointer is None else pointer.run_id


class _Killed(BaseException):
    """Ends a run where a kill would, past every ``except Exception``."""


def test_a_rerun_completes_a_promotion_its_run_did_not_finish_and_never_takes_back_a_newer_one(
    store, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="tasks")
    with monkeypatch.context() as patch:  # killed between publishing its manifest and moving the pointer
        patch.setattr(build_index, "promote", lambda *args: (_ for _ in ()).throw(_Killed()))
        with pytest.raises(_Killed):
            _build(store, index_type="flat", name="stopped")
    stopped = manifest.read(store, Stage.BUILD_INDEX, "stopped")
    assert stopped is not None and _promoted_run(store) != stopped.run_id
    rerun = _build(store, index_type="flat", name="stopped")
    assert rerun.skipped and _promoted_run(store) == stopped.run_id
    assert "build_index stopped: published but its pointer move unfinished" in caplog.messages
    again = _build(store, index_type="flat", name="stopped")
    assert again.skipped and "build_index stopped: promoted already" in caplog.messages
    newer = _build(store, index_type="flat", name="newer")
    assert _build(store, index_type="flat", name="stopped").skipped is not False
    assert _promoted_run(store) == newer.manifest.run_id
    assert "build_index stopped: superseded: the pointer moved since this run read it" in caplog.messages


def test_missing_objects_leave_the_pointer_alone(store):
    _build(store, index_type="flat", name="promoted-before")
    before = storage.read_bytes(catalog.pointer_uri(store, Pointer.INDEX))
    result = _build(store, index_type="flat", name="broken", promote=False)
    index_uri = next(o.uri for o in result.outputs if o.uri.endswith("index.faiss"))
    storage.delete(index_uri)
    _, seen = catalog.read_pointer(store, Pointer.INDEX)
    with pytest.raises(vector_index.IndexBuildError, match=f"{index_uri}: missing"):
        build_index.promote(store, result.manifest, seen)
    assert storage.read_bytes(catalog.pointer_uri(store, Pointer.INDEX)) == before


def _index_pointer(index_uri: str, ids_uri: str, manifest_uri: str = "") -> IndexPointer:
    """A hand-made pointer to the index at ``index_uri`` (encoded by the distill run ``tiny``)."""
    manifest_uri = manifest_uri or index_uri.rsplit("/indexes/", 1)[0] + "/manifests/build_index/hand-made.json"
    return IndexPointer(index_uri, ids_uri, manifest_uri, "tiny", 8, "hand-made")


def _published_by_hand(store: str, index_body: bytes, ids_body: bytes) -> IndexPointer:
    """An index and id map published under a build manifest written here (which records their sha256)."""
    run = manifest.StageRun(
        stage=Stage.BUILD_INDEX, key="by-hand", store=store, params={"model_run": "tiny"}, inputs=[]
    )
    index_uri, ids_uri = f"{store}/indexes/by-hand/index.faiss", f"{store}/indexes/by-hand/ids.parquet"
    run.write_output(index_uri, index_body)
    run.write_output(ids_uri, ids_body)
    run.publish()
    return _index_pointer(index_uri, ids_uri, catalog.manifest_uri(store, Stage.BUILD_INDEX, "by-hand"))


def test_a_pointer_naming_a_missing_index_is_a_clear_error(tmp_path, store):
    other = storage.to_uri(str(tmp_path / "other"))
    catalog.move_pointer(other, _index_pointer(f"{other}/indexes/gone/index.faiss", f"{other}/indexes/gone/ids"), None)
    with pytest.raises(vector_index.IndexBuildError, match="gone/index.faiss, which does not exist"):
        vector_index.search(other, "anything")
    with pytest.raises(vector_index.IndexBuildError, match="no index promoted yet"):
        vector_index.search(storage.to_uri(str(tmp_path / "empty")), "anything")


def test_bad_requests(store):
    with pytest.raises(vector_index.IndexBuildError, match="no published distill run 'nope'"):
        _build(store, model_run="nope")
    with pytest.raises(vector_index.IndexBuildError, match="pq_m=3 does not divide the dimension 8"):
        _build(store, index_type="ivf_pq", pq_m=3, name="bad-pq", promote=False)


def test_bad_settings_write_nothing(store):
    with pytest.raises(vector_index.IndexBuildError, match="pq_m=3"):
        _build(store, index_type="ivf_pq", pq_m=3, name="nothing-written", promote=False)
    assert storage.list_uris(f"{store}/indexes/nothing-written") == []


def test_non_finite_embeddings_are_refused_naming_the_shard_before_anything_is_indexed(store, monkeypatch):
    faults.nan_in_encodings(monkeypatch, 1, 0)
    shard = re.escape(f"{store}/sentences/")
    with pytest.raises(NonFiniteError, match=f"^{shard}.* encoded by tiny: 1 NaN or infinite embedding value"):
        _build(store, index_type="flat", name="non-finite", promote=False)
    assert storage.list_uris(f"{store}/indexes/non-finite") == []
    assert manifest.read(store, Stage.BUILD_INDEX, "non-finite") is None


def test_the_promoted_student_is_the_default(store, tmp_path):
    with pytest.raises(vector_index.IndexBuildError, match="no promoted model"):
        build_index.run(config.parse(build_index.BuildIndexParams, {"store": store, "promote": False}))
    catalog.move_pointer(store, ModelPointer("tiny", {}, f"{store}/manifests/validate/tiny.json"), None)
    result = build_index.run(
        config.parse(build_index.BuildIndexParams, {"store": store, "promote": False, "name": "from-promoted"})
    )
    assert result.manifest.params["model_run"] == "tiny"
    storage.delete(f"{store}/models/current.json")


def test_an_index_of_another_dimension_is_refused(store, tmp_path):
    import faiss
    import numpy as np

    other = storage.to_uri(str(tmp_path / "other"))
    ids = next(
        o.uri for o in _build(store, index_type="flat", name="dim", promote=False).outputs if o.contract == "index_ids"
    )
    wrong = faiss.IndexFlatIP(5)
    wrong.add(np.eye(5, dtype=np.float32))
    # search reads nothing outside the store it serves
    pointer = _published_by_hand(other, faiss.serialize_index(wrong).tobytes(), storage.read_bytes(ids))
    catalog.move_pointer(other, pointer, None)
    # the distill run 'tiny' copied into ``other``: its manifest names its exported model by store-relative
    # keys, so the model's files come along
    distill_manifest = f"{store}/manifests/distill/tiny.json"
    for uri in [distill_manifest, *(o.uri for o in manifest.read(store, Stage.DISTILL, "tiny").outputs)]:
        storage.write_bytes(other + uri.removeprefix(store), storage.read_bytes(uri))
    with pytest.raises(vector_index.IndexBuildError, match="index dimension 5 differs from the model's 8"):
        vector_index.search(other, "anything")


def test_the_served_index_is_verified_against_its_build_manifest(store, tmp_path):
    """One flipped byte in the promoted index, or a pointer naming an object its build manifest does not list:
    search refuses, naming the object, and serves nothing."""
    result = _build(store, index_type="flat", name="verified", promote=False)
    index_uri = next(o.uri for o in result.outputs if o.uri.endswith("index.faiss"))
    ids_uri = next(o.uri for o in result.outputs if o.contract == "index_ids")
    other = storage.to_uri(str(tmp_path / "other"))
    distill_manifest = f"{store}/manifests/distill/tiny.json"
    for uri in [distill_manifest, *(o.uri for o in manifest.read(store, Stage.DISTILL, "tiny").outputs)]:
        storage.write_bytes(other + uri.removeprefix(store), storage.read_bytes(uri))
    body = bytearray(storage.read_bytes(index_uri))
    pointer = _published_by_hand(other, bytes(body), storage.read_bytes(ids_uri))
    catalog.move_pointer(other, pointer, None)
    assert vector_index.search(other, "sentence about cats", k=3)  # as published: served

    body[len(body) // 2] ^= 0x01
    storage.write_bytes(pointer.index, bytes(body))
    with pytest.raises(storage.IntegrityError, match="by-hand/index.faiss"):
        vector_index.search(other, "sentence about cats")

    stray = f"{other}/indexes/stray/index.faiss"
    storage.write_bytes(stray, storage.read_bytes(index_uri))
    _, etag = catalog.read_pointer(other, Pointer.INDEX)
    catalog.move_pointer(other, _index_pointer(stray, pointer.ids, pointer.manifest), etag)
    with pytest.raises(
        vector_index.IndexBuildError, match="stray/index.faiss, which its build manifest .* does not list"
    ):
        vector_index.search(other, "sentence about cats")
