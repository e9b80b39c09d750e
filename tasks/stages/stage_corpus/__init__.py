"""Stage corpus: raw sentence files -> the ``sentences`` dataset, one ``ingest_date`` partition.

Reads plain text (one sentence per line), JSONL, CSV, TSV or Parquet, each optionally gzipped, as a
stream (:mod:`.readers`), ``batch_rows`` records at a time; normalises each batch with polars (Unicode NFC,
control characters to spaces, collapsed whitespace; :mod:`.normalise`), drops empty and over-long lines and
spills the rest to local disk (:mod:`.spill`), so memory follows the batch and the shard size, not the
input. It then de-duplicates by the sentence id (a hash of the normalised text) within the input and against
every partition already staged, through the staged-id index (:mod:`tasks.core.staged_ids`), a sixteenth of
the ids (a bucket) at a time beside a byte a row of the input; writes
``sentences/ingest_date=D/part-NNNNN-<sha8>.parquet`` shards and the partition's manifest, which lists the
shards and counts the dropped rows by reason; and records the partition's ids in the index by
compare-and-swap. A run that loses that compare-and-swap to a concurrent staging of another date loads
the index again and publishes again, so a sentence staged by both ends up in one partition only.
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tasks.core import catalog, manifest, sentences, staged_ids, storage
from tasks.core.catalog import Stage
from tasks.core.progress import Progress
from tasks.core.sources import CorpusInputError, resolve_source, source_uris
from tasks.stages.params import StageCorpusParams
from tasks.stages.stage_corpus import normalise, readers
from tasks.stages.stage_corpus.id_hasher import IdHasher
from tasks.stages.stage_corpus.spill import Spill

__all__ = ["DROP_REASONS", "CorpusInputError", "StageCorpusParams", "run"]

log = logging.getLogger(__name__)
DROP_REASONS = ("empty", "too_long", "duplicate_in_input", "already_staged")
_ATTEMPTS = 8  # index compare-and-swaps lost to concurrent stagings before giving up


def run(params: StageCorpusParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Stage ``params.source`` into the ``sentences`` partition of ``params.ingest_date``."""
    stage_run = manifest.StageRun(
        stage=Stage.STAGE_CORPUS,
        key=catalog.partition_key(params.ingest_date),
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[
            _fingerprint(uri, params.max_input_bytes)
            for uri in source_uris(resolve_source(params.source, params.ingest_date))
        ],
    )
    if skipped := stage_run.skip_result(force):
        if skipped.manifest is not None and staged_ids.record_if_missing(params.store, stage_run.key, skipped.manifest):
            log.info("%s: recorded in the staged-id index, which its run had not done", stage_run.key)
        return skipped
    with tempfile.TemporaryDirectory(prefix="hpd-stage-corpus-") as folder, closing(Spill(Path(folder))) as spill:
        with stage_run.phase("read_normalise"):
            dropped, records_read = _read(params, stage_run.inputs, spill, progress)
        stage_run.inputs = [replace(i, rows=records_read[i.uri]) for i in stage_run.inputs]
        with stage_run.phase("dedup_in_input"):
            first = _first_in_input(spill)
        dropped["duplicate_in_input"] = spill.rows - int(first.sum())
        stats = {"rows_read": sum(records_read.values()), "dropped": dropped}
        return _publish(stage_run, params, spill, first, stats)


def _fingerprint(uri: str, max_bytes: int) -> manifest.Input:
    """A source's size and sha256 (streamed), refused before reading when it is larger than ``max_bytes``."""
    if (size := storage.size(uri)) > max_bytes:
        raise CorpusInputError(f"{uri}: {size} bytes, more than max_input_bytes={max_bytes}")
    return manifest.Input(uri, storage.sha256_of(uri), None, size)


