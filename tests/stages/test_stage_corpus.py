import gzip
import hashlib
import json
import re
import tracemalloc
from datetime import date

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks import cli
from tasks.core import catalog, config, manifest, storage
from tasks.core.catalog import Stage
from tasks.core.sentences import normalise_text, sentence_id
from tasks.core.sentences import shards as partition_shards
from tasks.stages import stage_corpus
from tasks.stages.stage_corpus import CorpusInputError, StageCorpusParams, run
from tests.support.paths import CORPUS

DAY1, DAY2 = date(2026, 11, 1), date(2026, 11, 2)


@pytest.fixture
def store(store_root):
    return store_root


def _params(store, source, **extra):
    values = {"store": store, "source": str(source), "ingest_date": DAY1, **extra}
    return config.parse(StageCorpusParams, values)


def _staged_rows(store, day=DAY1):
    tables = [storage.read_parquet(uri) for uri in partition_shards(store, day)]
    return pa.concat_tables(tables).to_pylist() if tables else []


def test_vendored_corpus_is_staged_sharded_and_skipped_on_rerun(store):
    params = _params(store, CORPUS, column="sentence", shard_rows=20_000)
    first = run(params)
    assert not first.skipped
    manifest.validate(first.manifest.document)
    stats = first.stats
    assert stats["rows_read"] == 88_388
    assert stats["rows_written"] + sum(stats["dropped"].values()) == stats["rows_read"]
    assert stats["rows_written"] > 88_000
    outputs = first.outputs
    assert len(outputs) == -(-stats["rows_written"] // 20_000)
    assert all("/sentences/ingest_date=2026-11-01/part-" in o.uri for o in outputs)
    for output in outputs:
        assert manifest.sha256_hex(storage.read_bytes(output.uri)) == output.sha256
    assert sum(storage.read_parquet(o.uri).num_rows for o in outputs) == stats["rows_written"]
    assert first.manifest.inputs[0].sha256 == manifest.sha256_hex(CORPUS.read_bytes())

    again = run(params)
    assert again.skipped
    assert again.manifest.run_id == first.manifest.run_id


def test_second_partition_stores_repeated_sentences_once(store, tmp_path):
    (tmp_path / "day1.txt").write_text("alpha one\nbeta two\ngamma three\n")
    (tmp_path / "day2.txt").write_text("beta two\ndelta four\n  gamma   three \n")
    run(_params(store, tmp_path / "day1.txt"))
    second = run(
        config.parse(StageCorpusParams, {"store": store, "source": str(tmp_path / "day2.txt"), "ingest_date": DAY2})
    )
    assert [r["text"] for r in _staged_rows(store, DAY2)] == ["delta four"]
    assert second.stats["dropped"]["already_staged"] == 2


def test_rows_keep_provenance_and_normalised_text(store, tmp_path):
    source = tmp_path / "raw.txt"
    source.write_text("Cafe\u0301  au\tlait\n\n   \nfirst\nfirst\n" + "x" * 30 + "\n")
    result = run(_params(store, source, max_chars=20))
    rows = _staged_rows(store)
    assert [(r["text"], r["line"]) for r in rows] == [("Caf\u00e9 au lait", 1), ("first", 4)]
    assert rows[0]["sentence_id"] == sentence_id("Caf\u00e9 au lait")
    assert rows[0]["source"] == storage.to_uri(str(source))
    assert rows[0]["ingest_date"] == DAY1 and rows[0]["parent_id"] is None
    assert result.stats["dropped"] == {"empty": 2, "too_long": 1, "duplicate_in_input": 1, "already_staged": 0}


@pytest.mark.parametrize("name", ["s.txt.gz", "s.jsonl", "s.csv", "s.tsv", "s.parquet"])
def test_every_input_format(store, tmp_path, name):
    texts = ['He said "hi", twice', "Second  line"]
    path = tmp_path / name
    if name == "s.txt.gz":
        path.write_bytes(gzip.compress("\n".join(texts).encode()))
    elif name == "s.jsonl":
        path.write_text("\n".join(json.dumps({"id": i, "text": t}) for i, t in enumerate(texts)))
    elif name == "s.csv":
        path.write_text('id,text\n1,"He said ""hi"", twice"\n2,Second  line\n')
    elif name == "s.tsv":
        path.write_text('id\ttext\n1\tHe said "hi", twice\n2\tSecond  line\n')
    else:
        pq.write_table(pa.table({"text": texts, "id": [1, 2]}), path)
    run(_params(store, path))
    rows = _staged_rows(store)
    assert [r["text"] for r in rows] == ['He said "hi", twice', "Second line"]
    first_line = {"s.csv": 2, "s.tsv": 2}.get(name, 1)
    assert [r["line"] for r in rows] == [first_line, first_line + 1]


def test_a_folder_of_raw_files_is_one_partition(store, tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "a.txt").write_text("one\ntwo\n")
    (folder / "b.txt").write_text("two\nthree\n")
    result = run(_params(store, folder))
    assert [r["text"] for r in _staged_rows(store)] == ["one", "two", "three"]
    assert len(result.manifest.inputs) == 2


def test_force_reruns_and_leaves_the_shards_it_no_longer_lists_to_gc(store, tmp_path):
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(f"sentence {i}" for i in range(10)))
    first = run(_params(store, source, shard_rows=3))
    assert len(first.outputs) == 4
    rerun = run(_params(store, source, shard_rows=5), force=False)
    assert not rerun.skipped  # params changed
    kept = {o.uri for o in rerun.outputs}
    assert len(kept) == 2
    assert set(partition_shards(store, DAY1)) == kept
    replaced = {o.uri for o in first.outputs}  # left for readers of the replaced manifest; gc removes them later
    assert set(storage.list_uris(f"{store}/sentences")) == kept | replaced
    forced = run(_params(store, source, shard_rows=5), force=True)
    assert not forced.skipped and forced.manifest.run_id != rerun.manifest.run_id
    assert {o.uri for o in forced.outputs} == kept


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "message"),
    [
        ("bad.txt", b"good line\n\xff\xfe broken\n", {}, "not valid UTF-8 at line 2"),
        ("empty.txt", b"  \n", {}, "empty"),
        ("s.csv", b"id,sentence\n1,hello\n", {}, "no column 'text'"),
        ("s.jsonl", b'{"text": "ok"}\nnot json\n', {}, "line 2 is not JSON"),
        ("s.jsonl", b'{"text": "ok"}\n{"other": 1}\n', {}, "line 2 has no field 'text'"),
        ("s.parquet", b"PAR1 definitely not parquet", {}, "not a Parquet file"),
        ("s.xml", b"<a/>", {}, "cannot tell the format"),
        ("s.txt.gz", b"\x1f\x8b\x08\x00broken", {}, "corrupt gzip"),
    ],
)
def test_bad_input_names_the_input_and_publishes_nothing(store, tmp_path, name, content, kwargs, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorpusInputError, match=message) as err:
        run(_params(store, path, **kwargs))
    assert str(err.value).startswith(storage.to_uri(str(path)))
    assert storage.list_uris(store) == []


