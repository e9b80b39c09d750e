"""A distillation run's steps, taken by sentence-transformers' trainer.

:func:`fit` trains the run's student through a ``SentenceTransformer`` view of its parameters
(:func:`tasks.ml.student.as_sentence_transformer`) on the training rows as a ``datasets.Dataset``, in the
order of :class:`.sampler.HPDBatchSampler`, with :class:`.objective.HPDLoss` and the run's own AdamW and
schedule. The trainer does the forward and backward passes, gradient accumulation, clipping, AMP and DDP;
:class:`Schedule` hands each finished step and epoch back to the run (progress, evaluation, early stopping,
checkpoints). Nothing of Hugging Face's checkpoint layout is written or read: a resumed run has its weights,
optimizer and schedule in place already, and its resume folder holds only a ``trainer_state.json`` with the
step, from which the trainer skips the rows already trained; :class:`DistillSTTrainer` restores the run's own
RNG states instead of loading any file.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, TrainerState

from tasks.ml import student
from tasks.stages.distill.objective import HPDLoss
from tasks.stages.distill.sampler import HPDBatchSampler, Order
from tasks.stages.distill.state import restore_rng

if TYPE_CHECKING:
    from tasks.stages.distill.trainer import Trainer


class DistillSTTrainer(SentenceTransformerTrainer):
    """sentence-transformers' trainer, resumed from the run's own verified checkpoint: the weights are in place
    before training, and the RNG states are the checkpoint's (``resume_rng``), not a file's."""

    resume_rng: dict[str, Any] | None = None

    def add_model_card_callback(self, default_args_dict: dict[str, Any]) -> None:
        """None: the export writes our own model card (and ST's would compute examples from the rows)."""

    def _load_from_checkpoint(self, checkpoint_path: str) -> None:
        """Nothing to load: the run restored the weights from its checkpoint."""

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if self.resume_rng is not None:
            restore_rng(self.resume_rng)


class DistillSTArguments(SentenceTransformerTrainingArguments):
    """The trainer's settings, on one device per process: a run places its student on one GPU (several GPUs
    train through DDP, a process each), so on a host with several the trainer must not wrap it in
    ``DataParallel``, which would also multiply the batch by the GPUs seen."""

    @property
    def n_gpu(self) -> int:
        return min(super().n_gpu, 1)


class Schedule(TrainerCallback):
    """Hands the run each finished step (with its squared error, from ``loss``) and epoch."""

    def __init__(self, run: Trainer, loss: HPDLoss) -> None:
        self.run, self.loss = run, loss

    def on_epoch_begin(self, args: Any, state: TrainerState, control: Any, **kwargs: Any) -> None:
        self.run.epoch_begins(state.global_step)

    def on_step_end(self, args: Any, state: TrainerState, control: Any, **kwargs: Any) -> None:
        if self.run.step_ended(state.global_step, *self.loss.take()):
            control.should_training_stop = True

    def on_epoch_end(self, args: Any, state: TrainerState, control: Any, **kwargs: Any) -> None:
        self.run.epoch_ends(state.global_step)


def fit(run: Trainer, scratch: Path) -> None:
    """Train ``run`` from its step to its last (or an early stop); ``scratch``: a folder of this process's."""
    import torch

    params = run.params
    view = student.as_sentence_transformer(run.model)
    loss = HPDLoss(view, params)
    hf = DistillSTTrainer(
        model=view,
        args=arguments(run, scratch / "trainer"),
        train_dataset=run.data.training_dataset(scratch / "rows"),
        loss=loss,
        callbacks=[Schedule(run, loss)],
        optimizers=(run.optim.optimizer, run.optim.scheduler),
    )
    hf.remove_callback(PrinterCallback)  # the run logs its own progress
    if params.threads:  # accelerate sets its own count under CPU DDP
        torch.set_num_threads(params.threads)
    run.scaler = hf.accelerator.scaler
    resume = None
    if run.state.step:
        hf.resume_rng = run.resumed["rng"]
        if run.scaler is not None and run.resumed["scaler"]:
            run.scaler.load_state_dict(run.resumed["scaler"])
        resume = resume_folder(scratch / "resume", run.state.step, run.total_steps, run.micro_batch)
    hf.train(resume_from_checkpoint=resume)


def arguments(run: Trainer, output_dir: Path) -> DistillSTArguments:
    """The trainer's settings for ``run``: its steps, micro-batches and sampler, clipping, AMP and seed; no
    evaluation, saving, logging or reporting of the trainer's own (the run does those)."""
    params, world = run.params, run.dist.world
    order = Order(run.data, params.batch_size, params.length_grouped, world, epoch_of=run.current_epoch)
    return DistillSTArguments(
        output_dir=str(output_dir),
        max_steps=run.total_steps,
        per_device_train_batch_size=run.micro_batch,
        gradient_accumulation_steps=params.grad_accum,
        max_grad_norm=params.max_grad_norm,
        bf16=run.amp == "bf16",
        fp16=run.amp == "fp16",
        use_cpu=run.model.device.type == "cpu",  # CPU DDP (gloo) too
        seed=params.seed,
        data_seed=params.seed,
        batch_sampler=functools.partial(HPDBatchSampler, order=order),
        eval_strategy="no",
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
