"""Build index: encode the retrieval corpus with a distilled student into FAISS index segments, publish the
version, promote it.

The student is a published distill run (its exported sentence-transformers folder). An index version is a list
of segments searched together (:mod:`tasks.ml.segments`): it keeps every segment of the name's previous version
whose partitions are unchanged and that the same student built with the same settings, encodes only the
partitions none covers (each current ``sentences`` shard into the ``student_embeddings`` dataset) into one new
segment, then merges segments by tiers, from their stored embeddings. A day's new partition costs its own
encoding; a new student (a new name, or a new version under one) encodes everything, once.

Each segment's L2-normalised vectors go into a FAISS inner-product index (cosine similarity) of the type the
config names, or one chosen by the segment's size: exact ``flat`` up to 100k vectors, ``hnsw`` up to 5M,
``ivf_pq`` beyond (its candidates re-ranked on the full vectors unless ``refine`` says otherwise); ``ivf_flat``
on request; ``sq8`` stores int8 codes instead of float32. An approximate index's search breadth (IVF
``nprobe``, HNSW ``efSearch``) is doubled from its configured value until recall@10 against exact search
reaches ``target_recall``, on the segment's last rows held out of it while it is tuned (then added), or, with
lossy codes, stops rising; the value found is saved in the index. A segment that recalls less than
``min_recall`` fails the run before anything is published. The manifest records, per segment built, its build
time (tuning included), bytes, search breadth, queries/s at batch 1 and 64 and held-out recall@10.

The segments, their table (``segments.json``) and embeddings are published under ``indexes/<name>/<run id>/``
(a later build under the same name never touches them), then the manifest (listing every file of every
segment the version keeps, so gc keeps them; and its kept version); only then does ``indexes/current.json``
move, by compare-and-swap against the version read before the build, so concurrent rebuilds cannot leave it
naming a missing or partial index: one wins, the other fails with :class:`PromotionConflict`.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core import catalog, finite, manifest, parquet_shards, promoted, promotion, sentences, spaces, storage, uris
from tasks.core.catalog import Dataset, Pointer, Stage
from tasks.core.progress import Progress, format_bytes, format_duration
from tasks.ml import segments, student, vector_index
from tasks.ml.segments import Segment
from tasks.ml.vector_index import IndexBuildError, build_tuned
from tasks.stages.params import BuildIndexParams

_REFINE = {"none": "", "sq8": ",Refine(SQ8)", "flat": ",RFlat"}  # factory suffix of each IVF-PQ re-rank
INDEX_FILE = "index.faiss"
# The params that do not change what a segment holds: which partitions and student, the names, promotion, merging,
# the recall gate and the encode batch. Every other param, one added later included, is taken to change it (fail
# safe): a segment built with another value of it is not kept.
NOT_SEGMENT_SETTINGS = frozenset(
    {"store", "model_run", "partitions", "name", "promote", "merge_fanout", "min_recall", "batch_size"}
)

log = logging.getLogger(__name__)


class PromotionConflict(IndexBuildError):
    """Another rebuild moved the current pointer first; this index was published but not promoted."""


class RecallTooLow(IndexBuildError):
    """A segment recalls less than ``min_recall``: nothing is published or promoted."""


EXACT_MAX_ROWS = 100_000  # auto: an exact (flat) index up to this many vectors
HNSW_MAX_ROWS = 5_000_000  # auto: HNSW up to this many (measured to reach recall 0.95 there: bench/scale.py)


def choose_type(requested: str, rows: int) -> str:
    """``requested``, or for ``auto``: exact search up to :data:`EXACT_MAX_ROWS`, HNSW up to
    :data:`HNSW_MAX_ROWS`, IVF-PQ (its candidates re-ranked, by default on the full vectors) beyond."""
    if requested != "auto":
        return requested
    return "flat" if rows <= EXACT_MAX_ROWS else "hnsw" if rows <= HNSW_MAX_ROWS else "ivf_pq"


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
    """Encode the partitions no kept segment covers, merge, publish the version, then promote it by
    compare-and-swap."""
    params, distilled = _student_run(params)
    staged = _corpus_shards(params)
    name = params.name or distilled.key
    distill_uri = distilled.version_uri(params.store)  # the run as read now: a later one under its name changes nothing
    stage_run = manifest.StageRun(
        stage=Stage.BUILD_INDEX,
        key=name,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[
            manifest.Input(distill_uri, distilled.fingerprint),
            *(o.as_input() for s in staged.values() for o in s),
        ],
    )
    seen_etag = promoted.pointer_etag(params.store, Pointer.INDEX)
    if skipped := stage_run.skip_result(force):
        if params.promote and skipped.manifest is not None:
            _settle(params.store, skipped.manifest)
        return skipped
    builder = _Builder(params, stage_run, distilled, progress, force)
    try:
        listed, kept = builder.version(staged, distill_uri)
        stage_run.stats = _version_stats(listed, kept, builder.rows_encoded)
        if params.promote:
            stage_run.stats |= promotion.Promotion(seen_etag).as_stats()
        result = _published(stage_run, builder.prefix, listed)
    except BaseException:
        _discard(stage_run)  # a failed or refused build leaves nothing no manifest lists
        raise
    assert result.manifest is not None
    if result.manifest.run_id != stage_run.run_id:  # a concurrent identical build published first: its version stands
        _discard(stage_run)
    if params.promote:
        promote(params.store, result.manifest, seen_etag)
    return result


def _published(stage_run: manifest.StageRun, prefix: str, listed: list[Segment]) -> manifest.StageResult:
    """Write the version's segment table under ``prefix`` and publish its manifest, listing every segment's files."""
    for segment in segments.ordered(listed):
        stage_run.outputs.extend(segment.outputs)
    table = segments.table_bytes(stage_run.store, listed[0].dim, listed)
    stage_run.write_output(storage.join(prefix, segments.TABLE_FILE), table)
    return stage_run.publish()


def _discard(stage_run: manifest.StageRun) -> None:
    """Delete what a build whose version was not published wrote: its run folder (no other run writes there) and the
    kept version of its manifest, if written; a delete that fails is left to gc, logged."""
    prefix = catalog.index_prefix(stage_run.store, stage_run.key, stage_run.run_id)
    version = catalog.manifest_version_uri(stage_run.store, Stage.BUILD_INDEX, stage_run.key, stage_run.run_id)
    try:
        written = [*storage.list_uris(prefix), *([version] if storage.exists(version) else [])]
        for uri in written:
            storage.delete(uri)
    except storage.StorageError as exc:
        log.warning("build_index %s: %s not cleaned up (%s); gc removes it", stage_run.key, uris.redact(prefix), exc)
        return
    if written:
        log.info("build_index %s: removed the %d object(s) of its unpublished build", stage_run.key, len(written))


def _student_run(params: BuildIndexParams) -> tuple[BuildIndexParams, manifest.Manifest]:
    """The distill run whose student encodes the corpus: ``model_run``'s latest, or, when none is named, the
    promoted model's (the version its pointer names); ``params`` with that run's name."""
    if params.model_run is not None:
        distilled = manifest.read(params.store, Stage.DISTILL, params.model_run)
        if distilled is None:
            raise IndexBuildError(f"{params.store}: no published distill run {params.model_run!r}")
        return params, distilled
    current = promoted.model(params.store)
    if current is None:
        raise IndexBuildError(f"{params.store}: no promoted model ({Pointer.MODEL}); validate one or pass model_run")
    return params.model_copy(update={"model_run": current.model_run}), current.distilled


def _corpus_shards(params: BuildIndexParams) -> dict[str, list[manifest.Output]]:
    """Each wanted partition (ISO date) that holds staged sentences, and its shards as staging published them."""
    days = sorted(set(params.partitions or sentences.staged_days(params.store)))
    staged = {day.isoformat(): sentences.published(params.store, day, (Stage.STAGE_CORPUS,)) for day in days}
    found = {day: shards for day, shards in staged.items() if shards}
    if not found:
        raise IndexBuildError(f"{params.store}: no staged sentences for partitions {days}")
    return found


def _kept_segments(store: str, name: str, wanted: dict[str, str], model: str, settings: str) -> list[Segment]:
    """The segments of the version last published under ``name`` that the new one keeps, and a log line that
    says how much is left to encode (none before the first version, or one built before segments); a previous
    version that does not read is rebuilt whole, with a warning."""
    try:
        published = manifest.read(store, Stage.BUILD_INDEX, name)
        table = next((o for o in published.outputs if o.name == segments.TABLE_FILE), None) if published else None
        previous = [] if table is None else segments.read_table(store, table.uri, table.sha256)[1]
    except (manifest.ManifestError, segments.SegmentTableError, storage.StorageError) as exc:
        log.warning("build_index %s: the previous version does not read (%s); every partition is encoded", name, exc)
        previous = []
    kept = [s for s in previous if s.keeps(wanted, model, settings) and _intact(name, s)]
    covered = sum(len(s.partitions) for s in kept)
    log.info(
        "build_index %s: %d partition(s) wanted: %d in %d kept segment(s), %d to encode",
        name,
        len(wanted),
        covered,
        len(kept),
        len(wanted) - covered,
    )
    return kept


def segment_settings(params: BuildIndexParams) -> str:
    """The fingerprint of the settings that change what a segment holds: every param but
    :data:`NOT_SEGMENT_SETTINGS`."""
    return segments.settings_fingerprint(params.model_dump(mode="json", exclude=set(NOT_SEGMENT_SETTINGS)))


def _intact(name: str, segment: Segment) -> bool:
    """Whether every file of a segment the previous version lists is there as recorded (one HEAD each); a segment
    with a file missing or changed is not kept (its partitions are encoded again), with a warning naming it."""
    for output in segment.outputs:
        if (damage := output.damage()) is not None:
            log.warning("build_index %s: %s %s; segment %s is encoded again", name, output.uri, damage, segment.name)
            return False
    return True


def _version_stats(listed: list[Segment], kept: list[Segment], rows_encoded: int) -> dict[str, Any]:
    """The version's record: its size, the rows this run encoded, the lowest segment recall, each segment built."""
    return {
        "rows": sum(s.rows for s in listed),
        "dim": listed[0].dim,
        "bytes": sum(s.index.bytes for s in listed),
        "segments": len(listed),
        "segments_kept": sum(s in kept for s in listed),
        "rows_encoded": rows_encoded,
        "recall_at_10": min(s.stats["recall_at_10"] for s in listed),
        "built": [{"segment": s.name, **s.stats} for s in segments.ordered(listed) if s not in kept],
    }


