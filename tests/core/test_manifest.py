import json
import logging
import re

import pytest

from tasks.core import catalog, manifest, storage


@pytest.fixture
def store(tmp_path):
    return storage.to_uri(str(tmp_path / "store"))


def _run(store, params=None, sha="a" * 64):
    return manifest.StageRun(
        stage="demo_stage",
        key="ingest_date=2026-11-30",
        store=store,
        params=params or {"k": 1},
        inputs=[manifest.Input("file:///in.txt", sha, 3)],
    )


def test_published_manifest_validates_and_records_versions(store):
    run = _run(store)
    with run.phase("work"):
        run.outputs.append(manifest.Output(f"{store}/out/part-0.parquet", "b" * 64, 3, 10, "sentences", 1))
    published = run.publish()
    on_store = json.loads(storage.read_bytes(run.uri))
    assert on_store == published.manifest.document
    assert published.outputs == (manifest.Output(f"{store}/out/part-0.parquet", "b" * 64, 3, 10, "sentences", 1),)
    manifest.validate(on_store)
    assert on_store["manifest_version"] == 2
    assert on_store["packages"]["pyarrow"]
    assert on_store["code_version"].startswith(("git:", "hpd-pipeline=="))
    assert set(on_store["timings_s"]) == {"work", "total"}
    assert run.uri == f"{store}/manifests/demo_stage/ingest_date=2026-11-30.json"


def test_a_run_under_an_orchestrator_records_it_and_a_plain_run_does_not(store):
    airflow = {"orchestrator": "airflow", "dag_id": "hpd_ingest", "run_id": "manual__x", "task_id": "stage"}
    with manifest.orchestrated_by({**airflow, "try_number": 2}):
        under = _run(store).publish().manifest.document
    assert under["orchestration"] == {**airflow, "try_number": 2}
    plain = _run(store, params={"k": 2}).publish().manifest.document
    assert "orchestration" not in plain
    with pytest.raises(manifest.ManifestError, match="orchestration"):
        manifest.validate({**plain, "orchestration": {"dag_id": ["not", "a", "string"]}})


def test_same_inputs_and_params_complete_the_work(store):
    _run(store).publish()
    assert _run(store).skip_result(force=False) is not None
    assert _run(store).skip_result(force=True) is None
    assert _run(store, params={"k": 2}).skip_result(force=False) is None
    assert _run(store, sha="c" * 64).skip_result(force=False) is None


def test_rerun_replaces_the_manifest_and_a_concurrent_change_is_refused(store):
    _run(store).publish()
    rerun = _run(store, params={"k": 2})
    assert rerun.skip_result(force=False) is None
    _run(store, params={"k": 3}).publish()  # someone else published in between
    with pytest.raises(manifest.ConcurrentPublish, match="concurrent"):
        rerun.publish()
    assert manifest.read(store, "demo_stage", "ingest_date=2026-11-30").params == {"k": 3}


def test_invalid_manifest_is_not_published(store):
    run = _run(store)
    run.add_output("not-a-uri", b"body")
    with pytest.raises(manifest.ManifestError, match="outputs/0: 'not-a-uri' is not below the store"):
        run.publish()
    assert not storage.exists(run.uri)


def test_an_output_outside_the_store_is_not_published(store, tmp_path):
    run = _run(store)
    outside = storage.to_uri(str(tmp_path / "elsewhere" / "part-0.parquet"))
    run.write_output(f"{store}/out/a.bin", b"inside")
    run.write_output(outside, b"outside")
    with pytest.raises(manifest.ManifestError, match=f"outputs/1: '{outside}' is not below the store {store}"):
        run.publish()
    assert not storage.exists(run.uri)


def test_credentials_never_reach_the_manifest(store):
    params = {
        "source": "s3://AKIAXX:topsecret@bucket/raw",
        "aws_secret_access_key": "topsecret",
        "nested": {"password": "hunter2"},
    }
    run = _run(store, params=params)
    run.publish()
    body = storage.read_bytes(run.uri).decode()
    assert "topsecret" not in body and "hunter2" not in body and "AKIAXX" not in body
    assert '"source": "s3://bucket/raw"' in body


