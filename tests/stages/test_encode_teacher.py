import gzip
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file

from tasks import cli
from tasks.core import catalog, config, contracts, manifest, parquet_shards, sentences, storage, teacher_sample
from tasks.core.catalog import Stage
from tasks.ml import models, teachers
from tasks.ml.models import ModelError
from tasks.stages import encode_teacher, stage_corpus
from tests.support import faults
from tests.support.paths import CORPUS, REPO, SUPPORT
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)
HELPER = SUPPORT / "slow_encode.py"


def _corpus_lines(n):
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        return [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(n)]


def _stage(store, tmp_path, n=40, shard_rows=10):
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(_corpus_lines(n)))
    stage_corpus.run(
        config.parse(
            stage_corpus.StageCorpusParams,
            {"store": store, "source": str(source), "ingest_date": DAY, "shard_rows": shard_rows},
        )
    )


def _params(store, model, **extra):
    return config.parse(
        encode_teacher.EncodeTeacherParams, {"store": store, "teacher": str(model), "ingest_date": DAY, **extra}
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_sentence_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture
def store(tmp_path):
    return storage.to_uri(str(tmp_path / "store"))


def test_each_shard_becomes_one_embedding_shard_then_skips(store, tmp_path, tiny_model, caplog):
    _stage(store, tmp_path)
    caplog.set_level(logging.INFO, logger="tasks")
    result = encode_teacher.run(_params(store, tiny_model))
    assert result.stats == {"shards": 4, "encoded": 4, "skipped": 0, "rows": 40, "rows_available": 40}
    partition = catalog.teacher_partition(str(tiny_model), DAY)
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.stages.encode_teacher"]
    batch = encode_teacher.EncodeTeacherParams.model_fields["batch_size"].default
    sample = "the teacher sample (at most 1000 rows) holds 40 of the partition's 40 rows"
    assert lines[0] == f"encode_teacher ingest_date=2026-11-01: {sample}"
    assert lines[1].startswith(f"encode_teacher: teacher {tiny_model} on cpu (") and f", batch {batch}" in lines[1]
    per_shard = [line for line in lines if " sampled rows of " in line]
    assert len(per_shard) == 4 and all(
        line.endswith(" rows/s), 0 reused") and ": 10 sampled rows of 10: 10 encoded in " in line for line in per_shard
    )
    assert lines[-2].startswith(f"encode_teacher {partition}: finished 40/40 rows (100.0%) in ")
    assert lines[-1] == f"encode_teacher {partition}: 4 shard(s) encoded, 0 skipped; the teacher holds 40 of 40 rows"
    outputs = encode_teacher.output_shards(store, str(tiny_model), DAY)
    assert len(outputs) == 4
    table = storage.read_parquet(outputs[0])
    assert contracts.identify(table.schema) == ("teacher_embeddings", 1)
    assert table.schema.metadata[contracts.META_DIM] == b"32"
    staged = storage.read_parquet(sentences.shards(store, DAY)[0])
    assert table.column("sentence_id").to_pylist() == staged.column("sentence_id").to_pylist()
    embeddings = np.array(table.column("embedding").to_pylist())
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    for key in manifest.list_keys(store, Stage.ENCODE_TEACHER):
        manifest.validate(manifest.read(store, Stage.ENCODE_TEACHER, key).document)

    caplog.clear()
    again = encode_teacher.run(_params(store, tiny_model))
    assert again.skipped and again.stats["skipped"] == 4
    skips = [m for m in caplog.messages if ": skipped: " in m]
    assert len(skips) == 4 and all(m.endswith("matches, and its 1 output(s) are intact") for m in skips)
    assert (
        caplog.messages[-1]
        == f"encode_teacher {partition}: 0 shard(s) encoded, 4 skipped; the teacher holds 40 of 40 rows"
    )
    group = encode_teacher.run(_params(store, tiny_model, shards=[1, 2]), force=True)
    assert group.stats == {"shards": 2, "encoded": 2, "skipped": 0, "rows": 20, "rows_available": 40}


def _teacher_rows(store, model) -> dict[str, np.ndarray]:
    """Every row the teacher encoded in the partition: sentence id -> embedding."""
    tables = [storage.read_parquet(uri) for uri in encode_teacher.output_shards(store, str(model), DAY)]
    return {
        sid: np.asarray(vector)
        for table in tables
        for sid, vector in zip(
            table.column("sentence_id").to_pylist(), table.column("embedding").to_pylist(), strict=True
        )
    }


def test_the_teacher_encodes_a_bounded_sample_chosen_by_content_and_encodes_a_row_once(tmp_path, tiny_model):
    """The teacher encodes ``teacher_sample`` rows of a partition, the same ones whatever order its sentences came
    in; a larger sample encodes only the rows it adds (the others are reused, bit for bit), and 0 encodes all."""
    lines = _corpus_lines(40)
    stores = {}
    for name, order in (("forward", lines), ("reversed", lines[::-1])):
        stores[name] = storage.to_uri(str(tmp_path / name))
        source = tmp_path / f"{name}.txt"
        source.write_text("\n".join(order))
        values = {"store": stores[name], "source": str(source), "ingest_date": DAY, "shard_rows": 10}
        stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
        encode_teacher.run(_params(stores[name], tiny_model, teacher_sample=15))
    sampled = {name: _teacher_rows(store, tiny_model) for name, store in stores.items()}
    assert len(sampled["forward"]) == 15 and set(sampled["forward"]) == set(sampled["reversed"])
    staged = [sentences.sentence_id(sentences.normalise_text(line)) for line in lines]
    assert set(sampled["forward"]) == set(teacher_sample.ordered(staged, 0)[:15])

    store = stores["forward"]
    grown = encode_teacher.run(_params(store, tiny_model, teacher_sample=25))
    assert grown.stats["rows"] == 25 and grown.stats["rows_available"] == 40
    shard_runs = [
        manifest.read(store, Stage.ENCODE_TEACHER, key) for key in manifest.list_keys(store, Stage.ENCODE_TEACHER)
    ]
    assert (
        sum(run.stats["encoded"] for run in shard_runs) == 10 and sum(run.stats["reused"] for run in shard_runs) == 15
    )
    after = _teacher_rows(store, tiny_model)
    assert all(np.array_equal(after[sid], vector) for sid, vector in sampled["forward"].items())
    assert len(_teacher_rows(store, tiny_model)) == 25
    everything = encode_teacher.run(_params(store, tiny_model, teacher_sample=0))
    assert everything.stats["rows"] == 40
    assert encode_teacher.run(_params(store, tiny_model, teacher_sample=0)).skipped


def test_float16_output_and_shard_selection(store, tmp_path, tiny_model):
    _stage(store, tmp_path, n=20)
    encode_teacher.run(_params(store, tiny_model, output_dtype="float16", shards=[0]))
    (only,) = encode_teacher.output_shards(store, str(tiny_model), DAY)
    assert storage.read_parquet(only).schema.field("embedding").type == pa.list_(pa.float16(), 32)
    with pytest.raises(encode_teacher.EncodeError, match="out of range"):
        encode_teacher.run(_params(store, tiny_model, shards=[7]))


def test_nan_weights_or_embeddings_fail_naming_the_model_or_the_shard(store, tmp_path, tiny_model, monkeypatch):
    broken = tmp_path / "broken"
    build_sentence_model(broken)
    weights = load_file(broken / "model.safetensors")
    name = next(k for k in weights if k.endswith("embeddings.word_embeddings.weight"))
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    _stage(store, tmp_path, n=10)
    with pytest.raises(ModelError, match=f"^{re.escape(str(broken))}: weight .*word_embeddings.weight holds NaN"):
        encode_teacher.run(_params(store, broken))
    faults.nan_in_encodings(monkeypatch, 3, 1)
    with pytest.raises(encode_teacher.EncodeError, match=r"sentences/ingest_date=2026-11-01/part-00000-.*: 1 sentence"):
        encode_teacher.run(_params(store, tiny_model))
    assert storage.list_uris(f"{store}/teacher") == []
    assert manifest.list_keys(store, "encode_teacher") == []


def _texts(body: bytes) -> list[str] | None:
    """The text column of a Parquet file's bytes, or None where they do not read."""
    try:
        return pq.read_table(pa.BufferReader(body), columns=["text"]).column("text").to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError):
        return None


