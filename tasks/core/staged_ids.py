"""The staged-id index: which corpus partition holds each staged sentence id, so that staging a partition
de-duplicates against the ids alone instead of reading the id column of every staged shard.

The ids live in a few content-addressed Parquet segments (``staged_ids/ids-<sha16>.parquet``), each
bucketed by the first hex digit of the id (:data:`BUCKETS`), one row group a bucket: ``sentence_id`` (the
16 raw bytes of the blake2b digest) beside the ``partition`` holding it. ``staged_ids/index.json`` lists the
segments with their sha256, row count and the bucket of each row group, and for each staged partition the
segment holding its ids, a digest of the shard checksums its manifest listed and the version of that
manifest as a listing last saw it.

A staging run writes one segment of its own ids only, so what it writes follows its partition. Once more
than :data:`MAX_SEGMENTS` are live it writes every counted id into one instead (a compaction, one run in
``MAX_SEGMENTS``). So a run reads a bounded number of objects whatever the number of partitions staged: one
listing of the manifests, the manifests whose version changed since, and at most ``MAX_SEGMENTS`` segments
(read whole, verified); it holds one bucket decoded at a time.

The index is never trusted past the manifests: a partition whose manifest is gone no longer counts, and
one whose manifest is new or lists other shards than the index recorded (a store staged by an older
version, a re-staged partition, a run that died between its manifest and the index) counts with its ids
re-read from its shards (verified); rows of a partition in any segment but its own do not count. A staging
run writes its segment, then swaps ``index.json`` by compare-and-swap against the version it loaded;
:class:`storage.PreconditionFailed` tells it that another run recorded first.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from tasks.core import manifest, storage
from tasks.core.catalog import Stage

FOLDER = "staged_ids"
VERSION = 2
MAX_SEGMENTS = 8
BUCKETS = tuple("0123456789abcdef")
SCHEMA = {"sentence_id": pl.Binary, "partition": pl.Categorical}
_IDS_SCHEMA = pa.schema([("sentence_id", pa.binary(16)), ("partition", pa.dictionary(pa.int32(), pa.string()))])
_READERS = 4  # manifests or shards read at a time: reading and verifying release the GIL


class PartitionEntry(BaseModel):
    """A staged partition in ``index.json``: a digest of the shard checksums its manifest listed, the segment
    holding its ids (None in memory: its ids are to be re-read from its shards) and the version of its
    manifest a listing last saw (recorded once a run read that manifest, null when the listing showed none)."""

    model_config = ConfigDict(frozen=True, strict=True)

    digest: str
    segment: str | None = None
    manifest: str | None = None


class SegmentEntry(BaseModel):
    """A segment in ``index.json``: its sha256, row count, the bucket of each row group, and the partitions
    whose ids it holds."""

    model_config = ConfigDict(frozen=True, strict=True)

    sha256: str
    rows: int
    row_groups: list[str]
    partitions: list[str]

    @field_validator("row_groups")
    @classmethod
    def _buckets(cls, row_groups: list[str]) -> list[str]:
        if not set(row_groups) <= set(BUCKETS):
            raise ValueError(f"row groups {row_groups} are not all buckets")
        return row_groups


class Document(BaseModel):
    """``index.json``: the segments (by key, inside the index's folder) and each partition's entry, whose
    segment it lists. One that is not valid counts as none (the index is rebuilt)."""

    model_config = ConfigDict(frozen=True, strict=True)

    version: int
    partitions: dict[str, PartitionEntry]
    segments: dict[str, SegmentEntry]

    @model_validator(mode="after")
    def _consistent(self) -> Document:
        if self.version != VERSION:
            raise ValueError(f"version {self.version}, not {VERSION}")
        for name in self.segments:
            if not name.startswith(f"{FOLDER}/") or ".." in name or storage.hidden(name):
                raise ValueError(f"segment {name!r} lies outside {FOLDER}/")
        for key, entry in self.partitions.items():
            if entry.segment not in self.segments:
                raise ValueError(f"partition {key} names the segment {entry.segment!r}, which is not listed")
        return self

    def to_json(self) -> bytes:
        """The document as written: a partition entry holds only the fields it was given."""
        return json.dumps(self.model_dump(exclude_unset=True), indent=1, sort_keys=True).encode()


@dataclass(frozen=True)
class Segment:
    """A segment as read (whole, verified), the rows of each bucket in it (first row, count), and the
    partitions whose ids in it count. Its columns are decoded once, when first asked for: the partition
    column only when some of its ids do not count or every row is rewritten (a compaction)."""

    entry: SegmentEntry
    file: pq.ParquetFile
    spans: dict[str, tuple[int, int]]
    partitions: frozenset[str]
    _decoded: dict[bool, pl.DataFrame] = field(default_factory=dict, compare=False)

    def ids(self, bucket: str) -> pl.Series:
        """The ids of ``bucket`` that count."""
        if self._every_row_counts():
            return self._frame(labelled=False).get_column("sentence_id").slice(*self.spans.get(bucket, (0, 0)))
        return self.rows(bucket).get_column("sentence_id")

    def rows(self, bucket: str) -> pl.DataFrame:
        """The ids of ``bucket`` that count, and their partition."""
        rows = self._frame(labelled=True).slice(*self.spans.get(bucket, (0, 0)))
        if self._every_row_counts():
            return rows
        return rows.filter(pl.col("partition").is_in(list(self.partitions)))

    def _every_row_counts(self) -> bool:
        return self.partitions.issuperset(self.entry.partitions)

    def _frame(self, labelled: bool) -> pl.DataFrame:
        if labelled not in self._decoded:
            table = self.file.read(columns=None if labelled else ["sentence_id"]).combine_chunks()
            self._decoded[labelled] = pl.DataFrame(table)
        return self._decoded[labelled]


@dataclass(frozen=True)
class Index:
    """The index as loaded and reconciled with the manifests: each partition's entry but the one being
    staged; the recorded segments holding the ids that count; the ids of partitions re-read from their
    shards (written into the next segment); the etag of the ``index.json`` read (None: there was none)."""

    partitions: dict[str, PartitionEntry]
    segments: dict[str, Segment]
    repaired: pl.DataFrame
    etag: str | None

    def ids(self, bucket: str) -> pl.Series:
        """The ids of ``bucket`` (raw bytes) that count: those of the staged partitions but the one being
        staged."""
        ids = [segment.ids(bucket) for segment in self.segments.values()]
        return pl.concat([*ids, self.repaired_rows(bucket).get_column("sentence_id")])

    def rows(self, bucket: str) -> pl.DataFrame:
        """:meth:`ids`, with the partition holding each."""
        return pl.concat([*(segment.rows(bucket) for segment in self.segments.values()), self.repaired_rows(bucket)])

    def repaired_rows(self, bucket: str) -> pl.DataFrame:
        """The ids of ``bucket`` re-read from the shards of their partitions."""
        if self.repaired.is_empty():
            return self.repaired
        return _in_bucket(self.repaired, bucket)


def bucket_of(sentence_id: pl.Expr) -> pl.Expr:
    """A sentence id's bucket: its first hex digit, so that de-duplication can hold a sixteenth at a time."""
    return sentence_id.str.head(1)


def bucket_of_bytes(raw_id: pl.Expr) -> pl.Expr:
    """:func:`bucket_of` of an id held as raw bytes."""
    return raw_id.bin.encode("hex").str.head(1)


def as_bytes(sentence_id: pl.Expr) -> pl.Expr:
    """Hex sentence ids (``sentences.sentence_id``) as their 16 raw bytes, the index's form."""
    return sentence_id.str.decode("hex")


def index_uri(store: str) -> str:
    return storage.join(store, FOLDER, "index.json")


def outputs_digest(published: manifest.Manifest) -> str:
    """What the index records of a partition's manifest: a digest of the checksums of the shards it lists."""
    return manifest.sha256_hex(",".join(o.sha256 for o in published.outputs).encode())


def load(store: str, exclude_key: str) -> Index:
    """The index, brought up to date with the published staging manifests of every partition but
    ``exclude_key`` (the one being staged: its manifest is not read, it may be the corrupt one a forced run
    replaces; neither do its recorded ids count, :func:`record` replaces them)."""
    document, etag = _read_document(store)
    recorded = document.partitions if document else {}
    entries = document.segments if document else {}
    partitions, read_now = _reconciled(store, recorded, exclude_key)
    stale = sorted(key for key, entry in partitions.items() if entry.segment is None)
    holding: dict[str, set[str]] = {}  # segment -> the partitions whose ids in it count
    for key, entry in partitions.items():
        if entry.segment is not None:
            holding.setdefault(entry.segment, set()).add(key)
    with ThreadPoolExecutor(_READERS) as pool:
        repaired = list(pool.map(lambda key: _partition_ids(key, read_now[key]), stale))
        read = pool.map(lambda name: _read_segment(store, name, entries[name], holding[name]), holding)
        segments = dict(zip(holding, read, strict=True))
    return Index(partitions, segments, pl.concat([_empty(), *repaired]), etag)


def record(store: str, index: Index, key: str, published: manifest.Manifest, ids: Callable[[str], pl.Series]) -> None:
    """Record the partition ``key`` of ``published``, whose raw ids ``ids(bucket)`` gives a bucket at a time:
    a segment of them and of the partitions re-read (of every id that counts, once more than
    :data:`MAX_SEGMENTS` would be live), then ``index.json`` by compare-and-swap against the loaded version."""
    compact = len(index.segments) + 1 > MAX_SEGMENTS

    def rows(bucket: str) -> pl.DataFrame:
        fresh = pl.DataFrame({"sentence_id": ids(bucket)}).with_columns(partition=pl.lit(key, pl.Categorical))
        return pl.concat([index.rows(bucket) if compact else index.repaired_rows(bucket), fresh])

    moved = index.partitions.keys() if compact else {k for k, e in index.partitions.items() if e.segment is None}
    name, segment = _write_segment(store, rows, sorted({key, *moved}))
    partitions = index.partitions | {k: index.partitions[k].model_copy(update={"segment": name}) for k in moved}
    partitions[key] = PartitionEntry(digest=outputs_digest(published), segment=name)
    live = {entry.segment for entry in partitions.values()}
    segments = {n: s.entry for n, s in index.segments.items() if n in live} | {name: segment}
    document = Document(version=VERSION, partitions=partitions, segments=segments)
    storage.compare_and_swap(index_uri(store), document.to_json(), index.etag)


def record_if_missing(store: str, key: str, published: manifest.Manifest) -> bool:
    """Record the partition ``key`` of ``published`` from its shards when the index does not hold it as published
    (a staging stopped between its publish and its record); whether it recorded."""
    document, _ = _read_document(store)
    entry = document.partitions.get(key) if document else None
    if entry is not None and entry.digest == outputs_digest(published):
        return False
    ids = _partition_ids(key, published)
    record(store, load(store, key), key, published, lambda bucket: _in_bucket(ids, bucket).get_column("sentence_id"))
    return True


def held(store: str, candidate_ids: list[str], exclude_key: str = "") -> set[str]:
    """Which of ``candidate_ids`` (hex sentence ids) a staged corpus partition but ``exclude_key`` holds, from
    the index brought up to date with the manifests (:func:`load`): a bounded number of objects read, one bucket
    of ids decoded at a time."""
    if not candidate_ids:
        return set()
    index = load(store, exclude_key)
    candidates = pl.DataFrame({"hex": candidate_ids}, schema={"hex": pl.String}).with_columns(
        sentence_id=as_bytes(pl.col("hex")), bucket=bucket_of(pl.col("hex"))
    )
    found: set[str] = set()
    for bucket, wanted in candidates.partition_by("bucket", as_dict=True).items():
        matched = wanted.filter(pl.col("sentence_id").is_in(index.ids(str(bucket[0])).implode()))
        found.update(matched.get_column("hex").to_list())
    return found


def _reconciled(
    store: str, recorded: dict[str, PartitionEntry], exclude_key: str
) -> tuple[dict[str, PartitionEntry], dict[str, manifest.Manifest]]:
    """The entry of every partition with a published manifest but ``exclude_key``: as recorded when its
    manifest's version is the one recorded, else from the manifest (read), without a segment when the
    manifest lists other shards than the index recorded (its ids are to be re-read); and the manifests
    read, by partition."""
    listed = manifest.list_versions(store, Stage.STAGE_CORPUS)
    listed.pop(exclude_key, None)
    changed = sorted(
        key for key, seen in listed.items() if seen is None or (e := recorded.get(key)) is None or e.manifest != seen
    )
    entries = {key: recorded[key] for key in listed.keys() - set(changed)}
    with ThreadPoolExecutor(_READERS) as pool:
        found = zip(changed, pool.map(lambda k: manifest.read(store, Stage.STAGE_CORPUS, k), changed), strict=True)
        read = {key: published for key, published in found if published is not None}
    for key, published in read.items():
        entry = PartitionEntry(digest=outputs_digest(published), manifest=listed[key])
        before = recorded.get(key)
        if before is not None and before.digest == entry.digest:
            entry = before.model_copy(update={"manifest": entry.manifest})
        entries[key] = entry
    return entries, read


def live(store: str) -> set[str]:
    """``index.json`` and the segments it lists (for gc); nothing when it is missing or not a valid index."""
    document, _ = _read_document(store)
    if document is None:
        return set()
    return {index_uri(store)} | {storage.join(store, name) for name in document.segments}


def _read_document(store: str) -> tuple[Document | None, str | None]:
    """``index.json`` and its etag; a document that is not a valid index counts as none (it is rebuilt)."""
    try:
        found, etag = storage.read_json_versioned(index_uri(store))
    except ValueError:  # not JSON, or not UTF-8
        return None, storage.head(index_uri(store)).etag
    try:
        return Document.model_validate(found), etag
    except ValidationError:
        return None, etag


def _read_segment(store: str, name: str, entry: SegmentEntry, partitions: set[str]) -> Segment:
    """The segment ``name`` (read whole, verified), for the rows of ``partitions``."""
    uri = storage.join(store, name)
    try:
        ids = pq.ParquetFile(pa.BufferReader(storage.read_bytes(uri, sha256=entry.sha256)))
    except pa.ArrowException as exc:
        raise storage.StorageError(uri, f"cannot read Parquet: {exc}") from exc
    shape = (ids.metadata.num_rows, ids.metadata.num_row_groups, ids.schema_arrow)
    if shape != (entry.rows, len(entry.row_groups), _IDS_SCHEMA):
        found = f"{shape[0]} rows in {shape[1]} row groups of ({', '.join(map(str, shape[2].types))})"
        raise storage.StorageError(uri, f"holds {found}, not what {index_uri(store)} records")
    spans, start = {}, 0
    for group, bucket in enumerate(entry.row_groups):
        rows = ids.metadata.row_group(group).num_rows
        spans[bucket], start = (start, rows), start + rows
    return Segment(entry, ids, spans, frozenset(partitions))


def _in_bucket(rows: pl.DataFrame, bucket: str) -> pl.DataFrame:
    """The ``rows`` whose raw ``sentence_id`` lies in ``bucket``."""
    return rows.filter(bucket_of_bytes(pl.col("sentence_id")) == bucket)


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)