def test_list_keys(store):
    _run(store).publish()
    assert manifest.list_keys(store, "demo_stage") == ["ingest_date=2026-11-30"]
    assert manifest.list_keys(store, "other") == []


def test_parameters_that_merely_mention_tokens_still_count():
    inputs = [manifest.Input("file:///in", "a" * 64)]
    assert manifest.fingerprint("s", "k", inputs, {"translate_max_tokens": 128}) != manifest.fingerprint(
        "s", "k", inputs, {"translate_max_tokens": 512}
    )
    shown = manifest.redact(
        {"translate_max_tokens": 128, "session_token": "abc", "aws_secret_access_key": "x", "aws_access_key_id": "AKIA"}
    )
    assert shown == {
        "translate_max_tokens": 128,
        "session_token": "***",
        "aws_secret_access_key": "***",
        "aws_access_key_id": "***",
    }


def test_unreadable_manifest_names_its_uri(store):
    uri = catalog.manifest_uri(store, "demo_stage", "broken")
    storage.write_bytes(uri, b"{not json")
    with pytest.raises(manifest.ManifestError, match=f"{uri}: not a readable manifest"):
        manifest.read(store, "demo_stage", "broken")


def test_manifest_records_are_typed_and_a_non_manifest_is_named(store):
    run = _run(store)
    run.write_output(f"{store}/out/summary.json", b"{}")
    run.publish()
    published = manifest.read(store, "demo_stage", "ingest_date=2026-11-30")
    assert published.inputs == (manifest.Input("file:///in.txt", "a" * 64, 3),)
    assert published.output_named("summary.json").bytes == 2
    with pytest.raises(manifest.ManifestError, match="no output named 'missing.json'"):
        published.output_named("missing.json")
    storage.write_bytes(run.uri, b"[]")
    with pytest.raises(manifest.ManifestError, match=f"{run.uri}: not a manifest"):
        manifest.read(store, "demo_stage", "ingest_date=2026-11-30")


def _published_run(store):
    run = _run(store)
    run.write_output(f"{store}/out/a.bin", b"first output")
    run.write_output(f"{store}/out/b.bin", b"second output")
    run.publish()
    return run


def _without(document, name):
    return {k: v for k, v in document.items() if k != name}


def _recording(calls, real):
    def recorded(uri, *args, **kwargs):
        calls.append(uri)
        return real(uri, *args, **kwargs)

    return recorded


def _with_bad_output_bytes(document):
    return {**document, "outputs": [{**document["outputs"][0], "bytes": "12"}]}