def _flip_a_text_bit(path: Path) -> None:
    """Flip the first bit of the data pages (before the footer) after which the shard still reads but a
    sentence reads differently: the damage an unverified reader encodes without noticing. Same size."""
    body = path.read_bytes()
    original = _texts(body)
    footer_start = len(body) - 8 - int.from_bytes(body[-8:-4], "little")
    for at in range(4, footer_start):
        altered = body[:at] + bytes([body[at] ^ 0x20]) + body[at + 1 :]
        texts = _texts(altered)
        if texts is not None and len(texts) == len(original) and texts != original:
            path.write_bytes(altered)
            return
    raise AssertionError(f"{path}: no single-bit change of the data pages keeps it readable")


def test_an_altered_staged_shard_fails_naming_it_and_publishes_nothing_for_it(store, tmp_path, tiny_model, capsys):
    _stage(store, tmp_path, n=20)  # two shards of 10
    intact, altered = sentences.published(store, DAY)
    path = Path(altered.uri.removeprefix("file://"))
    size, before = path.stat().st_size, _texts(path.read_bytes())
    _flip_a_text_bit(path)
    assert path.stat().st_size == size
    after = storage.read_parquet(altered.uri, columns=["text"]).column("text").to_pylist()
    assert len(after) == 10 and after != before  # unverified, the altered text reads without a complaint

    args = ["encode-teacher", "--store", store, "--teacher", str(tiny_model), "--ingest-date", DAY.isoformat()]
    assert cli.main([*args, "--quiet"]) == 1
    error = capsys.readouterr().err
    assert f"{altered.uri}: sha256 mismatch: expected {altered.sha256}, read " in error

    def published_for(shard: manifest.Output) -> manifest.Manifest | None:
        key = catalog.teacher_shard_key(str(tiny_model), DAY, shard.uri)
        return manifest.read(store, Stage.ENCODE_TEACHER, key)

    # the teacher sample is chosen over every shard of the partition, each read verified first: nothing is encoded
    assert published_for(altered) is None and published_for(intact) is None
    assert storage.list_uris(f"{store}/teacher") == []
    with pytest.raises(storage.IntegrityError) as err:
        encode_teacher.run(_params(store, tiny_model))
    assert (err.value.uri, err.value.expected) == (altered.uri, altered.sha256)
    assert storage.list_uris(f"{store}/teacher") == []


