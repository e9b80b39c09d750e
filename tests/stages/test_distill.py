import io
import json
import logging
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pytest
from safetensors.numpy import load

from tasks.core import config, progress, storage
from tasks.core.finite import NonFiniteError
from tasks.ml import student
from tasks.ml.encoder import SentenceEncoder
from tasks.ml.onnx_encoder import OnnxEncoder
from tasks.stages import distill
from tasks.stages.distill.data import DistillDataError, ShardPair, TrainingData, shard_pairs
from tasks.stages.distill.evaluation import Evaluation, FidelityEvaluator
from tests.support.paths import REPO, SUPPORT
from tests.support.projected_store import PCA_NAME, corpus_lines, projected_store
from tests.support.servers import free_port

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)
HELPER = SUPPORT / "slow_distill.py"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A store with 240 staged sentences, encoded by a tiny teacher and projected to 8 dims."""
    root = tmp_path_factory.mktemp("distill")
    return {**projected_store(root, corpus_lines(240), DAY, shard_rows=80), "root": root}


# The in-batch neighbourhood term is computed per micro-batch: equality across batch splits holds for the MSE.
MSE_ALONE = {"relation_weight": 0.0}


def _values(prepared, **extra):
    """The mechanics are tested under validation-MSE selection without blends; the recipe's defaults (STS dev
    selection among blends of the initial and final weights) in test_distill_blending."""
    return {
        "select_on": "val_mse",
        "blend_initial": [],
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
    ids, texts, targets = pairs[0].read()
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


def test_an_onnx_export_joins_the_model_folder_with_its_sts_record(prepared, tmp_path):
    result = distill.run(_params(prepared, max_steps=2, name="onnx", onnx="fp32"))
    record = result.stats["onnx"]
    assert record["file"] == "onnx/encoder.onnx" and record["variant"] == "fp32"
    assert record["sts_dev"]["fp32"] == pytest.approx(record["sts_dev"]["torch"], abs=0.01)
    folder = student.fetch_exported(prepared["store"], "onnx", tmp_path)
    texts = ["A man is playing a guitar.", "short"]
    np.testing.assert_allclose(
        OnnxEncoder.load(folder).encode(texts), SentenceEncoder.load(str(folder)).encode(texts), atol=1e-5
    )
    assert "`onnx/encoder.onnx`" in (folder / "README.md").read_text()


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


def _trainer_lines(caplog, logger="tasks.stages.distill.run_log"):
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_the_run_logs_loss_evaluations_epochs_and_checkpoints(prepared, caplog, monkeypatch):
    monkeypatch.setenv(progress.EVERY_S_ENV, "0")  # a progress line every step
    caplog.set_level(logging.INFO, logger="tasks")
    result = distill.run(_params(prepared, init="random", epochs=2, checkpoint_every=4, name="logged"))
    lines = _trainer_lines(caplog)
    store = prepared["store"]
    losses = [json.loads(line) for line in storage.read_bytes(_run_file(store, "logged", "losses.jsonl")).splitlines()]
    step_lines = [line for line in lines if ", step=" in line and ": finished " not in line]
    assert len(step_lines) == len(losses) == 26  # 2 epochs of 13 steps
    rows = 2 * result.stats["train_rows"]
    for line, recorded in zip(step_lines, losses, strict=True):
        assert re.fullmatch(
            rf"distill logged: [\d,]+/{rows} rows \([\d.]+%\), [\d.,]+ rows/s, ETA \S+, step=\d+/26, .*", line
        )
        assert f", step={recorded['step']}/26, loss={recorded['loss']:.4g}, lr=" in line
    assert lines[-2].startswith(f"distill logged: finished {rows}/{rows} rows (100.0%) in ")
    evaluations = json.loads(storage.read_bytes(_run_file(store, "logged", "metrics.json")))["evals"]
    logged_evals = [line for line in lines if ": evaluation at step " in line]
    assert [int(line.split(" step ")[1].split(":")[0]) for line in logged_evals] == [5, 10, 15, 20, 25, 26]
    assert [e["step"] for e in evaluations[1:]] == [5, 10, 15, 20, 25, 26]
    assert f"val_mse {evaluations[1]['val_mse']:.6g}, val_cosine {evaluations[1]['val_cosine']:.4f}" in logged_evals[0]
    first_epoch = np.mean([item["loss"] for item in losses[:13]])
    assert f"distill logged: epoch 1/2 ended at step 13, mean training loss {first_epoch:.6g}" in lines
    exported = result.stats["exported"]
    assert lines[-1] == (
        f"distill logged: exporting the weights of step {exported['step']}: "
        f"val_mse {exported['val_mse']:.6g}, val_cosine {exported['val_cosine']:.4f}"
    )
    checkpoints = _trainer_lines(caplog, "tasks.stages.distill.checkpoints")
    assert [line.split(" written")[0] for line in checkpoints] == [f"checkpoint of step {s}" for s in range(4, 26, 4)]


def test_a_progress_line_carries_the_mean_loss_since_the_previous_one(prepared, caplog, monkeypatch):
    monkeypatch.setenv(progress.EVERY_S_ENV, "3600")  # no line before the final one
    caplog.set_level(logging.INFO, logger="tasks")
    distill.run(_params(prepared, init="random", max_steps=4, name="mean-loss"))
    losses = storage.read_bytes(_run_file(prepared["store"], "mean-loss", "losses.jsonl")).splitlines()
    mean = np.mean([json.loads(line)["loss"] for line in losses])
    [final] = [line for line in _trainer_lines(caplog) if ", step=" in line]
    assert final.startswith("distill mean-loss: finished ") and f", step=4/4, loss={mean:.4g}, lr=" in final


def _torchrun_command(*program):
    """torchrun starting ``program`` in two processes (CPU, gloo), and the environment to run it in."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        *program,
    ]
    return command, env


