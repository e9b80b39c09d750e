"""Scaling: 100k, 1M and 5M distinct sentences through staging, the streaming PCA and the index build and
search; wall time and peak RSS per stage and size, and the teacher encoding's projected time.

* Sentences: the vendored corpus, distinct after normalisation (``M`` of them), then sentence ``i`` is
  corpus sentence ``i mod M`` alone (first copy) or joined by a connector to corpus sentence
  ``(a + copy * STRIDE) mod M`` (later copies): distinct by construction, checked by the staged row count.
  Written as a gzip TSV (streamed), staged by ``stage_corpus.run`` with its default params.
* Teacher embeddings: ``encode_teacher.run`` itself, its model swapped for :class:`SyntheticTeacher`
  (768-d, clustered low-rank + noise, unit norm, float32), so the shards and manifests are the stage's own;
  timed as ``teacher_publish`` (the stage less the model). The teacher is the single 768-d
  all-mpnet-base-v2 (``DEFAULT_TEACHER``) for the encoding and the PCA, not the stages' composite default.
* PCA: ``fit_pca.run`` with its defaults (k=128, uncentered, every row, targets written).
* Index: ``build_index.run`` needs a distilled student to encode the corpus (hours on this CPU at 1M), so
  its own pieces are driven with the projected targets of the PCA stage as the 128-d vectors: read,
  L2-normalised, ``choose_type("auto", n)``, ``factory_string`` with the default params, ``build_tuned``
  as the stage does (``build_s``: build, search breadth tuned to the default ``target_recall`` on the last
  rows held out, ``tuned_recall_at_10``, then added); recall@10
  of 1,000 held-out queries (fresh synthetic teacher rows through the published projection) against exact
  search; single-query k=10 search latency (p50/p99 of 300, after 50 warm-up) through the index as built,
  with FAISS's default OpenMP threads and with one. The index's ``seconds`` include those measures; its
  scaling is of ``build_s`` (train, add, tune).
* Each stage runs in a fresh process (``python -m bench.scale --child``); wall seconds are around the
  stage call; peak RSS is that process's ``VmHWM``, reset once its imports are done (``rss_before_mb``: the
  RSS then). The 1-min load average is recorded before and after each stage: the machine is shared.
* Teacher encoding: the packaged all-mpnet-base-v2 (encode-teacher's ``auto`` dtype: bf16 autocast where the
  CPU runs bf16 natively, else fp32; batch 64) on 1,000 corpus sentences and
  1,000 sentences drawn as the largest size draws them; projected time = rows x seconds per sentence.

Scratch data under ``var/bench/scale/<size>``, deleted after each size unless ``--keep``.
``python -m bench scale`` (all sizes) or ``python -m bench.scale [SIZE ...] [--keep] [--resume]`` (``--resume``:
reuse the measures an earlier run kept in ``var/bench/scale/<size>.json`` and ``teacher.json``).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from bench import CORPUS, REPO, results

SIZES = (100_000, 1_000_000, 5_000_000)
STAGES = ("stage", "teacher_publish", "pca", "index")
WORK = REPO / "var" / "bench" / "scale"
DAY = date(2026, 1, 1)
DIM, K, RANK, CLUSTERS = 768, 128, 96, 2000
STRIDE = 7919
CONNECTORS = (", and", "; meanwhile,", ", while", "; separately,", ", because", "; however,", ", so", "; also,")
QUERIES, LATENCY_QUERIES, WARMUP = 1000, 300, 50
TEACHER_SAMPLE = 1000


# -- sentences --------------------------------------------------------------------------------------------


def base_sentences() -> list[str]:
    """The corpus's sentences, normalised, each distinct one once, in corpus order."""
    from tasks.core.sentences import normalise_text

    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        header, *rows = fh.read().splitlines()
    position = header.split("\t").index("sentence")
    texts = (normalise_text(row.split("\t")[position]) for row in rows)
    return [t for t in dict.fromkeys(texts) if t]


def derived(i: int, base: list[str]) -> str:
    """Sentence ``i``: a corpus sentence alone (first copy) or joined to another one (later copies)."""
    count = len(base)
    first, copy = i % count, i // count
    if copy == 0:
        return base[first]
    other = base[(first + copy * STRIDE) % count]
    return f"{base[first].rstrip(' .!?')}{CONNECTORS[copy % len(CONNECTORS)]} {other[:1].lower()}{other[1:]}"


