"""What a distillation run hands sentence-transformers' trainer besides its evaluator: callbacks that record
each step's loss and progress (:class:`StepLosses`), follow the epochs (:class:`EpochClock`), keep the best
weights and stop early (:class:`Selection`), and write checkpoints to the store (:class:`StoreCheckpoints`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from tasks.core.progress import Progress
from tasks.stages.distill.data import Position
from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.errors import DistillError
from tasks.stages.distill.evaluation import Evaluation
from tasks.stages.distill.objective import HPDLoss
from tasks.stages.distill.plan import TrainingPlan
from tasks.stages.distill.run_log import RunLog
from tasks.stages.distill.state import TrainState
from tasks.stages.distill.weights import KeptWeights


class StepLosses(TrainerCallback):
    """Records each step's training loss (the MSE over the global batch: ``loss``'s squared error summed over the
    processes) in the run's state and on its progress line, which carries the mean loss since the previous
    line; a non-finite loss ends the run with a :class:`DistillError` naming the step."""

    def __init__(self, loss: HPDLoss, run: TrainState, dist: Distributed, k: int, lr: Callable[[], float]) -> None:
        self.loss, self.run, self.dist, self.k, self.lr = loss, run, dist, k, lr
        self.progress: Progress | None = None
        self.unreported: list[float] = []

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        squared_error, rows = self.loss.take()
        device = self.loss.model.device
        rows = int(self.dist.sum(rows, device))
        loss = self.dist.sum(squared_error, device) / (rows * self.k)
        if not math.isfinite(loss):
            raise DistillError(
                f"{args.run_name}: training loss is {loss} at step {state.global_step} "
                f"(lr {self.lr():.2e}); lower lr or check the targets"
            )
        self.run.step = state.global_step
        self.run.losses.append((state.global_step, loss))
        self.unreported.append(loss)
        mean, step = float(np.mean(self.unreported)), f"{state.global_step}/{state.max_steps}"
        if self.progress is not None and self.progress.update(rows, step=step, loss=mean, lr=self.lr()):
            self.unreported.clear()


class EpochClock(TrainerCallback):
    """The epoch being trained, which the batch order follows (:meth:`current`), from the step it began or
    resumed at; logs each epoch trained to its end (not one cut short by the step budget or an early stop)."""

    def __init__(self, plan: TrainingPlan, run: TrainState, run_log: RunLog) -> None:
        self.plan, self.run, self.run_log = plan, run, run_log
        self.first_step = run.step

    def current(self) -> int:
        return self.first_step // self.plan.steps_per_epoch

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.first_step = state.global_step

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        step = state.global_step
        if step > self.first_step and step % self.plan.steps_per_epoch == 0:
            epoch = step // self.plan.steps_per_epoch - 1
            self.run.position = Position(epoch + 1)
            self.run_log.epoch(epoch, self.run, self.first_step)


class Selection(TrainerCallback):
    """Asks for an evaluation at the last step too (the trainer evaluates every ``eval_steps``), records each
    (the scores the trainer broadcast from the leader), keeps the best weights by ``select_on`` and stops the
    run after ``patience`` evaluations without improvement."""

    def __init__(self, run: TrainState, kept: KeptWeights, run_log: RunLog) -> None:
        self.run, self.kept, self.run_log = run, kept, run_log

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.global_step >= state.max_steps:
            control.should_evaluate = True

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, float],
        **kw: Any,
    ) -> None:
        evaluation = Evaluation.from_metrics(state.global_step, metrics)
        params = self.run_log.params
        if best := self.run.record_eval(evaluation, params.patience, params.select_on):
            self.kept.keep_best()
        self.run_log.evaluation(evaluation, best, self.run)
        if self.run.stopped_early:
            control.should_training_stop = True


class StoreCheckpoints(TrainerCallback):
    """Asks the trainer to save every ``every`` steps (not at the last) and then writes the run's checkpoint to
    the store with ``save`` (the trainer itself writes nothing: :class:`.st_trainer.DistillSTTrainer`)."""

    def __init__(self, every: int, save: Callable[[], None]) -> None:
        self.every, self.save = every, save

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.global_step % self.every == 0 and state.global_step < state.max_steps:
            control.should_save = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.save()
