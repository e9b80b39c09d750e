"""Safe replacement: a rerun leaves the replaced shards for the readers of the old manifest, and ``gc``
removes what nothing references once it is older than the retention, never anything a manifest,
pointer or live checkpoint folder references. The retention counts from when a gc run first saw an object
unreferenced: tests move gc's clock forward (``_later``) instead of waiting; temp files count from their last
write, backdated with os.utime on file:// (S3 object times cannot be, so there the retention is 0)."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from datetime import UTC, date, datetime, timedelta

import pytest

from tasks import cli
from tasks.core import catalog, config, manifest, storage
from tasks.core.catalog import Stage
from tasks.stages import stage_corpus

DAY = date(2026, 11, 1)
KEY = catalog.partition_key(DAY)
OLD = 48 * 3600  # seconds a backdated object is older than now


def _corpus(store: str, source, shard_rows: int) -> manifest.StageResult:
    values = {"store": store, "source": str(source), "ingest_date": DAY, "shard_rows": shard_rows}
    return stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))


def _gc(store: str, **values) -> manifest.StageResult:
    from tasks.stages import gc  # imported here: the first assertions of a test hold without the gc stage
    from tasks.stages.params import GCParams

    return gc.run(config.parse(GCParams, {"store": store, **values}))


def _later(monkeypatch, hours: float) -> None:
    """gc's clock, ``hours`` from now."""
    from tasks.stages import gc

    monkeypatch.setattr(gc, "now", lambda: datetime.now(UTC) + timedelta(hours=hours))


def _backdate(uri: str, seconds: int = OLD) -> None:
    path = uri.removeprefix("file://")
    then = time.time() - seconds
    os.utime(path, (then, then))


def _keys(store: str, uris) -> list[str]:
    return sorted(catalog.store_key(store, u) for u in uris)


def _current_outputs(store: str) -> set[str]:
    found = set()
    for stage in Stage:
        for key in manifest.list_keys(store, stage):
            found |= {o.uri for o in manifest.read(store, stage, key).outputs}
    return found


def test_replaced_shards_outlive_the_rerun_and_gc_removes_them_past_the_retention(store_root, tmp_path, monkeypatch):
    store, local = store_root, store_root.startswith("file://")
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(f"sentence {i}" for i in range(10)))
    first = _corpus(store, source, shard_rows=3)
    held = manifest.read(store, Stage.STAGE_CORPUS, KEY)  # a reader holds this manifest ...
    rerun = _corpus(store, source, shard_rows=5)  # ... while a rerun with a changed param replaces it
    assert not rerun.skipped and len(first.outputs) == 4 and len(rerun.outputs) == 2
    replaced = {o.uri for o in first.outputs} - {o.uri for o in rerun.outputs}
    assert replaced == {o.uri for o in held.outputs}
    for output in held.outputs:  # the reader of the previous manifest can still read every shard
        assert storage.read_parquet(output.uri, sha256=output.sha256).num_rows == output.rows

    prefix = catalog.sentences_prefix(store, Stage.STAGE_CORPUS, DAY)
    temp = storage.join(prefix, ".tmp-x")  # a killed writer's temp file
    storage.write_bytes(temp, b"half a shard")
    assert temp in {o.uri for o in storage.list_objects(store)}  # listed, with the hidden files
    assert not local or temp not in storage.list_uris(store)  # which the plain listing hides

    young = _gc(store, retention_hours=24)  # first seen unreferenced now: nothing goes for a day
    assert young.stats["deleted"] == 0 and young.stats["deleted_keys"] == []
    assert all(storage.exists(u) for u in replaced)
    assert set(young.stats["unreferenced_since"]) == set(_keys(store, (*replaced, temp)))

    retention = 24 if local else 0
    young_orphan = None
    if local:  # two days on: the marks and the temp file are old; a temp file written then is young
        _later(monkeypatch, hours=48)
        _backdate(temp)
        young_orphan = storage.join(prefix, ".tmp-young")
        storage.write_bytes(young_orphan, b"a writer still at work")
        os.utime(young_orphan.removeprefix("file://"), (time.time() + OLD, time.time() + OLD))
    expected = _keys(store, (*replaced, temp))

    dry = _gc(store, retention_hours=retention, dry_run=True)
    assert dry.stats["dry_run"] is True and dry.stats["deleted_keys"] == expected
    assert all(storage.exists(u) for u in (*replaced, temp))

    swept = _gc(store, retention_hours=retention)
    assert swept.stats["deleted_keys"] == expected and swept.stats["deleted"] == len(expected)
    assert swept.stats["deleted_bytes"] == sum(o.bytes for o in held.outputs) + len(b"half a shard")
    assert not any(storage.exists(u) for u in (*replaced, temp))
    assert young_orphan is None or storage.exists(young_orphan)
    assert all(storage.exists(u) for u in _current_outputs(store))
    assert _corpus(store, source, shard_rows=5).skipped  # the current manifest's shards are intact

    records = manifest.list_keys(store, Stage.GC)
    assert len(records) == 3 and records == sorted(records)  # each gc run recorded, none skipped
    recorded = manifest.read(store, Stage.GC, records[-1])
    manifest.validate(recorded.document)
    assert recorded.stats["deleted_keys"] == expected and recorded.params["retention_hours"] == retention
    assert _gc(store, retention_hours=retention).stats["deleted"] == 0  # the young orphan is not old yet
    assert young_orphan is None or storage.exists(young_orphan)