def _torchrun(hpd: Path, values, *extra):
    """``hpd distill`` (``hpd``: the ``warm_hpd`` fixture's) with ``values`` in two processes under torchrun (CPU,
    gloo)."""
    args = []
    for key, value in values.items():
        flag = f"--{key.replace('_', '-')}"
        args += [flag, *map(str, value)] if isinstance(value, list) else [f"{flag}={value}"]
    command, env = _torchrun_command("--no-python", str(hpd), "distill", *args, *extra)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_two_process_ddp_matches_single_process(prepared, warm_hpd):
    common = {**MSE_ALONE, "max_steps": 6, "eval_every": 6, "dropout": 0.0, "init": "random", "batch_size": 16}
    common["grad_accum"] = 2
    single = distill.run(_params(prepared, name="single", **common))
    out = _torchrun(warm_hpd, _values(prepared, name="ddp", **common), "--quiet")
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(storage.read_bytes(_run_file(prepared["store"], "ddp", "metrics.json")))
    assert metrics["world_size"] == 2
    assert metrics["best_step"] == single.stats["best_step"] == 6  # trained weights compared, not initial ones
    assert _max_diff(_weights(prepared["store"], "ddp"), _weights(prepared["store"], "single")) < 1e-4
    assert abs(metrics["best_val_mse"] - single.stats["best_val_mse"]) < 1e-6


# Two processes, 12 steps an epoch (203 training rows, micro-batches of 8 on each), three epochs, checkpoints
# every 3 steps: the unbroken run the killed one is compared with, and the one whose epochs' tails are checked.
DDP_STRAIGHT = {"epochs": 3, "dropout": 0.0, "init": "ridge", "checkpoint_every": 3, "eval_every": 4}


@pytest.fixture(scope="module")
def ddp_straight(prepared, warm_hpd) -> subprocess.CompletedProcess:
    done = _torchrun(warm_hpd, _values(prepared, name="ddp-straight", **DDP_STRAIGHT))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_two_processes_leave_out_each_epochs_tail_and_say_so(prepared, ddp_straight):
    """203 training rows in micro-batches of 8 on each of 2 processes: 12 whole rounds an epoch (192 rows, 12
    steps), the last 11 rows of each epoch's order left out, and the run says so; nothing hangs at the tail."""
    metrics = json.loads(storage.read_bytes(_run_file(prepared["store"], "ddp-straight", "metrics.json")))
    assert metrics["train_rows"] == 203 and metrics["steps"] == metrics["total_steps"] == 3 * 12
    losses = storage.read_bytes(_run_file(prepared["store"], "ddp-straight", "losses.jsonl")).splitlines()
    assert [json.loads(line)["step"] for line in losses] == list(range(1, 37))
    said = ddp_straight.stderr + ddp_straight.stdout
    assert "distill ddp-straight: each epoch trains 192 of 203 rows: under DDP the last 11 of its order" in said
    assert "epoch 1/3 ended at step 12" in said and "epoch 2/3 ended at step 24" in said


