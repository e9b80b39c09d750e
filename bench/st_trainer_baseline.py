"""Baseline: sentence-transformers' own MSELoss distillation training throughput (CPU, fp32 or bf16).

``SentenceTransformerTrainer`` (its extras ``datasets`` and ``accelerate``, which the stage needs too) with
its default optimizer (AdamW, weight_decay=0.01), constant LR, grad-norm clip 1.0, on-the-fly
tokenization in the collator, and ``bf16=True`` when asked (Accelerate wraps the model's forward in
``torch.autocast('cpu', bfloat16)``; weights stay fp32). The rows are consumed in the order given
(a sequential batch sampler), so a caller can feed it exactly the batches of its own loop.
``WARMUP`` extra optimizer steps run first and are excluded from the timing.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import numpy as np

# As the distillation stage trains: lr 1e-4, sequences cut at 128 tokens, seed 0.
LR, MAX_SEQ_LENGTH, SEED = 1e-4, 128, 0
WARMUP = 1  # the first step (optimizer state, kernel set-up) is left out of the timing


def _student(model_dir: str, k: int, max_seq_length: int) -> Any:
    """Transformer -> mean Pooling -> Dense(k, tanh); the BERT pooler (unused by mean pooling) is dropped,
    as the distillation stage's student drops it, so both compute the same per step."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    from torch import nn

    tr = Transformer(model_dir, max_seq_length=max_seq_length)
    if getattr(tr.auto_model, "pooler", None) is not None:
        tr.auto_model.pooler = None
    dim = tr.get_embedding_dimension()
    pool = Pooling(dim, pooling_mode="mean")
    dense = Dense(dim, k, activation_function=nn.Tanh())
    return SentenceTransformer(modules=[tr, pool, dense], device="cpu")


def _in_order(dataset: Any, batch_size: int, drop_last: bool, **kwargs: Any) -> Any:
    """A batch sampler taking the rows in the order given (sentence-transformers' callable hook)."""
    from sentence_transformers.base.sampler import DefaultBatchSampler
    from torch.utils.data import SequentialSampler

    return DefaultBatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=drop_last, **kwargs)


def _arguments(out: str, batch_size: int, steps: int, bf16: bool) -> Any:
    from sentence_transformers import SentenceTransformerTrainingArguments

    return SentenceTransformerTrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        max_grad_norm=1.0,
        bf16=bf16,
        batch_sampler=_in_order,
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=SEED,
        data_seed=SEED,
        dataloader_num_workers=0,
    )


def _with_trainer(model: Any, loss: Any, texts: list[str], targets: np.ndarray, steps: tuple[int, int], args: Any):
    """Train for warmup + timed steps; (seconds of the timed steps, torch threads seen, optimizer name)."""
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from transformers import TrainerCallback

    warmup, timed = steps
    marks: dict[int, float] = {}
    threads: list[int] = []

    class _Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step in (warmup, warmup + timed):
                marks[state.global_step] = time.perf_counter()
                threads.append(torch.get_num_threads())

    ds = Dataset.from_dict({"sentence": texts, "label": targets.tolist()})
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss, callbacks=[_Clock()])
    trainer.train()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    fused = optimizer.defaults.get("fused")
    return marks[warmup + timed] - marks[warmup], threads[-1], f"{type(optimizer).__name__} (fused={fused})"


def measure(
    model_dir: str,
    texts: list[str],
    targets: np.ndarray,
    batch_size: int,
    threads: int,
    steps: int,
    *,
    bf16: bool = False,
) -> dict:
    """Train the sentence-transformers student `model_dir` + Dense(hidden -> targets.shape[1], tanh) with
    sentence-transformers' trainer and MSELoss for WARMUP + `steps` optimizer steps on (texts, targets),
    rows taken in order; return {"sentences_per_s", "seconds" (of the `steps` timed), "steps", "final_loss",
    "torch_threads", "optimizer", "how" (one line naming the API used)}."""
    import torch
    from sentence_transformers import losses
    from transformers import set_seed

    torch.set_num_threads(threads)
    set_seed(SEED)
    targets = np.asarray(targets, dtype=np.float32)
    model = _student(model_dir, targets.shape[1], MAX_SEQ_LENGTH)
    loss = losses.MSELoss(model)
    last: list[float] = []
    loss.register_forward_hook(lambda _m, _i, out: last.append(float(out.detach())))
    with tempfile.TemporaryDirectory(prefix="st_baseline_") as out:
        args = _arguments(out, batch_size, WARMUP + steps, bf16)
        seconds, seen_threads, optimizer = _with_trainer(model, loss, texts, targets, (WARMUP, steps), args)
    return {
        "sentences_per_s": steps * batch_size / seconds,
        "seconds": seconds,
        "steps": steps,
        "final_loss": last[-1],
        "torch_threads": seen_threads,
        "optimizer": optimizer,
        "how": f"SentenceTransformerTrainer + losses.MSELoss, SentenceTransformerTrainingArguments(bf16={bf16})",
    }