def test_nothing_staged_is_a_clear_error(store, tiny_model):
    with pytest.raises(encode_teacher.EncodeError, match="no sentences staged for ingest_date=2026-11-01"):
        encode_teacher.run(_params(store, tiny_model))


def test_missing_model_is_a_clear_error(store, tmp_path):
    _stage(store, tmp_path, n=10)
    with pytest.raises(models.ModelError, match="no such folder"):
        encode_teacher.run(_params(store, tmp_path / "no-model"))


def _watch_for_partial_shards(prefix, stop, seen, problems):
    """Read every visible teacher shard while a run is going: each must be a complete Parquet file."""
    while not stop.is_set():
        for uri in storage.list_uris(prefix):
            if uri not in seen:
                try:
                    seen[uri] = storage.read_parquet(uri).num_rows
                except Exception as exc:  # any unreadable visible object is a failure
                    problems.append(f"{uri}: {exc}")
        time.sleep(0.01)


def test_killed_run_resumes_to_byte_identical_shards(tmp_path, tiny_model):
    stores = {name: storage.to_uri(str(tmp_path / name)) for name in ("killed", "straight")}
    for store in stores.values():
        _stage(store, tmp_path, n=80, shard_rows=10)  # 8 shards, the same in both stores
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    teacher_prefix = f"{stores['killed']}/teacher"
    stop, seen, problems = threading.Event(), {}, []
    watcher = threading.Thread(target=_watch_for_partial_shards, args=(teacher_prefix, stop, seen, problems))
    watcher.start()
    child = subprocess.Popen(
        [sys.executable, str(HELPER), stores["killed"], str(tiny_model), DAY.isoformat(), "0.3"], env=env
    )
    try:
        deadline = time.monotonic() + 120
        while len(manifest.list_keys(stores["killed"], "encode_teacher")) < 3:
            assert child.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        stop.set()
        watcher.join()
    assert problems == []
    assert all(rows == 10 for rows in seen.values())
    done_before_resume = len(manifest.list_keys(stores["killed"], "encode_teacher"))
    assert 3 <= done_before_resume < 8

    resumed = encode_teacher.run(_params(stores["killed"], tiny_model))
    assert resumed.stats["skipped"] == done_before_resume
    encode_teacher.run(_params(stores["straight"], tiny_model))
    killed = encode_teacher.output_shards(stores["killed"], str(tiny_model), DAY)
    straight = encode_teacher.output_shards(stores["straight"], str(tiny_model), DAY)
    assert len(killed) == len(straight) == 8
    for a, b in zip(killed, straight, strict=True):
        assert a.rsplit("/", 1)[1] == b.rsplit("/", 1)[1]
        assert storage.read_bytes(a) == storage.read_bytes(b)


