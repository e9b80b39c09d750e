"""Student training throughput against sentence-transformers' trainer with its MSELoss, like for like.

Same data (2,000 vendored corpus sentences with 128-d projected targets from the pipeline's PCA
stage over the packaged teacher all-mpnet-base-v2, encoded in encode-teacher's ``auto`` dtype; only
the student's training steps are timed, so the teacher only supplies the targets), same student
(all-MiniLM-L6-v2, sequences cut at 128 tokens, mean pooling, Dense(128, tanh), BERT pooler dropped),
same batches in the same order (batch 64), same threads, same steps. Ours: the distillation stage's
``Trainer.train`` (which trains through ``SentenceTransformerTrainer`` with the stage's sampler, loss,
optimizer and schedule, and its own progress, evaluation and checkpoint hooks), clocked at the end of its
steps; baseline: ``SentenceTransformerTrainer`` + ``losses.MSELoss`` (``bench/st_trainer_baseline.py``).
Like-for-like pairs, interleaved round by round (``bench/_paired.py``) after one untimed warm-up round:
bf16 autocast on both sides (the headline) and fp32 on both where the CPU runs bf16 natively (AVX-512 BF16 or
AMX), fp32 on both elsewhere (emulated bf16 would time the emulation); and ours with the stage's
length-grouped order at the headline dtype. Every run builds a fresh student and excludes its first
``WARMUP`` steps from the timing.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from bench import _paired, results, st_trainer_baseline
from tasks.core import config, storage
from tasks.ml import models, precision
from tasks.stages import distill, encode_teacher, fit_pca, stage_corpus
from tasks.stages.distill.data import Batch, Position, TrainingData, shard_pairs

ROOT = Path(__file__).parents[1]
SENTENCES, BATCH, WARMUP = 2_000, 64, st_trainer_baseline.WARMUP
STEPS = int(os.environ.get("HPD_BENCH_STEPS", 5))
ROUNDS = int(os.environ.get("HPD_BENCH_ROUNDS", 5))
THREADS = int(os.environ.get("HPD_BENCH_THREADS", len(os.sched_getaffinity(0))))
DAY = date(2026, 1, 1)
PCA = "k128-uncentered"
TEACHER_DTYPE = precision.resolve("auto", "cpu")  # bf16 where the CPU runs it natively, else fp32
HEADLINE = "bf16" if TEACHER_DTYPE == "bf16" else "fp32"  # the dtype of the headline pair
DTYPES = ("bf16", "fp32") if HEADLINE == "bf16" else ("fp32",)
BF16_MECHANISM = {
    "ours": "DistillParams amp='bf16': the stage passes SentenceTransformerTrainingArguments(bf16=True), so "
    "Accelerate autocasts the whole forward (transformer, pooling, Dense head); HPDLoss in fp32; weights and "
    "optimizer fp32",
    "sentence-transformers": "SentenceTransformerTrainingArguments(bf16=True): Accelerate wraps the model's "
    "forward in torch.autocast('cpu', bfloat16) (transformer, pooling, Dense head), outputs cast to fp32 "
    "before MSELoss; weights and optimizer fp32",
}
DIFFERENCES = [
    "optimizer: fused AdamW on both (ours built by the stage's Optimization, passed to the trainer); same "
    "hyper-parameters (lr 1e-4, weight decay 0.01 off biases/LayerNorm, clip 1.0)",
    "LR schedule: ours linear decay over the stage's step budget, the trainer constant (no effect on speed)",
    "per step, ours also records the step's loss and updates its progress line; its one evaluation runs "
    "after the last timed step",
    "Dense head random init draws differ (PyTorch default init on both; no effect on speed)",
]


def _prepare(tmp: Path) -> tuple[str, str]:
    store = storage.to_uri(str(tmp / "store"))
    teacher = models.DEFAULT_TEACHER
    models.resolve(teacher)  # offline, from the packaged model; fails early if it is not installed
    source = str(ROOT / "data" / "corpus" / "sentences.tsv.gz")
    corpus = {"store": store, "source": source, "column": "sentence", "limit": SENTENCES, "ingest_date": DAY}
    stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, corpus))
    encode_teacher.run(
        config.parse(
            encode_teacher.EncodeTeacherParams,
            {"store": store, "teacher": teacher, "ingest_date": DAY, "dtype": TEACHER_DTYPE, "threads": THREADS},
        )
    )
    fit_pca.run(config.parse(fit_pca.FitPCAParams, {"store": store, "teacher": teacher, "k": 128}))
    return store, teacher


def _params(store: str, teacher: str, amp: str, grouped: bool) -> distill.DistillParams:
    return config.parse(
        distill.DistillParams,
        {
            "store": store,
            "teacher": teacher,
            "pca_name": PCA,
            "batch_size": BATCH,
            "init": "random",
            "relation_weight": 0.0,  # the MSE alone, as sentence-transformers' MSELoss
            "amp": amp,
            "device": "cpu",
            "threads": THREADS,
            "warmup_ratio": 0.0,
            "length_grouped": grouped,
            "max_steps": WARMUP + STEPS,
            "eval_every": 10**6,  # the one evaluation, at the last step, is after the clock stops
            "checkpoint_every": 10**6,
            "name": f"bench-{amp}",
        },
    )


class _Clocked(distill.Trainer):
    """The stage's trainer, noting when each step ends (before the step's own evaluation or checkpoint)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ends: dict[int, float] = {}

    def step_ended(self, step: int, squared_error: float, rows: int) -> bool:
        self.ends[step] = time.perf_counter()
        return super().step_ended(step, squared_error, rows)


