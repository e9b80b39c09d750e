"""The training loop: the student learns to reproduce the projected teacher embeddings (HPD).

MSE between the student's Dense(k) output and the targets, optionally plus a (1 - cosine) term and an
in-batch similarity-structure term (the MSE between the student's and the targets' pairwise cosine
matrices; under DDP within each process's share); the embeddings and lower layers may be frozen;
AdamW with linear warmup and decay;
gradient accumulation; AMP on CUDA (bf16, or fp16 with a gradient scaler) and optional bf16 autocast
on CPU; validation every ``eval_every`` steps with early stopping and the best weights kept, by
validation MSE or by the mean STS-B/SICK-R dev score (``select_on``);
with ``blend_initial``, blends ``(1 - a) * initial + a * final`` of the initial weights and those training
ended with, scored after training, one exported instead of the best weights when it scores better
(:mod:`.blending`);
a checkpoint every ``checkpoint_every`` steps. Under DDP the loss is the sum of squared errors over
the global batch, so N processes compute the same gradient as one.

The run logs its plan, progress (rows, rate, ETA, step, mean training loss since the previous line, lr),
every evaluation, each epoch's end, each blend and the export; under DDP only the leader logs them.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import numpy as np

from tasks.core import uris
from tasks.core.progress import Progress
from tasks.ml import metrics, sts, student
from tasks.stages.distill import blending
from tasks.stages.distill.checkpoints import CheckpointError, Checkpoints
from tasks.stages.distill.data import Batch, Position, TrainingData
from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.objective import extra_loss
from tasks.stages.distill.optimization import Optimization
from tasks.stages.distill.state import TrainState, restore_rng, rng_states, seed_everything
from tasks.stages.params import DistillParams

log = logging.getLogger(__name__)
_FOLLOWER_LOG = logging.getLogger(f"{__name__}.follower")  # ranks other than 0: their warnings only
EVALUATIONS = 20  # validations a run makes when eval_every is not set
_FOLLOWER_LOG.setLevel(logging.WARNING)


class DistillError(ValueError):
    """Distillation cannot run or resume as configured; the message names the input."""


class Trainer:
    """One training run: model, optimiser, schedule, data position, checkpoints."""

    def __init__(
        self, params: DistillParams, data: TrainingData, device: str, dist: Distributed, fingerprint: str
    ) -> None:
        self.params, self.data, self.dist = params, data, dist
        self.state = TrainState()
        seed_everything(params.seed)
        self.model = _build_student(params, data.dim, device)
        self.amp = {"auto": "bf16" if device == "cuda" else "off"}.get(params.amp, params.amp)
        steps_per_epoch = math.ceil(data.train_rows / params.batch_size)
        self.total_steps = min(params.max_steps or math.inf, params.epochs * steps_per_epoch)
        self.eval_every = params.eval_every or max(1, math.ceil(self.total_steps / EVALUATIONS))
        self.optim = Optimization(self.model, params, self.total_steps, self.amp)
        self.ddp = self.model  # wrapped in DDP once initialised or restored: see train()
        self.best_weights: dict | None = None
        self.initial_weights: dict | None = None  # on the CPU, kept only to blend with (blend_initial)
        self.final_weights: dict | None = None  # likewise: the weights training ended with
        self.init_record: dict = {}
        self.exported: dict | None = None
        self.checkpoints = Checkpoints(params.store, params.name, fingerprint)
        self.log = log if dist.leader else _FOLLOWER_LOG
        self.losses_unreported: list[float] = []  # training losses since the last progress line

    def restore_or_initialise(self, force: bool) -> dict:
        """Resume from the latest checkpoint of this run (same fingerprint), or initialise the head."""
        found = None if force else _latest_checkpoint(self.checkpoints)
        if found is not None:
            pointer, uri, payload = found
            _restore(self, uri, payload)
            self.init_record = pointer.get("init", {})
            return {**self.init_record, "resumed_from_step": self.state.step}
        first = next(self.data.batches(Position(), min(self.params.init_rows, self.data.train_rows)))
        self.init_record = student.initialise_head(
            self.model, self.params.init, first.texts, first.targets, self.params.activation, self.params.ridge_alpha
        )
        # training must beat the initial weights
        self.state.record_eval({"step": 0, **self.validate()}, None, self.params.select_on)
        self.best_weights = self._weights()
        self.initial_weights = blending.cpu_copy(self.best_weights) if self.params.blend_initial else None
        _log_scores(self, f"head initialised ({self.params.init}) on {len(first.texts)} rows; at", self.state.evals[0])
        return self.init_record

    def train(self, progress: bool) -> None:
        """Train until the step budget is spent or early stopping; then keep the best weights."""
        self.ddp = self.dist.wrap(self.model)
        self.model.train()
        _log_plan(self)
        with _progress(self, progress) as reporter:
            while not self._finished():
                self._epoch(reporter)
        self.model.eval()
        self.final_weights = blending.cpu_copy(self.model.state_dict()) if self.initial_weights is not None else None
        if self.best_weights is not None:
            self.model.load_state_dict(self.best_weights)
        self.exported = _exported(self)

    def _epoch(self, reporter: Progress) -> None:
        """Train from the current position to the end of its epoch, or until finished."""
        state = self.state
        epoch, first_step = state.position.epoch, state.step
        for batch in self.data.batches(state.position, self.params.batch_size, self.params.length_grouped):
            self._step(batch, reporter)
            if self._finished():
                break
        if state.position.epoch == epoch and not self._finished():
            state.position = Position(epoch + 1)  # the rest of the epoch held no training rows
        if state.position.epoch > epoch:
            _log_epoch(self, epoch, first_step)

    def _finished(self) -> bool:
        return self.state.step >= self.total_steps or self.state.stopped_early

    def _step(self, batch: Batch, reporter: Progress) -> None:
        """Train on one batch, then evaluate and checkpoint on schedule."""
        state = self.state
        loss = self.train_step(batch)
        if not math.isfinite(loss):
            raise DistillError(
                f"{self.params.name}: training loss is {loss} at step {state.step + 1} "
                f"(lr {self.optim.lr:.2e}); lower lr or check the targets"
            )
        state.step += 1
        state.position = batch.next_position
        state.losses.append((state.step, loss))
        _report(self, reporter, len(batch.texts), loss)
        last = state.step >= self.total_steps
        if state.step % self.eval_every == 0 or last:
            self._evaluate()
        if state.step % self.params.checkpoint_every == 0 and not last:
            self._save_checkpoint()

    def train_step(self, batch: Batch) -> float:
        """One optimizer step on a global batch; returns its mean squared error."""
        rows = len(batch.texts)
        micro = math.ceil(rows / self.params.grad_accum)
        total = 0.0
        for start in range(0, rows, micro):
            # Under DDP, gradients are all-reduced once per step: on the last micro-batch only.
            accumulate = self.dist.world > 1 and start + micro < rows
            part = slice(start, start + micro)
            with self.ddp.no_sync() if accumulate else contextlib.nullcontext():
                total += self._micro_step(batch.texts[part], batch.targets[part], rows)
        self.optim.step(self.model.parameters())
        return self.dist.sum(total, self.model.device) / (rows * self.data.dim)

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
        output = self.ddp(features, self.amp if self.amp != "off" else "fp32").float()
        # The step's loss is the squared error summed over the global batch, divided by its size;
        # DDP averages gradients over ranks, hence * world.
        sse = ((output - goal) ** 2).sum() * weight
        self.optim.backward((sse / k + extra_loss(self.params, output, goal) * weight) * world / rows)
        return float(sse.detach())

    def validate(self) -> dict:
        """Validation MSE and mean cosine against the targets (and the STS dev score when selecting on it)."""
        return _validation_scores(self.model, self.data, self.params.select_on == "sts_dev")

    def _evaluate(self) -> None:
        result = {"step": self.state.step, **self.validate()}
        if best := self.state.record_eval(result, self.params.patience, self.params.select_on):
            self.best_weights = self._weights()
        _log_evaluation(self, result, best)

    def _weights(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def _save_checkpoint(self) -> None:
        rng = self.dist.gather(rng_states())  # every rank's dropout stream, so a resumed DDP run continues each
        if self.dist.leader:
            self.checkpoints.save(self.state.step, _checkpoint_payload(self, rng), self.init_record)


def _checkpoint_payload(trainer: Trainer, rng: list[Any]) -> dict:
    """What a checkpoint carries: tensors and plain types only (the initial weights only when blending)."""
    initial = {} if trainer.initial_weights is None else {"initial_weights": trainer.initial_weights}
    return {
        "model": trainer.model.state_dict(),
        **trainer.optim.state_dict(),
        "best_weights": trainer.best_weights,
        **initial,
        "state": trainer.state.to_dict(),
        "rng": rng,
    }


def _restore(trainer: Trainer, uri: str, payload: dict) -> None:
    """Load checkpoint ``uri``'s ``payload`` into ``trainer``."""
    try:  # the optimizer moves its own state to the model's device
        trainer.model.load_state_dict(payload["model"])
        trainer.optim.load_state_dict(payload)
        trainer.best_weights = payload["best_weights"]
        trainer.initial_weights = payload["initial_weights"] if trainer.params.blend_initial else None
        trainer.state = TrainState.from_dict(payload["state"])
        restore_rng(payload["rng"][trainer.dist.rank])
    except Exception as exc:  # a damaged payload fails in many ways (shapes, missing keys, types)
        raise DistillError(
            f"{uri}: corrupted or incompatible checkpoint ({type(exc).__name__}: {exc}); "
            f"rerun with --force to start over"
        ) from None
    trainer.log.info(
        "distill %s: resumed from %s at step %d", trainer.params.name, uris.redact(uri), trainer.state.step
    )