def _partition_ids(key: str, published: manifest.Manifest) -> pl.DataFrame:
    """A partition's ids, read from its shards verified against its manifest."""
    columns = [storage.read_parquet(o.uri, ["sentence_id"], o.sha256).column("sentence_id") for o in published.outputs]
    ids = pl.Series("sentence_id", pa.chunked_array(columns, pa.string()) if columns else [], pl.String)
    return pl.DataFrame({"sentence_id": ids}).select(
        as_bytes(pl.col("sentence_id")), partition=pl.lit(key, pl.Categorical)
    )


def _write_segment(store: str, rows: Callable[[str], pl.DataFrame], partitions: list[str]) -> tuple[str, SegmentEntry]:
    """A segment of ``rows(bucket)`` for every bucket (the ids of ``partitions``), written through a local file
    a bucket at a time, as a content-addressed object: its key, and its entry (sha256, row count, the bucket
    of each row group, the partitions)."""
    written: list[str] = []
    count = 0
    with tempfile.TemporaryFile() as spooled:
        options: dict[str, Any] = {"compression": "none", "use_dictionary": ["partition"], "write_statistics": False}
        with pq.ParquetWriter(spooled, _IDS_SCHEMA, **options) as writer:
            for bucket in BUCKETS:
                if (table := rows(bucket).to_arrow().cast(_IDS_SCHEMA)).num_rows:
                    writer.write_table(table, row_group_size=table.num_rows)
                    written.append(bucket)
                    count += table.num_rows
        spooled.seek(0)
        digest = hashlib.file_digest(spooled, "sha256").hexdigest()
        spooled.seek(0)
        name = f"{FOLDER}/ids-{digest[:16]}.parquet"
        storage.write_bytes(storage.join(store, name), spooled)
    return name, SegmentEntry(sha256=digest, rows=count, row_groups=written, partitions=partitions)
