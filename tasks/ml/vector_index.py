"""A FAISS index over sentence embeddings: building it, tuning its search breadth to a recall, measuring it,
and loading the promoted one to search.

The vectors are L2-normalised, so inner product is cosine similarity. An approximate index's search breadth
(IVF ``nprobe``, HNSW ``efSearch``) is doubled until recall@10 against exact search reaches the target, on
queries held out of the index while it is tuned (the last rows; added afterwards), so the recall is that of
queries it has not seen; with lossy codes, also until it stops rising. The promoted index
(``indexes/current.json``) loads only with the id map and student it names, each checked against its build
manifest's checksums and kept inside the store. The build-index stage (:mod:`tasks.stages.build_index`) and
the search service (:mod:`tasks.serve`) both use this module.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core import catalog, manifest, promoted, spaces, storage
from tasks.core.catalog import Pointer
from tasks.ml import segments, student
from tasks.ml.hits import Hit

QUERY_SAMPLE = 200
HELD_OUT = 1000  # at most this many rows (a tenth of an index of 100 or more) are held out as queries while tuning
MAX_EF_SEARCH = 1024  # the widest HNSW search tuning tries
MIN_RECALL_GAIN = 0.005  # a doubled search breadth that recalls less than this more is undone, and tuning stops


class IndexBuildError(ValueError):
    """The index cannot be built, promoted or loaded as asked; the message names the input."""


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


def held_out(rows: int) -> int:
    """The rows of an index of ``rows`` held out of its training and tuning (:func:`build_tuned`)."""
    return min(HELD_OUT, rows // 10) if rows >= 100 else 0


def build_tuned(vectors: np.ndarray, factory: str, nprobe: int, k_factor: float, ef_search: int, target: float):
    """:func:`build` over ``vectors``, its search breadth tuned to ``target`` (:func:`tune_search`) and measured
    (:func:`measure`) on the last rows held out of it (:data:`HELD_OUT`), which are added afterwards; an index
    under 100 vectors is tuned on its own rows. (index, measures)."""
    held = held_out(len(vectors))
    index = build(vectors[: len(vectors) - held], factory, nprobe, k_factor, ef_search)
    sample = RecallSample.held_out(vectors, held) if held else RecallSample.of(vectors)
    measured = {**tune_search(index, sample, target), **measure(index, sample)}
    if held:
        index.add(vectors[len(vectors) - held :])
    return index, measured


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

    @classmethod
    def held_out(cls, vectors: np.ndarray, count: int, k: int = 10) -> RecallSample:
        """The last ``count`` rows as queries, and their exact ``k`` nearest neighbours among the rows before."""
        import faiss

        queries = np.ascontiguousarray(vectors[len(vectors) - count :])
        _, truth = faiss.knn(queries, vectors[: len(vectors) - count], k, faiss.METRIC_INNER_PRODUCT)
        return cls(queries, np.full(count, -1), [[int(n) for n in row] for row in truth], k)

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


def _lossless(index) -> bool:
    """Whether ``index`` keeps the full vectors it compares (HNSW or IVF over flat codes): only the search
    breadth bounds its recall."""
    import faiss

    return isinstance(index, faiss.IndexHNSWFlat | faiss.IndexIVFFlat)


def tune_search(index, sample: RecallSample, target: float) -> dict[str, int]:
    """Double ``index``'s search breadth from its current value until ``sample`` reaches ``target`` recall, the
    breadth its limit (every list; :data:`MAX_EF_SEARCH`), or, with lossy codes, a doubling gains less than
    :data:`MIN_RECALL_GAIN` (undone: the codes, not the breadth, bound the recall then); the breadth kept:
    ``{"nprobe": n}`` or ``{"ef_search": n}``, empty for an exact index."""
    knob = _breadth_knob(index)
    if knob is None:
        return {}
    name, owner, attribute, limit = knob
    plateaus = not _lossless(index)
    recall = sample.recall(index)
    while recall < target and getattr(owner, attribute) < limit:
        before = getattr(owner, attribute)
        setattr(owner, attribute, min(2 * before, limit))
        widened = sample.recall(index)
        if plateaus and widened - recall < MIN_RECALL_GAIN:
            setattr(owner, attribute, before)
            break
        recall = widened
    return {name: int(getattr(owner, attribute))}


def measure(index, sample: RecallSample) -> dict[str, float]:
    """Queries/s at batch 1 and 64 (on the first :data:`QUERY_SAMPLE` queries) and recall@k against exact
    search, on ``sample``."""
    queries = sample.queries[:QUERY_SAMPLE]
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


def search(store: str, query: str, k: int = 5) -> list[Hit]:
    """The ``k`` nearest corpus sentences to ``query`` in the current index."""
    return load_current(store).search([query], k)[0]


@dataclass(frozen=True)
class LoadedSegment:
    """One segment in memory: its FAISS index and id map, known by the index's URI and checksum."""

    uri: str
    sha256: str
    ids_uri: str
    index: Any
    sentence_ids: list[str]
    texts: list[str]