def _read(
    params: StageCorpusParams, sources: list[manifest.Input], spill: Spill, progress: bool
) -> tuple[Counter[str], dict[str, int]]:
    """Spill the normalised rows kept from the sources; the drop counts by reason, and how many records were
    read from each source (at most ``params.limit`` in all)."""
    dropped: Counter[str] = Counter()
    records_read: dict[str, int] = {}
    with IdHasher() as hasher:
        for source in sources:
            uri = source.uri
            remaining = None if params.limit is None else params.limit - sum(records_read.values())
            records_read[uri] = 0
            what = f"stage_corpus {uri.rsplit('/', 1)[-1]}"
            with (
                readers.opened(source, params.max_input_bytes) as stream,
                Progress(what, total=None, unit="records", bar=progress, logger=log) as reporter,
            ):
                batches = readers.batches(uri, stream, params, remaining)
                for height, (kept, counts) in _overlapped(batches, uri, params, hasher):
                    reporter.update(height)
                    records_read[uri] += height
                    dropped.update(counts)
                    spill.add(kept)
    return dropped, records_read


def _overlapped(
    batches: Iterator[pl.DataFrame], uri: str, params: StageCorpusParams, hasher: IdHasher
) -> Iterator[tuple[int, tuple[pl.DataFrame, Counter[str]]]]:
    """Each batch's height and kept rows, normalised in a second thread (its ids hashed by ``hasher``'s
    process) while the next batch is read (two batches at most in hand)."""
    with ThreadPoolExecutor(1, thread_name_prefix="hpd-normalise") as pool:
        pending: tuple[int, Future[tuple[pl.DataFrame, Counter[str]]]] | None = None
        for batch in batches:
            started = (batch.height, pool.submit(normalise.kept_rows, batch, uri, params.max_chars, hasher))
            if pending:
                yield pending[0], pending[1].result()
            pending = started
        if pending:
            yield pending[0], pending[1].result()


def _first_in_input(spill: Spill) -> np.ndarray:
    """Which rows hold the first occurrence of their id in the input (a bucket of ids at a time)."""
    first = np.zeros(spill.rows, dtype=bool)
    for _, ids in spill.buckets():
        first[ids.filter(pl.col("sentence_id").is_first_distinct())["position"].to_numpy()] = True
    return first


def _not_held(spill: Spill, first: np.ndarray, index: staged_ids.Index) -> np.ndarray:
    """``first`` less the rows whose id another partition holds (a bucket of ids at a time; every recorded
    bucket is read, verified, before anything is published)."""
    keep = first.copy()
    for bucket in staged_ids.BUCKETS:
        held, ids = index.ids(bucket), spill.bucket(bucket)
        found = ids.filter(pl.col("sentence_id").is_in(held.implode()))
        keep[found["position"].to_numpy()] = False
    return keep


def _publish(
    stage_run: manifest.StageRun, params: StageCorpusParams, spill: Spill, first: np.ndarray, stats: dict[str, Any]
) -> manifest.StageResult:
    """Drop the ids another partition holds, publish the partition, record it in the index; again from the
    index's new version while a concurrent staging records first."""
    for attempt in range(_ATTEMPTS):
        with stage_run.phase("drop_already_staged"):
            index = staged_ids.load(params.store, stage_run.key)
            keep = _not_held(spill, first, index)
        dropped = {**stats["dropped"], "already_staged": int(first.sum()) - int(keep.sum())}
        stage_run.stats = {**stats, "rows_written": int(keep.sum()), "dropped": {r: dropped[r] for r in DROP_REASONS}}
        if attempt:
            stage_run.outputs = []
            stage_run.previous()  # our own manifest of the attempt before: the next publish replaces it
        tables = (_table(rows, params) for rows in spill.shards(keep, params.shard_rows))
        result = sentences.publish_shards(stage_run, params.ingest_date, tables)
        if result.manifest.run_id != stage_run.run_id:
            return result  # a concurrent run of the same work published first; it records its own ids
        try:
            with stage_run.phase("record_staged_ids"):
                staged_ids.record(params.store, index, stage_run.key, result.manifest, partial(spill.ids, keep=keep))
            return result
        except storage.PreconditionFailed:
            log.info("%s: another staging recorded its ids first; de-duplicating again", stage_run.key)
    raise RuntimeError(f"{staged_ids.index_uri(params.store)}: {_ATTEMPTS} concurrent updates in a row; rerun")


def _table(rows: pl.DataFrame, params: StageCorpusParams) -> pa.Table:
    return sentences.table({name: rows[name].to_arrow() for name in rows.columns}, params.ingest_date)