def test_missing_source_is_a_clear_error(store, tmp_path):
    with pytest.raises(CorpusInputError, match="no such file"):
        run(_params(store, tmp_path / "nowhere.txt"))


def test_normalise_and_sentence_id_are_stable():
    assert normalise_text(" a\u00a0 b\n") == "a b"
    # The id is part of the data contract: stored partitions rely on it never changing.
    assert sentence_id(normalise_text("a  b")) == "acc9227cc02e5f5c13e74125bce89499"


def test_limit_stages_a_sample_across_files(store, tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "a.txt").write_text("one\ntwo\n")
    (folder / "b.txt").write_text("two\nthree\nfour\n")
    result = run(_params(store, folder, limit=3))
    assert [r["text"] for r in _staged_rows(store)] == ["one", "two"]
    assert [i.rows for i in result.manifest.inputs] == [2, 1]


def _shard_bodies(outputs):
    return {o.uri: storage.read_bytes(o.uri) for o in outputs}


@pytest.mark.parametrize("damage", ["delete_every_shard", "truncate_one_shard"])
def test_a_rerun_rebuilds_missing_or_damaged_shards(store, tmp_path, damage):
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(f"sentence {i}" for i in range(10)))
    first = run(_params(store, source, shard_rows=3))
    bodies = _shard_bodies(first.outputs)
    assert len(bodies) == 4
    if damage == "delete_every_shard":
        for uri in bodies:
            storage.delete(uri)
    else:
        uri = first.outputs[1].uri
        storage.write_bytes(uri, bodies[uri][:-7])
    rerun = run(_params(store, source, shard_rows=3))
    assert not rerun.skipped and rerun.manifest.run_id != first.manifest.run_id
    assert rerun.outputs == first.outputs  # content-addressed: the same shards, byte for byte
    assert _shard_bodies(rerun.outputs) == bodies
    assert set(storage.list_uris(f"{store}/sentences")) == set(bodies)
    assert run(_params(store, source, shard_rows=3)).skipped


