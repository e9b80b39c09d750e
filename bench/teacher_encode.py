"""Teacher encoding throughput against sentence-transformers' ``encode``, like for like.

The packaged teacher (all-mpnet-base-v2, resolved offline), the same vendored corpus sentences, the
same thread count and the same batch size (64) on both sides. Two like-for-like pairs, interleaved
round by round (``bench/_paired.py``): bf16 (the headline) and fp32. Both sides get bf16 the same way:
``torch.autocast("cpu", torch.bfloat16)`` with fp32 weights (ours enters it around the transformer
in ``SentenceEncoder.forward``; for sentence-transformers it wraps the ``encode`` call). Each output is
checked against the fp32 sentence-transformers output (minimum cosine). An untimed warm-up round runs
every variant over all the sentences first (bf16 kernels are set up per input shape, so a first pass
is far slower) and supplies the outputs compared.
"""

from __future__ import annotations

import gzip
import os
import time
from collections.abc import Callable

import numpy as np

from bench import CORPUS, _paired, results

SENTENCES = int(os.environ.get("HPD_BENCH_SENTENCES", 256))
ROUNDS = int(os.environ.get("HPD_BENCH_ROUNDS", 7))
BATCH = 64
THREADS = int(os.environ.get("HPD_BENCH_THREADS", len(os.sched_getaffinity(0))))
BF16_MECHANISM = {
    "ours": "torch.autocast('cpu', bfloat16) around the transformer forward (SentenceEncoder.forward); "
    "weights stay fp32; pooling and normalisation in fp32",
    "sentence-transformers": "torch.autocast('cpu', bfloat16) around SentenceTransformer.encode "
    "(transformer, pooling, normalisation); weights stay fp32",
}


def _sentences() -> list[str]:
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        return [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(SENTENCES)]


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def _encoders() -> dict[str, Callable[[list[str]], np.ndarray]]:
    """Each variant's encode: ours and sentence-transformers, bf16 and fp32."""
    import torch
    from sentence_transformers import SentenceTransformer

    from tasks.ml import models
    from tasks.ml.encoder import SentenceEncoder

    st = SentenceTransformer(str(models.resolve(models.DEFAULT_TEACHER)), device="cpu")
    ours = SentenceEncoder.load(models.DEFAULT_TEACHER)
    if st.max_seq_length != ours.max_seq_length:
        raise SystemExit(f"max_seq_length: sentence-transformers {st.max_seq_length}, ours {ours.max_seq_length}")

    def st_encode(texts: list[str], bf16: bool) -> np.ndarray:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return st.encode(texts, batch_size=BATCH, show_progress_bar=False, convert_to_numpy=True)

    return {
        "ours_bf16": lambda texts: ours.encode(texts, batch_size=BATCH, dtype="bf16"),
        "st_bf16": lambda texts: st_encode(texts, True),
        "ours_fp32": lambda texts: ours.encode(texts, batch_size=BATCH, dtype="fp32"),
        "st_fp32": lambda texts: st_encode(texts, False),
    }


def _timed(fn: Callable[[list[str]], np.ndarray], texts: list[str]) -> Callable[[], float]:
    """A run of ``fn`` on ``texts`` returning its seconds."""

    def run() -> float:
        start = time.perf_counter()
        fn(texts)
        return time.perf_counter() - start

    return run


def _details(seconds: dict[str, list[float]], outputs: dict[str, np.ndarray], loads: tuple[float, float]) -> dict:
    import sentence_transformers
    import torch

    reference = outputs["st_fp32"]
    return {
        "sentences": SENTENCES,
        "batch": BATCH,
        "threads": THREADS,
        "torch_threads": torch.get_num_threads(),
        "rounds": ROUNDS,
        "order": "interleaved: ours_bf16, st_bf16, ours_fp32, st_fp32; reversed every other round; "
        "one untimed warm-up round over all the sentences first",
        "model": "all-mpnet-base-v2 (packaged, offline)",
        "bf16_mechanism": BF16_MECHANISM,
        "load_average_1min": {"start": loads[0], "end": loads[1]},
        "bf16_vs_bf16": _paired.pair(seconds, "ours_bf16", "st_bf16", SENTENCES),
        "fp32_vs_fp32": _paired.pair(seconds, "ours_fp32", "st_fp32", SENTENCES),
        "min_cosine_to_st_fp32": {k: round(_min_cosine(v, reference), 6) for k, v in outputs.items()},
        "not_like_for_like_ours_bf16_vs_st_fp32": {
            "note": "different dtypes (ours bf16, sentence-transformers fp32), both batch 64; not like-for-like",
            **_paired.pair(seconds, "ours_bf16", "st_fp32", SENTENCES),
        },
        "versions": {"torch": torch.__version__, "sentence_transformers": sentence_transformers.__version__},
    }


def main() -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(THREADS)
    start_load = _paired.load_average()
    texts = _sentences()
    encoders = _encoders()
    outputs = {name: fn(texts) for name, fn in encoders.items()}  # warm-up round, untimed
    seconds = _paired.interleaved({name: _timed(fn, texts) for name, fn in encoders.items()}, ROUNDS)
    details = _details(seconds, outputs, (start_load, _paired.load_average()))
    bf16 = details["bf16_vs_bf16"]
    return results.write(
        "teacher_encode",
        unit="sentences/s",
        ours=bf16["ours_per_s"],
        baseline_name="sentence-transformers encode (bf16 autocast, batch 64; like-for-like)",
        baseline=bf16["baseline_per_s"],
        higher_is_better=True,
        details=details,
    )


if __name__ == "__main__":
    print(main())