def test_a_killed_two_process_run_resumes_mid_epoch_two_to_the_same_weights(prepared, ddp_straight, warm_hpd):
    """The run of ``DDP_STRAIGHT`` killed after a checkpoint inside the second epoch and launched again: the
    resumed epoch takes that epoch's order (not the first's) and the run ends where the unbroken one does."""
    killed = _values(prepared, name="ddp-killed", **DDP_STRAIGHT)
    latest = f"{prepared['store']}/students/ddp-killed/checkpoints/latest.json"
    command, env = _torchrun_command(str(HELPER), json.dumps(killed))
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (storage.exists(latest) and json.loads(storage.read_bytes(latest))["step"] >= 15):
        assert child.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    for process in [*psutil.Process(child.pid).children(recursive=True), psutil.Process(child.pid)]:
        process.kill()  # the two processes (torchrun starts each in a session of its own), then torchrun
    child.wait()
    resumed = _torchrun(warm_hpd, killed)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [step] = re.findall(r"distill ddp-killed: resumed from \S+ at step (\d+)", resumed.stderr + resumed.stdout)
    assert int(step) in (15, 18, 21)
    stats = json.loads(storage.read_bytes(_run_file(prepared["store"], "ddp-killed", "metrics.json")))
    assert stats["steps"] == 36
    store = prepared["store"]
    assert _max_diff(_weights(store, "ddp-killed"), _weights(store, "ddp-straight")) < 1e-6
    losses = [storage.read_bytes(_run_file(store, name, "losses.jsonl")) for name in ("ddp-killed", "ddp-straight")]
    assert losses[0] == losses[1]


def test_accumulated_micro_batches_take_the_steps_of_the_whole_batch(prepared):
    common = {**MSE_ALONE, "max_steps": 4, "eval_every": 4, "dropout": 0.0, "init": "random", "batch_size": 16}
    whole, accumulated = {"name": "whole-batch"}, {"name": "accumulated", "grad_accum": 4}  # 16 rows: 1 x 16, 4 x 4
    runs = [distill.run(_params(prepared, **common, **extra)) for extra in (whole, accumulated)]
    assert [run.stats["best_step"] for run in runs] == [4, 4]  # trained weights are exported, not the initial ones
    assert _max_diff(_weights(prepared["store"], "accumulated"), _weights(prepared["store"], "whole-batch")) < 1e-5


def test_patience_stops_the_trainer_and_keeps_the_best_step(prepared, monkeypatch, caplog):
    """Validation worsens after step 2: with patience 2 the run stops at the second evaluation without
    improvement (step 4), the best weights being step 2's."""
    scores = {0: 1.0, 1: 0.6, 2: 0.5, 3: 0.7, 4: 0.8}
    monkeypatch.setattr(FidelityEvaluator, "evaluate", lambda self, model, step: Evaluation(step, scores[step], 0.0))
    caplog.set_level(logging.INFO, logger="tasks")
    result = distill.run(_params(prepared, init="random", eval_every=1, patience=2, name="patience"))
    stats = result.stats
    assert stats["stopped_early"] and stats["steps"] == 4 and stats["best_step"] == 2
    losses = storage.read_bytes(_run_file(prepared["store"], "patience", "losses.jsonl")).splitlines()
    assert len(losses) == 4
    assert "distill patience: stopping early (patience 2)" in _trainer_lines(caplog)


def test_a_batch_that_does_not_split_over_the_processes_is_named(prepared):
    params = _params(prepared, batch_size=16, grad_accum=2)
    data = TrainingData(shard_pairs(params.store, params.teacher, PCA_NAME), 0, params.val_fraction, 100)
    with pytest.raises(distill.DistillError, match="batch_size 16 is not a multiple of grad_accum 2 times 3"):
        distill.Trainer(params, data, "cpu", distill.Distributed(0, 3), "split")
    assert distill.Trainer(params, data, "cpu", distill.Distributed(0, 2), "split").plan.micro_batch == 4