CORRUPTIONS = {
    "empty-list": lambda body: b"[]",
    "not-json": lambda body: b"{not json",
    "not-utf8": lambda body: b"\xff\xfe{}",
    "no-outputs": lambda body: json.dumps(_without(json.loads(body), "outputs")).encode(),
    "no-host": lambda body: json.dumps(_without(json.loads(body), "host")).encode(),
    "output-bytes-a-string": lambda body: json.dumps(_with_bad_output_bytes(json.loads(body))).encode(),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_manifest_is_refused_naming_its_uri(store_root, corruption):
    run = _published_run(store_root)
    storage.write_bytes(run.uri, CORRUPTIONS[corruption](storage.read_bytes(run.uri)))
    with pytest.raises(manifest.ManifestError) as read_error:
        manifest.read(store_root, "demo_stage", "ingest_date=2026-11-30")
    assert str(read_error.value).startswith(f"{run.uri}: ")
    for attempt in (lambda r: r.previous(), lambda r: r.skip_result(force=False)):
        with pytest.raises(manifest.ManifestError) as run_error:
            attempt(_run(store_root))
        assert str(run_error.value).startswith(f"{run.uri}: ")


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_forced_run_replaces_a_corrupt_manifest(store_root, corruption, monkeypatch):
    _published_run(store_root)
    forced = _run(store_root)
    storage.write_bytes(forced.uri, CORRUPTIONS[corruption](storage.read_bytes(forced.uri)))
    reads = []
    with monkeypatch.context() as patched:
        patched.setattr(storage, "read_bytes", _recording(reads, storage.read_bytes))
        assert forced.skip_result(force=True) is None
    assert reads == []  # a forced run does not read the manifest to decide
    assert forced.previous_outputs() == set()  # nothing listed by a corrupt manifest gets deleted
    forced.write_output(f"{store_root}/out/c.bin", b"third output")
    published = forced.publish()
    assert published.manifest.run_id == forced.run_id
    on_store = manifest.read(store_root, "demo_stage", "ingest_date=2026-11-30")
    assert on_store.run_id == forced.run_id and on_store.outputs == published.outputs
    manifest.validate(on_store.document)


def test_a_skip_needs_every_output_with_its_recorded_size(store_root):
    run = _published_run(store_root)
    first, second = (o.uri for o in manifest.read(store_root, "demo_stage", "ingest_date=2026-11-30").outputs)
    assert _run(store_root).skip_result(force=False) is not None
    storage.write_bytes(second, b"second outpu")  # truncated
    assert _run(store_root).skip_result(force=False) is None
    assert _run(store_root).skip_result(force=False) is None
    storage.write_bytes(second, b"second output")
    assert _run(store_root).skip_result(force=False).manifest.run_id == run.run_id
    storage.delete(first)
    assert _run(store_root).skip_result(force=False) is None
    assert _run(store_root).previous_outputs() == {first, second}  # the rebuild still knows what it replaces


def test_a_verified_skip_sizes_each_output_and_reads_only_the_manifest(store, monkeypatch):
    run = _published_run(store)
    heads, sizes, reads = [], [], []
    monkeypatch.setattr(storage, "head", _recording(heads, storage.head))
    monkeypatch.setattr(storage, "size", _recording(sizes, storage.size))
    monkeypatch.setattr(storage, "read_bytes", _recording(reads, storage.read_bytes))
    assert _run(store).skip_result(force=False) is not None
    assert reads == [run.uri] and heads == [run.uri]  # the manifest (and its etag)
    assert sorted(sizes) == sorted([f"{store}/out/a.bin", f"{store}/out/b.bin"])  # each output: a stat


# -- store-relative lineage ---------------------------------------------------------------------------------
KEY = "ingest_date=2026-11-30"


def _copy_store(source: str, target: str) -> None:
    """Every object below ``source`` written to the same key below ``target`` (any backends)."""
    for uri in storage.list_uris(source):
        storage.write_bytes(target + uri[len(source) :], storage.read_bytes(uri))


def _lineage_run(store, params=None, raw="file:///raw/in.txt"):
    """A run reading a raw file outside ``store`` and a shard inside it, with ``store`` among its params
    (as every stage passes it)."""
    return manifest.StageRun(
        stage="demo_stage",
        key=KEY,
        store=store,
        params={"store": store, "k": 1, **(params or {})},
        inputs=[manifest.Input(raw, "a" * 64, 3, 30), manifest.Input(f"{store}/sentences/x.parquet", "c" * 64, 2)],
    )


def _published_lineage(store):
    run = _lineage_run(store)
    run.write_output(f"{store}/out/a.bin", b"first output")
    run.write_output(f"{store}/out/sub/b.bin", b"second output")
    return run.publish()


def test_lineage_below_the_store_is_recorded_by_key_and_the_root_nowhere(store_root):
    published = _published_lineage(store_root)
    body = storage.read_bytes(published.manifest_uri).decode()
    document = json.loads(body)
    assert document["manifest_version"] == 2
    assert document["inputs"] == [
        {"uri": "file:///raw/in.txt", "sha256": "a" * 64, "rows": 3, "bytes": 30},
        {"key": "sentences/x.parquet", "sha256": "c" * 64, "rows": 2},
    ]
    assert [o["key"] for o in document["outputs"]] == ["out/a.bin", "out/sub/b.bin"]
    assert all("uri" not in o for o in document["outputs"])
    assert document["params"] == {"k": 1}  # the store root is recorded nowhere
    assert store_root.split("://", 1)[1] not in body
    # in memory, every record is absolute again
    assert published.manifest.inputs[1].uri == f"{store_root}/sentences/x.parquet"
    assert [o.uri for o in published.outputs] == [f"{store_root}/out/a.bin", f"{store_root}/out/sub/b.bin"]


def test_a_manifest_resolves_against_the_store_it_is_read_from(store_root):
    published = _published_lineage(store_root)
    copy = f"{store_root}-copy"  # a sibling whose name starts with the original's
    _copy_store(store_root, copy)
    read = manifest.read(copy, "demo_stage", KEY)
    assert [i.uri for i in read.inputs] == ["file:///raw/in.txt", f"{copy}/sentences/x.parquet"]
    assert [o.uri for o in read.outputs] == [f"{copy}/out/a.bin", f"{copy}/out/sub/b.bin"]
    assert read.fingerprint == published.manifest.fingerprint
    assert [o.uri for o in manifest.read(store_root, "demo_stage", KEY).outputs] == [o.uri for o in published.outputs]


def test_the_store_root_is_in_no_fingerprint():
    first, second = "s3://bucket/root", "file:///elsewhere/store"
    assert _lineage_run(first).fingerprint == _lineage_run(second).fingerprint
    assert _lineage_run(first).fingerprint != _lineage_run(first, {"k": 2}).fingerprint
    assert _lineage_run(first).fingerprint != _lineage_run(first, raw="file:///raw/other.txt").fingerprint
    inside, outside = [manifest.Input("s3://b/r/x", "a" * 64)], [manifest.Input("s3://b/other/x", "a" * 64)]
    assert manifest.fingerprint("s", "k", inside, {"store": "s3://b/r"}, "s3://b/r") == manifest.fingerprint(
        "s", "k", [manifest.Input("file:///s/x", "a" * 64)], {"store": "file:///s"}, "file:///s"
    )
    assert manifest.fingerprint("s", "k", inside, {}, "s3://b/r") != manifest.fingerprint(
        "s", "k", outside, {}, "s3://b/other-root"
    )


def test_a_copied_store_completes_the_work_there_and_replaces_only_its_own_objects(store_root, monkeypatch):
    published = _published_lineage(store_root)
    original = {uri: storage.read_bytes(uri) for uri in storage.list_uris(store_root)}
    copy = f"{store_root}-copy"
    _copy_store(store_root, copy)
    touched = []
    with monkeypatch.context() as patched:
        patched.setattr(storage, "head", _recording(touched, storage.head))
        patched.setattr(storage, "size", _recording(touched, storage.size))
        patched.setattr(storage, "read_bytes", _recording(touched, storage.read_bytes))
        done = _lineage_run(copy).skip_result(force=False)
        assert done is not None and done.manifest.run_id == published.manifest.run_id
        assert set(touched) == {f"{copy}/manifests/demo_stage/{KEY}.json", f"{copy}/out/a.bin", f"{copy}/out/sub/b.bin"}
        rerun = _lineage_run(copy, {"k": 2})
        assert rerun.skip_result(force=False) is None
        assert rerun.previous_outputs() == {f"{copy}/out/a.bin", f"{copy}/out/sub/b.bin"}
    assert {uri: storage.read_bytes(uri) for uri in storage.list_uris(store_root)} == original


def test_a_manifest_of_another_version_is_refused_and_a_forced_run_replaces_it(store_root):
    published = _published_lineage(store_root)
    uri = published.manifest_uri
    old = json.loads(storage.read_bytes(uri))
    old["manifest_version"] = 1  # as version 1 wrote it: absolute URIs, the store among the params
    old["inputs"][1] = {"uri": f"{store_root}/sentences/x.parquet", **_without(old["inputs"][1], "key")}
    old["outputs"] = [{"uri": f"{store_root}/{o['key']}", **_without(o, "key")} for o in old["outputs"]]
    storage.write_bytes(uri, json.dumps(old).encode())
    message = f"^{re.escape(uri)}: manifest version 1 is not supported .*rerun the stage with --force"
    with pytest.raises(manifest.ManifestError, match=message):
        manifest.read(store_root, "demo_stage", KEY)
    with pytest.raises(manifest.ManifestError, match=message):
        _lineage_run(store_root).skip_result(force=False)
    forced = _lineage_run(store_root)
    assert forced.skip_result(force=True) is None
    assert forced.previous_outputs() == set()  # nothing it lists is deleted on its word
    forced.write_output(f"{store_root}/out/a.bin", b"first output")
    assert forced.publish().manifest.document["manifest_version"] == 2


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: {**d, "outputs": [{**_without(d["outputs"][0], "key"), "uri": "file:///s/out/a.bin"}]}, "outputs/0"),
        (lambda d: {**d, "outputs": [{**d["outputs"][0], "key": "out/../../etc/passwd"}]}, "outputs/0/key"),
        (lambda d: {**d, "outputs": [{**d["outputs"][0], "key": "/etc/passwd"}]}, "outputs/0/key"),
        (lambda d: {**d, "outputs": [{**d["outputs"][0], "key": "s3://bucket/out/a.bin"}]}, "outputs/0/key"),
        (lambda d: {**d, "inputs": [{**d["inputs"][1], "uri": "file:///s/x"}]}, "inputs/0"),
        (lambda d: {**d, "inputs": [{**d["inputs"][1], "key": "a//b"}]}, "inputs/0/key"),
        (lambda d: {**d, "params": {"store": "file:///s", "k": 1}}, "params"),
    ],
    ids=["output-uri", "dot-dot", "leading-slash", "scheme", "key-and-uri", "empty-segment", "store-param"],
)
def test_the_schema_holds_lineage_to_keys(store, change, where):
    document = _published_lineage(store).manifest.document
    manifest.validate(document)
    with pytest.raises(manifest.ManifestError, match=f"manifest invalid at {where}:"):
        manifest.validate(change(document))