CORRUPT_MANIFESTS = {
    "empty-list": lambda body: b"[]",
    "not-json": lambda body: b"{not json",
    "no-outputs": lambda body: json.dumps({k: v for k, v in json.loads(body).items() if k != "outputs"}).encode(),
}


@pytest.mark.parametrize("corruption", list(CORRUPT_MANIFESTS))
def test_a_corrupt_manifest_fails_the_rerun_and_force_replaces_it(store, tmp_path, capsys, corruption):
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(f"sentence {i}" for i in range(10)))
    argv = ["stage-corpus", "--source", str(source), "--ingest-date", DAY1.isoformat(), "--store", store]
    argv += ["--shard-rows", "3", "--quiet"]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    shards = set(partition_shards(store, DAY1))
    uri = first["manifest"]
    storage.write_bytes(uri, CORRUPT_MANIFESTS[corruption](storage.read_bytes(uri)))

    assert cli.main(argv) == 1
    assert capsys.readouterr().err.startswith(f"hpd: error: {uri}: ")
    with pytest.raises(manifest.ManifestError, match=f"^{re.escape(uri)}: "):
        manifest.read(store, Stage.STAGE_CORPUS, catalog.partition_key(DAY1))

    assert cli.main([*argv, "--force"]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["skipped"] is False and forced["outputs"] == 4
    published = manifest.read(store, Stage.STAGE_CORPUS, catalog.partition_key(DAY1))
    manifest.validate(published.document)
    assert {o.uri for o in published.outputs} == shards
    assert all(storage.exists(s) for s in shards)
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] is True


