"""The staged-id index: which corpus partition holds each staged sentence id, so that staging a partition
de-duplicates against the ids alone instead of reading the id column of every staged shard, and records
its own partition without rewriting anyone else's.

``staged_ids/index.json`` lists, for each staged partition, one Parquet segment of its ids (``sentence_id``,
content-addressed: ``staged_ids/<partition>-<sha16>.parquet``) with its sha256 and row count, and a digest
of the shard checksums its manifest listed. Every segment is read verified. The index is never trusted
past the manifests: on load, a partition whose manifest is missing, new or lists other shards than the
index recorded is re-read from its shards (verified), so a store staged by an older version, a re-staged
partition or a run that died between its manifest and the index all come out right. A staging run writes
its partition's segment (and those of partitions it re-read), then swaps ``index.json`` by
compare-and-swap against the version it loaded; :class:`storage.PreconditionFailed` tells it that another
run recorded first.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core import manifest, storage
from tasks.core.catalog import Stage

FOLDER = "staged_ids"
VERSION = 1
SCHEMA = {"sentence_id": pl.String, "partition": pl.String}
_SEGMENT_SCHEMA = pa.schema([("sentence_id", pa.large_string())])
_READERS = 4  # segments read (or shards re-read) at a time: reading and verifying release the GIL
Entry = dict[str, Any]  # digest; and key, sha256, rows once its segment is written


@dataclass(frozen=True)
class Index:
    """The staged ids of every partition but the one being staged (``sentence_id``, ``partition``), as loaded
    and reconciled with the manifests; each partition's entry (a partition re-read from its shards has no
    segment yet); the etag of the ``index.json`` read (None: there was none)."""

    ids: pl.DataFrame
    entries: dict[str, Entry]
    etag: str | None

    def held_elsewhere(self, key: str, bucket: str) -> pl.Series:
        """The ids of ``bucket`` (:func:`bucket_of`) that partitions other than ``key`` hold."""
        wanted = (pl.col("partition") != key) & pl.col("sentence_id").str.starts_with(bucket)
        return self.ids.filter(wanted)["sentence_id"]


def bucket_of(sentence_id: pl.Expr) -> pl.Expr:
    """A sentence id's bucket: its first hex digit, so that de-duplication can hold a sixteenth at a time."""
    return sentence_id.str.head(1)


def index_uri(store: str) -> str:
    return storage.join(store, FOLDER, "index.json")


def outputs_digest(published: manifest.Manifest) -> str:
    """What the index records of a partition's manifest: a digest of the checksums of the shards it lists."""
    return manifest.sha256_hex(",".join(o.sha256 for o in published.outputs).encode())


def load(store: str, exclude_key: str) -> Index:
    """The index, brought up to date with the published staging manifests of every partition but
    ``exclude_key`` (the one being staged: its manifest is not read, it may be the corrupt one a forced run
    replaces; neither is its segment, which :func:`record` replaces)."""
    document, etag = _read_document(store)
    entries: dict[str, Entry] = dict(document["partitions"]) if document else {}
    current = _published(store, exclude_key)
    known = (entries.keys() | current.keys()) - {exclude_key}
    stale = {key for key in known if entries.get(key, {}).get("digest") != _digest(current, key)}
    trusted = sorted(known - stale)
    with ThreadPoolExecutor(_READERS) as pool:
        segments = list(pool.map(lambda key: _read_segment(store, key, entries[key]), trusted))
        repaired = list(pool.map(lambda key: _partition_ids(key, current[key]), sorted(stale & current.keys())))
    entries = {key: entries[key] for key in [*trusted, exclude_key] if key in entries}
    entries |= {key: {"digest": outputs_digest(current[key])} for key in stale & current.keys()}
    return Index(pl.concat([_empty(), *segments, *repaired]), entries, etag)


