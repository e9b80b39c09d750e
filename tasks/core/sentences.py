"""The ``sentences`` dataset's shared ground: normalisation, sentence ids, rows, published shards.

Both the corpus staging and the augmentation stage write this dataset; every other stage reads it
through the shard lists in those stages' manifests.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core import catalog, contracts, manifest, parquet_shards
from tasks.core.catalog import Dataset, Stage

_WRITERS = 2  # shards encoded and written at a time: Parquet encoding and the write release the GIL
COLUMNS = ("sentence_id", "text", "source", "line", "parent_id", "aug_method", "aug_params")


# Control characters (C0, DEL, C1: NUL, BEL, ESC ...) become spaces, so no sentence carries one.
_CONTROL_TO_SPACE = {code: " " for code in (*range(0x20), *range(0x7F, 0xA0))}
_EPOCH = date(1970, 1, 1)  # date32 counts days from it


def normalise_text(text: str) -> str:
    """Unicode NFC, control characters replaced by spaces, whitespace runs collapsed to one space and the
    ends stripped."""
    return " ".join(unicodedata.normalize("NFC", text).translate(_CONTROL_TO_SPACE).split())


def sentence_id(text: str) -> str:
    """Stable content hash of a normalised sentence: blake2b-128, hex. Part of the data contract."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def hashed_below(sentence_ids: list[str], fraction: float, salt: str) -> np.ndarray:
    """Rows whose seeded hash of the sentence id falls below ``fraction``: a uniform, deterministic,
    order-free selection (samples, validation splits)."""
    if fraction >= 1.0:
        return np.ones(len(sentence_ids), dtype=bool)
    scale = float(1 << 64)
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(f"{salt}:{sid}".encode(), digest_size=8).digest(), "big") / scale < fraction
            for sid in sentence_ids
        ],
        dtype=bool,
    )


def table(rows: dict[str, Any], ingest_date: date) -> pa.Table:
    """A contract-checked ``sentences`` table from columns (lists or Arrow arrays; lineage columns may be
    absent)."""
    n = len(rows["sentence_id"])
    columns = {
        "sentence_id": _array(rows["sentence_id"], pa.string()),
        "text": _array(rows["text"], pa.string()),
        "source": _array(rows["source"], pa.string()),
        "line": _array(rows["line"], pa.int64()),
        "ingest_date": pa.array(np.full(n, (ingest_date - _EPOCH).days, np.int32)).view(pa.date32()),
    }
    for name in ("parent_id", "aug_method", "aug_params"):
        columns[name] = _array(rows[name], pa.string()) if name in rows else pa.nulls(n, pa.string())
    return contracts.load(Dataset.SENTENCES).conform(pa.table(columns))


def _array(values: Any, value_type: pa.DataType) -> Any:
    """A column as an Arrow array of ``value_type``: built from a list, or cast from an Arrow array."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.cast(value_type)
    return pa.array(values, value_type)


def publish_partition(
    stage_run: manifest.StageRun, ingest_date: date, table: pa.Table, shard_rows: int
) -> manifest.StageResult:
    """Write ``table`` as shards of ``shard_rows`` rows, then publish the run's manifest (:func:`publish_shards`)."""
    return publish_shards(
        stage_run, ingest_date, (table.slice(start, shard_rows) for start in range(0, table.num_rows, shard_rows))
    )


def publish_shards(stage_run: manifest.StageRun, ingest_date: date, tables: Iterable[pa.Table]) -> manifest.StageResult:
    """Write each of ``tables`` as a content-addressed shard of the run's stage (``_WRITERS`` at a time, at
    most twice as many tables in hand), then publish the run's manifest.

    The shards of the manifest it replaces are left where they are: a reader still holding that manifest
    can finish reading them, and a concurrent run of the partition that lost never had its shards deleted
    under it. Shards no manifest lists any longer are orphans, removed by the ``gc`` stage once they are
    older than its retention period."""
    stage_run.previous_outputs()  # read the replaced manifest now: publish compare-and-swaps against it
    prefix = catalog.sentences_prefix(stage_run.store, stage_run.stage, ingest_date)
    with stage_run.phase("write_shards"), ThreadPoolExecutor(_WRITERS, thread_name_prefix="hpd-shards") as pool:
        pending: deque[Future[parquet_shards.Shard]] = deque()
        for index, shard in enumerate(tables):  # the next table is made while the last ones are encoded
            pending.append(
                pool.submit(parquet_shards.write_shard, prefix, f"part-{index:05d}", shard, Dataset.SENTENCES)
            )
            if len(pending) > _WRITERS:
                stage_run.add_shard(pending.popleft().result())
        for written in pending:
            stage_run.add_shard(written.result())
    return stage_run.publish()


def staged_days(store: str) -> list[date]:
    """Every partition the corpus staging has published, in date order."""
    return [catalog.partition_date(key) for key in manifest.list_keys(store, Stage.STAGE_CORPUS)]


def published(
    store: str, ingest_date: date, stages: tuple[Stage, ...] = catalog.SENTENCE_WRITERS
) -> list[manifest.Output]:
    """A partition's published shards as the writing stages' manifests record them."""
    key = catalog.partition_key(ingest_date)
    found = (manifest.read(store, stage, key) for stage in stages)
    return [o for written in found if written for o in written.outputs]


def shards(store: str, ingest_date: date, stages: tuple[Stage, ...] = catalog.SENTENCE_WRITERS) -> list[str]:
    """URIs of a partition's published shards."""
    return [o.uri for o in published(store, ingest_date, stages)]