def test_a_source_is_streamed_not_read_whole(tmp_path):
    """On a local store: an in-process S3 server's own allocations would blur the measure."""
    store = storage.to_uri(str(tmp_path / "store"))
    source = tmp_path / "big.txt"
    with source.open("w") as fh:
        fh.writelines(f"sentence number {i} of a large source file\n" for i in range(800_000))  # ~35 MB
    (tmp_path / "small.txt").write_text("a first run imports what staging needs\n")
    run(_params(store, tmp_path / "small.txt", ingest_date=DAY2))
    tracemalloc.start()
    try:
        result = run(_params(store, source, limit=1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.stats["rows_read"] == 1000
    assert result.manifest.inputs[0].sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
    assert peak < source.stat().st_size / 4, (
        f"peak {peak} bytes of Python memory for a {source.stat().st_size} B source"
    )


def test_a_source_changed_after_its_fingerprint_is_refused(store, tmp_path, monkeypatch):
    source = tmp_path / "s.txt"
    source.write_text("one sentence\nanother sentence\n")
    fingerprint = stage_corpus._fingerprint

    def fingerprint_then_edit(uri, max_bytes):
        taken = fingerprint(uri, max_bytes)
        source.write_text("one sentence\nan edited sentence\n")  # a writer still busy with the file
        return taken

    monkeypatch.setattr(stage_corpus, "_fingerprint", fingerprint_then_edit)
    with pytest.raises(CorpusInputError, match=r"s\.txt: changed while it was being read"):
        run(_params(store, source))
    assert partition_shards(store, DAY1) == []


@pytest.mark.parametrize("name", ["long.txt", "long.txt.gz", "long.csv"])
def test_an_over_long_line_is_counted_without_holding_it(store, tmp_path, name):
    body = "text\nshort line\n" + "é" * 25_000 + "\nafter\n"  # 25k characters, 50k bytes, past the read buffer
    data = body.encode()
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(CorpusInputError, match=r"line 3 holds 25000 characters, more than max_line_chars=1000"):
        run(_params(store, tmp_path / name, column="text", max_line_chars=1000))


def test_a_source_template_resolves_to_the_partitions_files(store, tmp_path):
    for day, text in ((DAY1, "first day\n"), (DAY2, "second day\n")):
        folder = tmp_path / "raw" / day.strftime("%Y/%m/%d")
        folder.mkdir(parents=True)
        (folder / "part.txt").write_text(text)
    template = str(tmp_path / "raw" / "{ingest_date:%Y/%m/%d}")
    for day, text in ((DAY1, "first day"), (DAY2, "second day")):
        result = run(_params(store, template, ingest_date=day))
        assert [row["text"] for row in _staged_rows(store, day)] == [text]
        assert result.manifest.inputs[0].uri.endswith(day.strftime("%Y/%m/%d") + "/part.txt")


@pytest.mark.parametrize("template", ["raw/{day}", "raw/{ingest_date.year}", "raw/{0}", "raw/{ingest_date"])
def test_a_source_template_holds_only_the_ingest_date(store, template):
    with pytest.raises(CorpusInputError, match=r"not a valid source template \(.*(ingest_date|expected)"):
        run(_params(store, template))


def test_the_batch_size_changes_nothing_staged(store, tmp_path):
    """Duplicates, drops and shard boundaries across batches: a partition staged two records at a time is the
    one staged in a single batch, shard for shard."""
    lines = ["one", "two", "", "one", "x" * 30, "three", "two", "four", " four ", "five", "six", "one"]
    (tmp_path / "raw.txt").write_text("\n".join(lines))
    small = run(_params(store, tmp_path / "raw.txt", batch_rows=2, shard_rows=2, max_chars=20))
    other = storage.to_uri(str(tmp_path / "other"))
    whole = run(_params(other, tmp_path / "raw.txt", batch_rows=1000, shard_rows=2, max_chars=20))
    assert [o.sha256 for o in small.outputs] == [o.sha256 for o in whole.outputs]
    assert small.stats == whole.stats
    assert small.stats["dropped"] == {"empty": 1, "too_long": 1, "duplicate_in_input": 4, "already_staged": 0}
    assert [r["text"] for r in _staged_rows(store)] == ["one", "two", "three", "four", "five", "six"]


class _Killed(BaseException):
    """Ends a run where a kill would, past every ``except Exception``."""


def _staged_id_files(store: str) -> dict[str, object]:
    """The staged-id index's segments (bytes) and ``index.json`` without the versions of the manifests it saw
    (a manifest holds its run's id and times, so two runs' versions differ)."""
    root = storage.join(store, "staged_ids")
    files: dict[str, object] = {uri.removeprefix(root): storage.read_bytes(uri) for uri in storage.list_uris(root)}
    if "/index.json" in files:
        document = json.loads(files["/index.json"])
        for entry in document["partitions"].values():
            entry.pop("manifest", None)
        files["/index.json"] = document
    return files


@pytest.mark.parametrize("day2", [False, True], ids=["first-partition", "beside-another"])
def test_a_rerun_records_the_staged_ids_its_run_did_not(store_root, tmp_path, monkeypatch, day2):
    """Killed between publishing the partition and recording its ids, a staging's rerun (a skip) records them:
    the staged-id index ends byte for byte as an unbroken run leaves it."""
    source = tmp_path / "raw.txt"
    source.write_text("".join(f"sentence {i} of the day\n" for i in range(120)))
    stores = {name: storage.join(store_root, name) for name in ("clean", "killed")}
    if day2:
        for store in stores.values():
            run(_params(store, source, ingest_date=DAY2, limit=50))
    run(_params(stores["clean"], source, shard_rows=40))
    with monkeypatch.context() as patch:
        patch.setattr(stage_corpus.staged_ids, "record", lambda *args: (_ for _ in ()).throw(_Killed()))
        with pytest.raises(_Killed):
            run(_params(stores["killed"], source, shard_rows=40))
    assert manifest.read(stores["killed"], Stage.STAGE_CORPUS, catalog.partition_key(DAY1)) is not None
    assert run(_params(stores["killed"], source, shard_rows=40)).skipped
    assert _staged_id_files(stores["killed"]) == _staged_id_files(stores["clean"]) != {}
    before = _staged_id_files(stores["killed"])
    assert run(_params(stores["killed"], source, shard_rows=40)).skipped
    assert _staged_id_files(stores["killed"]) == before  # recorded once: a rerun over it writes nothing