@dataclass
class _Builder:
    """Builds the segments of one run's version under its folder (``indexes/<name>/<run id>/``)."""

    params: BuildIndexParams
    stage_run: manifest.StageRun
    distilled: manifest.Manifest
    progress: bool
    force: bool  # a forced run keeps no segment: it encodes every partition again
    rows_encoded: int = 0
    space: str | None = None  # the student's embedding space, stamped on the segments it encodes

    @property
    def prefix(self) -> str:
        return catalog.index_prefix(self.params.store, self.stage_run.key, self.stage_run.run_id)

    def version(
        self, staged: dict[str, list[manifest.Output]], distill_uri: str
    ) -> tuple[list[Segment], list[Segment]]:
        """The segments of the new version (the previous version's it keeps, one over the partitions none covers,
        then merged by tiers), and those it kept."""
        wanted = {day: segments.partition_fingerprint(shards) for day, shards in staged.items()}
        model = catalog.store_key(self.params.store, distill_uri) or distill_uri
        self.space = spaces.of(self.params.store, self.distilled)
        settings = segment_settings(self.params)
        kept = [] if self.force else _kept_segments(self.params.store, self.stage_run.key, wanted, model, settings)
        covered = {day for segment in kept for day in segment.partitions}
        pending = {day: staged[day] for day in wanted if day not in covered}
        listed = kept + ([self.encoded_segment(pending, wanted, model, settings)] if pending else [])
        while group := segments.next_merge(listed, self.params.merge_fanout):
            listed = [s for s in listed if s not in group] + [self.merged_segment(group)]
        return listed, kept

    def encoded_segment(
        self, pending: dict[str, list[manifest.Output]], wanted: dict[str, str], model: str, settings: str
    ) -> Segment:
        """Encode ``pending``'s shards with the student (publishing their embeddings) into a new segment. Bad
        index settings and altered corpus shards fail before the first write."""
        from tasks.ml.encoder import SentenceEncoder

        shards = [s for day in sorted(pending) for s in pending[day]]
        with self.stage_run.phase("read"):
            corpus = [
                (s.uri, storage.read_parquet(s.uri, columns=["sentence_id", "text"], sha256=s.sha256)) for s in shards
            ]
        rows = sum(table.num_rows for _, table in corpus)
        partitions = {day: wanted[day] for day in pending}
        with tempfile.TemporaryDirectory() as scratch, self.stage_run.phase("encode"):
            encoder = SentenceEncoder.load(str(student.fetch_published(self.distilled, Path(scratch))))
            chosen = _chosen(self.params, rows, encoder.dim)
            ids = pa.concat_tables([table for _, table in corpus])
            with Progress(f"build_index {self.stage_run.key} encode", rows, bar=self.progress, logger=log) as reporter:
                vectors = _encoded(encoder, self.params, ids, reporter)
        blocks = np.split(vectors, np.cumsum([table.num_rows for _, table in corpus])[:-1])
        for (shard_uri, _), block in zip(corpus, blocks, strict=True):
            finite.require_finite(block, f"{shard_uri} encoded by {self.params.model_run}", "embedding value")
        embeddings = [
            _written_embeddings(self.prefix, self.params, shard_uri, table, block)
            for (shard_uri, table), block in zip(corpus, blocks, strict=True)
        ]
        self.rows_encoded += rows
        return self._segment(partitions, model, settings, vectors, ids, embeddings, chosen)

    def merged_segment(self, group: list[Segment]) -> Segment:
        """One segment over ``group``'s partitions, built from their published embeddings and id maps."""
        with self.stage_run.phase("merge"):
            ids = pa.concat_tables(
                storage.read_parquet(s.ids.uri, columns=["sentence_id", "text"], sha256=s.ids.sha256) for s in group
            )
            embeddings = [e for s in group for e in s.embeddings]
            vectors = np.concatenate(
                [
                    parquet_shards.vectors(storage.read_parquet(e.uri, sha256=e.sha256), "embedding", e.uri)
                    for e in embeddings
                ]
            )
        if len(vectors) != ids.num_rows:
            raise IndexBuildError(f"{group[0].ids.uri}: {ids.num_rows} ids for {len(vectors)} stored embeddings")
        log.info("build_index %s: merging %d segments (%d vectors)", self.stage_run.key, len(group), len(vectors))
        partitions = {day: f for s in group for day, f in s.partitions.items()}
        chosen = _chosen(self.params, len(vectors), vectors.shape[1])
        merged = self._segment(partitions, group[0].model, group[0].settings, vectors, ids, embeddings, chosen)
        merged = dataclasses.replace(merged, space=group[0].space)
        merged.stats["merged"] = len(group)
        return merged

    def _segment(
        self,
        partitions: dict[str, str],
        model: str,
        settings: str,
        vectors: np.ndarray,
        ids: pa.Table,
        embeddings: list[manifest.Output],
        chosen: tuple[str, str, str | None],
    ) -> Segment:
        """Build, measure and publish a segment's index and id map; :class:`RecallTooLow` below ``min_recall``."""
        import faiss

        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        faiss.normalize_L2(vectors)
        days = sorted(partitions)
        folder = storage.join(self.prefix, "segments", days[0] if len(days) == 1 else f"{days[0]}_{days[-1]}")
        body, stats = _built_index(self.stage_run, self.params, vectors, *chosen[:2])
        if chosen[2] is not None:
            stats["fallback"] = chosen[2]
        index = manifest.Output(storage.join(folder, INDEX_FILE), manifest.sha256_hex(body), len(vectors), len(body))
        storage.write_bytes(index.uri, body)
        id_map = pa.table(
            {
                "faiss_id": pa.array(np.arange(len(vectors)), pa.int64()),
                "sentence_id": ids.column("sentence_id"),
                "text": ids.column("text"),
            }
        )
        written = _output(parquet_shards.write_shard(folder, "ids", id_map, Dataset.INDEX_IDS))
        return Segment(partitions, model, settings, index, written, tuple(embeddings), stats, self.space)


