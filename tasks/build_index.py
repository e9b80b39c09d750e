"""Build index: encode the retrieval corpus with a distilled student, build a FAISS index, promote it.

The student is a published distill run (its exported sentence-transformers folder). Each current
``sentences`` shard of the chosen partitions is encoded into the ``student_embeddings`` dataset;
the L2-normalised vectors go into a FAISS inner-product index (cosine similarity) of the type the
config names, or one chosen by size: exact ``flat`` up to 100k vectors, ``hnsw`` up to 1M,
``ivf_pq`` beyond; ``ivf_flat`` on request; ``sq8`` stores int8 codes instead of float32. The
manifest records build time, bytes, queries/s at batch 1 and 64 and recall@10 against exact search.

The index, its id map (``index_ids``) and the manifest are published under
``indexes/<name>/<fingerprint12>/``; only then does ``indexes/current.json`` move, by
compare-and-swap against the version read before the build, so concurrent rebuilds cannot leave it
naming a missing or partial index: one wins, the other fails with :class:`PromotionConflict`.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field
from tqdm import tqdm

from tasks import datasets, manifest, sentences, storage, student
from tasks.config import StageParams

STAGE = "build_index"
IndexType = Literal["auto", "flat", "ivf_flat", "hnsw", "ivf_pq"]
QUERY_SAMPLE = 200


class IndexBuildError(ValueError):
    """The index cannot be built or promoted as asked; the message names the input."""


class PromotionConflict(IndexBuildError):
    """Another rebuild moved the current pointer first; this index was published but not promoted."""


class BuildIndexParams(StageParams):
    model_run: str | None = Field(None, description="the distill run whose student encodes the corpus "
                                                  "(default: the promoted one, models/current.json)")
    partitions: list[date] | None = Field(None, description="corpus partitions (default: every staged one)")
    index_type: IndexType = Field("auto", description="auto chooses by corpus size")
    sq8: bool = Field(False, description="store int8 scalar-quantised codes instead of float32")
    hnsw_m: int = Field(32, gt=1)
    nlist: int | None = Field(None, gt=0, description="IVF lists (default: 4 sqrt(n))")
    nprobe: int = Field(16, gt=0)
    pq_m: int = Field(16, gt=0, description="IVF-PQ sub-quantisers (must divide the dimension)")
    pq_bits: int = Field(8, ge=1, le=12, description="IVF-PQ bits per sub-quantiser code")
    batch_size: int = Field(128, gt=0)
    dtype: Literal["fp32", "bf16"] = "fp32"
    name: str = Field("", pattern=r"^[A-Za-z0-9_.=-]*$", description="index name (default: the model run)")
    promote: bool = Field(True, description="move indexes/current.json to the new index")


def current_pointer_uri(store: str) -> str:
    return storage.join(store, "indexes", "current.json")


def choose_type(requested: str, rows: int) -> str:
    if requested != "auto":
        return requested
    return "flat" if rows <= 100_000 else "hnsw" if rows <= 1_000_000 else "ivf_pq"


def factory_string(index_type: str, rows: int, dim: int, params: BuildIndexParams) -> str:
    codes = "SQ8" if params.sq8 else "Flat"
    nlist = params.nlist or max(1, int(4 * np.sqrt(rows)))
    if index_type == "flat":
        return codes if params.sq8 else "Flat"
    if index_type == "hnsw":
        return f"HNSW{params.hnsw_m},{codes}"
    if index_type == "ivf_flat":
        return f"IVF{nlist},{codes}"
    if dim % params.pq_m:
        raise IndexBuildError(f"ivf_pq: pq_m={params.pq_m} does not divide the dimension {dim}")
    return f"IVF{nlist},PQ{params.pq_m}x{params.pq_bits}"


def run(params: BuildIndexParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Encode the corpus, build and publish the index, then promote it by compare-and-swap."""
    import faiss

    from tasks.encoder import SentenceEncoder

    if params.model_run is None:
        pointer, _ = student.promoted(params.store)
        if pointer is None:
            raise IndexBuildError(f"{params.store}: no promoted model (models/current.json); validate one or pass "
                                  f"model_run")
        params = params.model_copy(update={"model_run": pointer["model_run"]})
    days = params.partitions or sentences.staged_days(params.store)
    staged = [o for day in days for o in sentences.published(params.store, day, ("stage_corpus",))]
    if not staged:
        raise IndexBuildError(f"{params.store}: no staged sentences for partitions {days}")
    distilled = manifest.read(params.store, "distill", params.model_run)
    if distilled is None:
        raise IndexBuildError(f"{params.store}: no published distill run {params.model_run!r}")
    name = params.name or params.model_run
    stage_run = manifest.StageRun(
        stage=STAGE, key=name, store=params.store, params=params.model_dump(mode="json"),
        inputs=[{"uri": manifest.manifest_uri(params.store, "distill", params.model_run),
                 "sha256": distilled["fingerprint"], "rows": None}]
        + [{"uri": o["uri"], "sha256": o["sha256"], "rows": o["rows"]} for o in staged],
    )
    pointer_before = storage.read_json_versioned(current_pointer_uri(params.store))
    if not force and (done := stage_run.completed()) is not None:
        return manifest.StageResult(stage_run.uri, skipped=True, manifest=done)
    prefix = storage.join(params.store, "indexes", name, stage_run.fingerprint[:12])
    with tempfile.TemporaryDirectory() as scratch, stage_run.phase("encode"):
        encoder = SentenceEncoder.load(str(student.fetch_exported(params.store, params.model_run, Path(scratch))))
        rows = sum(item["rows"] for item in stage_run.inputs[1:])
        index_type = choose_type(params.index_type, rows)
        factory = factory_string(index_type, rows, encoder.dim, params)  # bad settings fail before any write
        ids, texts, blocks = [], [], []
        for shard_uri in tqdm([o["uri"] for o in staged], desc=f"index {name} encode", unit=" shard",
                              disable=not progress):
            table = storage.read_parquet(shard_uri, columns=["sentence_id", "text"])
            vectors = encoder.encode(table.column("text").to_pylist(), batch_size=params.batch_size,
                                     dtype=params.dtype)
            embeddings = pa.table({"sentence_id": table.column("sentence_id"), "embedding":
                                   pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])})
            stage_run.add_shard(datasets.write_shard(storage.join(prefix, "student_embeddings"),
                                                     datasets.derived_stem(shard_uri), embeddings,
                                                     "student_embeddings", dim=vectors.shape[1],
                                                     model_id=params.model_run))
            ids.extend(table.column("sentence_id").to_pylist())
            texts.extend(table.column("text").to_pylist())
            blocks.append(vectors)
    vectors = np.ascontiguousarray(np.concatenate(blocks), dtype=np.float32)
    faiss.normalize_L2(vectors)
    with stage_run.phase("build"):
        start = time.perf_counter()
        index = build(vectors, factory, params.nprobe)
        build_seconds = time.perf_counter() - start
    with stage_run.phase("measure"):
        stats = measure(index, vectors)
    body = faiss.serialize_index(index).tobytes()
    index_uri = storage.join(prefix, "index.faiss")
    storage.write_bytes(index_uri, body)
    stage_run.add_output(index_uri, manifest.sha256_hex(body), len(body), len(vectors))
    id_map = pa.table({"faiss_id": pa.array(np.arange(len(ids)), pa.int64()), "sentence_id": ids, "text": texts})
    stage_run.add_shard(datasets.write_shard(prefix, "ids", id_map, "index_ids"))
    stage_run.stats = {"index_type": index_type, "factory": factory,
                       "rows": len(vectors), "dim": int(vectors.shape[1]), "bytes": len(body),
                       "build_seconds": round(build_seconds, 3), **stats}
    published = stage_run.publish()
    if params.promote:
        promote(params.store, stage_run.uri, published, pointer_before)
    return manifest.StageResult(stage_run.uri, skipped=False, manifest=published)


