"""sentence-transformers' trainer, as a distillation run drives it.

:func:`build` hands ``SentenceTransformerTrainer`` a ``SentenceTransformer`` view of the run's student
(:func:`tasks.ml.student.as_sentence_transformer`), the training rows as a ``datasets.Dataset`` in the order of
:class:`.sampler.HPDBatchSampler`, :class:`.objective.HPDLoss`, the run's AdamW and schedule, its evaluator
and its callbacks (:mod:`.callbacks`). The trainer does the forward and backward passes, gradient accumulation,
clipping, AMP and DDP, evaluates every ``eval_every`` steps and saves when a callback asks it to. Nothing of
Hugging Face's checkpoint layout is written or read (:class:`DistillSTTrainer`): the run's callback writes its
own checkpoint to the store; a resumed run has its weights, optimizer and schedule in place already, and its
resume folder holds only a ``trainer_state.json`` with the step, from which the trainer skips the rows already
trained, while the run's own RNG states are restored instead of any file's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, TrainerState

from tasks.stages.distill.data import TrainingData
from tasks.stages.distill.evaluation import FidelityEvaluator
from tasks.stages.distill.objective import HPDLoss
from tasks.stages.distill.optimization import Optimization
from tasks.stages.distill.plan import TrainingPlan
from tasks.stages.distill.sampler import HPDBatchSampler, Order
from tasks.stages.distill.state import restore_rng
from tasks.stages.params import DistillParams


@dataclass(frozen=True)
class Resume:
    """Where a resumed run takes up: a folder from :func:`resume_folder`, its RNG and fp16 scaler states."""

    folder: str
    rng: dict[str, Any]
    scaler: dict[str, Any]


class DistillSTTrainer(SentenceTransformerTrainer):
    """sentence-transformers' trainer, checkpointed by the run's own callback and resumed from the run's own
    verified checkpoint: the weights are in place before training, and the RNG states are the checkpoint's
    (``resume_rng``), not a file's; an evaluation leaves the training's random streams as they were."""

    resume_rng: dict[str, Any] | None = None

    def train_run(self, threads: int | None, resume: Resume | None) -> None:
        """Train from the run's step (``resume``: a resumed run's) to its last, or an early stop."""
        import torch

        if threads:  # accelerate sets its own count under CPU DDP
            torch.set_num_threads(threads)
        if resume is not None:
            self.resume_rng = resume.rng
            if self.accelerator.scaler is not None and resume.scaler:
                self.accelerator.scaler.load_state_dict(resume.scaler)
        self.train(resume_from_checkpoint=resume.folder if resume else None)

    def add_model_card_callback(self, default_args_dict: dict[str, Any]) -> None:
        """None: the export writes our own model card (and ST's would compute examples from the rows)."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Nothing written here: the run's :class:`.callbacks.StoreCheckpoints` writes to the store on save."""

    def _load_from_checkpoint(self, checkpoint_path: str) -> None:
        """Nothing to load: the run restored the weights from its checkpoint."""

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if self.resume_rng is not None:
            restore_rng(self.resume_rng)

    def evaluate(
        self,
        eval_dataset: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """The evaluation, which must not draw from the CPU generator that dropout and the batch order use (the
        evaluation loader draws a seed): how often a run evaluates never changes what it trains."""
        import torch

        with torch.random.fork_rng(devices=[]):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)


class DistillSTArguments(SentenceTransformerTrainingArguments):
    """The trainer's settings, on one device per process: a run places its student on one GPU (several GPUs
    train through DDP, a process each), so on a host with several the trainer must not wrap it in
    ``DataParallel``, which would also multiply the batch by the GPUs seen."""

    @property
    def n_gpu(self) -> int:
        return min(super().n_gpu, 1)


def build(
    view: Any,
    rows: Any,
    loss: HPDLoss,
    evaluator: FidelityEvaluator,
    callbacks: list[TrainerCallback],
    optim: Optimization,
    args: DistillSTArguments,
) -> DistillSTTrainer:
    """The trainer of ``view`` (the student's ``SentenceTransformer``) on ``rows`` (a ``datasets.Dataset``) with the
    run's loss, evaluator, callbacks and optimisation; ``args`` from :func:`arguments`."""
    trainer = DistillSTTrainer(
        model=view,
        args=args,
        train_dataset=rows,
        loss=loss,
        evaluator=evaluator,
        callbacks=callbacks,
        optimizers=(optim.optimizer, optim.scheduler),
    )
    trainer.remove_callback(PrinterCallback)  # the run logs its own progress
    return trainer


def arguments(
    params: DistillParams,
    plan: TrainingPlan,
    data: TrainingData,
    output_dir: Path,
    epoch_of: Callable[[], int],
    cpu: bool,
) -> DistillSTArguments:
    """The trainer's settings: the plan's steps, micro-batches and evaluations, the sampler (its epoch from
    ``epoch_of``), clipping, AMP and seed; no saving, logging or reporting of the trainer's own."""
    order = Order(data, params.batch_size, params.length_grouped, plan.world, epoch_of=epoch_of)
    return DistillSTArguments(
        output_dir=str(output_dir),
        run_name=params.name,
        max_steps=plan.total_steps,
        per_device_train_batch_size=plan.micro_batch,
        gradient_accumulation_steps=params.grad_accum,
        max_grad_norm=params.max_grad_norm,
        bf16=plan.amp == "bf16",
        fp16=plan.amp == "fp16",
        use_cpu=cpu,  # CPU DDP (gloo) too
        seed=params.seed,
        data_seed=params.seed,
        batch_sampler=functools.partial(HPDBatchSampler, order=order),
        eval_strategy="steps",
        eval_steps=plan.eval_every,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,  # else True for any model that is not a PreTrainedModel
    )


def resume_folder(folder: Path, step: int, total_steps: int, micro_batch: int) -> str:
    """A folder the trainer resumes from at ``step``: a ``trainer_state.json`` and nothing else."""
    folder.mkdir(parents=True)
    state = TrainerState(global_step=step, max_steps=total_steps, train_batch_size=micro_batch)
    state.save_to_json(str(folder / "trainer_state.json"))
    return str(folder)