def _chosen(params: BuildIndexParams, rows: int, dim: int) -> tuple[str, str, str | None]:
    """(index type, factory string, why it is exact search instead of the type asked for, or None) for a segment of
    ``rows`` vectors of ``dim``; bad settings raise here. A segment too small to train the quantiser of the type asked
    for (IVF: as many vectors as lists; PQ: ``2 ** pq_bits`` a sub-quantiser) gets exact search, said in the log."""
    index_type = choose_type(params.index_type, rows)
    factory_string(index_type, rows, dim, params)  # bad settings are refused whatever the segment's size
    needed = _training_rows_needed(index_type, rows, params)
    trained = rows - vector_index.held_out(rows)
    if trained >= needed:
        return index_type, factory_string(index_type, rows, dim, params), None
    why = (
        f"{index_type} needs {needed} vectors to train its quantiser and this segment trains on {trained}: "
        "exact search instead"
    )
    log.warning("build_index: %s", why)
    return "flat", factory_string("flat", rows, dim, params), why


def _training_rows_needed(index_type: str, rows: int, params: BuildIndexParams) -> int:
    """The fewest vectors that train ``index_type``'s quantiser for a segment of ``rows``: an IVF's lists, and a
    PQ's ``2 ** pq_bits`` codes; 0 for an index that trains nothing."""
    nlist = params.nlist or max(1, int(4 * np.sqrt(rows)))
    return {"ivf_flat": nlist, "ivf_pq": max(nlist, 2**params.pq_bits)}.get(index_type, 0)


