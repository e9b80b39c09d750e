"""Distill: train the student to reproduce the teacher's projected embeddings (HPD), then export it.

MSE between the student's Dense(k) output and the PCA-projected teacher targets; AdamW with linear
warmup and decay; gradient accumulation; AMP on CUDA (bf16, or fp16 with a gradient scaler) and
optional bf16 autocast on CPU; validation MSE every ``eval_every`` steps with early stopping and
the best weights kept. Checkpoints (model, optimizer, scheduler, scaler, RNG states, data position,
loss history) go to the store every ``checkpoint_every`` steps; a rerun with the same inputs and
params resumes from the latest one and continues the same run.

Multi-process: launched with torchrun (``torchrun --nproc-per-node N --no-python hpd distill ...``)
each process trains on its slice of every global batch under DistributedDataParallel (NCCL on
GPUs, gloo on CPU); rank 0 writes. The loss is the sum of squared errors over the global batch,
so N processes compute the same gradient as one.

Output: ``students/<name>/model/`` (a sentence-transformers folder with a model card),
``losses.jsonl`` and ``metrics.json``, with a manifest.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator
from tqdm import tqdm

from tasks import manifest, models, storage
from tasks.config import StageParams
from tasks.distill_data import Position, TrainingData, shard_pairs
from tasks.student import Activation, Init

STAGE = "distill"
# Knobs that change how a run executes, not what it computes: outside the fingerprint, so changing
# them resumes (or skips) instead of starting over; recorded in the manifest's stats.
RUNTIME = {"threads", "checkpoint_every"}


class DistillError(ValueError):
    """Distillation cannot run or resume as configured; the message names the input."""


class DistillParams(StageParams):
    teacher: str = Field(models.DEFAULT_TEACHER, description="teacher whose projected targets to learn")
    pca_name: str = Field("k128-uncentered", description="the fit-pca run providing the targets")
    partitions: list[date] | None = Field(None, description="train on these ingest dates (default: all)")
    student: str = Field(models.DEFAULT_STUDENT, description="packaged model, local folder or cached hub id")
    student_layers: int | None = Field(None, gt=0, description="keep only the first N transformer layers")
    activation: Activation = "tanh"
    init: Init = Field("ridge", description="Dense head initialisation: ridge, pca or random")
    init_rows: int = Field(4096, gt=1, description="training rows sampled to fit the ridge/pca init")
    ridge_alpha: float = Field(1.0, gt=0)
    lr: float = Field(1e-4, gt=0)
    batch_size: int = Field(256, gt=0, description="global batch per optimizer step")
    grad_accum: int = Field(1, gt=0, description="micro-batches per optimizer step")
    epochs: int = Field(5, gt=0)
    max_steps: int | None = Field(None, gt=0, description="stop after this many optimizer steps")
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    max_seq_length: int = Field(128, gt=0)
    dropout: float | None = Field(None, ge=0, lt=1, description="override the student's dropout")
    amp: Literal["auto", "off", "bf16", "fp16"] = Field("auto", description="auto: bf16 on CUDA, off on CPU")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, gt=0)
    val_fraction: float = Field(0.02, gt=0, lt=1)
    val_max_rows: int = Field(2000, gt=0)
    eval_every: int = Field(100, gt=0)
    patience: int | None = Field(None, gt=0, description="evaluations without improvement before stopping")
    checkpoint_every: int = Field(200, gt=0)
    seed: int = 0
    name: str = Field("", pattern=r"^[A-Za-z0-9_.=-]*$", description="run name (default: <student>-<pca_name>)")

    @model_validator(mode="after")
    def _check(self) -> DistillParams:
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}")
        if self.amp == "fp16" and self.device == "cpu":
            raise ValueError("fp16 AMP needs CUDA; use amp=bf16 on CPU")
        if not self.name:
            layers = f"-L{self.student_layers}" if self.student_layers else ""
            object.__setattr__(self, "name", f"{models.slug(self.student)}{layers}-{self.pca_name}")
        return self


@dataclass
class TrainState:
    step: int = 0
    position: Position = field(default_factory=Position)
    best_val_mse: float = math.inf
    best_step: int = 0
    evals_since_best: int = 0
    stopped_early: bool = False
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


def run(params: DistillParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Train (or resume) the student on the PCA run's targets and publish the exported model."""
    import torch

    dist = _init_distributed()
    pairs = shard_pairs(params.store, params.teacher, params.pca_name, params.partitions)
    stage_run = manifest.StageRun(
        stage=STAGE, key=params.name, store=params.store, params=params.model_dump(mode="json", exclude=RUNTIME),
        inputs=[item for p in pairs for item in (
            {"uri": p.sentences_uri, "sha256": p.sha256[0], "rows": p.rows},
            {"uri": p.targets_uri, "sha256": p.sha256[1], "rows": p.rows})],
    )
    if not force and (done := stage_run.completed()) is not None:
        return manifest.StageResult(stage_run.uri, skipped=True, manifest=done)
    if params.threads:
        torch.set_num_threads(params.threads)
    device = params.device if params.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and dist.world > 1:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    with stage_run.phase("load_data"):
        data = TrainingData(pairs, params.seed, params.val_fraction, params.val_max_rows)
    trainer = Trainer(params, data, device, dist, stage_run.fingerprint)
    with stage_run.phase("train"):
        init_record = trainer.restore_or_initialise(force)
        trainer.train(progress)
    stage_run.stats = {**trainer.summary(init_record), "runtime": params.model_dump(mode="json", include=RUNTIME)}
    if not dist.leader:
        return manifest.StageResult(stage_run.uri, skipped=False, manifest={"stats": stage_run.stats, "outputs": []})
    with stage_run.phase("export"):
        for uri, body in trainer.export(stage_run, init_record).items():
            storage.write_bytes(uri, body)
            stage_run.add_output(uri, manifest.sha256_hex(body), len(body), None)
    return manifest.StageResult(stage_run.uri, skipped=False, manifest=stage_run.publish())


