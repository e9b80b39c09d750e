"""The students' deployment value: encode throughput against the teacher, with the STS scores beside it.

Measured: sentences/s of ``SentenceEncoder.encode`` (batch 64, tokenisation included, as the pipeline encodes)
over the same first ``HPD_BENCH_THROUGHPUT_SENTENCES`` (default 1,024) sentences of the vendored corpus, with
``torch.set_num_threads`` set to the cores this process may use, for:

- the teacher all-mpnet-base-v2 (768-d), fp32 and bf16;
- the exported students of ``bench/distill_quality`` (``var/bench/students/MiniLM-L6`` and ``MiniLM-L3``,
  Dense(128, tanh) heads), fp32, bf16 and int8.

bf16 is ``torch.autocast("cpu", bfloat16)`` around the transformer with fp32 weights (``SentenceEncoder.forward``).
int8 is PyTorch's dynamic quantisation, ``torch.ao.quantization.quantize_dynamic`` on every ``nn.Linear``: int8
weights, fp32 tensors in and out (each Linear quantises its input on the fly); it runs without autocast. The
variants run in interleaved rounds after one untimed warm-up round (``bench/_paired.py``); each figure is the
variant's median. The headline pair is like-for-like: the 6-layer student against the teacher, both bf16.

Beside each speed: STS-B test and SICK-R test (Spearman x100), cached with distill_quality's scores in
``var/bench/distill_quality_scores.json`` (a student's key names a digest of its folder's files, so a retrained
student is scored anew). int8 is worth exporting for a student only if it loses at most 0.3 points to the same
student in fp32 on both test sets and is faster than that student's fastest float variant (fp32 or bf16).

The ONNX graphs ``hpd distill --onnx`` exports (ONNX Runtime) are not among these variants yet: the export
scores its graph on STS dev against the PyTorch student, and ``bench/serve`` times it encoding queries.
``torch.ao.quantization`` is deprecated in recent PyTorch (it warns when used) but still runs in the pinned
version.

Rerun: ``python -m bench student_throughput`` after ``python -m bench distill_quality`` (which exports the
students); ``HPD_BENCH_ROUNDS`` sets the timed rounds (default 3).
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from bench import CORPUS, _paired, distill_quality, results
from tasks.ml import models
from tasks.ml.encoder import SentenceEncoder
from tasks.ml.precision import Dtype

SENTENCES = int(os.environ.get("HPD_BENCH_THROUGHPUT_SENTENCES", 1024))
ROUNDS = int(os.environ.get("HPD_BENCH_ROUNDS", 3))
BATCH = 64
THREADS = len(os.sched_getaffinity(0))
TEST_SETS = ("STS-B test", "SICK-R test")
INT8_MAX_LOSS = 0.3  # STS points (Spearman x100) int8 may lose to fp32 on each test set
PRECISIONS = ("fp32", "bf16", "int8")
OURS, BASELINE = "MiniLM-L6 bf16", "teacher bf16"
NOT_SCORED = {"teacher fp32"}

Encode = Callable[[list[str]], np.ndarray]
Scorer = Callable[[str, Callable[[], Encode]], dict[str, float]]  # (cache key, encode factory) -> scores by set
Variants = dict[str, tuple[SentenceEncoder, Dtype]]  # name -> (encoder, autocast dtype)
Row = dict[str, Any]  # a variant's figures: sentences/s, STS scores, dim, index bytes per vector


def corpus_sentences(count: int) -> list[str]:
    """The first ``count`` sentences of the vendored corpus."""
    with gzip.open(CORPUS, "rt") as f:
        next(f)  # header
        return [line.rstrip("\n").split("\t", 1)[1] for line in itertools.islice(f, count)]


def student_folders() -> dict[str, Path]:
    """The students distill_quality exported; exits saying how to make them when one is missing."""
    folders = {name: distill_quality.STUDENTS / name for name in distill_quality.RECIPE}
    missing = [str(folder) for folder in folders.values() if not (folder / "modules.json").is_file()]
    if missing:
        raise SystemExit(f"no exported student in {missing}: run `python -m bench distill_quality` first")
    return folders


def quantized(encoder: SentenceEncoder) -> SentenceEncoder:
    """A copy of ``encoder`` with every ``nn.Linear`` dynamically quantised (int8 weights, fp32 in and out)."""
    linear = {torch.nn.Linear}
    int8 = torch.ao.quantization.quantize_dynamic(encoder, linear, dtype=torch.qint8)  # type: ignore[no-untyped-call]
    return cast(SentenceEncoder, int8)


def variants(teacher: SentenceEncoder, students: dict[str, SentenceEncoder]) -> Variants:
    """The teacher at fp32 and bf16; each student at fp32, bf16 and int8 (which runs without autocast)."""
    found: Variants = {"teacher fp32": (teacher, "fp32"), "teacher bf16": (teacher, "bf16")}
    for name, encoder in students.items():
        found[f"{name} fp32"] = (encoder, "fp32")
        found[f"{name} bf16"] = (encoder, "bf16")
        found[f"{name} int8"] = (quantized(encoder), "fp32")
    return found


def encode_of(encoder: SentenceEncoder, dtype: Dtype) -> Encode:
    return lambda texts: encoder.encode(texts, batch_size=BATCH, dtype=dtype)


def _timer(encode: Encode, texts: list[str]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        encode(texts)
        return time.perf_counter() - start

    return run


def measure(measured: Variants, texts: list[str], rounds: int) -> dict[str, list[float]]:
    """Seconds of each variant encoding ``texts``, per round: interleaved, after one untimed warm-up round."""
    timers = {name: _timer(encode_of(*variant), texts) for name, variant in measured.items()}
    return _paired.interleaved(timers, rounds, warmup_rounds=1)


def folder_digest(folder: Path) -> str:
    """A digest of the folder's files (names and bytes): the identity of an exported model."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def score_keys(folders: dict[str, Path]) -> dict[str, str]:
    """Each variant's key in the scores cache; the teacher's bf16 key is distill_quality's own."""
    keys = {"teacher fp32": "teacher-fp32", "teacher bf16": "teacher"}
    for name, folder in folders.items():
        digest = folder_digest(folder)
        keys |= {f"{name} {precision}": f"{precision}-{name}@{digest}" for precision in PRECISIONS}
    return keys