@pytest.mark.slow
def test_real_teacher_matches_sentence_transformers(store, tmp_path):
    from sentence_transformers import SentenceTransformer

    _stage(store, tmp_path, n=64, shard_rows=32)  # two shards, read back in order
    encode_teacher.run(_params(store, models.DEFAULT_TEACHER))
    ours = pa.concat_tables(
        [storage.read_parquet(u) for u in encode_teacher.output_shards(store, models.DEFAULT_TEACHER, DAY)]
    )
    staged = pa.concat_tables([storage.read_parquet(u) for u in sentences.shards(store, DAY)])
    assert ours.column("sentence_id").to_pylist() == staged.column("sentence_id").to_pylist()
    reference = SentenceTransformer(str(models.resolve(models.DEFAULT_TEACHER)), device="cpu").encode(
        staged.column("text").to_pylist()
    )
    embeddings = np.array(ours.column("embedding").to_pylist(), dtype=np.float32)
    assert embeddings.shape == (64, 768)
    cosine = (embeddings * reference).sum(1) / np.linalg.norm(embeddings, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999


def test_a_composite_teacher_combines_its_members_shards_then_skips(store, tmp_path, tiny_model):
    other = build_sentence_model(tmp_path / "other", hidden=16, seed=1, normalize=False)
    spec = f"{tiny_model}+{other}"
    _stage(store, tmp_path, n=20)
    result = encode_teacher.run(_params(store, spec))
    assert result.stats == {"shards": 2, "encoded": 2, "skipped": 0, "rows": 20, "rows_available": 20}
    members = [encode_teacher.output_shards(store, str(m), DAY) for m in (tiny_model, other)]
    combined = encode_teacher.output_shards(store, spec, DAY)
    assert [len(m) for m in members] == [2, 2] and len(combined) == 2
    table = storage.read_parquet(combined[0])
    assert table.schema.metadata[contracts.META_DIM] == b"48"
    first, second = (np.array(storage.read_parquet(m[0]).column("embedding").to_pylist()) for m in members)
    unit = second / np.linalg.norm(second, axis=1, keepdims=True)
    np.testing.assert_allclose(
        np.array(table.column("embedding").to_pylist()), np.hstack([first, unit]) / np.sqrt(2), atol=1e-6
    )
    published = manifest.read(
        store, Stage.ENCODE_TEACHER, catalog.teacher_shard_key(spec, DAY, sentences.shards(store, DAY)[0])
    )
    read = {i.uri for i in published.inputs}
    assert {members[0][0], members[1][0]} <= read and len(read) == 3
    assert encode_teacher.run(_params(store, spec)).stats["skipped"] == 2


def test_a_weighted_composite_shares_its_members_encodings_and_scales_their_blocks(store, tmp_path, tiny_model):
    other = build_sentence_model(tmp_path / "other", hidden=16, seed=1)
    _stage(store, tmp_path, n=10)
    encode_teacher.run(_params(store, f"{tiny_model}+{other}"))
    weighted = f"{tiny_model}+0.5*{other}"
    assert encode_teacher.run(_params(store, weighted)).stats["rows"] == 10
    members = [encode_teacher.output_shards(store, str(m), DAY) for m in (tiny_model, other)]
    assert [len(m) for m in members] == [1, 1]  # each member encoded once, for both composites
    first, second = (parquet_shards.vectors(storage.read_parquet(m[0]), "embedding") for m in members)
    (shard,) = encode_teacher.output_shards(store, weighted, DAY)
    np.testing.assert_allclose(
        parquet_shards.vectors(storage.read_parquet(shard), "embedding"),
        teachers.combine([first, second], [1.0, 0.5]),
        atol=1e-6,
    )
    assert shard not in encode_teacher.output_shards(store, f"{tiny_model}+{other}", DAY)


def test_a_composite_teacher_refuses_a_damaged_member_shard(store, tmp_path, tiny_model):
    other = build_sentence_model(tmp_path / "other", hidden=16, seed=1)
    spec = f"{tiny_model}+{other}"
    _stage(store, tmp_path, n=10)
    encode_teacher.run(_params(store, str(other)))
    (member,) = encode_teacher.output_shards(store, str(other), DAY)
    path = Path(member.removeprefix("file://"))
    body = bytearray(path.read_bytes())
    body[len(body) // 2] ^= 0x01
    path.write_bytes(bytes(body))
    with pytest.raises(storage.IntegrityError, match=member):
        encode_teacher.run(_params(store, spec))
    assert encode_teacher.output_shards(store, spec, DAY) == []
