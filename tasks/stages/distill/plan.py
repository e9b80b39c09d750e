"""A distillation run's plan: micro-batches, steps, evaluations and the rows each epoch trains, from its params,
its data and its processes."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from tasks.core.progress import Progress
from tasks.stages.distill.errors import DistillError
from tasks.stages.distill.sampler import micro_batches
from tasks.stages.params import DistillParams

EVALUATIONS = 20  # validations a run makes when eval_every is not set


@dataclass(frozen=True)
class TrainingPlan:
    """``micro_batch``: rows of a micro-batch on each process; ``epoch_micro_batches``: those of an epoch over all
    processes; ``epoch_rows``: the rows an epoch trains (under DDP only whole rounds of full micro-batches over
    the processes); ``amp``: ``bf16``, ``fp16`` or ``off``."""

    name: str
    world: int
    micro_batch: int
    epoch_micro_batches: int
    steps_per_epoch: int
    total_steps: int
    eval_every: int
    epoch_rows: int
    amp: str

    @classmethod
    def of(cls, params: DistillParams, train_rows: int, device: str, world: int) -> TrainingPlan:
        """The plan of a run of ``params`` over ``train_rows`` rows on ``world`` processes; a
        :class:`DistillError` naming the run when its batch does not split or its rows fill no round."""
        micro_batch = _micro_batch(params, world)
        epoch_micro_batches = _epoch_micro_batches(params.name, train_rows, micro_batch, world)
        steps_per_epoch = math.ceil(epoch_micro_batches / world / params.grad_accum)
        total_steps = int(min(params.max_steps or math.inf, params.epochs * steps_per_epoch))
        return cls(
            name=params.name,
            world=world,
            micro_batch=micro_batch,
            epoch_micro_batches=epoch_micro_batches,
            steps_per_epoch=steps_per_epoch,
            total_steps=total_steps,
            eval_every=params.eval_every or max(1, math.ceil(total_steps / EVALUATIONS)),
            epoch_rows=min(train_rows, epoch_micro_batches * micro_batch),
            amp={"auto": "bf16" if device == "cuda" else "off"}.get(params.amp, params.amp),
        )

    def progress(self, params: DistillParams, step: int, bar: bool, logger: logging.Logger) -> Progress:
        """The run's progress in training rows, from ``step``, where it (re)starts."""
        total = int(min(self.total_steps * params.batch_size, params.epochs * self.epoch_rows))
        done = min(step * params.batch_size, total)
        return Progress(f"distill {self.name}", total, done=done, bar=bar, logger=logger)

    def log_dropped_tail(self, log: logging.Logger, train_rows: int) -> None:
        """Under DDP, the rows at the end of each epoch's order that fill no whole round of micro-batches."""
        if dropped := train_rows - self.epoch_rows:
            log.info(
                "distill %s: each epoch trains %d of %d rows: under DDP the last %d of its order, short of a "
                "micro-batch of %d rows on each of %d processes, are left out",
                self.name,
                self.epoch_rows,
                train_rows,
                dropped,
                self.micro_batch,
                self.world,
            )


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
