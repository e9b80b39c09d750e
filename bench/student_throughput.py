"""The students' deployment value: encode throughput against the teacher, with the STS scores beside it.

Measured: sentences/s of encoding (batch 64, tokenisation included, as the pipeline encodes) over the same
first ``HPD_BENCH_THROUGHPUT_SENTENCES`` (default 1,024) sentences of the vendored corpus, with the threads set
to the cores this process may use (``torch.set_num_threads``; ONNX Runtime's intra-op threads), for:

- the teacher all-mpnet-base-v2 (768-d) in fp32, and in bf16 where the CPU runs it natively
  (:data:`bench.distill_quality.DTYPE`: AVX-512 BF16 or AMX; elsewhere bf16 is emulated, many times slower);
- two exported 6- and 3-layer students (Dense(128, tanh) heads): the distill runs ``recipe-MiniLM-L6`` and
  ``recipe-MiniLM-L3`` of ``bench/distill_quality``'s store by default, or the runs
  ``HPD_BENCH_STUDENT_RUNS`` names (``MiniLM-L6=run,MiniLM-L3=run``) in the store ``HPD_BENCH_STUDENT_STORE``
  (for instance the demo's ``var/store``). Each in PyTorch fp32 (and bf16 where native), PyTorch int8, and
  the ONNX graphs ``hpd distill --onnx`` exports: fp32 (fused) and int8, run by ONNX Runtime.

bf16 is ``torch.autocast("cpu", bfloat16)`` around the transformer with fp32 weights (``SentenceEncoder.forward``).
PyTorch int8 is ``torch.ao.quantization.quantize_dynamic`` on every ``nn.Linear``: int8 weights, fp32 tensors in
and out; it runs without autocast. The ONNX graphs are built as the export builds them
(:func:`tasks.ml.onnx_encoder.build_graphs`) and encode through :class:`~tasks.ml.onnx_encoder.OnnxEncoder`.
The variants run in interleaved rounds after one untimed warm-up round (``bench/_paired.py``); each figure is
the variant's median. The headline pair is like-for-like: the 6-layer student against the teacher, both in
PyTorch at the same dtype (bf16 where native, else fp32).

Beside each speed: STS-B test and SICK-R test (Spearman x100), cached with distill_quality's scores in
``var/bench/distill_quality_scores.json`` (a student's key names a digest of its folder's files, and an ONNX
graph's the digest of the graph, so a retrained student or a graph built otherwise is scored anew); the
teacher is scored at the headline dtype only. An export (PyTorch int8, ONNX fp32, ONNX int8) is worth it for a
student only if it loses at most 0.3 points to the same student in PyTorch fp32 on both test sets and is
faster than that student's fastest PyTorch float variant.
``torch.ao.quantization`` is deprecated in recent PyTorch (it warns when used) but still runs in the pinned
version.

Rerun: ``python -m bench student_throughput`` after ``python -m bench distill_quality`` (which trains the
students), or with ``HPD_BENCH_STUDENT_STORE``/``HPD_BENCH_STUDENT_RUNS`` naming other runs;
``HPD_BENCH_ROUNDS`` sets the timed rounds (default 3).
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from bench import CORPUS, REPO, _paired, distill_quality, results
from tasks.core import manifest, storage
from tasks.core.catalog import Stage
from tasks.ml import models, onnx_encoder
from tasks.ml.encoder import SentenceEncoder
from tasks.ml.precision import Dtype

SENTENCES = int(os.environ.get("HPD_BENCH_THROUGHPUT_SENTENCES", 1024))
ROUNDS = int(os.environ.get("HPD_BENCH_ROUNDS", 3))
BATCH = 64
THREADS = len(os.sched_getaffinity(0))
TEST_SETS = ("STS-B test", "SICK-R test")
MAX_EXPORT_LOSS = 0.3  # STS points (Spearman x100) an export may lose to PyTorch fp32 on each test set
DTYPE: Dtype = distill_quality.DTYPE  # the headline pair's dtype: bf16 where the CPU runs it natively, else fp32
FLOATS: tuple[Dtype, ...] = ("fp32", "bf16") if DTYPE == "bf16" else ("fp32",)
EXPORTS = ("int8", "onnx fp32", "onnx int8")  # each student's variants besides its PyTorch floats
FETCHED = REPO / "var" / "bench" / "throughput_students"

Encode = Callable[[list[str]], np.ndarray]
Scorer = Callable[[str, Callable[[], Encode]], dict[str, float]]  # (cache key, encode factory) -> scores by set
Row = dict[str, Any]  # a variant's figures: sentences/s, STS scores, dim, index bytes per vector


@dataclass(frozen=True)
class Variant:
    """One way of encoding: the function and the width of what it returns; ``built``: for a model built here from
    the student's folder (an ONNX graph), a digest of what was built (part of its scores' cache key)."""

    encode: Encode
    dim: int
    built: str = ""


def corpus_sentences(count: int) -> list[str]:
    """The first ``count`` sentences of the vendored corpus."""
    with gzip.open(CORPUS, "rt") as f:
        next(f)  # header
        return [line.rstrip("\n").split("\t", 1)[1] for line in itertools.islice(f, count)]


def student_runs() -> tuple[str, dict[str, str]]:
    """The store and the distill run of each student: ``HPD_BENCH_STUDENT_STORE``/``HPD_BENCH_STUDENT_RUNS``,
    else distill_quality's recipe runs."""
    named = os.environ.get("HPD_BENCH_STUDENT_RUNS")
    if not named:
        return distill_quality.STORE, {name: f"recipe-{name}" for name in distill_quality.RECIPE}
    runs = dict(pair.split("=", 1) for pair in named.split(","))
    return storage.to_uri(os.environ.get("HPD_BENCH_STUDENT_STORE", str(REPO / "var" / "store"))), runs


