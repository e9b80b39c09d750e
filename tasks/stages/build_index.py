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

The index, its id map (``index_ids``) and the manifest are published under
``indexes/<name>/<fingerprint12>/``; only then does ``indexes/current.json`` move, by
compare-and-swap against the version read before the build, so concurrent rebuilds cannot leave it
naming a missing or partial index: one wins, the other fails with :class:`PromotionConflict`.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core import catalog, datasets, manifest, sentences, storage, uris
from tasks.core.catalog import Dataset, Pointer, Stage
from tasks.core.progress import Progress, format_bytes, format_duration
from tasks.ml import student
from tasks.stages.params import BuildIndexParams

QUERY_SAMPLE = 200
MAX_EF_SEARCH = 1024  # the widest HNSW search tuning tries
MIN_RECALL_GAIN = 0.005  # a doubled search breadth that recalls less than this more is undone, and tuning stops
_REFINE = {"none": "", "sq8": ",Refine(SQ8)", "flat": ",RFlat"}  # factory suffix of each IVF-PQ re-rank
INDEX_FILE = "index.faiss"

log = logging.getLogger(__name__)


class IndexBuildError(ValueError):
    """The index cannot be built or promoted as asked; the message names the input."""


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
    params = _with_model_run(params)
    assert params.model_run is not None
    staged = _corpus_shards(params)
    distilled = manifest.read(params.store, Stage.DISTILL, params.model_run)
    if distilled is None:
        raise IndexBuildError(f"{params.store}: no published distill run {params.model_run!r}")
    name = params.name or params.model_run
    distill_uri = catalog.manifest_uri(params.store, Stage.DISTILL, params.model_run)
    stage_run = manifest.StageRun(
        stage=Stage.BUILD_INDEX,
        key=name,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[manifest.Input(distill_uri, distilled.fingerprint), *(o.as_input() for o in staged)],
    )
    _, seen_etag = catalog.read_pointer(params.store, Pointer.INDEX)
    if skipped := stage_run.skip_result(force):
        return skipped
    prefix = catalog.index_prefix(params.store, name, stage_run.fingerprint)
    corpus = _encode_corpus(params, stage_run, staged, prefix, progress)
    stage_run.stats = _write_index(stage_run, prefix, corpus, params)
    stage_run.add_shard(
        datasets.write_shard(
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


def _with_model_run(params: BuildIndexParams) -> BuildIndexParams:
    """``params`` with the promoted model's run when none is named."""
    if params.model_run is not None:
        return params
    pointer, _ = student.promoted(params.store)
    if pointer is None:
        raise IndexBuildError(f"{params.store}: no promoted model ({Pointer.MODEL}); validate one or pass model_run")
    return params.model_copy(update={"model_run": pointer.model_run})


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
    params: BuildIndexParams, stage_run: manifest.StageRun, shards: list[manifest.Output], prefix: str, progress: bool
) -> EncodedCorpus:
    """Encode every corpus shard with the student, publishing its embeddings. Bad index settings and
    altered corpus shards fail before the first write."""
    import faiss

    from tasks.ml.encoder import SentenceEncoder

    assert params.model_run is not None
    ids, texts, blocks = [], [], []
    corpus = _read_corpus(stage_run, shards)
    with tempfile.TemporaryDirectory() as scratch, stage_run.phase("encode"):
        encoder = SentenceEncoder.load(str(student.fetch_exported(params.store, params.model_run, Path(scratch))))
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
                stage_run.add_shard(_write_embeddings(prefix, shard_uri, table, vectors, params.model_run))
                ids.extend(table.column("sentence_id").to_pylist())
                texts.extend(shard_texts)
                blocks.append(vectors)
    vectors = np.ascontiguousarray(np.concatenate(blocks), dtype=np.float32)
    faiss.normalize_L2(vectors)
    return EncodedCorpus(ids, texts, vectors, index_type, factory)


def _write_embeddings(
    prefix: str, shard_uri: str, table: pa.Table, vectors: np.ndarray, model_run: str
) -> datasets.Shard:
    """Publish the student embeddings of one corpus shard."""
    embeddings = pa.table(
        {
            "sentence_id": table.column("sentence_id"),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1]),
        }
    )
    return datasets.write_shard(
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


def build(vectors: np.ndarray, factory: str, nprobe: int, k_factor: float = 16.0, ef_search: int = 16):
    """The index ``factory`` names over ``vectors``: IVF probing ``nprobe`` lists, HNSW keeping ``ef_search``
    candidates, a re-ranking one (``Refine``) re-scoring ``k_factor`` times k candidates."""
    import faiss

    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)
    if factory.startswith("IVF"):
        faiss.extract_index_ivf(index).nprobe = nprobe
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search
    if isinstance(index, faiss.IndexRefine):
        index.k_factor = k_factor
    return index


