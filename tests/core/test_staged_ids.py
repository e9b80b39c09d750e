"""The staged-id index: kept by every staging run, verified on read, rebuilt from the manifests when missing or
out of date, and right under concurrent stagings of two dates."""

import json
import threading
from datetime import date

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core import catalog, config, manifest, staged_ids, storage
from tasks.core.sentences import sentence_id
from tasks.core.sentences import shards as partition_shards
from tasks.stages import stage_corpus

DAY1, DAY2, DAY3 = date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)
KEY1, KEY2 = catalog.partition_key(DAY1), catalog.partition_key(DAY2)


def _stage(store, tmp_path, day, lines, **extra):
    source = tmp_path / f"{day}-{len(lines)}.txt"
    source.write_text("\n".join(lines))
    values = {"store": store, "source": str(source), "ingest_date": day, "shard_rows": 2, **extra}
    return stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))


def _staged(store, day):
    return {
        row["sentence_id"]: row["text"]
        for uri in partition_shards(store, day)
        for row in storage.read_parquet(uri).to_pylist()
    }


def _recorded(store):
    """What ``index.json`` and its segments hold (read verified), as {sentence id: partition}: each
    partition's rows in the segment its entry names."""
    document = _document(store)
    found = {}
    for name, entry in document["segments"].items():
        owners = {key for key, e in document["partitions"].items() if e["segment"] == name}
        segment = pq.ParquetFile(pa.BufferReader(storage.read_bytes(storage.join(store, name), entry["sha256"])))
        assert segment.metadata.num_rows == entry["rows"]
        for group, bucket in enumerate(entry["row_groups"]):
            for row in segment.read_row_group(group).to_pylist():
                assert row["sentence_id"].hex().startswith(bucket)
                if row["partition"] in owners:
                    found[row["sentence_id"].hex()] = row["partition"]
    return found


def _document(store):
    return json.loads(storage.read_bytes(staged_ids.index_uri(store)))


def _truth(store, *days):
    return {sid: catalog.partition_key(day) for day in days for sid in _staged(store, day)}


def test_each_run_records_its_partition_and_a_restage_replaces_it(store_root, tmp_path):
    _stage(store_root, tmp_path, DAY1, ["alpha one", "beta two", "gamma three"])
    first = _document(store_root)
    _stage(store_root, tmp_path, DAY2, ["beta two", "delta four"])
    assert _recorded(store_root) == _truth(store_root, DAY1, DAY2)
    second = _document(store_root)
    assert second["partitions"][KEY1]["segment"] == first["partitions"][KEY1]["segment"]  # not rewritten
    assert second["segments"][second["partitions"][KEY2]["segment"]]["rows"] == 1  # DAY2's one new id only
    assert set(_staged(store_root, DAY2).values()) == {"delta four"}

    # re-staging DAY1 with other sentences: its own old ids neither count against it nor stay in the index
    _stage(store_root, tmp_path, DAY1, ["alpha one", "delta four", "epsilon five"], max_chars=500)
    assert set(_staged(store_root, DAY1).values()) == {"alpha one", "epsilon five"}
    assert _recorded(store_root) == _truth(store_root, DAY1, DAY2)
    assert sentence_id("delta four") in _recorded(store_root)  # DAY2's
    assert sentence_id("beta two") not in _recorded(store_root)  # staged by DAY1 only, which no longer holds it