@dataclass(frozen=True)
class LoadedIndex:
    """The promoted index in memory: the student that encodes queries, the FAISS index (its segments searched
    together), its id map, and the pointer (and its etag) it was loaded from. Immutable once loaded: a service
    swaps whole instances."""

    store: str
    pointer: catalog.IndexPointer
    etag: str | None
    encoder: Any
    index: Any
    sentence_ids: list[str]
    texts: list[str]
    loaded_at: float
    segments: tuple[LoadedSegment, ...] = ()
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

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
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
                Hit(rank + 1, round(float(s), 4), self.sentence_ids[r], self.texts[r])
                for rank, (s, r) in enumerate(zip(row_scores, row_ids, strict=True))
                if r >= 0
            ]
            for row_scores, row_ids in zip(scores, rows, strict=True)
        ]


def current_pointer(store: str) -> tuple[catalog.IndexPointer, str | None]:
    """The promoted index pointer and its etag, every object it names checked to exist (and, by
    :func:`tasks.core.promoted.index`, to lie inside ``store``)."""
    current = promoted.index(store)
    where = catalog.pointer_uri(store, Pointer.INDEX)
    if current is None:
        raise IndexBuildError(f"{where}: no index promoted yet; run build-index")
    pointer = current.pointer
    for uri in (u for u in (pointer.index, pointer.ids, pointer.manifest) if u is not None):
        if not storage.exists(uri):
            raise IndexBuildError(f"{where} names {uri}, which does not exist")
    return pointer, current.etag


def _recorded_checksums(store: str, pointer: catalog.IndexPointer) -> dict[str, str]:
    """The sha256 the pointer's build manifest records for the segment table (or index and id map) it names; a
    pointer naming an object its manifest does not list is refused."""
    published = manifest.parse(pointer.manifest, storage.read_bytes(pointer.manifest), store)
    recorded = {output.uri: output.sha256 for output in published.outputs}
    for uri in (u for u in (pointer.index, pointer.ids) if u is not None):
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