@dataclass(frozen=True)
class RecallSample:
    """Queries drawn from the indexed vectors, and each one's exact ``k`` nearest neighbours (inner product)
    other than itself: an indexed vector finds itself almost always, which a new query cannot, so it is left
    out of both sides."""

    queries: np.ndarray
    rows: np.ndarray
    truth: list[list[int]]
    k: int

    @classmethod
    def of(cls, vectors: np.ndarray, k: int = 10) -> RecallSample:
        import faiss

        rows = np.random.default_rng(0).choice(len(vectors), min(QUERY_SAMPLE, len(vectors)), replace=False)
        queries = np.ascontiguousarray(vectors[rows])
        _, truth = faiss.knn(queries, vectors, k + 1, faiss.METRIC_INNER_PRODUCT)
        return cls(queries, rows, _others(truth, rows, k), k)

    def recall(self, index) -> float:
        """The share of the exact neighbours ``index`` finds."""
        _, found = index.search(self.queries, self.k + 1)
        hits = [
            len(set(f) & set(t)) / self.k for f, t in zip(_others(found, self.rows, self.k), self.truth, strict=True)
        ]
        return float(np.mean(hits))


def _others(neighbours: np.ndarray, rows: np.ndarray, k: int) -> list[list[int]]:
    """Each query's first ``k`` neighbours that are not its own row."""
    return [[int(n) for n in found if n != own][:k] for found, own in zip(neighbours, rows, strict=True)]


def _breadth_knob(index) -> tuple[str, Any, str, int] | None:
    """(name, object, attribute, largest value) of what widens ``index``'s search; None for an exact one."""
    import faiss

    if hasattr(index, "hnsw"):
        return "ef_search", index.hnsw, "efSearch", MAX_EF_SEARCH
    ivf = faiss.try_extract_index_ivf(index)
    return None if ivf is None else ("nprobe", ivf, "nprobe", int(ivf.nlist))


def tune_search(index, sample: RecallSample, target: float) -> dict[str, int]:
    """Double ``index``'s search breadth from its current value until ``sample`` reaches ``target`` recall, the
    breadth its limit (every list; :data:`MAX_EF_SEARCH`), or a doubling gains less than :data:`MIN_RECALL_GAIN`
    (undone: the codes, not the breadth, bound the recall then); the breadth kept: ``{"nprobe": n}`` or
    ``{"ef_search": n}``, empty for an exact index."""
    knob = _breadth_knob(index)
    if knob is None:
        return {}
    name, owner, attribute, limit = knob
    recall = sample.recall(index)
    while recall < target and getattr(owner, attribute) < limit:
        before = getattr(owner, attribute)
        setattr(owner, attribute, min(2 * before, limit))
        widened = sample.recall(index)
        if widened - recall < MIN_RECALL_GAIN:
            setattr(owner, attribute, before)
            break
        recall = widened
    return {name: int(getattr(owner, attribute))}


def measure(index, sample: RecallSample) -> dict[str, float]:
    """Queries/s at batch 1 and 64 and recall@k against exact search, on ``sample``."""
    queries = sample.queries
    start = time.perf_counter()
    for row in queries:
        index.search(row[None, :], sample.k)
    qps_1 = len(queries) / (time.perf_counter() - start)
    start = time.perf_counter()
    for first in range(0, len(queries), 64):
        index.search(queries[first : first + 64], sample.k)
    qps_64 = len(queries) / (time.perf_counter() - start)
    return {
        "queries_per_s_batch1": round(qps_1, 1),
        "queries_per_s_batch64": round(qps_64, 1),
        f"recall_at_{sample.k}": round(sample.recall(index), 4),
    }


