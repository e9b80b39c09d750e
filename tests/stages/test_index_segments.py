"""Index versions made of segments: a new partition is encoded alone, segments merge by tiers, and whatever the
order partitions came in, the version searches as one full build over the same data does."""

import dataclasses
import logging
from datetime import date, timedelta

import pytest

from tasks.core import catalog, config, manifest, spaces, storage
from tasks.core.catalog import Pointer, Stage
from tasks.ml import segments, vector_index
from tasks.serve.holder import IndexHolder
from tasks.stages import build_index, gc, stage_corpus
from tests.support.projected_store import distill_tiny, projected_store

pytestmark = pytest.mark.models

DAYS = [date(2026, 11, 1) + timedelta(days=n) for n in range(4)]
TOPICS = ["cats", "markets", "rain", "music", "football", "trains", "bread", "rivers"]
QUERIES = ["a sentence about rain", "football and music", "cats 3", "rivers of bread"]


def _texts(day: int) -> list[str]:
    return [f"day {day} sentence {i} about {TOPICS[(i + day) % 8]} and {i % 11}" for i in range(60)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Four partitions of 60 distinct sentences each and a tiny student (k=8) published as run 'tiny'."""
    root = tmp_path_factory.mktemp("segments")
    prepared = projected_store(root, _texts(0), DAYS[0], shard_rows=40)
    for n, day in enumerate(DAYS[1:], start=1):
        raw = root / f"raw-{n}.txt"
        raw.write_text("\n".join(_texts(n)))
        values = {"store": prepared["store"], "source": str(raw), "ingest_date": day, "shard_rows": 40}
        stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
    distill_tiny(prepared, "tiny", max_steps=2)
    return prepared["store"]


def _build(store: str, name: str, days: list[date], **extra) -> manifest.StageResult:
    values = {"store": store, "model_run": "tiny", "name": name, "partitions": days, **extra}
    return build_index.run(config.parse(build_index.BuildIndexParams, values))


def _searched(store: str) -> tuple[list[str], list[list[tuple[str, float]]]]:
    """The promoted index's sentence ids (sorted) and each query's hits (id, score)."""
    loaded = vector_index.load_current(store)
    hits = loaded.search(QUERIES, 5)
    return sorted(loaded.sentence_ids), [[(h.sentence_id, round(h.score, 3)) for h in found] for found in hits]


def _table(store: str, result: manifest.StageResult) -> list[segments.Segment]:
    return segments.read_table(store, result.manifest.output_named(segments.TABLE_FILE).uri)[1]


def test_a_new_partition_is_encoded_alone_and_the_version_searches_as_a_full_build(store, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    first = _build(store, "daily", DAYS[:1])
    second = _build(store, "daily", DAYS[:2])
    third = _build(store, "daily", DAYS[:3])
    assert [r.stats["rows_encoded"] for r in (first, second, third)] == [60, 60, 60]
    assert [(r.stats["segments"], r.stats["segments_kept"]) for r in (first, second, third)] == [(1, 0), (2, 1), (3, 2)]
    assert "build_index daily: 3 partition(s) wanted: 2 in 2 kept segment(s), 1 to encode" in caplog.messages
    kept = _table(store, third)
    assert kept[:2] == _table(store, second)  # the same objects, not copies: a day writes its own segment only
    assert {o.uri for s in kept for o in s.outputs} <= {o.uri for o in third.manifest.outputs}
    daily = _searched(store)

    full = _build(store, "full", DAYS[:3])
    assert (full.stats["segments"], full.stats["rows_encoded"], full.stats["rows"]) == (1, 180, 180)
    assert _searched(store) == daily
    assert _build(store, "daily", DAYS[:3]).skipped


def test_segments_merge_by_tiers_and_keep_the_contents(store):
    merged = [_build(store, "merging", DAYS[: n + 1], merge_fanout=2) for n in range(4)]
    assert [r.stats["segments"] for r in merged] == [1, 1, 2, 1]  # 1; 1+1 -> 2; 2,1; 2,1+1 -> 2,2 -> 4
    last = _table(store, merged[-1])
    assert [sorted(s.partitions) for s in last] == [[d.isoformat() for d in DAYS]]
    assert merged[-1].stats["rows_encoded"] == 60 and last[0].stats["merged"] == 2
    assert sum(o.rows for o in last[0].embeddings) == 240  # built from the stored embeddings, not encoded again
    merged_search = _searched(store)
    _build(store, "merging-full", DAYS)
    assert _searched(store) == merged_search


def test_partitions_staged_in_any_order_leave_the_same_index(store):
    for n, order in enumerate(([DAYS[2], DAYS[0], DAYS[1]], [DAYS[1], DAYS[2], DAYS[0]])):
        for upto in range(1, 4):
            _build(store, f"order-{n}", order[:upto])
        again = _build(store, f"order-{n}", order)  # a rerun of the backfill: nothing to do
        assert again.skipped
        if n == 0:
            first = _searched(store)
    assert _searched(store) == first
    _build(store, "in-date-order", DAYS[:3])
    assert _searched(store) == first


def test_a_version_below_min_recall_is_refused_and_not_promoted(store):
    before = storage.read_bytes(catalog.pointer_uri(store, Pointer.INDEX)) if _promoted(store) else None
    coarse = {"index_type": "ivf_flat", "nlist": 16, "nprobe": 1, "target_recall": 0}
    with pytest.raises(build_index.RecallTooLow, match=r"IVF16,Flat over 60 vectors recalls 0\.\d+ at 10, below"):
        _build(store, "coarse", DAYS[:1], min_recall=0.99, **coarse)
    assert manifest.read(store, Stage.BUILD_INDEX, "coarse") is None
    assert storage.list_uris(f"{store}/indexes/coarse") == []  # nothing no manifest lists: no embeddings, no segment
    assert storage.list_uris(f"{store}/manifest_versions/build_index/coarse") == []
    assert (storage.read_bytes(catalog.pointer_uri(store, Pointer.INDEX)) if _promoted(store) else None) == before


def _promoted(store: str) -> bool:
    return storage.exists(catalog.pointer_uri(store, Pointer.INDEX))


def test_gc_keeps_every_segment_the_current_version_lists_and_a_service_swaps_in_only_the_new_one(store):
    _build(store, "served", DAYS[:2])
    holder = IndexHolder(store, poll_s=60)
    assert holder.refresh()
    before = holder.current
    _build(store, "served", DAYS[:3])
    assert holder.refresh()
    after = holder.current
    assert len(before.segments) == 1 and len(after.segments) == 2  # one segment a run: days 1-2, then day 3
    assert after.segments[0].index is before.segments[0].index  # the kept segment: the object already loaded
    assert after.encoder is before.encoder and after.index.ntotal == 180
    gc.run(config.parse(gc.GCParams, {"store": store, "retention_hours": 0}))
    gc.run(config.parse(gc.GCParams, {"store": store, "retention_hours": 0}))
    pointer, _ = catalog.read_pointer(store, Pointer.INDEX)
    _, listed = segments.read_table(store, pointer.index)
    assert all(storage.exists(o.uri) for s in listed for o in s.outputs)
    assert sorted(vector_index.load_current(store).sentence_ids) == sorted(after.sentence_ids)


def test_segments_are_stamped_with_their_embedding_space_and_a_version_mixing_spaces_is_refused(store):
    _build(store, "spaces", DAYS[:1], promote=False)
    table = _table(store, _build(store, "spaces", DAYS[:2], promote=False))  # two segments
    distilled = manifest.read(store, Stage.DISTILL, "tiny")
    space = spaces.of(store, distilled)
    assert space == f"pca:{spaces.basis(store, distilled).sha256}" and {s.space for s in table} == {space}
    vector_index.require_one_space(store, table, distilled)  # one space, the queries' student's: searched
    other = "pca:" + "0" * 64  # another basis: a student distilled to another PCA
    mixed = [table[0], dataclasses.replace(table[1], space=other)]
    with pytest.raises(vector_index.IndexBuildError, match=f"its vectors are in the embedding space {other}, the"):
        vector_index.require_one_space(store, mixed, distilled)
    legacy = [dataclasses.replace(s, space=None) for s in table]  # stamped before spaces: its student's own
    vector_index.require_one_space(store, legacy, distilled)
    foreign = [dataclasses.replace(table[0], space=None, model="manifest_versions/distill/other/r.json")]
    with pytest.raises(vector_index.IndexBuildError, match="model:manifest_versions/distill/other/r.json"):
        vector_index.require_one_space(store, foreign, distilled)


def test_a_build_that_crashes_leaves_nothing_no_manifest_lists(store, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("the FAISS build died")

    monkeypatch.setattr(build_index, "build_tuned", crash)
    with pytest.raises(RuntimeError, match="the FAISS build died"):
        _build(store, "crashed", DAYS[:1])
    assert storage.list_uris(f"{store}/indexes/crashed") == []  # its embeddings were written before the crash


def test_a_segment_too_small_for_its_quantiser_gets_exact_search_and_says_so(store, caplog):
    """An IVF of 64 lists cannot be trained on a day's 60 vectors: that segment gets exact search, said in the log
    and the manifest, and the day is searchable; the next day's build goes on."""
    caplog.set_level(logging.WARNING, logger="tasks")
    settings = {"index_type": "ivf_flat", "nlist": 64}
    first = _build(store, "small", DAYS[:1], **settings)
    (built,) = first.stats["built"]
    assert built["index_type"] == "flat" and built["factory"] == "Flat"
    assert (
        built["fallback"]
        == "ivf_flat needs 64 vectors to train its quantiser and this segment trains on 60: exact search instead"
    )
    assert any(built["fallback"] in message for message in caplog.messages)
    second = _build(store, "small", DAYS[:2], **settings)
    assert second.stats["rows"] == 120 and len(vector_index.load_current(store).sentence_ids) == 120
    pq = _build(store, "small-pq", DAYS[:1], index_type="ivf_pq", pq_m=4)
    assert "ivf_pq needs 256 vectors to train its quantiser" in pq.stats["built"][0]["fallback"]


def test_a_lost_segment_file_is_encoded_again_not_kept(store, caplog):
    """A kept segment must be there: one whose id map is lost (a bad copy or sync) is encoded again, with a warning
    naming the file, instead of being listed by a version that then cannot be promoted."""
    first = _build(store, "mended", DAYS[:1])
    (segment,) = _table(store, first)
    storage.delete(segment.ids.uri)
    caplog.set_level(logging.WARNING, logger="tasks")
    second = _build(store, "mended", DAYS[:2])
    assert second.stats["segments_kept"] == 0 and second.stats["rows_encoded"] == 120
    assert any(f"{segment.ids.uri} is missing; segment {segment.name} is encoded again" in m for m in caplog.messages)
    assert len(vector_index.load_current(store).sentence_ids) == 120  # promoted: every file there


def test_a_new_index_setting_changes_the_segment_unless_it_is_listed_as_not_mattering(store):
    """Fail safe: every param changes what a segment holds unless ``NOT_SEGMENT_SETTINGS`` says it does not, so a
    setting added later is never silently reused."""

    class WithNewKnob(build_index.BuildIndexParams):
        new_knob: int = 1

    values = {"store": store, "model_run": "tiny"}
    base = build_index.segment_settings(WithNewKnob(**values))
    assert build_index.segment_settings(WithNewKnob(**values, new_knob=2)) != base
    for setting, value in (("batch_size", 7), ("min_recall", 0.5), ("merge_fanout", 3), ("name", "other")):
        assert build_index.segment_settings(WithNewKnob(**values, **{setting: value})) == base, setting


def test_a_build_whose_identical_twin_promoted_first_is_not_a_conflict(store):
    """Two runs of one build at once: the one that loses the pointer's race finds it naming the very version it
    would promote, so it ends green; a different build that lost the race still fails with a conflict."""
    first = _build(store, "twins", DAYS[:1])
    build_index.promote(store, first.manifest, seen_etag=None)  # a stale etag: the pointer moved to this very build
    other = _build(store, "other-twin", DAYS[:1], promote=False)
    with pytest.raises(build_index.PromotionConflict, match="moved by another rebuild since this one started"):
        build_index.promote(store, other.manifest, seen_etag=None)