def _encoded(encoder: Any, params: BuildIndexParams, ids: pa.Table, reporter: Progress) -> np.ndarray:
    """The pending shards' texts encoded by the student in one pass: batches of similar length across shards."""
    texts = ids.column("text").to_pylist()
    return encoder.encode(texts, batch_size=params.batch_size, dtype=params.dtype, on_rows=reporter.update)


def _written_embeddings(
    prefix: str, params: BuildIndexParams, shard_uri: str, table: pa.Table, vectors: np.ndarray
) -> manifest.Output:
    """Publish the student embeddings of one corpus shard under ``prefix``."""
    embeddings = pa.table(
        {
            "sentence_id": table.column("sentence_id"),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1]),
        }
    )
    folder = storage.join(prefix, Dataset.STUDENT_EMBEDDINGS)
    stem, dim = catalog.derived_stem(shard_uri), vectors.shape[1]
    shard = parquet_shards.write_shard(folder, stem, embeddings, Dataset.STUDENT_EMBEDDINGS, dim, params.model_run)
    return _output(shard)


def _built_index(
    stage_run: manifest.StageRun, params: BuildIndexParams, vectors: np.ndarray, index_type: str, factory: str
) -> tuple[bytes, dict[str, Any]]:
    """The serialized index of ``factory`` over ``vectors``, and its stats; refused below ``min_recall``."""
    import faiss

    key = stage_run.key
    log.info("build_index %s: a %s index (%s) over %d vectors", key, index_type, factory, len(vectors))
    with stage_run.phase("build"):
        start = time.perf_counter()
        index, measured = build_tuned(
            vectors, factory, params.nprobe, params.refine_k_factor, params.hnsw_ef_search, params.target_recall
        )
        build_seconds = time.perf_counter() - start
    body = faiss.serialize_index(index).tobytes()
    log.info(
        "build_index %s: built %s over %d vectors of dim %d in %s, %s; %s",
        key,
        factory,
        len(vectors),
        vectors.shape[1],
        format_duration(build_seconds),
        format_bytes(len(body)),
        ", ".join(f"{name} {value}" for name, value in measured.items()),
    )
    if measured["recall_at_10"] < params.min_recall:
        raise RecallTooLow(
            f"build_index {key}: {factory} over {len(vectors)} vectors recalls {measured['recall_at_10']} at 10, "
            f"below min_recall {params.min_recall}; nothing published or promoted"
        )
    return body, {
        "index_type": index_type,
        "factory": factory,
        "rows": len(vectors),
        "dim": int(vectors.shape[1]),
        "bytes": len(body),
        "build_seconds": round(build_seconds, 3),
        **measured,
    }


