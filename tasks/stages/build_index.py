"""Build index: encode the retrieval corpus with a distilled student, build a FAISS index, promote it.

The student is a published distill run (its exported sentence-transformers folder). Each current
``sentences`` shard of the chosen partitions is encoded into the ``student_embeddings`` dataset;
the L2-normalised vectors go into a FAISS inner-product index (cosine similarity) of the type the
config names, or one chosen by size: exact ``flat`` up to 100k vectors, ``hnsw`` up to 1M,
``ivf_pq`` beyond (its candidates re-ranked on int8 codes unless ``refine`` says otherwise); ``ivf_flat``
on request; ``sq8`` stores int8 codes instead of float32. An approximate index's search breadth (IVF
``nprobe``, HNSW ``efSearch``) is doubled from its configured value until recall@10 against exact search,
on a sample of the corpus as queries (each one's own row left out), reaches ``target_recall`` or stops
rising; the value found is saved in the index. The manifest records build time, bytes, the search breadth, queries/s at
batch 1 and 64 and recall@10.

The index and its id map (``index_ids``) are published under ``indexes/<name>/<run id>/`` (a later build under
the same name never touches them), then the manifest (and its kept version); only then does
``indexes/current.json`` move, by compare-and-swap against the version read before the build, so concurrent
rebuilds cannot leave it naming a missing or partial index: one wins, the other fails with :class:`PromotionConflict`.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core import catalog, finite, manifest, parquet_shards, promotion, sentences, storage, uris
from tasks.core.catalog import Dataset, Pointer, Stage
from tasks.core.progress import Progress, format_bytes, format_duration
from tasks.ml import student
from tasks.ml.vector_index import IndexBuildError, RecallSample, build, measure, tune_search
from tasks.stages.params import BuildIndexParams

_REFINE = {"none": "", "sq8": ",Refine(SQ8)", "flat": ",RFlat"}  # factory suffix of each IVF-PQ re-rank
INDEX_FILE = "index.faiss"

log = logging.getLogger(__name__)


class PromotionConflict(IndexBuildError):
    """Another rebuild moved the current pointer first; this index was published but not promoted."""


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
    return f"IVF{nlist},PQ{params.pq_m}x{params.pq_bits}" + _REFINE[params.refine]


def run(params: BuildIndexParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Encode the corpus, build and publish the index, then promote it by compare-and-swap."""
    params, distilled = _student_run(params)
    staged = _corpus_shards(params)
    name = params.name or distilled.key
    distill_uri = distilled.version_uri(params.store)  # the run as read now: a later one under its name changes nothing
    stage_run = manifest.StageRun(
        stage=Stage.BUILD_INDEX,
        key=name,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[manifest.Input(distill_uri, distilled.fingerprint), *(o.as_input() for o in staged)],
    )
    _, seen_etag = catalog.read_pointer(params.store, Pointer.INDEX)
    if skipped := stage_run.skip_result(force):
        if params.promote and skipped.manifest is not None:
            _settle(params.store, skipped.manifest)
        return skipped
    prefix = catalog.index_prefix(params.store, name, stage_run.run_id)
    corpus = _encode_corpus(params, distilled, stage_run, staged, prefix, progress)
    recorded = promotion.Promotion(seen_etag).as_stats() if params.promote else {}
    stage_run.stats = {**_write_index(stage_run, prefix, corpus, params), **recorded}
    stage_run.add_shard(
        parquet_shards.write_shard(
            prefix,
            "ids",
            pa.table(
                {
                    "faiss_id": pa.array(np.arange(len(corpus.ids)), pa.int64()),
                    "sentence_id": corpus.ids,
                    "text": corpus.texts,
                }
            ),
            Dataset.INDEX_IDS,
        )
    )
    result = stage_run.publish()
    if params.promote:
        assert result.manifest is not None
        promote(params.store, result.manifest, seen_etag)
    return result


def _student_run(params: BuildIndexParams) -> tuple[BuildIndexParams, manifest.Manifest]:
    """The distill run whose student encodes the corpus: ``model_run``'s latest, or, when none is named, the
    promoted model's (the version its pointer names); ``params`` with that run's name."""
    if params.model_run is not None:
        distilled = manifest.read(params.store, Stage.DISTILL, params.model_run)
        if distilled is None:
            raise IndexBuildError(f"{params.store}: no published distill run {params.model_run!r}")
        return params, distilled
    pointer, _ = student.promoted(params.store)
    if pointer is None:
        raise IndexBuildError(f"{params.store}: no promoted model ({Pointer.MODEL}); validate one or pass model_run")
    distilled = manifest.served_distill(params.store, pointer)
    return params.model_copy(update={"model_run": pointer.model_run}), distilled


def _corpus_shards(params: BuildIndexParams) -> list[manifest.Output]:
    days = params.partitions or sentences.staged_days(params.store)
    staged = [o for day in days for o in sentences.published(params.store, day, (Stage.STAGE_CORPUS,))]
    if not staged:
        raise IndexBuildError(f"{params.store}: no staged sentences for partitions {days}")
    return staged


@dataclass(frozen=True)
class EncodedCorpus:
    """The corpus as the index holds it: ids, texts, L2-normalised vectors, and the index chosen for it."""

    ids: list[str]
    texts: list[str]
    vectors: np.ndarray
    index_type: str
    factory: str


def _read_corpus(stage_run: manifest.StageRun, shards: list[manifest.Output]) -> list[tuple[str, pa.Table]]:
    """(URI, ids and texts) of every corpus shard, each verified against the sha256 its staging manifest
    records: all of them before the first embeddings shard is written."""
    with stage_run.phase("read"):
        return [(s.uri, storage.read_parquet(s.uri, columns=["sentence_id", "text"], sha256=s.sha256)) for s in shards]