def write_source(path: Path, rows: int, base: list[str], block: int = 100_000) -> None:
    """``rows`` derived sentences as a gzip TSV (``source``, ``sentence``), written a block at a time."""
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as out:
        out.write("source\tsentence\n")
        for start in range(0, rows, block):
            out.write("".join(f"scale\t{derived(i, base)}\n" for i in range(start, min(rows, start + block))))


# -- synthetic teacher embeddings -------------------------------------------------------------------------


class Synthetic:
    """Teacher-like 768-d rows: one of ``CLUSTERS`` centres plus a within-cluster spread, both in a fixed
    rank-``RANK`` subspace with a decaying spectrum, a shared mean direction and isotropic noise; unit norm."""

    def __init__(self) -> None:
        fixed = np.random.default_rng(12345)
        self.basis = np.linalg.qr(fixed.normal(size=(DIM, RANK)))[0].T.astype(np.float32)
        self.spectrum = np.exp(-np.arange(RANK) / 24.0).astype(np.float32)
        self.centres = (fixed.normal(size=(CLUSTERS, RANK)) * self.spectrum).astype(np.float32)
        direction = fixed.normal(size=DIM)
        self.mean = (1.5 * direction / np.linalg.norm(direction)).astype(np.float32)

    def rows(self, count: int, rng: np.random.Generator) -> np.ndarray:
        cluster = rng.integers(0, CLUSTERS, count)
        latent = self.centres[cluster] + 0.5 * rng.standard_normal((count, RANK), np.float32) * self.spectrum
        x = latent @ self.basis
        x += self.mean
        noise = rng.standard_normal((count, DIM), np.float32)
        noise *= 1.6 / np.sqrt(DIM)
        x += noise
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


class SyntheticTeacher:
    """Stands in for the teacher model in ``encode_teacher``: same interface, synthetic rows seeded by the
    batch's first text (reruns give the same shards)."""

    dim, max_seq_length = DIM, 384

    def __init__(self) -> None:
        self.synthetic = Synthetic()

    def encode(self, texts: list[str], batch_size: int = 64, dtype: str = "fp32", on_rows: Any = None) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(texts[0].encode()) if texts else 0)
        out = self.synthetic.rows(len(texts), rng)
        if on_rows is not None:
            on_rows(len(texts))
        return out


# -- one stage, in its own process ------------------------------------------------------------------------


def _store(work: Path) -> str:
    return str(work / "store")


def _stage(work: Path) -> dict[str, Any]:
    from tasks.core import config
    from tasks.stages import stage_corpus
    from tasks.stages.params import StageCorpusParams

    values = {"source": str(work / "source.tsv.gz"), "column": "sentence", "ingest_date": DAY, "store": _store(work)}
    result = stage_corpus.run(config.parse(StageCorpusParams, values))
    stats = result.stats
    return {
        "rows": stats["rows_written"],
        "rows_read": stats["rows_read"],
        "dropped": stats["dropped"],
        "phases_s": result.manifest.document["timings_s"],
        "output_mb": _mb(sum(o.bytes for o in result.outputs)),
    }


def _teacher_publish(work: Path) -> dict[str, Any]:
    from tasks.core import config
    from tasks.ml.models import DEFAULT_TEACHER
    from tasks.stages import encode_teacher
    from tasks.stages.params import EncodeTeacherParams

    encode_teacher._load_encoder = lambda params: SyntheticTeacher()  # the model, and only it, swapped
    values = {"ingest_date": DAY, "store": _store(work), "teacher": DEFAULT_TEACHER}
    result = encode_teacher.run(config.parse(EncodeTeacherParams, values))
    return {"rows": result.stats["rows"], "shards": result.stats["shards"], "output_mb": _mb(_bytes(result))}