def _output(shard: parquet_shards.Shard) -> manifest.Output:
    return manifest.Output(shard.uri, shard.sha256, shard.rows, shard.bytes, shard.contract, shard.schema_version)


def _settle(store: str, published: manifest.Manifest) -> None:
    """On a rerun of a published build: complete the promotion it did not finish, or say where it stands."""
    unfinished, etag = promotion.resume(store, Pointer.INDEX, published, lambda p: p.run_id == published.run_id)
    if unfinished:
        promote(store, published, etag)


def served_objects(published: manifest.Manifest) -> tuple[str, str | None]:
    """What a pointer to ``published`` names: its segment table (and no id map: each segment has its own), or,
    for a build from before segments, its index and id map."""
    table = next((o.uri for o in published.outputs if o.name == segments.TABLE_FILE), None)
    if table is not None:
        return table, None
    return published.output_named(INDEX_FILE).uri, published.outputs_of(Dataset.INDEX_IDS)[0].uri


def promote(store: str, published: manifest.Manifest, seen_etag: str | None) -> catalog.IndexPointer:
    """Move ``indexes/current.json`` to a published index, by compare-and-swap against ``seen_etag``."""
    index_uri, ids_uri = served_objects(published)
    searched = [o.uri for o in published.outputs if o.contract != Dataset.STUDENT_EMBEDDINGS]
    for uri in searched:
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
        moved = promotion.move(store, pointer, seen_etag, published)
    except catalog.PointerMoved:
        raise PromotionConflict(
            f"{catalog.pointer_uri(store, Pointer.INDEX)}: moved by another rebuild since this "
            f"one started; {index_uri} is published but not promoted"
        ) from None
    if moved:
        where = catalog.pointer_uri(store, Pointer.INDEX)
        log.info("build_index %s: promoted; %s names %s", published.key, uris.redact(where), uris.redact(index_uri))
    return pointer