def _ours(store: str, teacher: str, data: TrainingData, amp: str, grouped: bool, notes: dict) -> float:
    """Seconds of the timed steps of one fresh run of the distillation stage's trainer."""
    import torch

    torch.set_num_threads(THREADS)
    trainer = _Clocked(_params(store, teacher, amp, grouped), data, "cpu", distill.Distributed(), "bench")
    trainer.train(progress=False)
    name = f"ours_{'grouped_' if grouped else ''}{'fp32' if amp == 'off' else amp}"
    notes[name] = {"final_loss": trainer.state.losses[-1][1], "torch_threads": torch.get_num_threads()}
    return trainer.ends[WARMUP + STEPS] - trainer.ends[WARMUP]


def _theirs(batches: list[Batch], bf16: bool, notes: dict) -> float:
    """Seconds of the timed steps of one fresh sentence-transformers trainer run on the same batches."""
    texts = [t for batch in batches for t in batch.texts]
    targets = np.concatenate([batch.targets for batch in batches])
    student = str(models.resolve(models.DEFAULT_STUDENT))
    found = st_trainer_baseline.measure(student, texts, targets, BATCH, THREADS, STEPS, bf16=bf16)
    kept = ("final_loss", "torch_threads", "optimizer", "how")
    notes[f"st_{'bf16' if bf16 else 'fp32'}"] = {k: found[k] for k in kept}
    return found["seconds"]


def _variants(store: str, teacher: str, notes: dict) -> dict[str, Callable[[], float]]:
    data = TrainingData(shard_pairs(store, teacher, PCA), 0, 0.02, 64)
    batches = list(islice(data.batches(Position(), BATCH), WARMUP + STEPS))  # the stage's order, ungrouped
    amp = {"bf16": "bf16", "fp32": "off"}
    variants: dict[str, Callable[[], float]] = {}
    for dtype in DTYPES:
        variants[f"ours_{dtype}"] = partial(_ours, store, teacher, data, amp[dtype], False, notes)
        variants[f"st_{dtype}"] = partial(_theirs, batches, dtype == "bf16", notes)
        if dtype == HEADLINE:
            variants[f"ours_grouped_{dtype}"] = partial(_ours, store, teacher, data, amp[dtype], True, notes)
    return variants


def _details(seconds: dict[str, list[float]], notes: dict, loads: tuple[float, float], teacher: str) -> dict:
    rows = STEPS * BATCH
    pairs = {f"{dtype}_vs_{dtype}": _paired.pair(seconds, f"ours_{dtype}", f"st_{dtype}", rows) for dtype in DTYPES}
    return {
        "student": models.DEFAULT_STUDENT,
        "teacher": teacher,
        "teacher_dtype": TEACHER_DTYPE,
        "sentences": SENTENCES,
        "batch": BATCH,
        "max_seq_length": st_trainer_baseline.MAX_SEQ_LENGTH,
        "steps_timed": STEPS,
        "warmup_steps": WARMUP,
        "threads": THREADS,
        "rounds": ROUNDS,
        "order": f"interleaved: {', '.join(seconds)}; reversed every other round; one untimed warm-up round first; "
        f"each run a fresh student on the same batches (ours_grouped_{HEADLINE}: the first batches of the stage's "
        "length-grouped order)",
        "load_average_1min": {"start": loads[0], "end": loads[1]},
        **({"bf16_mechanism": BF16_MECHANISM} if "bf16" in DTYPES else {}),
        **pairs,
        f"length_grouped_{HEADLINE}_vs_trainer_{HEADLINE}": {
            **_paired.pair(seconds, f"ours_grouped_{HEADLINE}", f"st_{HEADLINE}", rows),
            "comparison": "not same-batches: the same dtype, batch size, threads and steps, but ours takes the "
            "first batches of the stage's length-grouped order (length_grouped, the stage's default: sentences of "
            "like lengths together) and the trainer the rows in order (sentence-transformers has no "
            "length-grouping batch sampler)",
        },
        "last_run": notes,
        "differences": DIFFERENCES,
    }


def main() -> dict:
    start_load = _paired.load_average()
    notes: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        store, teacher = _prepare(Path(tmp))
        seconds = _paired.interleaved(_variants(store, teacher, notes), ROUNDS, warmup_rounds=1)
    details = _details(seconds, notes, (start_load, _paired.load_average()), teacher)
    headline = details[f"{HEADLINE}_vs_{HEADLINE}"]
    mode = "bf16 autocast" if HEADLINE == "bf16" else "fp32"
    return results.write(
        "distill_train",
        unit="sentences/s",
        ours=headline["ours_per_s"],
        baseline=headline["baseline_per_s"],
        baseline_name=f"sentence-transformers trainer + MSELoss ({mode}, batch 64; like-for-like)",
        higher_is_better=True,
        details=details,
    )


if __name__ == "__main__":
    print(main())
