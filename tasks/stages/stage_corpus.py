"""Stage corpus: raw sentence files -> the ``sentences`` dataset, one ``ingest_date`` partition.

Reads plain text (one sentence per line), JSONL, CSV, TSV or Parquet, each optionally gzipped, as a
stream (memory follows the kept rows, not the file); normalises (Unicode NFC, collapsed whitespace);
drops empty and over-long lines; de-duplicates by
the sentence id (a hash of the normalised text) within the input and against every partition
already staged; writes ``sentences/ingest_date=D/part-NNNNN-<sha8>.parquet`` shards and the
partition's manifest, which lists the shards and counts the dropped rows by reason.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import json
import logging
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core import catalog, manifest, sentences, storage
from tasks.core.catalog import Stage
from tasks.core.progress import Progress
from tasks.core.sources import CorpusInputError, resolve_source, source_uris
from tasks.stages.params import StageCorpusParams

log = logging.getLogger(__name__)
_CHUNK = 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = codecs.BOM_UTF8
DROP_REASONS = ("empty", "too_long", "duplicate_in_input", "already_staged")
_SUFFIX_FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
}


def run(params: StageCorpusParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Stage ``params.source`` into the ``sentences`` partition of ``params.ingest_date``."""
    key = catalog.partition_key(params.ingest_date)
    stage_run = manifest.StageRun(
        stage=Stage.STAGE_CORPUS,
        key=key,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[
            _fingerprint(uri, params.max_input_bytes)
            for uri in source_uris(resolve_source(params.source, params.ingest_date))
        ],
    )
    if skipped := stage_run.skip_result(force):
        return skipped
    with stage_run.phase("read_normalise_dedup"):
        rows, dropped, records_read = _read_sentences(params, stage_run.inputs, progress)
    stage_run.inputs = [replace(i, rows=records_read[i.uri]) for i in stage_run.inputs]
    with stage_run.phase("drop_already_staged"):
        staged = sentences.already_staged(params.store, rows["sentence_id"], exclude_key=key)
        keep = [i for i, sid in enumerate(rows["sentence_id"]) if sid not in staged]
        dropped["already_staged"] = len(rows["sentence_id"]) - len(keep)
        rows = {name: [values[i] for i in keep] for name, values in rows.items()}

    # The whole partition is checked before the first shard is written, so a refusal publishes nothing.
    table = sentences.table(rows, params.ingest_date)
    stage_run.stats = {
        "rows_read": sum(records_read.values()),
        "rows_written": table.num_rows,
        "dropped": {reason: dropped[reason] for reason in DROP_REASONS},
    }
    return sentences.publish_partition(stage_run, params.ingest_date, table, params.shard_rows)


def _fingerprint(uri: str, max_bytes: int) -> manifest.Input:
    """A source's size and sha256 (streamed), refused before reading when it is larger than ``max_bytes``."""
    if (size := storage.size(uri)) > max_bytes:
        raise CorpusInputError(f"{uri}: {size} bytes, more than max_input_bytes={max_bytes}")
    return manifest.Input(uri, storage.sha256_of(uri), None, size)


def _read_sentences(
    params: StageCorpusParams, sources: list[manifest.Input], progress: bool
) -> tuple[dict[str, list], Counter[str], dict[str, int]]:
    """The normalised sentences kept from the sources (columns), the drop counts by reason, and how many
    records were read from each source (at most ``params.limit`` in all)."""
    dropped: Counter[str] = Counter()
    rows: dict[str, list] = {name: [] for name in ("sentence_id", "text", "source", "line")}
    seen: set[str] = set()
    records_read: dict[str, int] = {}
    for source in sources:
        uri = source.uri
        remaining = None if params.limit is None else params.limit - sum(records_read.values())
        records_read[uri] = 0
        what = f"stage_corpus {uri.rsplit('/', 1)[-1]}"
        with (
            _opened(source, params.max_input_bytes) as stream,
            Progress(what, total=None, unit="records", bar=progress, logger=log) as reporter,
        ):
            records = itertools.islice(_records(uri, stream, _format_of(uri, params.format), params), remaining)
            for line_no, raw_text in records:
                reporter.update()
                records_read[uri] += 1
                text = sentences.normalise(raw_text or "")
                sid = sentences.sentence_id(text)
                if reason := _drop_reason(text, sid, params.max_chars, seen):
                    dropped[reason] += 1
                    continue
                seen.add(sid)
                for name, value in zip(rows, (sid, text, uri, line_no), strict=True):
                    rows[name].append(value)
    return rows, dropped, records_read


