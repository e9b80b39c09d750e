"""What a distillation run tells its operator: its plan, evaluations, epochs, blends and export. Under DDP only
the leader logs them; the other processes log their warnings only."""

from __future__ import annotations

import logging

import numpy as np

from tasks.stages.distill.data import TrainingData
from tasks.stages.distill.evaluation import Evaluation
from tasks.stages.distill.plan import TrainingPlan
from tasks.stages.distill.state import TrainState
from tasks.stages.params import DistillParams

_LEADER = logging.getLogger(__name__)
_FOLLOWER = logging.getLogger(f"{__name__}.follower")
_FOLLOWER.setLevel(logging.WARNING)


class RunLog:
    """The log of run ``params.name``, from this process (``leader``: rank 0)."""

    def __init__(self, params: DistillParams, leader: bool) -> None:
        self.params, self.name = params, params.name
        self.logger = _LEADER if leader else _FOLLOWER

    def plan(self, plan: TrainingPlan, state: TrainState, data: TrainingData, device: str) -> None:
        """The steps ahead of ``state`` on ``data``, on ``device``; under DDP, the rows each epoch leaves out."""
        params = self.params
        self.logger.info(
            "distill %s: training steps %d to %d of %d rows each (%d micro-batch(es)), %d epoch(s) of %d rows, "
            "%d validation rows, k=%d, lr %.3g, device %s, amp %s, %d process(es); loss mse + %g cosine + %g "
            "structure + %g neighbourhood (on the %s), %d frozen layer(s), selecting on %s",
            self.name,
            state.step + 1,
            plan.total_steps,
            params.batch_size,
            params.grad_accum,
            params.epochs,
            data.train_rows,
            len(data.val_texts),
            data.dim,
            params.lr,
            device,
            plan.amp,
            plan.world,
            params.cosine_weight,
            params.structure_weight,
            params.relation_weight,
            params.relation_on,
            params.freeze_layers,
            params.select_on,
        )
        plan.log_dropped_tail(self.logger, data.train_rows)

    def resumed(self, checkpoint: str, step: int) -> None:
        self.logger.info("distill %s: resumed from %s at step %d", self.name, checkpoint, step)

    def scores(self, what: str, evaluation: Evaluation) -> None:
        """An evaluation's scores, with the STS dev score when the run selects on it."""
        sts_dev = "" if evaluation.sts_dev is None else f", sts_dev {evaluation.sts_dev:.3f}"
        self.logger.info(
            "distill %s: %s step %d: val_mse %.6g, val_cosine %.4f%s",
            self.name,
            what,
            evaluation.step,
            evaluation.val_mse,
            evaluation.val_cosine,
            sts_dev,
        )

    def evaluation(self, evaluation: Evaluation, best: bool, state: TrainState) -> None:
        """An evaluation's scores, whether it is the best so far, and an early stop it caused."""
        self.scores("evaluation at", evaluation)
        if not best:
            select_on = self.params.select_on
            self.logger.info(
                "distill %s: no improvement for %d evaluation(s); best %s %.6g at step %d",
                self.name,
                state.evals_since_best,
                select_on,
                state.best_value(select_on),
                state.best_step,
            )
        if state.stopped_early:
            self.logger.info("distill %s: stopping early (patience %s)", self.name, self.params.patience)

    def epoch(self, epoch: int, state: TrainState, first_step: int) -> None:
        """The end of ``epoch``, with the mean training loss of the steps this process ran in it."""
        losses = [loss for step, loss in state.losses if step > first_step]
        mean = f"{np.mean(losses):.6g}" if losses else "n/a"
        self.logger.info(
            "distill %s: epoch %d/%d ended at step %d, mean training loss %s",
            self.name,
            epoch + 1,
            self.params.epochs,
            state.step,
            mean,
        )
