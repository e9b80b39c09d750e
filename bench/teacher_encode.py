"""Teacher encoding throughput against sentence-transformers' ``encode``.

The same 5,000 vendored corpus sentences, the real default teacher (all-mpnet-base-v2), the same
thread count. Baseline: ``SentenceTransformer.encode`` with its defaults (fp32, batch 32). Ours:
the pipeline's encoder in fp32 and with bf16 autocast, each checked against the baseline's output
(minimum cosine). The headline is our bf16 path; both figures are in ``details``.
"""

from __future__ import annotations

import gzip
import os
import time

import numpy as np

from bench import CORPUS, results

SENTENCES = 5_000
THREADS = int(os.environ.get("HPD_BENCH_THREADS", len(os.sched_getaffinity(0))))


def _sentences() -> list[str]:
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        return [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(SENTENCES)]


def _timed(fn) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def main() -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    from tasks.ml import models
    from tasks.ml.encoder import SentenceEncoder

    torch.set_num_threads(THREADS)
    texts = _sentences()
    reference_model = SentenceTransformer(str(models.resolve(models.DEFAULT_TEACHER)), device="cpu")
    ours_model = SentenceEncoder.load(models.DEFAULT_TEACHER)
    reference_model.encode(texts[:64])  # warm-up, both sides
    ours_model.encode(texts[:64], dtype="bf16")
    reference, t_reference = _timed(lambda: reference_model.encode(texts))
    fp32, t_fp32 = _timed(lambda: ours_model.encode(texts, batch_size=64, dtype="fp32"))
    bf16, t_bf16 = _timed(lambda: ours_model.encode(texts, batch_size=64, dtype="bf16"))
    details = {
        "sentences": SENTENCES,
        "threads": THREADS,
        "model": models.DEFAULT_TEACHER,
        "baseline_seconds": round(t_reference, 2),
        "ours_fp32": {
            "sentences_per_s": round(SENTENCES / t_fp32, 2),
            "seconds": round(t_fp32, 2),
            "min_cosine_to_baseline": round(_min_cosine(fp32, reference), 6),
        },
        "ours_bf16": {
            "sentences_per_s": round(SENTENCES / t_bf16, 2),
            "seconds": round(t_bf16, 2),
            "min_cosine_to_baseline": round(_min_cosine(bf16, reference), 6),
            "min_cosine_to_ours_fp32": round(_min_cosine(bf16, fp32), 6),
        },
        "ratio_fp32": round(t_reference / t_fp32, 3),
    }
    return results.write(
        "teacher_encode",
        unit="sentences/s",
        ours=round(SENTENCES / t_bf16, 2),
        baseline_name="sentence-transformers encode (fp32, batch 32; ours bf16: not like-for-like)",
        baseline=round(SENTENCES / t_reference, 2),
        higher_is_better=True,
        details=details,
    )


if __name__ == "__main__":
    print(main())