def promote(store: str, published: manifest.Manifest, seen_etag: str | None) -> catalog.IndexPointer:
    """Move ``indexes/current.json`` to a published index, by compare-and-swap against ``seen_etag``."""
    index_uri, ids_uri = published.output_named(INDEX_FILE).uri, published.outputs_of(Dataset.INDEX_IDS)[0].uri
    for uri in (index_uri, ids_uri):
        if not storage.exists(uri):
            raise IndexBuildError(f"{uri}: missing; the current pointer stays as it was")
    pointer = catalog.IndexPointer(
        index_uri,
        ids_uri,
        catalog.manifest_uri(store, Stage.BUILD_INDEX, published.key),
        published.params["model_run"],
        published.stats["dim"],
        published.run_id,
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


def search(store: str, query: str, k: int = 5) -> list[dict]:
    """The ``k`` nearest corpus sentences to ``query`` in the current index."""
    return load_current(store).search([query], k)[0]


@dataclass(frozen=True)
class LoadedIndex:
    """The promoted index in memory: the student that encodes queries, the FAISS index, its id map, and the
    pointer (and its etag) it was loaded from. Immutable once loaded: a service swaps whole instances."""

    store: str
    pointer: catalog.IndexPointer
    etag: str | None
    encoder: Any
    index: Any
    sentence_ids: list[str]
    texts: list[str]
    loaded_at: float
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def index_key(self) -> str:
        return catalog.store_key(self.store, self.pointer.index) or self.pointer.index

    @property
    def query_encoder(self) -> str:
        """``onnx-int8`` or ``onnx-fp32`` (ONNX Runtime), or ``torch`` (:func:`query_encoder`)."""
        from tasks.ml.onnx_encoder import OnnxEncoder

        return f"onnx-{self.encoder.variant}" if isinstance(self.encoder, OnnxEncoder) else "torch"

    @property
    def encodes_one_lock_free(self) -> bool:
        """Whether one query encodes without the lock: through an ONNX graph whose single-query path is safe to
        share between threads (:attr:`OnnxEncoder.encodes_one_thread_safely`)."""
        from tasks.ml.onnx_encoder import OnnxEncoder

        return isinstance(self.encoder, OnnxEncoder) and self.encoder.encodes_one_thread_safely

    def search(self, queries: list[str], k: int) -> list[list[dict]]:
        """The ``k`` nearest corpus sentences to each query. Encoding holds a lock (a fast tokenizer is not
        safe to call from two threads at once), except for one query :attr:`encodes_one_lock_free`; FAISS
        searches concurrently."""
        import faiss

        with contextlib.nullcontext() if len(queries) == 1 and self.encodes_one_lock_free else self.lock:
            vectors = self.encoder.encode(queries)
        faiss.normalize_L2(vectors)
        scores, rows = self.index.search(vectors, k)
        return [
            [
                {
                    "rank": rank + 1,
                    "score": round(float(s), 4),
                    "sentence_id": self.sentence_ids[r],
                    "text": self.texts[r],
                }
                for rank, (s, r) in enumerate(zip(row_scores, row_ids, strict=True))
                if r >= 0
            ]
            for row_scores, row_ids in zip(scores, rows, strict=True)
        ]


def current_pointer(store: str) -> tuple[catalog.IndexPointer, str | None]:
    """The promoted index pointer and its etag, every object it names checked to lie inside ``store``."""
    pointer, etag = catalog.read_pointer(store, Pointer.INDEX)
    where = catalog.pointer_uri(store, Pointer.INDEX)
    if pointer is None:
        raise IndexBuildError(f"{where}: no index promoted yet; run build-index")
    for uri in (pointer.index, pointer.ids, pointer.manifest):
        if catalog.store_key(store, uri) is None:  # a hand-made pointer may hold an absolute URI: not followed out
            raise IndexBuildError(f"{where} names {uris.redact(uri)}, outside the store {store}; refused")
        if not storage.exists(uri):
            raise IndexBuildError(f"{where} names {uri}, which does not exist")
    return pointer, etag


def _recorded_checksums(store: str, pointer: catalog.IndexPointer) -> dict[str, str]:
    """The sha256 the pointer's build manifest records for the index and the id map it names; a pointer naming
    an object its manifest does not list is refused."""
    published = manifest.parse(pointer.manifest, storage.read_bytes(pointer.manifest), store)
    recorded = {output.uri: output.sha256 for output in published.outputs}
    for uri in (pointer.index, pointer.ids):
        if uri not in recorded:
            where = catalog.pointer_uri(store, Pointer.INDEX)
            raise IndexBuildError(f"{where} names {uri}, which its build manifest {pointer.manifest} does not list")
    return recorded


def query_encoder(folder: Path, choice: str = "auto") -> Any:
    """What encodes queries: with ``auto``, the student's ONNX graph run by ONNX Runtime where distill
    exported one (its ``onnx``), else (and with ``torch``) the PyTorch student."""
    from tasks.ml import onnx_encoder
    from tasks.ml.encoder import SentenceEncoder

    if choice == "torch" or onnx_encoder.exported_graph(folder) is None:
        return SentenceEncoder.load(str(folder))
    return onnx_encoder.OnnxEncoder.load(folder)


def load_current(store: str, query_encoder_choice: str = "auto") -> LoadedIndex:
    """Load the promoted index, its id map and the student that built it, checked against each other; queries
    are encoded as :func:`query_encoder` chooses."""
    import faiss

    pointer, etag = current_pointer(store)
    recorded = _recorded_checksums(store, pointer)
    body = storage.read_bytes(pointer.index, sha256=recorded[pointer.index])
    try:
        index = faiss.deserialize_index(np.frombuffer(body, dtype=np.uint8))
    except RuntimeError as exc:  # faiss's reader refuses what is not an index it wrote
        raise IndexBuildError(f"{pointer.index}: not a FAISS index ({str(exc).strip()[-200:]})") from None
    ids = storage.read_parquet(pointer.ids, columns=["sentence_id", "text"], sha256=recorded[pointer.ids])
    with tempfile.TemporaryDirectory() as scratch:
        encoder = query_encoder(student.fetch_exported(store, pointer.model_run, Path(scratch)), query_encoder_choice)
    if encoder.dim != index.d:
        raise IndexBuildError(f"{pointer.index}: index dimension {index.d} differs from the model's {encoder.dim}")
    if ids.num_rows != index.ntotal:
        raise IndexBuildError(f"{pointer.ids}: {ids.num_rows} ids for the {index.ntotal} vectors of {pointer.index}")
    sentence_ids, texts = ids.column("sentence_id").to_pylist(), ids.column("text").to_pylist()
    return LoadedIndex(store, pointer, etag, encoder, index, sentence_ids, texts, time.time())