def load_current(store: str, query_encoder_choice: str = "auto", reuse: LoadedIndex | None = None) -> LoadedIndex:
    """Load the promoted index (every segment its table lists, searched together), its id maps and the student
    that built it, checked against each other; queries are encoded as :func:`query_encoder` chooses. Segments
    and a student that ``reuse`` (the index served until now) already holds, the same objects, are not read
    again: a version that adds a day's segment loads that segment."""
    pointer, etag = current_pointer(store)
    recorded = _recorded_checksums(store, pointer)
    held = {(s.uri, s.sha256): s for s in reuse.segments} if reuse is not None else {}
    listed = _listed(store, pointer, recorded)
    parts = [held.get((uri, sha)) or _read_segment(uri, sha, ids, ids_sha) for uri, sha, ids, ids_sha in listed]
    if reuse is not None and pointer.model is not None and reuse.pointer.model == pointer.model:
        encoder = reuse.encoder
    else:
        with tempfile.TemporaryDirectory() as scratch:
            encoder = query_encoder(
                student.fetch_published(_served(store, pointer), Path(scratch)), query_encoder_choice
            )
    for part in parts:
        if encoder.dim != part.index.d:
            raise IndexBuildError(f"{part.uri}: index dimension {part.index.d} differs from the model's {encoder.dim}")
        if len(part.sentence_ids) != part.index.ntotal:
            raise IndexBuildError(
                f"{part.ids_uri}: {len(part.sentence_ids)} ids for the {part.index.ntotal} vectors of {part.uri}"
            )
    index = parts[0].index if len(parts) == 1 else _searched_together(parts, encoder.dim)
    sentence_ids = [i for part in parts for i in part.sentence_ids]
    texts = [t for part in parts for t in part.texts]
    return LoadedIndex(store, pointer, etag, encoder, index, sentence_ids, texts, time.time(), tuple(parts))


def _served(store: str, pointer: catalog.IndexPointer) -> manifest.Manifest:
    """The distill manifest version whose student encoded the index and encodes its queries."""
    return manifest.read_at(store, catalog.distill_manifest_uri(store, pointer))


def _listed(store: str, pointer: catalog.IndexPointer, recorded: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(index URI, sha256, id map URI, sha256) of each segment the pointer's table lists, in search order (each in
    the embedding space of the student that encodes the queries: :func:`require_one_space`); the one index and id
    map of a pointer from before segments."""
    if pointer.ids is not None:
        return [(pointer.index, recorded[pointer.index], pointer.ids, recorded[pointer.ids])]
    _, listed = segments.read_table(store, pointer.index, recorded[pointer.index])
    require_one_space(store, listed, _served(store, pointer))
    return [(s.index.uri, s.index.sha256, s.ids.uri, s.ids.sha256) for s in segments.ordered(listed)]


def require_one_space(store: str, listed: list[segments.Segment], served: manifest.Manifest) -> None:
    """Refuse (an :class:`IndexBuildError` naming the segment) a version holding a segment whose vectors are in
    another embedding space than the queries of ``served``'s student (:mod:`tasks.core.spaces`): its neighbours
    would be meaningless. A segment from before spaces were stamped is in its own student's space."""
    space, model = spaces.of(store, served), catalog.store_key(store, served.version_uri(store))
    for segment in listed:
        found = segment.space or (space if segment.model == model else f"model:{segment.model}")
        if found != space:
            raise IndexBuildError(
                f"{segment.index.uri}: its vectors are in the embedding space {found}, the queries' student "
                f"{served.key} encodes into {space}: mixed spaces are refused"
            )


def _read_segment(index_uri: str, index_sha256: str, ids_uri: str, ids_sha256: str) -> LoadedSegment:
    """A segment's index and id map, each verified against its checksum."""
    import faiss

    body = storage.read_bytes(index_uri, sha256=index_sha256)
    try:
        index = faiss.deserialize_index(np.frombuffer(body, dtype=np.uint8))
    except RuntimeError as exc:  # faiss's reader refuses what is not an index it wrote
        raise IndexBuildError(f"{index_uri}: not a FAISS index ({str(exc).strip()[-200:]})") from None
    ids = storage.read_parquet(ids_uri, columns=["sentence_id", "text"], sha256=ids_sha256)
    sentence_ids, texts = ids.column("sentence_id").to_pylist(), ids.column("text").to_pylist()
    return LoadedSegment(index_uri, index_sha256, ids_uri, index, sentence_ids, texts)


def _searched_together(parts: list[LoadedSegment], dim: int) -> Any:
    """One FAISS index over the segments: each searched (with its own breadth), the hits merged by score, a
    segment's rows numbered after those of the segments before it."""
    import faiss

    together = faiss.IndexShards(dim, False, True)  # not threaded: a request's search runs in its own thread
    for part in parts:
        together.add_shard(part.index)
    return together