def build(vectors: np.ndarray, factory: str, nprobe: int):
    import faiss

    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)
    if hasattr(index, "nprobe"):
        index.nprobe = nprobe
    return index


def measure(index, vectors: np.ndarray, k: int = 10) -> dict:
    """Queries/s at batch 1 and 64 and recall@k against exact search, on a sample of the corpus."""
    import faiss

    queries = vectors[np.random.default_rng(0).choice(len(vectors), min(QUERY_SAMPLE, len(vectors)), replace=False)]
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    _, truth = exact.search(queries, k)
    start = time.perf_counter()
    for row in queries:
        index.search(row[None, :], k)
    qps_1 = len(queries) / (time.perf_counter() - start)
    start = time.perf_counter()
    for first in range(0, len(queries), 64):
        _, found = index.search(queries[first:first + 64], k)
    qps_64 = len(queries) / (time.perf_counter() - start)
    _, found = index.search(queries, k)
    recall = np.mean([len(set(f) & set(t)) / k for f, t in zip(found, truth, strict=True)])
    return {"queries_per_s_batch1": round(qps_1, 1), "queries_per_s_batch64": round(qps_64, 1),
            f"recall_at_{k}": round(float(recall), 4)}


def promote(store: str, manifest_uri: str, published: dict, seen: tuple[dict | None, str | None]) -> dict:
    """Move ``indexes/current.json`` to a published index, by compare-and-swap against ``seen``."""
    index_uri = next(o["uri"] for o in published["outputs"] if o["uri"].endswith("/index.faiss"))
    ids_uri = next(o["uri"] for o in published["outputs"] if o["contract"] == "index_ids")
    for uri in (index_uri, ids_uri):
        if not storage.exists(uri):
            raise IndexBuildError(f"{uri}: missing; the current pointer stays as it was")
    pointer = {"index": index_uri, "ids": ids_uri, "manifest": manifest_uri, "model_run": published["params"]
               ["model_run"], "dim": published["stats"]["dim"], "run_id": published["run_id"]}
    try:
        storage.compare_and_swap(current_pointer_uri(store), json.dumps(pointer, indent=2).encode(), seen[1])
    except storage.PreconditionFailed:
        raise PromotionConflict(f"{current_pointer_uri(store)}: moved by another rebuild since this one started; "
                                f"{index_uri} is published but not promoted") from None
    return pointer


