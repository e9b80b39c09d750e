"""Baseline: sentence-transformers' own MSELoss distillation training throughput (CPU, fp32).

``SentenceTransformerTrainer`` (its extras ``datasets`` and ``accelerate`` are dev dependencies) with
AdamW(lr, weight_decay=0.01), constant LR, grad-norm clip 1.0, on-the-fly tokenization in the collator.
``WARMUP`` extra optimizer steps run first and are excluded from the timing.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer, losses
from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
from torch import nn
from transformers import set_seed

WARMUP = 2
# As the distillation stage trains: lr 1e-4, sequences cut at 128 tokens, seed 0.
LR, MAX_SEQ_LENGTH, SEED = 1e-4, 128, 0


def _student(model_dir: str, k: int, max_seq_length: int) -> SentenceTransformer:
    tr = Transformer(model_dir, max_seq_length=max_seq_length)
    dim = tr.get_embedding_dimension()
    pool = Pooling(dim, pooling_mode="mean")
    dense = Dense(dim, k, activation_function=nn.Tanh())
    return SentenceTransformer(modules=[tr, pool, dense], device="cpu")


def _with_trainer(
    model: SentenceTransformer, loss: nn.Module, texts: list[str], targets: np.ndarray, batch_size: int, steps: int
) -> tuple[float, str]:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    marks: dict[int, float] = {}

    class _Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step in (WARMUP, WARMUP + steps):
                marks[state.global_step] = time.perf_counter()

    ds = Dataset.from_dict({"sentence": texts, "label": targets.tolist()})
    with tempfile.TemporaryDirectory(prefix="st_baseline_") as out:
        args = SentenceTransformerTrainingArguments(
            output_dir=out,
            max_steps=WARMUP + steps,
            per_device_train_batch_size=batch_size,
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.01,
            max_grad_norm=1.0,
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
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss, callbacks=[_Clock()])
        trainer.train()
    return marks[WARMUP + steps] - marks[WARMUP], "SentenceTransformerTrainer + SentenceTransformerTrainingArguments"


def measure(model_dir: str, texts: list[str], targets: np.ndarray, batch_size: int, threads: int, steps: int) -> dict:
    """Train the sentence-transformers student `model_dir` + Dense(hidden -> targets.shape[1], tanh) with
    sentence-transformers' trainer and MSELoss for `steps` optimizer steps on (texts, targets);
    return {"sentences_per_s", "seconds", "steps", "final_loss", "how" (one line naming the API used)}."""
    torch.set_num_threads(threads)
    set_seed(SEED)
    targets = np.asarray(targets, dtype=np.float32)
    model = _student(model_dir, targets.shape[1], MAX_SEQ_LENGTH)
    loss = losses.MSELoss(model)
    last: list[float] = []
    loss.register_forward_hook(lambda _m, _i, out: last.append(float(out.detach())))
    seconds, how = _with_trainer(model, loss, texts, targets, batch_size, steps)
    return {
        "sentences_per_s": steps * batch_size / seconds,
        "seconds": seconds,
        "steps": steps,
        "final_loss": last[-1],
        "how": how,
    }