def test_an_old_shard_replaced_now_gets_the_whole_retention(tmp_path, monkeypatch):
    """The retention starts when a shard stops being referenced, however old the shard is."""
    store = storage.to_uri(str(tmp_path / "store"))
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(f"sentence {i}" for i in range(6)))
    first = _corpus(store, source, shard_rows=3)
    for output in first.outputs:
        _backdate(output.uri, seconds=30 * 24 * 3600)  # written a month ago ...
    _corpus(store, source, shard_rows=2)  # ... replaced now, while a reader may hold the old manifest
    assert _gc(store, retention_hours=24).stats["deleted"] == 0
    _later(monkeypatch, hours=23)
    assert _gc(store, retention_hours=24).stats["deleted"] == 0
    _later(monkeypatch, hours=25)
    assert _gc(store, retention_hours=24).stats["deleted_keys"] == _keys(store, (o.uri for o in first.outputs))


def test_gc_keeps_what_manifests_pointers_and_live_checkpoints_reference(tmp_path, monkeypatch):
    store = storage.to_uri(str(tmp_path / "store"))
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\nthree\n")
    staged = _corpus(store, source, shard_rows=2)
    live_ckpt = catalog.checkpoints_prefix(store, "alive")
    dead_ckpt = catalog.checkpoints_prefix(store, "dead")
    planted = {
        storage.join(live_ckpt, "latest.json"): b"{}",
        storage.join(live_ckpt, "step-00000001.pt"): b"weights",
        storage.join(dead_ckpt, "step-00000001.pt"): b"weights",
        storage.join(store, "indexes", "x", "index.faiss"): b"named by the pointer",
        storage.join(store, "validation", "x", "orphan.json"): b"{}",
    }
    for uri, body in planted.items():
        storage.write_bytes(uri, body)
    built = catalog.store_key(store, staged.manifest_uri)  # a manifest that reads stands in for the build's
    pointer = {"index": "indexes/x/index.faiss", "ids": "indexes/x/index.faiss", "manifest": built, "model": built}
    storage.write_bytes(
        catalog.pointer_uri(store, catalog.Pointer.INDEX),
        json.dumps({**pointer, "model_run": "x", "dim": 8, "run_id": "r"}).encode(),
    )
    assert _gc(store, retention_hours=1).stats["deleted"] == 0  # marks the unreferenced ones
    _later(monkeypatch, hours=2)
    swept = _gc(store, retention_hours=1)
    assert swept.stats["deleted_keys"] == _keys(store, [storage.join(dead_ckpt, "step-00000001.pt")]) + _keys(
        store, [storage.join(store, "validation", "x", "orphan.json")]
    )
    assert all(storage.exists(u) for u in planted if "/dead/" not in u and "orphan" not in u)
    assert all(storage.exists(o.uri) for o in staged.outputs)
    assert storage.exists(catalog.pointer_uri(store, catalog.Pointer.INDEX))