# -- logging ------------------------------------------------------------------------------------------------
PREFIX = "demo_stage ingest_date=2026-11-30: "


@pytest.fixture
def logs(caplog):
    """``caplog`` capturing what ``tasks.*`` logs at DEBUG and up."""
    caplog.set_level(logging.DEBUG, logger="tasks")
    return caplog


def _messages(logs) -> list[str]:
    return [r.getMessage() for r in logs.records if r.name.startswith("tasks.")]


def test_a_run_logs_its_inputs_params_phases_and_outputs(store, logs):
    run = _run(store, params={"k": 1, "mode": "centered", "store": store})
    with run.phase("work"):
        run.write_output(f"{store}/out/a.bin", b"abc", rows=1)
    run.publish()
    lines = _messages(logs)
    assert lines[:3] == [
        f"{PREFIX}started run {run.run_id} in {store}; inputs: 1 object(s), 3 rows",
        f"{PREFIX}input file:///in.txt (3 rows)",
        f'{PREFIX}params k=1, mode="centered"',  # the store root is no param of the run
    ]
    assert re.fullmatch(re.escape(f"{PREFIX}phase work took ") + r"\d+\.\ds", lines[3])
    assert lines[4] == f"{PREFIX}output {store}/out/a.bin (1 rows, 3 B)"
    published = f"{PREFIX}published 1 object(s), 1 rows, 3 B, then the manifest {run.uri}; "
    assert lines[5].startswith(published) and lines[5].endswith(" in all") and len(lines) == 6