def search(store: str, query: str, k: int = 5) -> list[dict]:
    """The ``k`` nearest corpus sentences to ``query`` in the current index."""
    import faiss

    from tasks.encoder import SentenceEncoder

    pointer, _ = storage.read_json_versioned(current_pointer_uri(store))
    if pointer is None:
        raise IndexBuildError(f"{current_pointer_uri(store)}: no index promoted yet; run build-index")
    for uri in (pointer["index"], pointer["ids"]):
        if not storage.exists(uri):
            raise IndexBuildError(f"{current_pointer_uri(store)} names {uri}, which does not exist")
    index = faiss.deserialize_index(np.frombuffer(storage.read_bytes(pointer["index"]), dtype=np.uint8))
    ids = storage.read_parquet(pointer["ids"])
    with tempfile.TemporaryDirectory() as scratch:
        encoder = SentenceEncoder.load(str(student.fetch_exported(store, pointer["model_run"], Path(scratch))))
        vector = encoder.encode([query])
    if vector.shape[1] != index.d:
        raise IndexBuildError(f"{pointer['index']}: index dimension {index.d} differs from the model's "
                              f"{vector.shape[1]}")
    faiss.normalize_L2(vector)
    scores, rows = index.search(vector, k)
    texts, sids = ids.column("text").to_pylist(), ids.column("sentence_id").to_pylist()
    return [{"rank": rank + 1, "score": round(float(score), 4), "sentence_id": sids[row], "text": texts[row]}
            for rank, (score, row) in enumerate(zip(scores[0], rows[0], strict=True)) if row >= 0]
