"""Student training throughput against sentence-transformers' trainer with its MSELoss.

Same data (2,000 vendored corpus sentences with 128-d projected targets from the pipeline's PCA
stage over the packaged teacher all-mpnet-base-v2, encoded in bf16 to keep the set-up short; only
the student's training steps are timed, so the teacher only supplies the targets), same
student (all-MiniLM-L6-v2 + mean pooling + Dense(128, tanh)), same batch (64), same threads.
Ours: the distillation stage's trainer, fp32 and with bf16 autocast (the headline); baseline:
``SentenceTransformerTrainer`` in fp32 (``bench/st_trainer_baseline.py``). Warm-up steps excluded.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import date
from pathlib import Path

from bench import results, st_trainer_baseline
from tasks.core import config, storage
from tasks.ml import models
from tasks.stages import distill, encode_teacher, fit_pca, stage_corpus
from tasks.stages.distill.data import Position, TrainingData, shard_pairs

ROOT = Path(__file__).parents[1]
SENTENCES, BATCH, STEPS, WARMUP = 2_000, 64, 10, 2
THREADS = len(os.sched_getaffinity(0))
DAY = date(2026, 1, 1)


def _prepare(tmp: Path) -> tuple[str, str]:
    store = storage.to_uri(str(tmp / "store"))
    teacher = models.DEFAULT_TEACHER
    models.resolve(teacher)  # offline, from the packaged model; fails early if it is not installed
    stage_corpus.run(
        config.parse(
            stage_corpus.StageCorpusParams,
            {
                "store": store,
                "source": str(ROOT / "data" / "corpus" / "sentences.tsv.gz"),
                "column": "sentence",
                "limit": SENTENCES,
                "ingest_date": DAY,
            },
        )
    )
    encode_teacher.run(
        config.parse(
            encode_teacher.EncodeTeacherParams,
            {"store": store, "teacher": teacher, "ingest_date": DAY, "dtype": "bf16", "threads": THREADS},
        )
    )
    fit_pca.run(config.parse(fit_pca.FitPCAParams, {"store": store, "teacher": teacher, "k": 128}))
    return store, teacher


def _ours(store: str, teacher: str, amp: str) -> float:
    import torch

    torch.set_num_threads(THREADS)
    params = config.parse(
        distill.DistillParams,
        {
            "store": store,
            "teacher": teacher,
            "pca_name": "k128-uncentered",
            "batch_size": BATCH,
            "init": "random",
            "amp": amp,
            "device": "cpu",
            "threads": THREADS,
            "warmup_ratio": 0.0,
            "name": f"bench-{amp}",
        },
    )
    data = TrainingData(shard_pairs(store, teacher, "k128-uncentered"), params.seed, 0.02, 64)
    trainer = distill.Trainer(params, data, "cpu", distill.Distributed(), "bench")
    trainer.model.train()
    batches = data.batches(Position(), BATCH)
    for _ in range(WARMUP):
        trainer.train_step(next(batches))
    start = time.perf_counter()
    for _ in range(STEPS):
        trainer.train_step(next(batches))
    return STEPS * BATCH / (time.perf_counter() - start)


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store, teacher = _prepare(Path(tmp))
        data = TrainingData(shard_pairs(store, teacher, "k128-uncentered"), 0, 0.02, 64)
        batch = next(data.batches(Position(), (WARMUP + STEPS) * BATCH))
        baseline = st_trainer_baseline.measure(
            str(models.resolve(models.DEFAULT_STUDENT)), batch.texts, batch.targets, BATCH, THREADS, STEPS
        )
        fp32 = _ours(store, teacher, "off")
        bf16 = _ours(store, teacher, "bf16")
    return results.write(
        "distill_train",
        unit="sentences/s",
        ours=round(bf16, 2),
        baseline=round(baseline["sentences_per_s"], 2),
        baseline_name="sentence-transformers trainer + MSELoss (fp32; ours bf16: not like-for-like)",
        higher_is_better=True,
        details={
            "student": models.DEFAULT_STUDENT,
            "teacher": teacher,
            "teacher_dtype": "bf16",
            "sentences": SENTENCES,
            "batch": BATCH,
            "steps_timed": STEPS,
            "warmup_steps": WARMUP,
            "threads": THREADS,
            "ours_fp32_sentences_per_s": round(fp32, 2),
            "ours_bf16_sentences_per_s": round(bf16, 2),
            "ratio_fp32": round(fp32 / baseline["sentences_per_s"], 3),
            "baseline": baseline,
        },
    )


if __name__ == "__main__":
    print(main())