def _exported(trainer: Trainer) -> dict:
    """Score the best weights (loaded) and, with ``blend_initial``, each blend of the initial and final weights;
    load the weights to export (a blend only when it scores better by ``select_on``) and return their record:
    the best weights' evaluation, with ``blend`` (the chosen fraction, or None) and ``blends`` (every blend's
    evaluation) when blending. Every process exports the leader's choice."""
    best = {"step": trainer.state.best_step, **trainer.validate()}
    if trainer.initial_weights is None or trainer.final_weights is None:
        _log_scores(trainer, "exporting the weights of", best)
        return best
    blends = []
    for a in trainer.params.blend_initial:
        trainer.model.load_state_dict(blending.blend(trainer.initial_weights, trainer.final_weights, a))
        blends.append({"step": trainer.state.step, "blend": a, **trainer.validate()})
        _log_scores(trainer, f"blend {a:g} of the initial weights and those of", blends[-1])
    select_on = trainer.params.select_on
    chosen, blends = trainer.dist.gather((blending.choose(best, blends, select_on), blends))[0]
    if chosen is None:
        trainer.model.load_state_dict(trainer.best_weights)
        _log_scores(trainer, f"no blend beats the best weights by {select_on}; exporting the weights of", best)
        return {**best, "blend": None, "blends": blends}
    a = chosen["blend"]
    trainer.model.load_state_dict(blending.blend(trainer.initial_weights, trainer.final_weights, a))
    what = f"blend {a:g} beats the best weights by {select_on}; exporting the initial weights blended {a:g} toward"
    _log_scores(trainer, f"{what} those of", chosen)
    return {**chosen, "blends": blends}