def _encode_corpus(
    params: BuildIndexParams,
    distilled: manifest.Manifest,
    stage_run: manifest.StageRun,
    shards: list[manifest.Output],
    prefix: str,
    progress: bool,
) -> EncodedCorpus:
    """Encode every corpus shard with the student, publishing its embeddings. Bad index settings and
    altered corpus shards fail before the first write."""
    import faiss

    from tasks.ml.encoder import SentenceEncoder

    assert params.model_run is not None
    ids, texts, blocks = [], [], []
    corpus = _read_corpus(stage_run, shards)
    with tempfile.TemporaryDirectory() as scratch, stage_run.phase("encode"):
        encoder = SentenceEncoder.load(str(student.fetch_published(distilled, Path(scratch))))
        rows = sum(i.rows or 0 for i in stage_run.inputs[1:])
        index_type = choose_type(params.index_type, rows)
        factory = factory_string(index_type, rows, encoder.dim, params)
        log.info("build_index %s: a %s index (%s) over %d vectors", stage_run.key, index_type, factory, rows)
        with Progress(f"build_index {stage_run.key} encode", rows, bar=progress, logger=log) as reporter:
            for shard_uri, table in corpus:
                shard_texts = table.column("text").to_pylist()
                vectors = encoder.encode(
                    shard_texts, batch_size=params.batch_size, dtype=params.dtype, on_rows=reporter.update
                )
                finite.require_finite(vectors, f"{shard_uri} encoded by {params.model_run}", "embedding value")
                stage_run.add_shard(_write_embeddings(prefix, shard_uri, table, vectors, params.model_run))
                ids.extend(table.column("sentence_id").to_pylist())
                texts.extend(shard_texts)
                blocks.append(vectors)
    vectors = np.ascontiguousarray(np.concatenate(blocks), dtype=np.float32)
    faiss.normalize_L2(vectors)
    return EncodedCorpus(ids, texts, vectors, index_type, factory)


def _write_embeddings(
    prefix: str, shard_uri: str, table: pa.Table, vectors: np.ndarray, model_run: str
) -> parquet_shards.Shard:
    """Publish the student embeddings of one corpus shard."""
    embeddings = pa.table(
        {
            "sentence_id": table.column("sentence_id"),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1]),
        }
    )
    return parquet_shards.write_shard(
        storage.join(prefix, Dataset.STUDENT_EMBEDDINGS),
        catalog.derived_stem(shard_uri),
        embeddings,
        Dataset.STUDENT_EMBEDDINGS,
        dim=vectors.shape[1],
        model_id=model_run,
    )


def _write_index(
    stage_run: manifest.StageRun, prefix: str, corpus: EncodedCorpus, params: BuildIndexParams
) -> dict[str, Any]:
    """Build, measure and publish the index; its stats."""
    import faiss

    with stage_run.phase("build"):
        start = time.perf_counter()
        index = build(corpus.vectors, corpus.factory, params.nprobe, params.refine_k_factor, params.hnsw_ef_search)
        build_seconds = time.perf_counter() - start
    with stage_run.phase("measure"):
        sample = RecallSample.of(corpus.vectors)
        breadth = tune_search(index, sample, params.target_recall)
        stats = {**breadth, **measure(index, sample)}
    body = faiss.serialize_index(index).tobytes()
    stage_run.write_output(storage.join(prefix, INDEX_FILE), body, rows=len(corpus.vectors))
    log.info(
        "build_index %s: built %s over %d vectors of dim %d in %s, %s; %s",
        stage_run.key,
        corpus.factory,
        len(corpus.vectors),
        corpus.vectors.shape[1],
        format_duration(build_seconds),
        format_bytes(len(body)),
        ", ".join(f"{name} {value}" for name, value in stats.items()),
    )
    return {
        "index_type": corpus.index_type,
        "factory": corpus.factory,
        "rows": len(corpus.vectors),
        "dim": int(corpus.vectors.shape[1]),
        "bytes": len(body),
        "build_seconds": round(build_seconds, 3),
        **stats,
    }


def _settle(store: str, published: manifest.Manifest) -> None:
    """On a rerun of a published build: complete the promotion it did not finish, or say where it stands."""
    settled, etag = promotion.settle(store, Pointer.INDEX, lambda p: p.run_id == published.run_id, published.stats)
    log.info("build_index %s: %s", published.key, settled)
    if settled is promotion.Settlement.UNFINISHED:
        promote(store, published, etag)


def promote(store: str, published: manifest.Manifest, seen_etag: str | None) -> catalog.IndexPointer:
    """Move ``indexes/current.json`` to a published index, by compare-and-swap against ``seen_etag``."""
    index_uri, ids_uri = published.output_named(INDEX_FILE).uri, published.outputs_of(Dataset.INDEX_IDS)[0].uri
    for uri in (index_uri, ids_uri):
        if not storage.exists(uri):
            raise IndexBuildError(f"{uri}: missing; the current pointer stays as it was")
    pointer = catalog.IndexPointer(
        index_uri,
        ids_uri,
        published.version_uri(store),
        published.params["model_run"],
        published.stats["dim"],
        published.run_id,
        published.inputs[0].uri,
    )
    try:
        catalog.move_pointer(store, pointer, seen_etag)
    except catalog.PointerMoved:
        raise PromotionConflict(
            f"{catalog.pointer_uri(store, Pointer.INDEX)}: moved by another rebuild since this "
            f"one started; {index_uri} is published but not promoted"
        ) from None
    where = catalog.pointer_uri(store, Pointer.INDEX)
    log.info("build_index %s: promoted; %s names %s", published.key, uris.redact(where), uris.redact(index_uri))
    return pointer