def test_many_inputs_are_named_at_debug_beyond_the_first_few(store, logs):
    inputs = [manifest.Input(f"file:///in/{n}.txt", "a" * 64, 10, 2048) for n in range(8)]
    manifest.StageRun(stage="demo_stage", key="ingest_date=2026-11-30", store=store, params={}, inputs=inputs)
    info = [r.getMessage() for r in logs.records if r.levelno == logging.INFO]
    assert info[0].endswith("inputs: 8 object(s), 80 rows, 16.0 KiB")
    assert info[1:7] == [f"{PREFIX}input file:///in/{n}.txt (10 rows, 2.0 KiB)" for n in range(5)] + [
        f"{PREFIX}... and 3 more inputs (listed at DEBUG)"
    ]
    assert f"{PREFIX}input file:///in/7.txt (10 rows, 2.0 KiB)" in _messages(logs)


def test_each_skip_decision_logs_its_reason(store, logs):
    def decision(run, force=False):
        logs.clear()  # the run's start lines
        run.skip_result(force)
        return _messages(logs)

    run = _run(store)
    assert decision(run) == [f"{PREFIX}running: no manifest at {run.uri}"]
    run.write_output(f"{store}/out/a.bin", b"abc")
    run.publish()
    assert decision(_run(store)) == [f"{PREFIX}skipped: {run.uri} matches, and its 1 output(s) are intact"]
    assert decision(_run(store), force=True) == [f"{PREFIX}running: forced, the published manifest is not read"]
    changed = "running: the published manifest has another fingerprint"
    assert decision(_run(store, params={"k": 2})) == [f"{PREFIX}{changed} (params changed: k)"]
    assert decision(_run(store, sha="c" * 64)) == [f"{PREFIX}{changed} (inputs: 1 new or changed, 1 replaced or gone)"]
    storage.write_bytes(f"{store}/out/a.bin", b"ab")
    assert decision(_run(store)) == [f"{PREFIX}running: output {store}/out/a.bin has 2 bytes, the manifest records 3"]
    storage.delete(f"{store}/out/a.bin")
    assert decision(_run(store)) == [f"{PREFIX}running: output {store}/out/a.bin is missing"]