def run_prefix(params: DistillParams) -> str:
    return storage.join(params.store, "students", params.name)


def _init_distributed() -> Distributed:
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world == 1:
        return Distributed()
    import torch
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Distributed(torch_dist.get_rank(), torch_dist.get_world_size())


class Trainer:
    """One training run: model, optimiser, schedule, data position, checkpoints."""

    def __init__(self, params: DistillParams, data: TrainingData, device: str, dist: Distributed,
                 fingerprint: str) -> None:
        import torch

        from tasks import student

        self.params, self.data, self.dist, self.fingerprint = params, data, dist, fingerprint
        self.state = TrainState()
        _seed_everything(params.seed)
        self.model = student.build(params.student, data.dim, params.activation, params.student_layers,
                                   params.max_seq_length, params.dropout, device)
        self.amp = {"auto": "bf16" if device == "cuda" else "off"}.get(params.amp, params.amp)
        no_decay = [p for n, p in self.model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
        decay = [p for n, p in self.model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": params.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}], lr=params.lr)
        steps_per_epoch = math.ceil(data.train_rows / params.batch_size)
        self.total_steps = min(params.max_steps or math.inf, params.epochs * steps_per_epoch)
        warmup = int(params.warmup_ratio * self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: (s + 1) / max(warmup, 1) if s < warmup
            else max(0.0, (self.total_steps - s) / max(self.total_steps - warmup, 1)))
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == "fp16")
        self.ddp = self.model  # wrapped in DDP once initialised or restored: see train()
        self.best_weights: dict | None = None
        self.init_record: dict = {}
        self.exported: dict | None = None
        self.checkpoints = storage.join(run_prefix(params), "checkpoints")

    # -- start ---------------------------------------------------------------------------------------------
    def restore_or_initialise(self, force: bool) -> dict:
        """Resume from the latest checkpoint of this run (same fingerprint), or initialise the head."""
        latest = storage.join(self.checkpoints, "latest.json")
        if not force and storage.exists(latest):
            pointer = json.loads(storage.read_bytes(latest))
            if pointer.get("fingerprint") == self.fingerprint:
                self._load_checkpoint(pointer["uri"])
                self.init_record = pointer.get("init", {})
                return {**self.init_record, "resumed_from_step": self.state.step}
        from tasks import student

        rows = min(self.params.init_rows, self.data.train_rows)
        texts, targets = [], []
        for batch in self.data.batches(Position(), rows):
            texts, targets = batch.texts, batch.targets
            break
        record = student.initialise_head(self.model, self.params.init, texts, targets, self.params.activation,
                                         self.params.ridge_alpha)
        self.init_record = record
        self.state.evals.append({"step": 0, **self.validate()})
        self.state.best_val_mse = self.state.evals[0]["val_mse"]  # training must beat the initial weights
        self.best_weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return record

    # -- loop ----------------------------------------------------------------------------------------------
    def train(self, progress: bool) -> None:
        params, state = self.params, self.state
        if self.dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            cuda = self.model.device.type == "cuda"
            self.ddp = DistributedDataParallel(self.model, device_ids=[self.model.device] if cuda else None)
        self.model.train()
        bar = tqdm(total=self.total_steps, initial=state.step, unit=" step", desc=f"distill {params.name}",
                   disable=not (progress and self.dist.leader))
        while state.step < self.total_steps and not state.stopped_early:
            epoch = state.position.epoch
            for batch in self.data.batches(state.position, params.batch_size):
                loss = self.train_step(batch)
                if not math.isfinite(loss):
                    raise DistillError(f"{params.name}: training loss is {loss} at step {state.step + 1} "
                                       f"(lr {self.scheduler.get_last_lr()[0]:.2e}); lower lr or check the targets")
                state.step += 1
                state.position = batch.next_position
                state.losses.append((state.step, loss))
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.5f}")
                last = state.step >= self.total_steps
                if state.step % params.eval_every == 0 or last:
                    self._evaluate()
                if state.step % params.checkpoint_every == 0 and not last:
                    self._save_checkpoint()
                if last or state.stopped_early:
                    break
            if state.position.epoch == epoch and not (state.step >= self.total_steps or state.stopped_early):
                state.position = Position(epoch + 1)  # the rest of the epoch held no training rows
        bar.close()
        self.model.eval()
        if self.best_weights is not None:
            self.model.load_state_dict(self.best_weights)
        self.exported = {"step": state.best_step, **self.validate()}

    def train_step(self, batch) -> float:
        """One optimizer step on a global batch; returns its mean squared error."""
        import torch

        params, world = self.params, self.dist.world
        rows, k = len(batch.texts), self.data.dim
        micro = math.ceil(rows / params.grad_accum)
        total = 0.0
        for start in range(0, rows, micro):
            # Under DDP, gradients are all-reduced once per step: on the last micro-batch only.
            accumulate = world > 1 and start + micro < rows
            with self.ddp.no_sync() if accumulate else contextlib.nullcontext():
                total += self._micro_step(batch.texts[start:start + micro], batch.targets[start:start + micro],
                                          rows)
        if world > 1:
            import torch.distributed as torch_dist

            reduced = torch.tensor([total], device=self.model.device)
            torch_dist.all_reduce(reduced)
            total = float(reduced[0])
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), params.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total / (rows * k)

    def _micro_step(self, texts: list[str], targets: np.ndarray, rows: int) -> float:
        """Forward and backward of this rank's share of one micro-batch; returns its summed squared error."""
        import torch

        world, rank, k = self.dist.world, self.dist.rank, self.data.dim
        local = slice(rank * len(texts) // world, (rank + 1) * len(texts) // world)
        # A rank whose slice is empty (a short last batch) still joins DDP's gradient all-reduce,
        # with one row weighted zero.
        weight = 1.0 if local.stop > local.start else 0.0
        local = local if weight else slice(0, 1)
        features = self.model.tokenize(texts[local])
        goal = torch.as_tensor(targets[local], device=self.model.device)
        dtype = self.amp if self.amp != "off" else "fp32"
        output = self.ddp(features, dtype).float()
        # The step's loss is the squared error summed over the global batch, divided by its size;
        # DDP averages gradients over ranks, hence * world.
        sse = ((output - goal) ** 2).sum() * weight
        self.scaler.scale(sse * world / (rows * k)).backward()
        return float(sse.detach())

    def validate(self) -> dict:
        """MSE and mean cosine of the student's outputs against the held-out targets."""
        self.model.eval()
        predicted = self.model.encode(self.data.val_texts, batch_size=128)
        self.model.train()
        goal = self.data.val_targets
        cosine = (predicted * goal).sum(1) / np.maximum(np.linalg.norm(predicted, axis=1)
                                                       * np.linalg.norm(goal, axis=1), 1e-12)
        return {"val_mse": float(((predicted - goal) ** 2).mean()), "val_cosine": float(cosine.mean())}

    def _evaluate(self) -> None:
        state = self.state
        result = {"step": state.step, **self.validate()}
        state.evals.append(result)
        if result["val_mse"] < state.best_val_mse:
            state.best_val_mse, state.best_step, state.evals_since_best = result["val_mse"], state.step, 0
            self.best_weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        else:
            state.evals_since_best += 1
            if self.params.patience and state.evals_since_best >= self.params.patience:
                state.stopped_early = True

    # -- checkpoints ---------------------------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        import torch

        rng = [_rng_states()]
        if self.dist.world > 1:  # every rank's dropout stream, so a resumed DDP run continues each one
            import torch.distributed as torch_dist

            rng = [None] * self.dist.world
            torch_dist.all_gather_object(rng, _rng_states())
        if not self.dist.leader:
            return
        payload = {
            "fingerprint": self.fingerprint, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "best_weights": self.best_weights, "state": _state_to_dict(self.state), "rng": rng,
        }
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        uri = storage.join(self.checkpoints, f"step-{self.state.step:08d}.pt")
        storage.write_bytes(uri, buffer.getvalue())
        pointer = {"uri": uri, "step": self.state.step, "fingerprint": self.fingerprint, "init": self.init_record}
        storage.write_bytes(storage.join(self.checkpoints, "latest.json"), json.dumps(pointer).encode())
        older = sorted(u for u in storage.list_uris(self.checkpoints) if u.endswith(".pt") and u != uri)
        for stale in older[:-1]:  # keep this checkpoint and the one before it
            storage.delete(stale)

    def _load_checkpoint(self, uri: str) -> None:
        import torch

        try:  # loaded on the CPU: RNG states must stay CPU tensors; the optimizer moves its own state
            payload = torch.load(io.BytesIO(storage.read_bytes(uri)), map_location="cpu", weights_only=False)
            self.model.load_state_dict(payload["model"])
            self.optimizer.load_state_dict(payload["optimizer"])
            self.scheduler.load_state_dict(payload["scheduler"])
            self.scaler.load_state_dict(payload["scaler"])
            self.best_weights = payload["best_weights"]
            self.state = _state_from_dict(payload["state"])
            _restore_rng(payload["rng"][self.dist.rank])
        except Exception as exc:  # a damaged file fails in many ways (unpickling, zip, shapes, missing keys)
            raise DistillError(f"{uri}: corrupted or incompatible checkpoint ({type(exc).__name__}: {exc}); "
                               f"rerun with --force to start over") from None

    # -- results -------------------------------------------------------------------------------------------
    def summary(self, init_record: dict) -> dict:
        state = self.state
        return {"steps": state.step, "total_steps": self.total_steps, "train_rows": self.data.train_rows,
                "val_rows": len(self.data.val_texts), "k": self.data.dim, "best_step": state.best_step,
                "best_val_mse": state.best_val_mse, "initial": state.evals[0] if state.evals else None,
                "final": state.evals[-1] if state.evals else None, "exported": self.exported,
                "stopped_early": state.stopped_early,
                "init": init_record, "amp": self.amp, "world_size": self.dist.world}

    def export(self, stage_run: manifest.StageRun, init_record: dict) -> dict[str, bytes]:
        """The sentence-transformers folder (with model card), loss history and metrics, as URI -> bytes."""
        # A folder per fingerprint: a rerun never overwrites what the published manifest lists.
        prefix = storage.join(run_prefix(self.params), stage_run.fingerprint[:12])
        files: dict[str, bytes] = {}
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch) / "model"
            self.model.save(folder)
            (folder / "README.md").write_text(_model_card(self.params, stage_run, self.summary(init_record)))
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                files[storage.join(prefix, "model", *path.relative_to(folder).parts)] = path.read_bytes()
        losses = "".join(json.dumps({"step": s, "loss": loss}) + "\n" for s, loss in self.state.losses)
        files[storage.join(prefix, "losses.jsonl")] = losses.encode()
        metrics = {"evals": self.state.evals, **self.summary(init_record)}
        files[storage.join(prefix, "metrics.json")] = json.dumps(metrics, indent=2).encode()
        return files