def _pca(work: Path) -> dict[str, Any]:
    from tasks.core import config
    from tasks.ml.models import DEFAULT_TEACHER
    from tasks.stages import fit_pca
    from tasks.stages.params import FitPCAParams

    result = fit_pca.run(config.parse(FitPCAParams, {"store": _store(work), "k": K, "teacher": DEFAULT_TEACHER}))
    return {
        "rows": result.stats["rows_fitted"],
        "explained_variance_ratio_sum": round(result.stats["explained_variance_ratio_sum"], 4),
        "phases_s": result.manifest.document["timings_s"],
        "output_mb": _mb(_bytes(result)),
    }


def _bytes(result: Any) -> int:
    return sum(o.bytes for o in result.outputs)


def _mb(count: float) -> float:
    return round(count / 2**20, 1)


def _target_vectors(store: str) -> np.ndarray:
    """The PCA run's projected targets (every row, shard order), L2-normalised as ``build_index`` does."""
    import faiss

    from tasks.core import catalog, manifest, parquet_shards, storage
    from tasks.core.catalog import Dataset, Stage
    from tasks.ml.models import DEFAULT_TEACHER

    name = catalog.default_pca_name(K, "uncentered")
    published = manifest.read(store, Stage.FIT_PCA, catalog.pca_key(DEFAULT_TEACHER, name))
    shards = published.outputs_of(Dataset.PROJECTED_TARGETS)
    vectors, row = np.empty((sum(s.rows for s in shards), K), np.float32), 0
    for shard in shards:
        block = parquet_shards.vectors(storage.read_parquet(shard.uri, sha256=shard.sha256), "target")
        vectors[row : row + len(block)], row = block, row + len(block)
    faiss.normalize_L2(vectors)
    return vectors


def _queries(store: str) -> np.ndarray:
    """Held-out queries: fresh synthetic teacher rows through the published projection, L2-normalised."""
    import faiss

    from tasks.core import catalog
    from tasks.ml.models import DEFAULT_TEACHER
    from tasks.ml.projection import load_projection

    projection = load_projection(store, DEFAULT_TEACHER, catalog.default_pca_name(K, "uncentered"))
    queries = np.ascontiguousarray(projection.apply(Synthetic().rows(QUERIES, np.random.default_rng(999))))
    faiss.normalize_L2(queries)
    return queries


def _index(work: Path) -> dict[str, Any]:
    import faiss

    from tasks.core import config
    from tasks.ml import vector_index
    from tasks.stages import build_index
    from tasks.stages.params import BuildIndexParams

    start = time.perf_counter()
    vectors = _target_vectors(_store(work))
    read_s = time.perf_counter() - start
    params = config.parse(BuildIndexParams, {"store": _store(work)})
    index_type = build_index.choose_type(params.index_type, len(vectors))
    factory = build_index.factory_string(index_type, len(vectors), K, params)
    start = time.perf_counter()
    index, tuned = vector_index.build_tuned(
        vectors, factory, params.nprobe, params.refine_k_factor, params.hnsw_ef_search, params.target_recall
    )
    build_s, build_peak = time.perf_counter() - start, status_mb("VmHWM")
    size = len(faiss.serialize_index(index))
    queries = _queries(_store(work))
    _, truth = faiss.knn(queries, vectors, 10, faiss.METRIC_INNER_PRODUCT)
    _, found = index.search(queries, 10)
    recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
    return {
        "rows": len(vectors),
        "faiss": faiss.__version__,
        "type": index_type,
        "factory": factory,
        "read_s": round(read_s, 3),
        "build_s": round(build_s, 3),
        "build_rows_per_s": round(len(vectors) / build_s),
        "peak_mb_to_build": build_peak,
        "search_breadth": {n: v for n, v in tuned.items() if n in ("nprobe", "ef_search")},
        "tuned_recall_at_10": tuned["recall_at_10"],
        "size_mb": _mb(size),
        "recall_at_10": round(float(recall), 4),
        **_latency(index, queries),
    }