def student_folders(store: str, runs: dict[str, str], into: Path = FETCHED) -> dict[str, Path]:
    """Each run's exported student, downloaded into ``into/<name>``; exits saying how to make a missing one."""
    missing = [run for run in runs.values() if manifest.read(store, Stage.DISTILL, run) is None]
    if missing:
        raise SystemExit(
            f"no distill run {missing} in {store}: run `python -m bench distill_quality` first, "
            "or name published runs with HPD_BENCH_STUDENT_STORE and HPD_BENCH_STUDENT_RUNS"
        )
    from tasks.ml import student

    folders = {}
    for name, run in runs.items():
        shutil.rmtree(into / name, ignore_errors=True)
        folders[name] = student.fetch_exported(store, run, into / name)
    return folders


def quantized(encoder: SentenceEncoder) -> SentenceEncoder:
    """A copy of ``encoder`` with every ``nn.Linear`` dynamically quantised (int8 weights, fp32 in and out)."""
    linear = {torch.nn.Linear}
    int8 = torch.ao.quantization.quantize_dynamic(encoder, linear, dtype=torch.qint8)  # type: ignore[no-untyped-call]
    return cast(SentenceEncoder, int8)


def encode_of(encoder: SentenceEncoder, dtype: Dtype) -> Encode:
    return lambda texts: encoder.encode(texts, batch_size=BATCH, dtype=dtype)


def torch_variant(encoder: SentenceEncoder, dtype: Dtype) -> Variant:
    return Variant(encode_of(encoder, dtype), encoder.dim)


def onnx_variants(encoder: SentenceEncoder, scratch: Path) -> dict[str, Variant]:
    """The student's ONNX graphs, fp32 and int8, built in ``scratch`` as ``hpd distill --onnx`` builds them."""
    graphs = onnx_encoder.build_graphs(encoder.eval(), scratch, int8=True)
    found = {}
    for variant, graph in graphs.items():
        onnx = onnx_encoder.OnnxEncoder(graph, encoder.tokenizer, encoder.max_seq_length, threads=THREADS)
        built = hashlib.sha256(graph.read_bytes()).hexdigest()[:16]
        found[f"onnx {variant}"] = Variant(partial(onnx.encode, batch_size=BATCH), onnx.dim, built)
    return found