def test_too_few_rows_for_one_round_over_the_processes_is_named(prepared):
    params = _params(prepared, batch_size=256)
    data = TrainingData(shard_pairs(params.store, params.teacher, PCA_NAME), 0, params.val_fraction, 100)
    said = f"{data.train_rows} training rows fill no round of micro-batches of 128 rows on each of 2 processes"
    with pytest.raises(distill.DistillError, match=said):
        distill.Trainer(params, data, "cpu", distill.Distributed(0, 2), "few")
    assert distill.Trainer(params, data, "cpu", distill.Distributed(0, 1), "few").plan.total_steps == params.epochs


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
    checkpoint = f"{store}/" + json.loads(storage.read_bytes(latest))["key"]  # store-relative
    storage.write_bytes(checkpoint, b"not a checkpoint")
    with pytest.raises(distill.DistillError, match=f"{checkpoint}: corrupted"):
        distill.run(params)
    assert not storage.exists(f"{store}/manifests/distill/corrupt.json")
    assert [u for u in storage.list_uris(f"{store}/students/corrupt") if "/checkpoints/" not in u] == []


def test_rng_states_survive_a_weights_only_round_trip():
    """The RNG states a checkpoint carries are tensors and plain types: they load with weights_only=True
    and every generator (Python, NumPy, torch) continues exactly."""
    import random

    import torch

    from tasks.stages.distill.state import restore_rng, rng_states

    random.gauss(0, 1), np.random.standard_normal()  # cached Gaussians are part of the state
    buffer = io.BytesIO()
    torch.save({"rng": [rng_states()]}, buffer)

    def draw():
        return random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()

    expected = draw()
    restore_rng(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)["rng"][0])
    assert draw() == expected


class _Stop(Exception):
    """Ends a run right after its first checkpoint, as a kill would."""


def _stopped_after_first_checkpoint(params, monkeypatch) -> None:
    """Run ``params`` and stop it right after its first checkpoint, as a kill would."""
    save = distill.Trainer.save_checkpoint

    def save_then_stop(self):
        save(self)
        raise _Stop

    with monkeypatch.context() as patch:
        patch.setattr(distill.Trainer, "save_checkpoint", save_then_stop)
        with pytest.raises(_Stop):
            distill.run(params)


def _checkpointed_run(prepared, monkeypatch, name):
    """A run of ``name`` stopped right after its checkpoint of step 1: its params, ``latest.json``'s URI
    and the pointer in it (which names the checkpoint by its store-relative ``key``)."""
    params = _params(prepared, max_steps=6, checkpoint_every=1, name=name)
    _stopped_after_first_checkpoint(params, monkeypatch)
    latest = f"{prepared['store']}/students/{name}/checkpoints/latest.json"
    return params, latest, json.loads(storage.read_bytes(latest))


def test_a_checkpoint_of_the_former_loop_resumes(prepared, monkeypatch):
    """The former loop's payload: the same keys, its data position mid-shard and its disabled scaler's state;
    the run resumes from its step and trains to the end."""
    import torch

    params, latest, pointer = _checkpointed_run(prepared, monkeypatch, "former-loop")
    uri = f"{prepared['store']}/{pointer['key']}"
    payload = torch.load(io.BytesIO(storage.read_bytes(uri)), weights_only=True)
    payload["state"]["position"] = {"epoch": 0, "shard": 1, "row": 7}
    payload["scaler"] = torch.amp.GradScaler("cuda", enabled=False).state_dict()
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    storage.write_bytes(uri, buffer.getvalue())
    result = distill.run(params)
    assert result.stats["init"]["resumed_from_step"] == 1 and result.stats["steps"] == 6
    losses = storage.read_bytes(_run_file(prepared["store"], "former-loop", "losses.jsonl")).splitlines()
    assert [json.loads(line)["step"] for line in losses] == list(range(1, 7))


def _nothing_published(store, name):
    return not storage.exists(f"{store}/manifests/distill/{name}.json") and not [
        u for u in storage.list_uris(f"{store}/students/{name}") if "/checkpoints/" not in u
    ]