def _drop_reason(text: str, sid: str, max_chars: int, seen: set[str]) -> str | None:
    if not text:
        return "empty"
    if len(text) > max_chars:
        return "too_long"
    return "duplicate_in_input" if sid in seen else None


def _format_of(uri: str, requested: str) -> str:
    if requested != "auto":
        return requested
    name = uri.lower().removesuffix(".gz")
    for suffix, fmt in _SUFFIX_FORMATS.items():
        if name.endswith(suffix):
            return fmt
    raise CorpusInputError(
        f"{uri}: cannot tell the format from the name; pass format (one of {sorted(set(_SUFFIX_FORMATS.values()))})"
    )


@contextmanager
def _opened(source: manifest.Input, max_bytes: int) -> Iterator[BinaryIO]:
    """A source as a stream of its (decompressed) bytes. Its raw bytes are hashed as they stream by; once the
    caller is done, the rest is hashed too and must match the digest taken before reading, so what was
    parsed is what the manifest records."""
    with storage.open_read(source.uri) as raw:
        hashing = storage.HashingReader(raw)
        buffered = io.BufferedReader(hashing, _CHUNK)
        gzipped = buffered.peek(2)[:2] == _GZIP_MAGIC
        yield _BoundedGunzip(source.uri, buffered, max_bytes) if gzipped else buffered
        hashing.drain()
    if hashing.hexdigest() != source.sha256:
        raise CorpusInputError(f"{source.uri}: changed while it was being read (its sha256 is not the one recorded)")


