import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from safetensors.numpy import load

from tasks.core import config, storage
from tasks.ml import student
from tasks.ml.encoder import SentenceEncoder
from tasks.stages import distill
from tasks.stages.distill.data import DistillDataError, ShardPair, read_pair, shard_pairs
from tests.support.paths import REPO, SUPPORT
from tests.support.projected_store import PCA_NAME, corpus_lines, projected_store

DAY = date(2026, 11, 1)
HELPER = SUPPORT / "slow_distill.py"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A store with 240 staged sentences, encoded by a tiny teacher and projected to 8 dims."""
    root = tmp_path_factory.mktemp("distill")
    return {**projected_store(root, corpus_lines(240), DAY, shard_rows=80), "root": root}


def _values(prepared, **extra):
    return {
        "store": prepared["store"],
        "teacher": prepared["teacher"],
        "student": prepared["student"],
        "pca_name": PCA_NAME,
        "batch_size": 16,
        "lr": 1e-3,
        "val_fraction": 0.15,
        "eval_every": 5,
        "checkpoint_every": 1000,
        "threads": 1,
        **extra,
    }


def _params(prepared, **extra):
    return config.parse(distill.DistillParams, _values(prepared, **extra))


def _run_file(store, name, path):
    """A file of a published distill run (its outputs live in a folder per fingerprint)."""
    return student.exported_prefix(store, name).removesuffix("/model") + "/" + path


def _weights(store, name):
    prefix = student.exported_prefix(store, name)
    merged = load(storage.read_bytes(f"{prefix}/model.safetensors"))
    merged.update({f"dense.{k}": v for k, v in load(storage.read_bytes(f"{prefix}/2_Dense/model.safetensors")).items()})
    return merged


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) for k in a)


def test_pairs_follow_lineage(prepared):
    pairs = shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME)
    assert len(pairs) == 3 and sum(p.rows for p in pairs) == 240
    ids, texts, targets = read_pair(pairs[0])
    assert len(ids) == len(texts) == 80 and targets.shape == (80, 8)


def test_training_lowers_validation_mse_and_exports(prepared):
    result = distill.run(_params(prepared, init="random", epochs=3, name="lowers"))
    stats = result.stats
    assert stats["steps"] == 3 * 13  # ceil(204 training rows / 16) per epoch
    assert stats["final"]["val_mse"] < stats["initial"]["val_mse"]
    assert stats["best_val_mse"] <= stats["final"]["val_mse"]
    outputs = {o.uri.split("/students/lowers/")[1].split("/", 1)[1] for o in result.outputs}
    assert {
        "model/modules.json",
        "model/2_Dense/config.json",
        "model/README.md",
        "losses.jsonl",
        "metrics.json",
    } <= outputs
    losses = storage.read_bytes(_run_file(prepared["store"], "lowers", "losses.jsonl")).decode().splitlines()
    assert len(losses) == stats["steps"]
    assert distill.run(_params(prepared, init="random", epochs=3, name="lowers")).skipped


@pytest.mark.parametrize("init", ["ridge", "pca"])
def test_fitted_inits_start_below_random(prepared, init):
    random_start = distill.run(_params(prepared, init="random", max_steps=1, name=f"start-random-{init}"))
    fitted = distill.run(_params(prepared, init=init, max_steps=1, name=f"start-{init}"))
    assert fitted.stats["initial"]["val_mse"] < random_start.stats["initial"]["val_mse"]
    assert fitted.stats["init"]["init"] == init


def test_exported_model_loads_in_sentence_transformers(prepared, tmp_path):
    from sentence_transformers import SentenceTransformer

    distill.run(_params(prepared, max_steps=4, name="export"))
    folder = tmp_path / "export"
    prefix = student.exported_prefix(prepared["store"], "export") + "/"
    for uri in storage.list_uris(prefix):
        path = folder / uri[len(prefix) :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(storage.read_bytes(uri))
    texts = ["A man is playing a guitar.", "Stocks fell sharply on Monday.", "short", "x y z " * 20]
    reference = SentenceTransformer(str(folder), device="cpu").encode(texts)
    ours = SentenceEncoder.load(str(folder)).encode(texts)
    assert ours.shape == (4, 8)
    assert float(np.abs(ours - reference).max()) < 1e-5
    assert "Homomorphic Projective Distillation" in (folder / "README.md").read_text()


def test_killed_run_resumes_to_the_same_weights(prepared):
    values = _values(prepared, init="ridge", max_steps=12, checkpoint_every=3, eval_every=4)
    straight = distill.run(config.parse(distill.DistillParams, {**values, "name": "straight"}))
    killed = {**values, "name": "killed"}
    latest = f"{prepared['store']}/students/killed/checkpoints/latest.json"
    child = subprocess.Popen(
        [sys.executable, str(HELPER), json.dumps(killed)], env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    deadline = time.monotonic() + 120
    while not (storage.exists(latest) and json.loads(storage.read_bytes(latest))["step"] >= 6):
        assert child.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    resumed = distill.run(config.parse(distill.DistillParams, killed))
    assert resumed.stats["init"]["resumed_from_step"] in (6, 9)
    assert _max_diff(_weights(prepared["store"], "killed"), _weights(prepared["store"], "straight")) < 1e-6
    losses = [storage.read_bytes(_run_file(prepared["store"], n, "losses.jsonl")) for n in ("killed", "straight")]
    assert losses[0] == losses[1]
    assert straight.stats["steps"] == resumed.stats["steps"] == 12


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_matches_single_process(prepared):
    common = {"max_steps": 6, "dropout": 0.0, "init": "ridge", "batch_size": 16, "grad_accum": 2}
    single = distill.run(_params(prepared, name="single", **common))
    hpd = Path(sys.executable).parent / "hpd"
    args = [f"--{k.replace('_', '-')}={v}" for k, v in _values(prepared, name="ddp", **common).items()]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--nnodes=1",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            "--no-python",
            str(hpd),
            "distill",
            *args,
            "--quiet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(storage.read_bytes(_run_file(prepared["store"], "ddp", "metrics.json")))
    assert metrics["world_size"] == 2
    assert _max_diff(_weights(prepared["store"], "ddp"), _weights(prepared["store"], "single")) < 1e-4
    assert abs(metrics["best_val_mse"] - single.stats["best_val_mse"]) < 1e-6


def test_corrupted_checkpoint_is_named_and_nothing_is_published(prepared):
    values = _values(prepared, max_steps=6, checkpoint_every=3, name="corrupt")
    params = config.parse(distill.DistillParams, values)
    store = prepared["store"]
    child = subprocess.Popen(
        [sys.executable, str(HELPER), json.dumps(values)], env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    latest = f"{store}/students/corrupt/checkpoints/latest.json"
    deadline = time.monotonic() + 120
    while not storage.exists(latest):
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    checkpoint = json.loads(storage.read_bytes(latest))["uri"]
    storage.write_bytes(checkpoint, b"not a checkpoint")
    with pytest.raises(distill.DistillError, match=f"{checkpoint}: corrupted"):
        distill.run(params)
    assert not storage.exists(f"{store}/manifests/distill/corrupt.json")
    assert [u for u in storage.list_uris(f"{store}/students/corrupt") if "/checkpoints/" not in u] == []


def test_bad_training_data_is_named(prepared, tmp_path):
    pair = shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME)[0]
    targets = storage.read_parquet(pair.targets_uri)
    broken = targets.set_column(0, "sentence_id", pa.array(["unknown"] + targets.column("sentence_id").to_pylist()[1:]))
    uri = storage.to_uri(str(tmp_path / "broken.parquet"))
    storage.write_parquet(uri, broken)
    with pytest.raises(DistillDataError, match="1 target id"):
        read_pair(ShardPair(pair.sentences_uri, uri, ("", ""), pair.rows))
    with pytest.raises(DistillDataError, match="no PCA run 'k9-nope'"):
        distill.run(_params(prepared, pca_name="k9-nope"))
    with pytest.raises(DistillDataError, match="validation split is empty"):
        distill.run(_params(prepared, val_fraction=1e-9, name="empty-val"))
    with pytest.raises(config.ConfigError, match="grad_accum"):
        _params(prepared, batch_size=10, grad_accum=3)


@pytest.mark.timeout(120)
def test_an_epoch_ending_in_validation_only_shards_moves_on(prepared, tmp_path):
    """A batch that fills exactly at the end of the last shard with training rows must not stall the loop
    when the epoch's remaining shards hold only validation rows."""
    from tasks.stages.distill.data import TrainingData, is_validation

    candidates = [f"id-{i}" for i in range(200)]
    held_out = is_validation(candidates, 0.5, 0)
    train_ids = [c for c, h in zip(candidates, held_out, strict=True) if not h][:8]
    val_ids = [c for c, h in zip(candidates, held_out, strict=True) if h][:4]
    pairs = []
    for name, ids in (("a", train_ids), ("b", val_ids)):
        sentences_uri = storage.to_uri(str(tmp_path / f"{name}-sentences.parquet"))
        targets_uri = storage.to_uri(str(tmp_path / f"{name}-targets.parquet"))
        storage.write_parquet(sentences_uri, pa.table({"sentence_id": ids, "text": [f"text {i}" for i in ids]}))
        values = np.random.default_rng(0).uniform(-0.1, 0.1, (len(ids), 8)).astype(np.float32)
        storage.write_parquet(
            targets_uri,
            pa.table({"sentence_id": ids, "target": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 8)}),
        )
        pairs.append(ShardPair(sentences_uri, targets_uri, ("", ""), len(ids)))
    data = TrainingData(pairs, seed=0, val_fraction=0.5, val_max_rows=10)
    assert data.train_rows == 8 and len(data.val_texts) == 4
    params = _params(prepared, batch_size=4, epochs=4, name="validation-only-tail", init="random")
    trainer = distill.Trainer(params, data, "cpu", distill.Distributed(), "test")
    trainer.restore_or_initialise(force=True)
    trainer.train(progress=False)
    assert trainer.state.step == 8