@pytest.mark.parametrize("damage", ["missing", "not-json", "out-of-date"])
def test_a_missing_or_stale_index_is_rebuilt_from_the_manifests(store_root, tmp_path, damage):
    _stage(store_root, tmp_path, DAY1, ["alpha one", "beta two"])
    before = storage.read_bytes(staged_ids.index_uri(store_root))
    _stage(store_root, tmp_path, DAY2, ["gamma three", "delta four"])
    if damage == "missing":  # a store staged before the index existed
        for uri in storage.list_uris(storage.join(store_root, staged_ids.FOLDER)):
            storage.delete(uri)
    elif damage == "not-json":
        storage.write_bytes(staged_ids.index_uri(store_root), b"{not json")
    else:  # DAY2 staged by a version that kept no index: the index still holds DAY1 only
        storage.write_bytes(staged_ids.index_uri(store_root), before)

    third = _stage(store_root, tmp_path, DAY3, ["delta four", "beta two", "new five"])
    assert third.stats["dropped"]["already_staged"] == 2
    assert set(_staged(store_root, DAY3).values()) == {"new five"}
    assert _recorded(store_root) == _truth(store_root, DAY1, DAY2, DAY3)


def test_an_index_entry_that_no_manifest_backs_is_not_trusted(store_root, tmp_path):
    """A run that recorded ids but whose partition is gone (or never published) blocks no sentence."""
    _stage(store_root, tmp_path, DAY1, ["alpha one"])
    _stage(store_root, tmp_path, DAY2, ["beta two"])
    storage.delete(catalog.manifest_uri(store_root, stage_corpus.Stage.STAGE_CORPUS, KEY2))
    third = _stage(store_root, tmp_path, DAY3, ["beta two", "alpha one"])
    assert set(_staged(store_root, DAY3).values()) == {"beta two"}
    assert third.stats["dropped"]["already_staged"] == 1