def _latest_checkpoint(checkpoints: Checkpoints) -> tuple[dict, str, dict] | None:
    """This run's latest checkpoint (pointer, URI, payload), if any; a refused one is a :class:`DistillError`."""
    try:
        return checkpoints.resume()
    except CheckpointError as exc:
        raise DistillError(f"{exc}; rerun with --force to start over") from None


def _build_student(params: DistillParams, dim: int, device: str) -> Any:
    model = student.build(
        params.student, dim, params.activation, params.student_layers, params.max_seq_length, params.dropout, device
    )
    student.freeze(model, params.freeze_layers, params.student)
    return model


def _progress(trainer: Trainer, bar: bool) -> Progress:
    """The run's progress in training rows, from where it (re)starts."""
    params = trainer.params
    total = int(min(trainer.total_steps * params.batch_size, params.epochs * trainer.data.train_rows))
    done = min(trainer.state.step * params.batch_size, total)
    return Progress(f"distill {params.name}", total, done=done, bar=bar and trainer.dist.leader, logger=trainer.log)


def _report(trainer: Trainer, reporter: Progress, rows: int, loss: float) -> None:
    """Count ``rows`` trained; a progress line carries the mean training loss since the previous one."""
    trainer.losses_unreported.append(loss)
    step = f"{trainer.state.step}/{trainer.total_steps}"
    if reporter.update(rows, step=step, loss=float(np.mean(trainer.losses_unreported)), lr=trainer.optim.lr):
        trainer.losses_unreported.clear()