def test_gc_refuses_to_delete_anything_when_a_manifest_does_not_read(tmp_path):
    store = storage.to_uri(str(tmp_path / "store"))
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\n")
    uri = _corpus(store, source, shard_rows=1).manifest_uri
    orphan = storage.join(store, "sentences", "orphan.parquet")
    storage.write_bytes(orphan, b"x")
    storage.write_bytes(uri, b"{not json")
    _backdate(orphan)
    with pytest.raises(manifest.ManifestError, match=uri):
        _gc(store, retention_hours=0)
    assert storage.exists(orphan)


def test_gc_stops_when_a_manifest_a_pointer_names_is_missing(tmp_path, capsys):
    """A lost kept version (a bad copy or sync): what the promoted run lists is unknown, so nothing is deleted."""
    store = storage.to_uri(str(tmp_path / "store"))
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\n")
    staged = _corpus(store, source, shard_rows=1)
    lost = "manifest_versions/build_index/x/r.json"
    pointer = {"index": "indexes/x/r/segments.json", "ids": None, "manifest": lost, "model_run": "x", "dim": 8}
    model = catalog.store_key(store, staged.manifest_uri)
    index_pointer = catalog.pointer_uri(store, catalog.Pointer.INDEX)
    storage.write_bytes(index_pointer, json.dumps({**pointer, "run_id": "r", "model": model}).encode())
    orphan = storage.join(store, "indexes", "x", "r", "segments", "2026-11-01", "index.faiss")
    storage.write_bytes(orphan, b"a segment only the lost version lists")
    _backdate(orphan)
    with pytest.raises(
        manifest.ManifestError,
        match=re.escape(f"{catalog.resolve(store, lost)}: missing, and {index_pointer} names it"),
    ):
        _gc(store, retention_hours=0)
    assert storage.exists(orphan) and manifest.list_keys(store, Stage.GC) == []
    assert cli.main(["gc", "--store", store, "--retention-hours", "0", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert lost in err and index_pointer in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert storage.exists(orphan) and manifest.list_keys(store, Stage.GC) == []


def test_a_manifest_deleted_between_the_listing_and_its_read_is_passed_over(tmp_path, monkeypatch):
    """No pointer names it: another gc run deleted it meanwhile; what it listed is left to the next run."""
    store = storage.to_uri(str(tmp_path / "store"))
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\n")
    staged = _corpus(store, source, shard_rows=1)
    listing = storage.list_objects

    def list_then_delete(prefix: str) -> list[storage.ListedObject]:
        listed = listing(prefix)
        if storage.exists(staged.manifest_uri):
            storage.delete(staged.manifest_uri)
        return listed

    monkeypatch.setattr(storage, "list_objects", list_then_delete)
    swept = _gc(store, retention_hours=0)
    assert swept.stats["deleted_keys"] == _keys(store, (o.uri for o in staged.outputs))


def test_hpd_gc_from_the_cli(tmp_path, capsys, monkeypatch, caplog):
    store = storage.to_uri(str(tmp_path / "store"))
    orphan = storage.join(store, "sentences", "ingest_date=2026-11-01", "part-00000-deadbeef.parquet")
    storage.write_bytes(orphan, b"left behind")
    argv = ["gc", "--store", store, "--quiet"]
    assert cli.main(argv) == 0  # first seen unreferenced now
    assert json.loads(capsys.readouterr().out)["stats"]["deleted"] == 0
    _later(monkeypatch, hours=25)

    caplog.set_level(logging.INFO, logger="tasks")
    assert cli.main([*argv, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert "1 unreferenced: 0 kept until past the retention, 1 (11 B) to delete (dry run: nothing is deleted)" in (
        caplog.text
    )
    assert dry["skipped"] is False and dry["stats"]["deleted_keys"] == [catalog.store_key(store, orphan)]
    assert storage.exists(orphan)
    assert cli.main(argv) == 0
    swept = json.loads(capsys.readouterr().out)
    assert swept["skipped"] is False and swept["stats"]["deleted"] == 1 and swept["stats"]["deleted_bytes"] == 11
    assert not storage.exists(orphan)
    assert swept["manifest"].startswith(storage.join(store, "manifests", "gc") + "/")
    assert cli.main([*argv, "--retention-hours", "-1"]) == 2
    assert "--retention-hours" in capsys.readouterr().err
