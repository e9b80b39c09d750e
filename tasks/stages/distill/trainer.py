"""A training run: the student learns to reproduce the projected teacher embeddings (HPD).

The steps are sentence-transformers' trainer's (:mod:`.st_trainer`); this run owns the rest. MSE between
the student's Dense(k) output and the targets, optionally plus a (1 - cosine) term and an in-batch
similarity-structure term (the MSE between the student's and the targets' pairwise cosine matrices, within
each micro-batch of each process; :mod:`.objective`); the embeddings and lower layers may be frozen;
AdamW with linear warmup and decay (:mod:`.optimization`); gradient accumulation; AMP (bf16: the trainer
autocasts the whole forward pass, pooling and head included; fp16 on CUDA with the accelerator's gradient
scaler); validation every ``eval_every`` steps with early stopping and the best weights kept, by
validation MSE or by the mean STS-B/SICK-R dev score (``select_on``);
with ``blend_initial``, blends ``(1 - a) * initial + a * final`` of the initial weights and those training
ended with, scored after training, one exported instead of the best weights when it scores better
(:mod:`.blending`);
a checkpoint every ``checkpoint_every`` steps, which a rerun resumes exactly (weights, optimizer, schedule,
every process's RNG states; the trainer skips the rows already trained). A step's gradient is that of the
squared error summed over the global batch, over its size, so N processes compute the same gradient as
one; with ``grad_accum``, an epoch's short last step averages its micro-batches' means instead. Under DDP an
epoch trains only whole rounds of full micro-batches over the processes: the rest of its order is left out
(logged with the plan).

The run logs its plan, progress (rows, rate, ETA, step, mean training loss since the previous line, lr),
every evaluation, each epoch's end, each blend and the export; under DDP only the leader logs them.
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core import uris
from tasks.core.progress import Progress
from tasks.ml import metrics, sts, student
from tasks.stages.distill import blending, st_trainer
from tasks.stages.distill.checkpoints import CheckpointError, Checkpoints
from tasks.stages.distill.data import Position, TrainingData
from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.optimization import Optimization
from tasks.stages.distill.sampler import micro_batches
from tasks.stages.distill.state import TrainState, restore_rng, rng_states, seed_everything
from tasks.stages.params import DistillParams

log = logging.getLogger(__name__)
_FOLLOWER_LOG = logging.getLogger(f"{__name__}.follower")  # ranks other than 0: their warnings only
EVALUATIONS = 20  # validations a run makes when eval_every is not set
_FOLLOWER_LOG.setLevel(logging.WARNING)


class DistillError(ValueError):
    """Distillation cannot run or resume as configured; the message names the input."""


class Trainer:
    """One training run: model, optimiser, schedule, data position, checkpoints (the steps themselves are taken
    by sentence-transformers' trainer: :mod:`.st_trainer`)."""

    def __init__(
        self, params: DistillParams, data: TrainingData, device: str, dist: Distributed, fingerprint: str
    ) -> None:
        self.params, self.data, self.dist = params, data, dist
        self.state = TrainState()
        self.micro_batch = _micro_batch(params, dist.world)
        seed_everything(params.seed)
        self.model = _build_student(params, data.dim, device)
        self.amp = {"auto": "bf16" if device == "cuda" else "off"}.get(params.amp, params.amp)
        self.epoch_micro_batches = _epoch_micro_batches(params.name, data.train_rows, self.micro_batch, dist.world)
        self.steps_per_epoch = math.ceil(self.epoch_micro_batches / dist.world / params.grad_accum)
        self.total_steps = int(min(params.max_steps or math.inf, params.epochs * self.steps_per_epoch))
        self.eval_every = params.eval_every or max(1, math.ceil(self.total_steps / EVALUATIONS))
        self.optim = Optimization(self.model, params, self.total_steps)
        self.scaler: Any = None  # the fp16 gradient scaler of the trainer's accelerator, while training
        self.resumed: dict = {}  # what a resumed run restores once training starts: RNG and scaler states
        self.best_weights: dict | None = None
        self.initial_weights: dict | None = None  # on the CPU, kept only to blend with (blend_initial)
        self.final_weights: dict | None = None  # likewise: the weights training ended with
        self.init_record: dict = {}
        self.exported: dict | None = None
        self.checkpoints = Checkpoints(params.store, params.name, fingerprint)
        self.log = log if dist.leader else _FOLLOWER_LOG
        self.losses_unreported: list[float] = []  # training losses since the last progress line
        self.reporter: Progress | None = None
        self.epoch_first_step = 0

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
        self.model.train()
        _log_plan(self)
        _log_dropped_tail(self)
        with tempfile.TemporaryDirectory(prefix="hpd-distill-") as scratch, _progress(self, progress) as reporter:
            self.reporter = reporter
            if not self._finished():
                st_trainer.fit(self, Path(scratch))
        self.reporter, self.scaler = None, None
        self.model.eval()
        self.final_weights = blending.cpu_copy(self.model.state_dict()) if self.initial_weights is not None else None
        if self.best_weights is not None:
            self.model.load_state_dict(self.best_weights)
        self.exported = _exported(self)

    def _finished(self) -> bool:
        return self.state.step >= self.total_steps or self.state.stopped_early

    def epoch_begins(self, step: int) -> None:
        self.epoch_first_step = step

    def current_epoch(self) -> int:
        """The epoch being trained (0-based), from the step it began or resumed at."""
        return self.epoch_first_step // self.steps_per_epoch

    def step_ended(self, step: int, squared_error: float, rows: int) -> bool:
        """Record step ``step`` (its summed squared error over ``rows`` rows, this process's), then evaluate and
        checkpoint on schedule; True when the run stops early."""
        state = self.state
        rows = int(self.dist.sum(rows, self.model.device))
        loss = self.dist.sum(squared_error, self.model.device) / (rows * self.data.dim)
        if not math.isfinite(loss):
            raise DistillError(
                f"{self.params.name}: training loss is {loss} at step {step} "
                f"(lr {self.optim.lr:.2e}); lower lr or check the targets"
            )
        state.step = step
        state.losses.append((step, loss))
        _report(self, rows, loss)
        last = step >= self.total_steps
        if step % self.eval_every == 0 or last:
            self._evaluate()
            state.stopped_early = bool(self.dist.gather(state.stopped_early)[0])  # the leader's decision
        if step % self.params.checkpoint_every == 0 and not last:
            self._save_checkpoint()
        return state.stopped_early

    def epoch_ends(self, step: int) -> None:
        """Log an epoch trained to its end (not one cut short by the step budget or an early stop)."""
        if step > self.epoch_first_step and step % self.steps_per_epoch == 0:
            epoch = step // self.steps_per_epoch - 1
            self.state.position = Position(epoch + 1)
            _log_epoch(self, epoch, self.epoch_first_step)

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
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else {},
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
        trainer.resumed = {"rng": payload["rng"][trainer.dist.rank], "scaler": payload["scaler"]}
        restore_rng(trainer.resumed["rng"])  # a damaged state fails here; the trainer restores it again to train
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


def _micro_batch(params: DistillParams, world: int) -> int:
    """Rows of a micro-batch on each process: the global batch over ``grad_accum`` micro-batches and the
    processes."""
    parts = params.grad_accum * world
    if params.batch_size % parts:
        raise DistillError(
            f"{params.name}: batch_size {params.batch_size} is not a multiple of grad_accum {params.grad_accum} "
            f"times {world} process(es)"
        )
    return params.batch_size // parts


def _epoch_micro_batches(name: str, rows: int, micro_batch: int, world: int) -> int:
    """The micro-batches of an epoch over all processes (:func:`micro_batches`); a :class:`DistillError` when
    under DDP the rows fill no whole round of them (there would be nothing to train)."""
    found = micro_batches(rows, micro_batch, world, world > 1)
    if not found:
        raise DistillError(
            f"{name}: {rows} training rows fill no round of micro-batches of {micro_batch} rows on each of {world} "
            "processes; train on more rows, with a smaller batch_size or with fewer processes"
        )
    return found


def _build_student(params: DistillParams, dim: int, device: str) -> Any:
    model = student.build(
        params.student, dim, params.activation, params.student_layers, params.max_seq_length, params.dropout, device
    )
    student.freeze(model, params.freeze_layers, params.student)
    return model


def _progress(trainer: Trainer, bar: bool) -> Progress:
    """The run's progress in training rows, from where it (re)starts."""
    params = trainer.params
    total = int(min(trainer.total_steps * params.batch_size, params.epochs * _epoch_rows(trainer)))
    done = min(trainer.state.step * params.batch_size, total)
    return Progress(f"distill {params.name}", total, done=done, bar=bar and trainer.dist.leader, logger=trainer.log)


def _epoch_rows(trainer: Trainer) -> int:
    """Rows an epoch trains: all, but under DDP only whole rounds of full micro-batches over the processes."""
    return min(trainer.data.train_rows, trainer.epoch_micro_batches * trainer.micro_batch)


def _report(trainer: Trainer, rows: int, loss: float) -> None:
    """Count ``rows`` trained; a progress line carries the mean training loss since the previous one."""
    trainer.losses_unreported.append(loss)
    step = f"{trainer.state.step}/{trainer.total_steps}"
    mean, reporter = float(np.mean(trainer.losses_unreported)), trainer.reporter
    if reporter is not None and reporter.update(rows, step=step, loss=mean, lr=trainer.optim.lr):
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


def _log_dropped_tail(trainer: Trainer) -> None:
    """Under DDP, the rows at the end of each epoch's order that fill no whole round of micro-batches."""
    dropped = trainer.data.train_rows - _epoch_rows(trainer)
    if dropped:
        trainer.log.info(
            "distill %s: each epoch trains %d of %d rows: under DDP the last %d of its order, short of a "
            "micro-batch of %d rows on each of %d processes, are left out",
            trainer.params.name,
            _epoch_rows(trainer),
            trainer.data.train_rows,
            dropped,
            trainer.micro_batch,
            trainer.dist.world,
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
        select_on = trainer.params.select_on
        trainer.log.info(
            "distill %s: no improvement for %d evaluation(s); best %s %.6g at step %d",
            trainer.params.name,
            state.evals_since_best,
            select_on,
            state.best_value(select_on),
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