def _log_plan(trainer: Trainer) -> None:
    params, data = trainer.params, trainer.data
    trainer.log.info(
        "distill %s: training steps %d to %d of %d rows each (%d micro-batch(es)), %d epoch(s) of %d rows, "
        "%d validation rows, k=%d, lr %.3g, device %s, amp %s, %d process(es); loss mse + %g cosine + %g "
        "structure, %d frozen layer(s), selecting on %s",
        params.name,
        trainer.state.step + 1,
        trainer.total_steps,
        params.batch_size,
        params.grad_accum,
        params.epochs,
        data.train_rows,
        len(data.val_texts),
        data.dim,
        params.lr,
        trainer.model.device,
        trainer.amp,
        trainer.dist.world,
        params.cosine_weight,
        params.structure_weight,
        params.freeze_layers,
        params.select_on,
    )


def _log_epoch(trainer: Trainer, epoch: int, first_step: int) -> None:
    """The end of ``epoch``, with the mean training loss of the steps this process ran in it."""
    state, name = trainer.state, trainer.params.name
    losses = [loss for step, loss in state.losses if step > first_step]
    mean = f"{np.mean(losses):.6g}" if losses else "n/a"
    trainer.log.info(
        "distill %s: epoch %d/%d ended at step %d, mean training loss %s",
        name,
        epoch + 1,
        trainer.params.epochs,
        state.step,
        mean,
    )


def _log_scores(trainer: Trainer, what: str, result: dict) -> None:
    """An evaluation's scores, with the STS dev score when the run selects on it."""
    sts_dev = f", sts_dev {result['sts_dev']:.3f}" if "sts_dev" in result else ""
    trainer.log.info(
        "distill %s: %s step %d: val_mse %.6g, val_cosine %.4f%s",
        trainer.params.name,
        what,
        result["step"],
        result["val_mse"],
        result["val_cosine"],
        sts_dev,
    )


def _log_evaluation(trainer: Trainer, result: dict, best: bool) -> None:
    """An evaluation's scores, whether it is the best so far, and an early stop it caused."""
    state = trainer.state
    _log_scores(trainer, "evaluation at", result)
    if not best:
        trainer.log.info(
            "distill %s: no improvement for %d evaluation(s); best val_mse %.6g at step %d",
            trainer.params.name,
            state.evals_since_best,
            state.best_val_mse,
            state.best_step,
        )
    if state.stopped_early:
        trainer.log.info("distill %s: stopping early (patience %s)", trainer.params.name, trainer.params.patience)


def _validation_scores(model: Any, data: TrainingData, with_sts_dev: bool) -> dict:
    model.eval()
    predicted = model.encode(data.val_texts, batch_size=128)
    sts_dev = {"sts_dev": round(sts.dev_score(lambda t: model.encode(t, batch_size=128)), 3)} if with_sts_dev else {}
    model.train()
    measured = metrics.fidelity(predicted, data.val_targets)
    return {"val_mse": measured["mse"], "val_cosine": measured["mean_cosine"], **sts_dev}