def test_a_tampered_segment_is_refused(store_root, tmp_path):
    _stage(store_root, tmp_path, DAY1, [f"sentence {i}" for i in range(40)])
    bucket = storage.join(store_root, next(iter(_document(store_root)["segments"])))
    body = bytearray(storage.read_bytes(bucket))
    body[len(body) // 2] ^= 1
    storage.write_bytes(bucket, bytes(body))
    with pytest.raises(storage.IntegrityError, match="sha256 mismatch"):
        _stage(store_root, tmp_path, DAY2, ["another one"])
    assert partition_shards(store_root, DAY2) == []


def test_segments_stay_bounded_by_compaction(store_root, tmp_path, monkeypatch):
    """Each run writes a segment of its own ids; the run that would leave more than MAX_SEGMENTS live writes
    every id that counts into one instead."""
    monkeypatch.setattr(staged_ids, "MAX_SEGMENTS", 3)
    days = [date(2026, 11, day) for day in range(1, 6)]
    counts = []
    for number, day in enumerate(days):
        _stage(store_root, tmp_path, day, [f"day {number} sentence", "shared sentence"])
        counts.append(len(_document(store_root)["segments"]))
        assert _recorded(store_root) == _truth(store_root, *days[: number + 1])
    assert counts == [1, 2, 3, 1, 2]
    assert len(_recorded(store_root)) == len(days) + 1


def test_a_run_reads_only_the_manifests_changed_since_the_index_recorded_them(store_root, tmp_path, monkeypatch):
    """The index keeps each manifest's listed version: a run reads the manifest the run before it published
    (recorded without a version) and no other, however many partitions are staged."""
    monkeypatch.setattr(storage.objects, "RACY_NS", 0)  # versions of just-written local files count
    for day in range(1, 6):
        _stage(store_root, tmp_path, date(2026, 11, day), [f"day {day} sentence"])
    read, reads = manifest.read, []
    monkeypatch.setattr(manifest, "read", lambda store, stage, key: reads.append(key) or read(store, stage, key))
    staged = _stage(store_root, tmp_path, date(2026, 11, 6), ["day 2 sentence", "day 6 sentence"])
    assert [key for key in reads if key != catalog.partition_key(date(2026, 11, 6))] == [
        catalog.partition_key(date(2026, 11, 5))
    ]
    assert staged.stats["dropped"]["already_staged"] == 1
    assert _recorded(store_root) == _truth(store_root, *[date(2026, 11, day) for day in range(1, 7)])


def test_a_manifest_rewritten_since_it_was_recorded_is_read_again(store_root, tmp_path, monkeypatch):
    """A partition re-staged by a run that died before recording its ids: its manifest's version changed,
    so its ids are re-read from its shards and the old ones no longer count."""
    monkeypatch.setattr(storage.objects, "RACY_NS", 0)
    _stage(store_root, tmp_path, DAY1, ["alpha one"])
    _stage(store_root, tmp_path, DAY2, ["beta two"])
    _stage(store_root, tmp_path, DAY3, ["unrelated"])  # DAY2's version is recorded now
    record = staged_ids.record
    monkeypatch.setattr(staged_ids, "record", lambda *args: None)  # re-staging DAY2 dies before recording
    _stage(store_root, tmp_path, DAY2, ["gamma three"], max_chars=400)
    monkeypatch.setattr(staged_ids, "record", record)
    fourth = _stage(store_root, tmp_path, date(2026, 11, 4), ["beta two", "gamma three"])
    assert set(_staged(store_root, date(2026, 11, 4)).values()) == {"beta two"}
    assert fourth.stats["dropped"]["already_staged"] == 1


def test_concurrent_stagings_of_two_dates_stage_each_sentence_once(store_root, tmp_path, monkeypatch):
    """Both runs load the index before either records (a barrier), so both first keep the shared sentences;
    the run that loses the index's compare-and-swap de-duplicates again and publishes again."""
    shared = [f"shared sentence {i}" for i in range(30)]
    lines = {
        DAY1: shared + [f"only the first day {i}" for i in range(10)],
        DAY2: [f"only the second day {i}" for i in range(10)] + shared[::-1],
    }
    barrier, load, loads = threading.Barrier(2, timeout=30), staged_ids.load, []

    def load_together(store, exclude_key):
        loads.append(exclude_key)
        if loads.count(exclude_key) == 1:
            barrier.wait()
        return load(store, exclude_key)

    monkeypatch.setattr(staged_ids, "load", load_together)
    results, errors = {}, []

    def stage(day):
        try:
            results[day] = _stage(store_root, tmp_path, day, lines[day])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=stage, args=(day,)) for day in lines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sorted(loads) == sorted([KEY1, KEY2, KEY1 if loads.count(KEY1) > 1 else KEY2])  # one retry

    first, second = _staged(store_root, DAY1), _staged(store_root, DAY2)
    assert not first.keys() & second.keys()
    assert sorted(first.values()) + sorted(second.values()) != []
    assert sorted([*first.values(), *second.values()]) == sorted(set(lines[DAY1] + lines[DAY2]))
    assert _recorded(store_root) == _truth(store_root, DAY1, DAY2)
    dropped = sum(r.stats["dropped"]["already_staged"] for r in results.values())
    assert dropped == len(shared)
    assert sum(r.stats["rows_written"] for r in results.values()) == len(set(lines[DAY1] + lines[DAY2]))


def test_held_matches_across_partitions_honours_the_exclusion_and_outlives_a_lost_index(store_root, tmp_path):
    _stage(store_root, tmp_path, DAY1, ["alpha one", "beta two", "gamma three"])
    _stage(store_root, tmp_path, DAY2, ["delta four", "epsilon five"])
    ids = {text: sentence_id(text) for text in ("beta two", "epsilon five", "never staged")}

    assert staged_ids.held(store_root, list(ids.values())) == {ids["beta two"], ids["epsilon five"]}
    assert staged_ids.held(store_root, list(ids.values()), exclude_key=KEY2) == {ids["beta two"]}
    assert staged_ids.held(store_root, [ids["never staged"]]) == set()
    assert staged_ids.held(store_root, []) == set()
    storage.delete(staged_ids.index_uri(store_root))  # the manifests still say what is staged
    assert staged_ids.held(store_root, list(ids.values())) == {ids["beta two"], ids["epsilon five"]}