def _latency(index: Any, queries: np.ndarray) -> dict[str, float]:
    """Single-query k=10 search times, warm, p50 and p99 in ms: with FAISS's default OpenMP threads (what
    ``LoadedIndex.search`` gets) and with one thread."""
    import faiss

    found, default = {}, faiss.omp_get_max_threads()
    for threads, label in ((default, ""), (1, "_1thread")):
        faiss.omp_set_num_threads(threads)
        for row in queries[:WARMUP]:
            index.search(row[None, :], 10)
        times = []
        for row in queries[WARMUP : WARMUP + LATENCY_QUERIES]:
            start = time.perf_counter()
            index.search(row[None, :], 10)
            times.append(1000 * (time.perf_counter() - start))
        found[f"search_p50_ms{label}"] = round(float(np.percentile(times, 50)), 3)
        found[f"search_p99_ms{label}"] = round(float(np.percentile(times, 99)), 3)
    faiss.omp_set_num_threads(default)
    return {"search_threads_default": default, **found}


def _teacher(work: Path) -> dict[str, Any]:
    """Seconds per sentence of the real teacher on corpus sentences and on the largest size's mix."""
    import torch

    from tasks.ml import models, precision
    from tasks.ml.encoder import SentenceEncoder

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    base, rng = base_sentences(), np.random.default_rng(0)
    samples = {
        "corpus": [base[i] for i in rng.choice(len(base), TEACHER_SAMPLE, replace=False)],
        "derived": [derived(int(i), base) for i in rng.choice(max(SIZES), TEACHER_SAMPLE, replace=False)],
    }
    start = time.perf_counter()
    encoder = SentenceEncoder.load(models.DEFAULT_TEACHER)
    dtype = precision.resolve("auto", "cpu")  # as encode-teacher's default: bf16 only where the CPU has it natively
    found: dict[str, Any] = {"load_s": round(time.perf_counter() - start, 2), "threads": torch.get_num_threads()}
    found["dtype"] = dtype
    encoder.encode(samples["corpus"][:64], batch_size=64, dtype=dtype)  # warm-up
    for name, texts in samples.items():
        start = time.perf_counter()
        encoder.encode(texts, batch_size=64, dtype=dtype)
        seconds = time.perf_counter() - start
        found[name] = {
            "sentences": len(texts),
            "mean_chars": round(float(np.mean([len(t) for t in texts])), 1),
            "seconds": round(seconds, 2),
            "ms_per_sentence": round(1000 * seconds / len(texts), 2),
        }
    return found


CHILDREN: dict[str, Callable[[Path], dict[str, Any]]] = {
    "stage": _stage,
    "teacher_publish": _teacher_publish,
    "pca": _pca,
    "index": _index,
    "teacher": _teacher,
}


def status_mb(field: str) -> float:
    from bench.stage_corpus import status_mb as read

    return read(field)


def _child(stage: str, work: Path) -> None:
    """Run one stage in this fresh process; print its measures as JSON."""
    import faiss  # noqa: F401  -- the imports are done before the peak is reset
    import polars  # noqa: F401

    from bench.stage_corpus import reset_peak_rss
    from tasks.stages import build_index, encode_teacher, fit_pca, stage_corpus  # noqa: F401

    if stage == "teacher":
        import torch  # noqa: F401

    before = reset_peak_rss()
    start = time.perf_counter()
    found = CHILDREN[stage](work)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": round(seconds, 3), "rss_before_mb": before, "peak_mb": status_mb("VmHWM"), **found}))


# -- the parent -------------------------------------------------------------------------------------------


