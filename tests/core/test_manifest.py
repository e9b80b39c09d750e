import json

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
        run.outputs.append(manifest.Output("file:///out/part-0.parquet", "b" * 64, 3, 10, "sentences", 1))
    published = run.publish()
    on_store = json.loads(storage.read_bytes(run.uri))
    assert on_store == published.manifest.document
    assert published.outputs == (manifest.Output("file:///out/part-0.parquet", "b" * 64, 3, 10, "sentences", 1),)
    manifest.validate(on_store)
    assert on_store["packages"]["pyarrow"]
    assert on_store["code_version"].startswith(("git:", "hpd-pipeline=="))
    assert set(on_store["timings_s"]) == {"work", "total"}
    assert run.uri == f"{store}/manifests/demo_stage/ingest_date=2026-11-30.json"


def test_same_inputs_and_params_complete_the_work(store):
    _run(store).publish()
    assert _run(store).completed() is not None
    assert _run(store, params={"k": 2}).completed() is None
    assert _run(store, sha="c" * 64).completed() is None


def test_rerun_replaces_the_manifest_and_a_concurrent_change_is_refused(store):
    _run(store).publish()
    rerun = _run(store, params={"k": 2})
    assert rerun.completed() is None
    _run(store, params={"k": 3}).publish()  # someone else published in between
    with pytest.raises(manifest.ManifestError, match="concurrent"):
        rerun.publish()
    assert manifest.read(store, "demo_stage", "ingest_date=2026-11-30").params == {"k": 3}


def test_invalid_manifest_is_not_published(store):
    run = _run(store)
    run.add_output("not-a-uri", b"body")
    with pytest.raises(manifest.ManifestError, match="outputs/0/uri"):
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
    for attempt in (lambda r: r.previous(), lambda r: r.completed(), lambda r: r.skip_result(force=False)):
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
    assert _run(store_root).completed() is not None
    storage.write_bytes(second, b"second outpu")  # truncated
    assert _run(store_root).completed() is None
    assert _run(store_root).skip_result(force=False) is None
    storage.write_bytes(second, b"second output")
    assert _run(store_root).completed().run_id == run.run_id
    storage.delete(first)
    assert _run(store_root).completed() is None
    assert _run(store_root).previous_outputs() == {first, second}  # the rebuild still knows what it replaces


def test_a_verified_skip_costs_one_head_per_output_and_reads_only_the_manifest(store, monkeypatch):
    run = _published_run(store)
    heads, reads = [], []
    monkeypatch.setattr(storage, "head", _recording(heads, storage.head))
    monkeypatch.setattr(storage, "read_bytes", _recording(reads, storage.read_bytes))
    assert _run(store).skip_result(force=False) is not None
    assert reads == [run.uri]
    assert sorted(heads) == sorted([run.uri, f"{store}/out/a.bin", f"{store}/out/b.bin"])