def record(store: str, index: Index, key: str, published: manifest.Manifest, ids: Iterable[pl.Series]) -> None:
    """Record ``ids`` as the partition ``key`` of ``published``: its segment (and those of the partitions the
    load re-read), then ``index.json`` by compare-and-swap against the loaded version."""
    entries = {**index.entries, key: {"digest": outputs_digest(published)}}
    unwritten = [name for name, entry in entries.items() if "key" not in entry]

    def write(name: str) -> Entry:
        rows = ids if name == key else [index.ids.filter(pl.col("partition") == name)["sentence_id"]]
        return {"digest": entries[name]["digest"], **_write_segment(store, name, rows)}

    with ThreadPoolExecutor(_READERS) as pool:
        entries |= dict(zip(unwritten, pool.map(write, unwritten), strict=True))
    body = json.dumps({"version": VERSION, "partitions": entries}, indent=1, sort_keys=True).encode()
    storage.compare_and_swap(index_uri(store), body, index.etag)


def live(store: str) -> set[str]:
    """``index.json`` and the segments it lists (for gc); nothing when it is missing or not a valid index."""
    document, _ = _read_document(store)
    if document is None:
        return set()
    return {index_uri(store)} | {storage.join(store, e["key"]) for e in document["partitions"].values()}


def _read_document(store: str) -> tuple[dict[str, Any] | None, str | None]:
    """``index.json`` and its etag; a document that is not a valid index counts as none (it is rebuilt)."""
    try:
        document, etag = storage.read_json_versioned(index_uri(store))
    except ValueError:  # not JSON, or not UTF-8
        return None, storage.head(index_uri(store)).etag
    return (document if _well_formed(document) else None), etag


def _well_formed(document: Any) -> bool:
    if not isinstance(document, dict) or document.get("version") != VERSION:
        return False
    entries = document.get("partitions")
    return isinstance(entries, dict) and all(_well_formed_entry(e) for e in entries.values())


def _well_formed_entry(entry: Any) -> bool:
    """A written entry: its digest, sha256 and row count, and a segment key inside the index's folder."""
    if not isinstance(entry, dict) or not all(isinstance(entry.get(f), str) for f in ("digest", "key", "sha256")):
        return False
    key = entry["key"]
    return key.startswith(f"{FOLDER}/") and ".." not in key and not storage.hidden(key)


def _read_segment(store: str, key: str, entry: Entry) -> pl.DataFrame:
    table = storage.read_parquet(storage.join(store, entry["key"]), sha256=entry["sha256"])
    return pl.DataFrame({"sentence_id": table.column("sentence_id"), "partition": key}, schema=SCHEMA)


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)


def _published(store: str, exclude_key: str) -> dict[str, manifest.Manifest]:
    """Every published staging manifest but ``exclude_key``'s, by partition key."""
    keys = [key for key in manifest.list_keys(store, Stage.STAGE_CORPUS) if key != exclude_key]
    with ThreadPoolExecutor(_READERS) as pool:
        found = dict(zip(keys, pool.map(lambda key: manifest.read(store, Stage.STAGE_CORPUS, key), keys), strict=True))
    return {key: m for key, m in found.items() if m is not None}


def _digest(current: dict[str, manifest.Manifest], key: str) -> str | None:
    return outputs_digest(current[key]) if key in current else None


def _partition_ids(key: str, published: manifest.Manifest) -> pl.DataFrame:
    """A partition's ids, read from its shards verified against its manifest."""
    columns = [
        storage.read_parquet(o.uri, columns=["sentence_id"], sha256=o.sha256).column("sentence_id")
        for o in published.outputs
    ]
    ids = pl.Series("sentence_id", pa.chunked_array(columns, pa.string()) if columns else [], pl.String)
    return pl.DataFrame({"sentence_id": ids, "partition": key}, schema=SCHEMA)


def _write_segment(store: str, partition: str, ids: Iterable[pl.Series]) -> Entry:
    """A partition's ids (a piece at a time, through a local file) as a content-addressed Parquet object;
    its key, sha256 and row count."""
    with tempfile.TemporaryFile() as spooled:
        rows = 0
        with pq.ParquetWriter(spooled, _SEGMENT_SCHEMA, compression="zstd") as writer:
            for piece in ids:
                writer.write_table(pa.table([piece.to_arrow()], schema=_SEGMENT_SCHEMA))
                rows += piece.len()
        spooled.seek(0)
        digest = hashlib.file_digest(spooled, "sha256").hexdigest()
        spooled.seek(0)
        key = f"{FOLDER}/{partition}-{digest[:16]}.parquet"
        storage.write_bytes(storage.join(store, key), spooled)
    return {"key": key, "sha256": digest, "rows": rows}