def _model_card(params: DistillParams, stage_run: manifest.StageRun, summary: dict) -> str:
    inputs = "\n".join(f"- `{i['uri']}` (sha256 `{i['sha256'][:12]}`)" for i in stage_run.inputs)
    config = json.dumps(params.model_dump(mode="json"), indent=2)
    layers = f"(first {params.student_layers} layers) " if params.student_layers else ""
    return f"""---
library_name: sentence-transformers
pipeline_tag: sentence-similarity
tags: [sentence-transformers, feature-extraction, distillation, hpd]
---
# {params.name}

A {summary['k']}-dimensional sentence encoder distilled with Homomorphic Projective Distillation
(Findings of ACL 2022) by hpd-pipeline: the student `{params.student}`
{layers}+ mean pooling + Dense(k, {params.activation})
learned to reproduce the teacher `{params.teacher}`'s embeddings projected by PCA run
`{params.pca_name}`.

```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("path/to/this/folder")
embeddings = model.encode(["A sentence.", "Another one."])
```

## Training
- steps: {summary['steps']} of {summary['total_steps']} (best at step {summary['best_step']})
- stopped early: {summary['stopped_early']}
- training rows: {summary['train_rows']}, validation rows: {summary['val_rows']}
- head initialisation: {summary['init']}
- validation before training: {summary['initial']}
- validation at the last step: {summary['final']}
- validation of the exported (best) weights: {summary['exported']}
- best validation MSE: {summary['best_val_mse']:.6g}

## Configuration
```json
{config}
```

## Data lineage
Run `{stage_run.run_id}`, code `{manifest.code_version()}`. Inputs:
{inputs}
"""


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_states() -> dict:
    import torch

    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_rng(states: dict) -> None:
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _state_to_dict(state: TrainState) -> dict:
    return {**asdict(state), "position": asdict(state.position)}


def _state_from_dict(raw: dict) -> TrainState:
    return TrainState(**{**raw, "position": Position(**raw["position"]),
                         "losses": [tuple(x) for x in raw["losses"]]})