class _Planted:
    """Unpickling it touches ``marker``: what a planted checkpoint could do as the worker's user."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize(
    ("form", "refusal"),
    [("torch.save", "not a safe checkpoint, refused"), ("pickle", "not a torch archive\\); refused")],
    ids=["torch-save", "raw-pickle"],
)
def test_a_planted_pickle_is_refused_and_never_run(prepared, monkeypatch, tmp_path, form, refusal):
    """A ``step-00000006.pt`` planted in the run's folder whose unpickling would run code (touch a marker)."""
    import torch

    name = f"planted-{form.replace('.', '-')}"
    params, latest, pointer = _checkpointed_run(prepared, monkeypatch, name)
    marker = tmp_path / "marker"
    planted_key = pointer["key"].rsplit("/", 1)[0] + "/step-00000006.pt"
    planted = f"{prepared['store']}/{planted_key}"
    buffer = io.BytesIO()
    torch.save({"model": _Planted(marker)}, buffer)
    body = buffer.getvalue() if form == "torch.save" else pickle.dumps({"model": _Planted(marker)})
    storage.write_bytes(planted, body)
    storage.write_bytes(latest, json.dumps({**pointer, "key": planted_key, "step": 6}).encode())
    with pytest.raises(distill.DistillError, match=f"^{re.escape(planted)}: .*{refusal}.*--force"):
        distill.run(params)
    assert not marker.exists()
    assert _nothing_published(prepared["store"], name)
    # the planted file is live: an unsafe load runs it
    if form == "torch.save":
        torch.load(io.BytesIO(body), weights_only=False)
    else:
        pickle.loads(body)
    assert marker.exists()


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        pytest.param(kind, named, id=kind)
        for kind, named in [
            ("other-run", "students/{name}-other/checkpoints/step-00000001.pt"),
            ("dot-dot", "{prefix}/../../{name}-other/checkpoints/step-00000001.pt"),
            ("outside-store", "{outside}/step-00000001.pt"),  # an absolute URI, not a key
            ("own-absolute", "{store}/{prefix}/step-00000001.pt"),  # its own checkpoint, but not by key
            ("bad-name", "{prefix}/stolen.pt"),  # in the folder, not a step-<8 digits>.pt
            ("dot", "{prefix}/./step-00000001.pt"),  # the run's own checkpoint, spelt with a '.' segment
        ]
    ],
)
def test_a_pointer_outside_the_run_folder_is_refused(prepared, monkeypatch, tmp_path, kind, named):
    """``latest.json`` may name only a ``step-<8 digits>.pt`` of this run's checkpoint folder, by its
    store-relative key; each place named here holds a genuine checkpoint of the same fingerprint, so only
    the confinement refuses it."""
    name, store = f"confined-{kind}", prepared["store"]
    params, latest, pointer = _checkpointed_run(prepared, monkeypatch, name)
    prefix = pointer["key"].rsplit("/", 1)[0]
    key = named.format(store=store, name=name, prefix=prefix, outside=storage.to_uri(str(tmp_path)))
    uri = key if "://" in key else f"{store}/{key}"
    if "/./" not in uri:
        storage.write_bytes(uri, storage.read_bytes(f"{store}/{pointer['key']}"))
    storage.write_bytes(latest, json.dumps({**pointer, "key": key}).encode())
    with pytest.raises(distill.DistillError, match=f"^{re.escape(latest)}: names '{re.escape(key)}'.*refused"):
        distill.run(params)
    assert _nothing_published(prepared["store"], name)
    storage.write_bytes(latest, json.dumps(pointer).encode())  # the run's own checkpoint still resumes
    assert distill.run(params).stats["init"]["resumed_from_step"] == 1


def test_bad_training_data_is_named(prepared, tmp_path):
    pair = shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME)[0]
    targets = storage.read_parquet(pair.targets_uri)
    broken = targets.set_column(0, "sentence_id", pa.array(["unknown"] + targets.column("sentence_id").to_pylist()[1:]))
    uri = storage.to_uri(str(tmp_path / "broken.parquet"))
    storage.write_parquet(uri, broken)
    with pytest.raises(DistillDataError, match="1 target id"):
        ShardPair(pair.sentences_uri, uri, ("", ""), pair.rows).read()
    column = targets.schema.get_field_index("target")
    flat = targets.column("target").combine_chunks().flatten().to_numpy(zero_copy_only=False).copy()
    flat[5] = np.nan
    size = targets.schema.field("target").type.list_size
    nan_uri = storage.to_uri(str(tmp_path / "nan.parquet"))
    storage.write_parquet(nan_uri, targets.set_column(column, "target", pa.FixedSizeListArray.from_arrays(flat, size)))
    with pytest.raises(
        NonFiniteError, match=f"^{re.escape(nan_uri)}: 1 NaN or infinite target value\\(s\\), first in row 0"
    ):
        ShardPair(pair.sentences_uri, nan_uri, ("", ""), pair.rows).read()
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
