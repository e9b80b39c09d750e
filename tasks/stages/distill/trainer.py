"""A training run: the student learns to reproduce the projected teacher embeddings (HPD).

sentence-transformers' trainer owns the loop (:mod:`.st_trainer`); the run hands it what is its own: the
student, the loss (:mod:`.objective`: MSE between the student's Dense(k) output and the targets plus, by
default, an in-batch neighbourhood KL term, optionally a (1 - cosine) and an in-batch similarity-structure
term), AdamW with linear warmup and decay
(:mod:`.optimization`), the batch order (:mod:`.sampler`), an evaluator (:mod:`.evaluation`: validation MSE
and mean cosine, and the STS-B dev score when selecting on it) that the trainer runs every ``eval_every``
steps, and callbacks (:mod:`.callbacks`) that record the losses and progress, keep the best weights by
``select_on``, stop early after ``patience`` evaluations without improvement and write a checkpoint every
``checkpoint_every`` steps, which a rerun resumes exactly (weights, optimizer, schedule, every process's RNG
states; the trainer skips the rows already trained). Gradient accumulation, clipping, AMP (bf16 autocasts the
whole forward pass; fp16 on CUDA with the accelerator's gradient scaler) and DDP are the trainer's. A step's
gradient is that of the squared error summed over the global batch, over its size, so N processes compute the
same gradient as one (the in-batch terms are each micro-batch's: equal only with them off); under DDP an epoch
trains only whole rounds of full micro-batches (:mod:`.plan`).
With ``blend_initial``, blends of the initial and final weights may be exported instead (:mod:`.blending`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tasks.core import uris
from tasks.core.progress import Progress
from tasks.ml import student
from tasks.stages.distill import blending, st_trainer
from tasks.stages.distill.callbacks import EpochClock, Selection, StepLosses, StoreCheckpoints
from tasks.stages.distill.checkpoints import CheckpointError, Checkpoints
from tasks.stages.distill.data import Position, TrainingData
from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.errors import DistillError
from tasks.stages.distill.evaluation import FidelityEvaluator
from tasks.stages.distill.objective import HPDLoss
from tasks.stages.distill.optimization import Optimization
from tasks.stages.distill.plan import TrainingPlan
from tasks.stages.distill.run_log import RunLog
from tasks.stages.distill.state import Snapshot, TrainState, restore_rng, rng_states, seed_everything
from tasks.stages.distill.weights import KeptWeights
from tasks.stages.params import DistillParams


class Trainer:
    """One training run: the student (and its ``SentenceTransformer`` view, which the trainer trains), its plan,
    optimisation, state, kept weights and checkpoints."""

    def __init__(
        self,
        params: DistillParams,
        data: TrainingData,
        device: str,
        dist: Distributed,
        fingerprint: str,
        spec: str = "",
        keep_head: bool = False,
    ) -> None:
        """``spec``: the model to start from (default: ``params.student``); ``keep_head``: its head too."""
        self.params, self.data, self.dist = params, data, dist
        self.plan = TrainingPlan.of(params, data.train_rows, device, dist.world)
        seed_everything(params.seed)
        self.keep_head = keep_head
        self.model = _build_student(params, spec or params.student, data.dim, device, keep_head)
        self.view = student.as_sentence_transformer(self.model)
        self.evaluator = FidelityEvaluator(data, params.select_on)
        self.optim = Optimization(self.model, params, self.plan.total_steps)
        self.state = TrainState()
        self.kept = KeptWeights(self.model, blends=bool(params.blend_initial))
        self.checkpoints = Checkpoints(params.store, params.name, fingerprint)
        self.run_log = RunLog(params, dist.leader)
        self.scaler: Any = None  # the fp16 gradient scaler of the trainer's accelerator, while training
        self.resumed: Snapshot | None = None  # a resumed run's checkpoint: its RNG and scaler states restore later
        self.init_record: dict[str, Any] = {}
        self.exported: dict[str, Any] | None = None

    def restore_or_initialise(self, force: bool) -> dict[str, Any]:
        """Resume from the latest checkpoint of this run (same fingerprint), or initialise the head."""
        found = None if force else _latest_checkpoint(self.checkpoints)
        if found is not None:
            pointer, uri, payload = found
            self._restore(uri, payload)
            self.init_record = pointer.get("init", {})
            return {**self.init_record, "resumed_from_step": self.state.step}
        self.init_record = _initial_head(self.model, self.params, self.data, self.keep_head)
        initial = self.evaluator.evaluate(self.view, 0)  # training must beat the initial weights
        self.state.record_eval(initial, None, self.params.select_on)
        self.kept.keep_best()
        self.kept.keep_initial()
        self.run_log.scores(f"head {student.head_note(self.init_record)}; at", initial)
        return self.init_record

    def train(self, progress: bool) -> None:
        """Train until the step budget is spent or early stopping; then load the weights to export."""
        self.model.train()
        self.run_log.plan(self.plan, self.state, self.data, str(self.model.device))
        if self.state.step < self.plan.total_steps and not self.state.stopped_early:
            reporter = self.plan.progress(
                self.params, self.state.step, progress and self.dist.leader, self.run_log.logger
            )
            with tempfile.TemporaryDirectory(prefix="hpd-distill-") as scratch, reporter:
                self._fit(Path(scratch), reporter)
        self.model.eval()
        self.kept.keep_final()
        self.kept.load(self.kept.best)
        self.exported = blending.export_choice(
            self.kept, self.evaluator, self.view, self.state, self.dist, self.run_log
        )

    def _fit(self, scratch: Path, reporter: Progress) -> None:
        """Hand the trainer the run's loss, evaluator and callbacks, and train."""
        loss = HPDLoss(self.view, self.params)
        losses = StepLosses(loss, self.state, self.dist, self.data.dim, lambda: self.optim.lr)
        losses.progress = reporter
        clock = EpochClock(self.plan, self.state, self.run_log)
        selection = Selection(self.state, self.kept, self.run_log)
        callbacks = [losses, clock, selection, StoreCheckpoints(self.params.checkpoint_every, self.save_checkpoint)]
        cpu = self.model.device.type == "cpu"
        args = st_trainer.arguments(self.params, self.plan, self.data, scratch / "trainer", clock.current, cpu)
        rows = self.data.training_dataset(scratch / "rows")
        hf = st_trainer.build(self.view, rows, loss, self.evaluator, callbacks, self.optim, args)
        self.scaler = hf.accelerator.scaler
        try:
            hf.train_run(self.params.threads, self._resume(scratch))
        finally:
            self.scaler = None

    def _resume(self, scratch: Path) -> st_trainer.Resume | None:
        """Where a resumed run takes up: its step, RNG and scaler states."""
        if not self.state.step:
            return None
        plan = self.plan
        folder = st_trainer.resume_folder(scratch / "resume", self.state.step, plan.total_steps, plan.micro_batch)
        resumed = self.resumed
        assert resumed is not None, "a run past step 0 resumed from a checkpoint"
        return st_trainer.Resume(folder, resumed.rng[self.dist.rank], resumed.scaler)

    def save_checkpoint(self) -> None:
        """Write the run's checkpoint (the leader; every process's RNG states, so a resumed DDP run continues
        each dropout stream)."""
        rng = self.dist.gather(rng_states())
        if not self.dist.leader:
            return
        parts = {**self.optim.state_dict(), **self.kept.checkpoint_part(), "state": self.state.to_dict(), "rng": rng}
        scaler = self.scaler.state_dict() if self.scaler is not None else {}
        snapshot = Snapshot(self.model.state_dict(), scaler=scaler, **parts)
        self.checkpoints.save(self.state.step, snapshot.as_payload(), self.init_record)

    def _restore(self, uri: str, payload: dict[str, Any]) -> None:
        """Load checkpoint ``uri``'s ``payload``."""
        try:  # the optimizer moves its own state to the model's device
            snapshot = Snapshot.from_payload(payload)
            self.model.load_state_dict(snapshot.model)
            self.optim.load_state_dict(snapshot.optimizer, snapshot.scheduler)
            self.kept.restore(snapshot.best_weights, snapshot.initial_weights)
            self.state = TrainState.from_dict(snapshot.state)
            restore_rng(snapshot.rng[self.dist.rank])  # a damaged state fails here; the trainer restores it again
            self.resumed = snapshot
        except Exception as exc:  # a damaged payload fails in many ways (shapes, missing keys, types)
            raise DistillError(
                f"{uri}: corrupted or incompatible checkpoint ({type(exc).__name__}: {exc}); "
                f"rerun with --force to start over"
            ) from None
        self.run_log.resumed(uris.redact(uri), self.state.step)


def _latest_checkpoint(checkpoints: Checkpoints) -> tuple[dict[str, Any], str, dict[str, Any]] | None:
    """This run's latest checkpoint (pointer, URI, payload), if any; a refused one is a :class:`DistillError`."""
    try:
        return checkpoints.resume()
    except CheckpointError as exc:
        raise DistillError(f"{exc}; rerun with --force to start over") from None


def _initial_head(model: Any, params: DistillParams, data: TrainingData, keep_head: bool) -> dict[str, Any]:
    """The head's record: kept from the warm start (step 0 is then the model it starts from), or fitted by
    ``params.init`` on a first batch of up to ``init_rows`` rows."""
    if keep_head:
        return {"init": "warm_start"}
    first = next(data.batches(Position(), min(params.init_rows, data.train_rows)))
    return student.initialise_head(
        model, params.init, first.texts, first.targets, params.activation, params.ridge_alpha
    )


def _build_student(params: DistillParams, spec: str, dim: int, device: str, keep_head: bool) -> Any:
    model = student.build(
        spec, dim, params.activation, params.student_layers, params.max_seq_length, params.dropout, device
    )
    if keep_head:
        student.keep_head(model, spec)
    student.freeze(model, params.freeze_layers, spec)
    return model