def test_a_failed_phase_logs_how_long_it_ran(store, logs):
    run = _run(store)
    with pytest.raises(RuntimeError), run.phase("work"):
        raise RuntimeError("interrupted")
    assert re.fullmatch(re.escape(f"{PREFIX}phase work failed after ") + r"\d+\.\ds", _messages(logs)[-1])
    assert "work" in run.timings_s


def test_no_credential_reaches_a_log_line(store_root, logs):
    """Credentials in a source URI, a param or the store URI itself are never logged (nor in the refusal)."""
    secret_uri = "s3://AKIAUSER:hunter2@bucket/raw/in.txt"

    def run(params, store=store_root):
        secrets = {"source": secret_uri, "aws_secret_access_key": "hunter2", "nested": {"password": "hunter2"}}
        inputs = [manifest.Input(secret_uri, "a" * 64, 3, 10)]
        return manifest.StageRun(stage="demo_stage", key=KEY, store=store, params={**params, **secrets}, inputs=inputs)

    first = run({"k": 1})
    first.skip_result(force=False)
    with first.phase("work"):
        first.write_output(f"{store_root}/out/a.bin", b"abc")
    first.publish()
    run({"k": 1}).skip_result(force=False)
    run({"k": 2}).skip_result(force=False)
    with pytest.raises(storage.StorageError) as refused:
        run({"k": 1}, store="s3://AKIAUSER:hunter2@bucket/root").skip_result(force=False)
    text = "\n".join([*_messages(logs), str(refused.value)])
    assert "hunter2" not in text and "AKIAUSER" not in text
    assert f"{PREFIX}input s3://bucket/raw/in.txt (3 rows, 10 B)" in text
    assert any(
        line.startswith(f"{PREFIX}started run") and " in s3://bucket/root; " in line for line in text.split("\n")
    )
    assert f"{PREFIX}skipped: " in text and "(params changed: k)" in text