class _BoundedGunzip(io.RawIOBase):
    """The decompressed bytes of a gzip stream (every member), refused as soon as they exceed ``max_bytes``."""

    def __init__(self, uri: str, compressed: BinaryIO, max_bytes: int) -> None:
        super().__init__()
        self._uri, self._max_bytes, self._count = uri, max_bytes, 0
        self._inflated = gzip.GzipFile(fileobj=compressed, mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            count = self._inflated.readinto(buffer)
        except EOFError:
            raise CorpusInputError(f"{self._uri}: corrupt gzip data (truncated)") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise CorpusInputError(f"{self._uri}: corrupt gzip data ({exc})") from None
        self._count += count
        if self._count > self._max_bytes:
            raise CorpusInputError(f"{self._uri}: decompresses to more than max_input_bytes={self._max_bytes} bytes")
        return count


def _records(uri: str, stream: BinaryIO, fmt: str, params: StageCorpusParams) -> Iterator[tuple[int, str | None]]:
    """(1-based line or row number, raw text) for every record of one source."""
    if fmt == "parquet":
        yield from _parquet_records(uri, stream.read(), params.column, params.max_line_chars)
        return
    if fmt not in ("text", "jsonl", "csv", "tsv"):
        raise CorpusInputError(f"{uri}: unknown format {fmt!r}")
    lines = _lines(uri, stream, params.max_line_chars)
    if fmt == "text":
        yield from ((line_no, line.rstrip("\r\n")) for line_no, line in enumerate(lines, start=1))
    elif fmt == "jsonl":
        yield from _jsonl_records(uri, lines, params.column)
    else:
        yield from _delimited_records(uri, lines, params.column, tsv=fmt == "tsv")


def _lines(uri: str, stream: BinaryIO, max_chars: int) -> Iterator[str]:
    """The source's lines as text (with their endings), each read with a bounded buffer: a line longer than
    ``max_chars`` is refused, its length counted without holding it; a source of blank lines is empty."""
    line_no, offset, blank = 0, 0, True
    limit = 4 * max_chars + 2  # the most bytes max_chars UTF-8 characters and a line ending take
    while raw := stream.readline(limit):
        line_no += 1
        line = _decode(uri, raw.removeprefix(_BOM) if line_no == 1 else raw, line_no, offset)
        offset += len(raw)
        if len(body := line.rstrip("\r\n")) > max_chars or (len(raw) == limit and not raw.endswith(b"\n")):
            length = len(body) + _rest_of_line(stream, raw, limit)
            raise CorpusInputError(
                f"{uri}: line {line_no} holds {length} characters, more than max_line_chars={max_chars}"
            )
        blank = blank and not body.strip()
        yield line
    if blank:
        raise CorpusInputError(f"{uri}: the input is empty")


def _decode(uri: str, raw: bytes, line_no: int, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusInputError(f"{uri}: not valid UTF-8 at line {line_no} (byte {offset + exc.start})") from None


def _rest_of_line(stream: BinaryIO, piece: bytes, limit: int) -> int:
    """How many characters of an over-long line follow ``piece`` (read in bounded pieces, not kept)."""
    decoder, rest = codecs.getincrementaldecoder("utf-8")(errors="replace"), 0
    while not piece.endswith(b"\n") and (piece := stream.readline(limit)):
        rest += len(decoder.decode(piece).rstrip("\r\n"))
    return rest


def _jsonl_records(uri: str, lines: Iterator[str], column: str) -> Iterator[tuple[int, str | None]]:
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusInputError(f"{uri}: line {line_no} is not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or column not in record:
            raise CorpusInputError(f"{uri}: line {line_no} has no field {column!r}")
        value = record[column]
        if value is not None and not isinstance(value, str):
            raise CorpusInputError(f"{uri}: line {line_no}: field {column!r} is not a string")
        yield line_no, value


def _delimited_records(uri: str, lines: Iterator[str], column: str, tsv: bool) -> Iterator[tuple[int, str]]:
    # TSV corpora carry bare quotes inside sentences: no quoting there; CSV follows RFC 4180.
    reader = csv.reader(lines, delimiter="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
    try:
        header = next(reader, None)
        if header is None:
            raise CorpusInputError(f"{uri}: no header line")
        if column not in header:
            raise CorpusInputError(f"{uri}: no column {column!r} (columns: {header})")
        position = header.index(column)
        for row in reader:
            if not row:
                continue
            if len(row) <= position:
                raise CorpusInputError(f"{uri}: line {reader.line_num} has {len(row)} field(s), no {column!r}")
            yield reader.line_num, row[position]
    except csv.Error as exc:
        raise CorpusInputError(f"{uri}: malformed at line {reader.line_num} ({exc})") from None


def _parquet_records(uri: str, data: bytes, column: str, max_chars: int) -> Iterator[tuple[int, str | None]]:
    """Parquet needs random access: the file is read whole (within max_input_bytes), then a row group
    at a time."""
    if not data.strip():
        raise CorpusInputError(f"{uri}: the input is empty")
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    except pa.ArrowException as exc:
        raise CorpusInputError(f"{uri}: not a Parquet file ({exc})") from None
    if column not in parquet.schema_arrow.names:
        raise CorpusInputError(f"{uri}: no column {column!r} (columns: {parquet.schema_arrow.names})")
    values_type = parquet.schema_arrow.field(column).type
    if not pa.types.is_string(values_type) and not pa.types.is_large_string(values_type):
        raise CorpusInputError(f"{uri}: column {column!r} is {values_type}, not text")
    row = 0
    for batch in parquet.iter_batches(columns=[column]):
        for value in batch.column(0).to_pylist():
            row += 1
            if value is not None and len(value) > max_chars:
                raise CorpusInputError(
                    f"{uri}: row {row} holds {len(value)} characters, more than max_line_chars={max_chars}"
                )
            yield row, value
