"""Publishing contract-checked Parquet shards.

A shard is checked against its data contract before a byte is written, then published atomically
under a content-addressed name (``<stem>-<sha8>.parquet``), so reruns that produce the same rows
produce the same object, a changed shard never overwrites one a manifest still lists, and a
refused table leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core import contracts, finite, storage


@dataclass(frozen=True)
class Shard:
    """A published shard, as a manifest records it."""

    uri: str
    sha256: str
    bytes: int
    rows: int
    contract: str
    schema_version: int


def parquet_bytes(table: pa.Table, dictionary: list[str]) -> bytes:
    """Deterministic Parquet serialisation (zstd, the ``dictionary`` columns dictionary-encoded, the others
    plain: a dictionary of unique values only costs time): equal tables give equal bytes."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=dictionary)
    return sink.getvalue()


def write_shard(
    prefix: str,
    stem: str,
    table: pa.Table,
    contract_name: str,
    dim: int | None = None,
    model_id: str | None = None,
    value_type: str = "float32",
) -> Shard:
    """Check ``table`` against its contract, then publish it as ``<prefix>/<stem>-<sha8>.parquet``."""
    contract = contracts.load(contract_name)
    checked = contract.conform(table, dim=dim, model_id=model_id, value_type=value_type)
    body = parquet_bytes(checked, contract.dictionary_columns)
    digest = hashlib.sha256(body).hexdigest()
    uri = storage.join(prefix, f"{stem}-{digest[:8]}.parquet")
    storage.write_bytes(uri, body)
    return Shard(uri, digest, len(body), checked.num_rows, contract.name, contract.version)


def vectors(table: pa.Table, column: str, source: str | None = None) -> np.ndarray:
    """A fixed-size-list column (embeddings, targets) as a C-contiguous ``(rows, dim)`` float32 array; with
    ``source`` (where the table was read), a :class:`finite.NonFiniteError` naming it unless all are finite."""
    values = table.column(column).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    width = getattr(table.schema.field(column).type, "list_size", -1)  # a fixed-size list's: an empty one too
    with np.errstate(over="ignore"):  # a value beyond float32 becomes an infinity, refused below with a source
        array = np.ascontiguousarray(values.reshape(table.num_rows, width), dtype=np.float32)
    if source is not None:
        finite.require_finite(array, source, f"{column} value")
    return array