def measure(stage: str, work: Path) -> dict[str, Any]:
    """One stage in a fresh process: its measures, the load average around it, its throughput."""
    load_start = os.getloadavg()[0]
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    with open(work / f"{stage}.log", "w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "bench.scale", "--child", stage, str(work)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
    if done.returncode:
        raise RuntimeError(f"{stage}: exit {done.returncode}; see {work / f'{stage}.log'}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["load_1min"] = {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)}
    if "rows" in found:
        found["rows_per_s"] = round(found["rows"] / found["seconds"])
    print(f"   {work.name} {stage}: {json.dumps(found)}", flush=True)
    return found


def run_size(rows: int, base: list[str], keep: bool) -> dict[str, Any]:
    """Every stage at one size, on a fresh store."""
    work = WORK / str(rows)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    start = time.perf_counter()
    write_source(work / "source.tsv.gz", rows, base)
    found: dict[str, Any] = {
        "source": {"seconds": round(time.perf_counter() - start, 2), "mb": _mb((work / "source.tsv.gz").stat().st_size)}
    }
    for stage in STAGES:
        found[stage] = measure(stage, work)
    found["distinct"] = found["stage"]["rows"] == rows
    found["store_mb"] = _mb(sum(p.stat().st_size for p in (work / "store").rglob("*") if p.is_file()))
    if not keep:
        shutil.rmtree(work)
    return found


def _scaling(by_size: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per stage, largest size against smallest: seconds per row and peak RSS, as ratios (1: linear time,
    flat memory); for the PCA also its streaming phases alone (the eigendecomposition is a constant); for
    the index the build alone (its ``seconds`` include the recall and latency measures)."""
    small, large = by_size[min(by_size)], by_size[max(by_size)]
    out: dict[str, Any] = {"from": min(by_size), "to": max(by_size)}
    for stage in STAGES:
        out[stage] = {
            "seconds_per_row_ratio": round(_per_row(large[stage], stage) / _per_row(small[stage], stage), 3),
            "peak_rss_ratio": round(large[stage]["peak_mb"] / small[stage]["peak_mb"], 3),
            "peak_growth_mb": round(large[stage]["peak_mb"] - small[stage]["peak_mb"], 1),
        }
    out["pca"]["streaming_seconds_per_row_ratio"] = round(_streaming(large) / _streaming(small), 3)
    return out


def _per_row(found: dict[str, Any], stage: str) -> float:
    """Seconds per row; for the index, of the build (train + add) alone."""
    return found["build_s" if stage == "index" else "seconds"] / found["rows"]


def _streaming(found: dict[str, Any]) -> float:
    phases = found["pca"]["phases_s"]
    return (phases["accumulate"] + phases.get("write_targets", 0.0)) / found["pca"]["rows"]


def _projection(teacher: dict[str, Any], sizes: tuple[int, ...]) -> dict[str, Any]:
    """Hours to encode each size on this CPU, at the measured cost of the sentences that size holds."""
    per = teacher["derived"]["ms_per_sentence"] / 1000
    return {str(n): {"cpu_hours": round(n * per / 3600, 1), "cpu_days": round(n * per / 86400, 2)} for n in sizes}


def _saved(name: str, resume: bool, measured: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``measured()``, kept as ``WORK/<name>.json``; with ``resume``, what an earlier run kept there."""
    path = WORK / f"{name}.json"
    if resume and path.exists():
        return dict(json.loads(path.read_text()))
    found = measured()
    path.write_text(json.dumps(found, indent=2))
    return found


def main(sizes: tuple[int, ...] = SIZES, keep: bool = False, resume: bool = False) -> dict[str, Any]:
    """Every size (a size or the teacher measure kept from an earlier run is reused with ``resume``)."""
    base = base_sentences()
    WORK.mkdir(parents=True, exist_ok=True)
    by_size = {rows: _saved(str(rows), resume, lambda rows=rows: run_size(rows, base, keep)) for rows in sizes}
    teacher = _saved("teacher", resume, lambda: measure("teacher", WORK))
    shutil.rmtree(WORK / "tmp", ignore_errors=True)
    small, large = by_size[min(sizes)], by_size[max(sizes)]

    def throughput(found: dict[str, Any]) -> float:
        return round(found["stage"]["rows"] / (found["stage"]["seconds"] + found["pca"]["seconds"]))

    return results.write(
        "scale",
        unit="sentences/s (staging + PCA)",
        ours=throughput(large),
        baseline_name=f"the same at {min(sizes):,} (ratio 1: linear)",
        baseline=throughput(small),
        higher_is_better=True,
        details={
            "sizes": list(sizes),
            "base_sentences": len(base),
            "by_size": {str(n): found for n, found in by_size.items()},
            "scaling": _scaling(by_size),
            "teacher_encode": {**teacher, "projected": _projection(teacher, sizes)},
            "method": __doc__,
        },
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], Path(sys.argv[3]))
    else:
        flags = {"--keep", "--resume"}
        sizes = tuple(int(a) for a in sys.argv[1:] if a not in flags) or SIZES
        print(json.dumps(main(sizes, "--keep" in sys.argv, "--resume" in sys.argv), indent=2))
