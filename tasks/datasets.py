"""Publishing contract-checked Parquet shards.

A shard is checked against its data contract before a byte is written, then published atomically
under a content-addressed name (``<stem>-<sha8>.parquet``), so reruns that produce the same rows
produce the same object, a changed shard never overwrites one a manifest still lists, and a
refused table leaves nothing behind.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks import contracts, manifest, models, storage


@dataclass(frozen=True)
class Shard:
    """A published shard, as a manifest records it."""

    uri: str
    sha256: str
    bytes: int
    rows: int
    contract: str
    schema_version: int


def parquet_bytes(table: pa.Table) -> bytes:
    """Deterministic Parquet serialisation (zstd): equal tables give equal bytes."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def write_shard(prefix: str, stem: str, table: pa.Table, contract_name: str, dim: int | None = None,
                model_id: str | None = None, value_type: str = "float32") -> Shard:
    """Check ``table`` against its contract, then publish it as ``<prefix>/<stem>-<sha8>.parquet``."""
    contract = contracts.load(contract_name)
    checked = contract.conform(table, dim=dim, model_id=model_id, value_type=value_type)
    body = parquet_bytes(checked)
    digest = manifest.sha256_hex(body)
    uri = storage.join(prefix, f"{stem}-{digest[:8]}.parquet")
    storage.write_bytes(uri, body)
    return Shard(uri, digest, len(body), checked.num_rows, contract.name, contract.version)


def vectors(table: pa.Table, column: str) -> np.ndarray:
    """A fixed-size-list column (embeddings, targets) as a C-contiguous ``(rows, dim)`` float32 array."""
    values = table.column(column).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values.reshape(table.num_rows, -1), dtype=np.float32)


def derived_stem(source_uri: str) -> str:
    """``<dataset>-<shard name>``: a shard computed from another is named after it."""
    dataset, _, name = source_uri.rsplit("/", 3)[-3:]
    return f"{dataset}-{name.removesuffix('.parquet')}"


def teacher_partition(teacher: str, ingest_date: date) -> str:
    """Where a partition's teacher embeddings and their manifests live, under ``teacher/`` and
    ``manifests/encode_teacher/``."""
    return f"{models.slug(teacher)}/ingest_date={ingest_date.isoformat()}"


def teacher_shard_key(teacher: str, ingest_date: date, sentences_uri: str) -> str:
    """The encode_teacher manifest key of the embeddings of one sentences shard."""
    return f"{teacher_partition(teacher, ingest_date)}/{derived_stem(sentences_uri)}"