def variants(
    teacher: SentenceEncoder, students: dict[str, SentenceEncoder], scratch: Path, floats: tuple[Dtype, ...] = FLOATS
) -> dict[str, Variant]:
    """The teacher in each of ``floats``; each student in each of ``floats``, PyTorch int8 (no autocast) and
    its ONNX graphs (built under ``scratch``)."""
    found = {f"teacher {dtype}": torch_variant(teacher, dtype) for dtype in floats}
    for name, encoder in students.items():
        found |= {f"{name} {dtype}": torch_variant(encoder, dtype) for dtype in floats}
        found[f"{name} int8"] = torch_variant(quantized(encoder), "fp32")
        (scratch / name).mkdir(parents=True, exist_ok=True)
        found |= {f"{name} {v}": graph for v, graph in onnx_variants(encoder, scratch / name).items()}
    return found


def _timer(encode: Encode, texts: list[str]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        encode(texts)
        return time.perf_counter() - start

    return run


def measure(measured: dict[str, Variant], texts: list[str], rounds: int) -> dict[str, list[float]]:
    """Seconds of each variant encoding ``texts``, per round: interleaved, after one untimed warm-up round."""
    timers = {name: _timer(variant.encode, texts) for name, variant in measured.items()}
    return _paired.interleaved(timers, rounds, warmup_rounds=1)


def folder_digest(folder: Path) -> str:
    """A digest of the folder's files (names and bytes): the identity of an exported model."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def score_keys(
    folders: dict[str, Path],
    built: dict[str, str] | None = None,
    floats: tuple[Dtype, ...] = FLOATS,
    dtype: Dtype = DTYPE,
) -> dict[str, str]:
    """Each scored variant's key in the scores cache: the teacher at ``dtype`` only (distill_quality's own key;
    scoring it in another dtype would cost minutes on 2 cores for the same weights), every student variant
    (by its folder's digest, and by the digest of what was built for it, ``built``: a graph the export builds
    otherwise is scored anew)."""
    keys = {f"teacher {dtype}": "teacher"}
    for name, folder in folders.items():
        digest = folder_digest(folder)
        keys |= {f"{name} {v}": f"{v.replace(' ', '-')}-{name}@{digest}" for v in (*floats, *EXPORTS)}
    for variant, identity in (built or {}).items():
        keys[variant] += f"+{identity}"
    return keys


def _factory(encode: Encode) -> Callable[[], Encode]:
    return lambda: encode


def sts_scores(measured: dict[str, Variant], keys: dict[str, str], score: Scorer) -> dict[str, dict[str, float | None]]:
    """The test-set scores of each variant that has a key (``score`` caches them under it); None elsewhere."""
    found: dict[str, dict[str, float | None]] = {}
    for name, variant in measured.items():
        if name not in keys:
            found[name] = dict.fromkeys(TEST_SETS)
            continue
        scores = score(keys[name], _factory(variant.encode))
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


def export_decision(rows: dict[str, Row], student: str, export: str) -> dict[str, Any]:
    """An export (``int8``, ``onnx fp32``, ``onnx int8``) against the same student in PyTorch: STS deltas to fp32,
    speed ratios, and whether it is worth exporting (within the loss bound and faster than every PyTorch float)."""
    fp32, candidate = rows[f"{student} fp32"], rows[f"{student} {export}"]
    deltas = {on: round(candidate[on] - fp32[on], 2) for on in TEST_SETS}
    floats = [name for name in rows if name in {f"{student} {dtype}" for dtype in ("fp32", "bf16")}]
    fastest = max(floats, key=lambda name: rows[name]["sentences_per_s"])
    vs_fastest = round(candidate["sentences_per_s"] / rows[fastest]["sentences_per_s"], 3)
    losing = [on for on, delta in deltas.items() if delta < -MAX_EXPORT_LOSS]
    quality = f"within {MAX_EXPORT_LOSS} STS of fp32 on {' and '.join(TEST_SETS)}"
    if losing:
        quality = f"loses more than {MAX_EXPORT_LOSS} STS on {', '.join(losing)}"
    speed = f"{vs_fastest}x the sentences/s of {fastest} ({'faster' if vs_fastest > 1 else 'not faster'})"
    return {
        "delta_vs_fp32": deltas,
        "speed_ratio_vs_fp32": round(candidate["sentences_per_s"] / fp32["sentences_per_s"], 3),
        "fastest_float": fastest,
        "speed_ratio_vs_fastest_float": vs_fastest,
        "worth_exporting": not losing and vs_fastest > 1,
        "why": f"{quality}; {speed}",
    }


def benchmark(
    measured: dict[str, Variant],
    texts: list[str],
    rounds: int,
    keys: dict[str, str],
    score: Scorer,
    dtype: Dtype = DTYPE,
) -> dict[str, Any]:
    """Time every variant, score it, and decide on each export of each student: the result's details."""
    start = _paired.load_average()
    seconds = measure(measured, texts, rounds)
    loads = {"start": start, "end": _paired.load_average()}
    rows = table(seconds, sts_scores(measured, keys, score), {n: v.dim for n, v in measured.items()}, len(texts))
    students = [name.removesuffix(" onnx int8") for name in measured if name.endswith(" onnx int8")]
    return {
        "sentences": len(texts),
        "batch": BATCH,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "order": f"interleaved: {', '.join(measured)}; reversed every other round; one untimed warm-up round first",
        "load_average_1min": loads,
        "table": rows,
        "like_for_like": _paired.pair(seconds, f"MiniLM-L6 {dtype}", f"teacher {dtype}", len(texts)),
        "onnx_vs_pytorch_fp32": {
            student: _paired.pair(seconds, f"{student} onnx fp32", f"{student} fp32", len(texts))
            for student in students
        },
        "exports": {student: {e: export_decision(rows, student, e) for e in EXPORTS} for student in students},
        "methods": {
            "int8": "torch.ao.quantization.quantize_dynamic on every nn.Linear (qint8 weights, fp32 in and out)",
            "onnx fp32": "onnx_encoder.build_graphs: traced (opset 17), ONNX Runtime's BERT fusions; ONNX Runtime CPU",
            "onnx int8": "the fused fp32 graph through onnxruntime.quantization.quantize_dynamic (QInt8 weights, "
            "one scale per output channel, 7 bits)",
        },
        "score_keys": keys,
        "seconds": {name: [round(s, 3) for s in runs] for name, runs in seconds.items()},
        "versions": {"torch": torch.__version__, "onnxruntime": _onnxruntime_version()},
    }


def _onnxruntime_version() -> str:
    import onnxruntime  # type: ignore[import-untyped]

    return str(onnxruntime.__version__)


def main() -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(THREADS)
    store, runs = student_runs()
    folders = student_folders(store, runs)
    students = {name: SentenceEncoder.load(str(folder)) for name, folder in folders.items()}
    with tempfile.TemporaryDirectory(prefix="hpd-bench-onnx-") as scratch:
        measured = variants(SentenceEncoder.load(models.DEFAULT_TEACHER), students, Path(scratch))
        texts = corpus_sentences(SENTENCES)
        built = {name: variant.built for name, variant in measured.items() if variant.built}
        details = benchmark(measured, texts, ROUNDS, score_keys(folders, built), distill_quality.scored)
    details["students"] = {name: {"store": store, "run": run} for name, run in runs.items()}
    pair = details["like_for_like"]
    return results.write(
        "student_throughput",
        unit="sentences/s",
        ours=pair["ours_per_s"],
        baseline_name=f"teacher all-mpnet-base-v2 ({DTYPE}, batch 64, same threads and sentences)",
        baseline=pair["baseline_per_s"],
        higher_is_better=True,
        details=details,
    )


if __name__ == "__main__":
    print(main())