def _factory(encode: Encode) -> Callable[[], Encode]:
    return lambda: encode


def sts_scores(measured: Variants, keys: dict[str, str], score: Scorer) -> dict[str, dict[str, float | None]]:
    """The test-set scores of each variant (``score`` caches them under the variant's key); the teacher is
    scored in bf16 only (the same weights: scoring it again in fp32 would cost minutes on 2 cores)."""
    found: dict[str, dict[str, float | None]] = {}
    for name, variant in measured.items():
        if name in NOT_SCORED:
            found[name] = dict.fromkeys(TEST_SETS)
            continue
        scores = score(keys[name], _factory(encode_of(*variant)))
        found[name] = {on: scores[on] for on in TEST_SETS}
    return found


def table(
    seconds: dict[str, list[float]], scores: dict[str, dict[str, float | None]], dims: dict[str, int], sentences: int
) -> dict[str, Row]:
    """Speed and quality side by side, one row per variant."""
    return {
        name: {
            "sentences_per_s": round(sentences / statistics.median(runs), 2),
            **scores[name],
            "dim": dims[name],
            "index_bytes_per_vector": dims[name] * 4,  # float32 vectors, as the flat index stores them
        }
        for name, runs in seconds.items()
    }


def int8_decision(rows: dict[str, Row], student: str) -> dict[str, Any]:
    """int8 against the same student in float: STS deltas, speed ratios, and whether int8 is worth exporting."""
    fp32, int8 = rows[f"{student} fp32"], rows[f"{student} int8"]
    deltas = {on: round(int8[on] - fp32[on], 2) for on in TEST_SETS}
    fastest = max((f"{student} fp32", f"{student} bf16"), key=lambda name: rows[name]["sentences_per_s"])
    vs_fastest = round(int8["sentences_per_s"] / rows[fastest]["sentences_per_s"], 3)
    losing = [on for on, delta in deltas.items() if delta < -INT8_MAX_LOSS]
    quality = f"within {INT8_MAX_LOSS} STS of fp32 on {' and '.join(TEST_SETS)}"
    if losing:
        quality = f"loses more than {INT8_MAX_LOSS} STS on {', '.join(losing)}"
    speed = f"{vs_fastest}x the sentences/s of {fastest} ({'faster' if vs_fastest > 1 else 'not faster'})"
    return {
        "delta_vs_fp32": deltas,
        "speed_ratio_vs_fp32": round(int8["sentences_per_s"] / fp32["sentences_per_s"], 3),
        "fastest_float": fastest,
        "speed_ratio_vs_fastest_float": vs_fastest,
        "int8_worth_exporting": not losing and vs_fastest > 1,
        "why": f"{quality}; {speed}",
    }


def benchmark(measured: Variants, texts: list[str], rounds: int, keys: dict[str, str], score: Scorer) -> dict[str, Any]:
    """Time every variant, score it, and decide on int8 for each student: the result's details."""
    start = _paired.load_average()
    seconds = measure(measured, texts, rounds)
    loads = {"start": start, "end": _paired.load_average()}
    dims = {name: encoder.dim for name, (encoder, _) in measured.items()}
    rows = table(seconds, sts_scores(measured, keys, score), dims, len(texts))
    students = [name.removesuffix(" int8") for name in measured if name.endswith(" int8")]
    return {
        "sentences": len(texts),
        "batch": BATCH,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "order": f"interleaved: {', '.join(measured)}; reversed every other round; one untimed warm-up round first",
        "load_average_1min": loads,
        "table": rows,
        "like_for_like": _paired.pair(seconds, OURS, BASELINE, len(texts)),
        "int8": {student: int8_decision(rows, student) for student in students},
        "int8_method": "torch.ao.quantization.quantize_dynamic on every nn.Linear (qint8 weights, fp32 in and out)",
        "score_keys": keys,
        "seconds": {name: [round(s, 3) for s in runs] for name, runs in seconds.items()},
        "versions": {"torch": torch.__version__},
    }


def main() -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(THREADS)
    folders = student_folders()
    students = {name: SentenceEncoder.load(str(folder)) for name, folder in folders.items()}
    measured = variants(SentenceEncoder.load(models.DEFAULT_TEACHER), students)
    texts = corpus_sentences(SENTENCES)
    details = benchmark(measured, texts, ROUNDS, score_keys(folders), distill_quality.scored)
    pair = details["like_for_like"]
    return results.write(
        "student_throughput",
        unit="sentences/s",
        ours=pair["ours_per_s"],
        baseline_name="teacher all-mpnet-base-v2 (bf16 autocast, batch 64, same threads and sentences)",
        baseline=pair["baseline_per_s"],
        higher_is_better=True,
        details=details,
    )


if __name__ == "__main__":
    print(main())
