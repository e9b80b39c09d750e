"""Raw sources as records: a fingerprint-checked, size-capped byte stream, its lines, and the (line number,
raw text) records of each format (text, JSONL, CSV, TSV, Parquet), handed on in bounded batches.

Lines are decoded a chunk at a time (one UTF-8 decode and one split per chunk); a chunk that holds anything
unusual (bad UTF-8, a line near the length cap) hands the rest of the source to the line-at-a-time reader,
which produces the exact refusal (line number, byte offset, the full length of an over-long line).
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from isal import igzip, isal_zlib

from tasks.core import manifest, storage
from tasks.core.sources import CorpusInputError
from tasks.stages.params import StageCorpusParams

_CHUNK = 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = codecs.BOM_UTF8
_SUFFIX_FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
}
Record = tuple[int, str | None]
_RECORDS = 10_000  # records a frame, where they are read one at a time
_FIELD_LIMIT = csv.field_size_limit()


def format_of(uri: str, requested: str) -> str:
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
def opened(source: manifest.Input, max_bytes: int) -> Iterator[io.BufferedReader]:
    """A source as a buffered stream of its (decompressed) bytes. Its raw bytes are hashed as they stream by;
    once the caller is done, the rest is hashed too and must match the digest taken before reading, so what
    was parsed is what the manifest records."""
    with storage.open_read(source.uri) as raw:
        hashing = storage.HashingReader(raw)
        buffered = io.BufferedReader(hashing, _CHUNK)
        gzipped = buffered.peek(2)[:2] == _GZIP_MAGIC
        yield io.BufferedReader(_BoundedGunzip(source.uri, buffered, max_bytes), _CHUNK) if gzipped else buffered
        hashing.drain()
    if hashing.hexdigest() != source.sha256:
        raise CorpusInputError(f"{source.uri}: changed while it was being read (its sha256 is not the one recorded)")


class _BoundedGunzip(io.RawIOBase):
    """The decompressed bytes of a gzip stream (every member, inflated by ISA-L), refused as soon as they exceed
    ``max_bytes``."""

    def __init__(self, uri: str, compressed: BinaryIO, max_bytes: int) -> None:
        super().__init__()
        self._uri, self._max_bytes, self._count = uri, max_bytes, 0
        self._inflated = igzip.GzipFile(fileobj=compressed, mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            count = self._inflated.readinto(buffer)
        except EOFError:
            raise CorpusInputError(f"{self._uri}: corrupt gzip data (truncated)") from None
        except (gzip.BadGzipFile, isal_zlib.error) as exc:
            raise CorpusInputError(f"{self._uri}: corrupt gzip data ({exc})") from None
        self._count += count
        if self._count > self._max_bytes:
            raise CorpusInputError(f"{self._uri}: decompresses to more than max_input_bytes={self._max_bytes} bytes")
        return count


class _Prepended(io.RawIOBase):
    """``head`` then the rest of ``stream``: a chunk already taken, handed back to a line-at-a-time reader."""

    def __init__(self, head: bytes, stream: io.BufferedReader) -> None:
        super().__init__()
        self._head, self._stream = memoryview(head), stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._head:
            return self._stream.readinto(buffer)
        count = min(len(buffer), len(self._head))
        buffer[:count], self._head = self._head[:count], self._head[count:]
        return count


def batches(
    uri: str, stream: io.BufferedReader, params: StageCorpusParams, limit: int | None
) -> Iterator[pl.DataFrame]:
    """The source's records (at most ``limit``) as frames of ``line`` (1-based line or row number) and ``raw``
    (the text), about ``params.batch_rows`` at a time."""
    frames = _frames(uri, stream, format_of(uri, params.format), params)
    held: list[pl.DataFrame] = []
    count = 0
    while (limit is None or count < limit) and (frame := next(frames, None)) is not None:
        frame = frame if limit is None else frame.head(limit - count)
        held.append(frame)
        count += frame.height
        if sum(f.height for f in held) >= params.batch_rows:
            yield pl.concat(held)
            held = []
    if held:
        yield pl.concat(held)


def _frames(uri: str, stream: io.BufferedReader, fmt: str, params: StageCorpusParams) -> Iterator[pl.DataFrame]:
    if fmt == "parquet":
        return _parquet_frames(uri, stream.read(), params.column, params.max_line_chars)
    if fmt not in ("text", "jsonl", "csv", "tsv"):
        raise CorpusInputError(f"{uri}: unknown format {fmt!r}")
    chunks = _line_chunks(uri, stream, params.max_line_chars)
    if fmt == "text":
        return _text_frames(chunks)
    if fmt == "tsv":
        return _tsv_frames(uri, chunks, params.column)
    lines = (line + "\n" for chunk in chunks for line in chunk.to_list())  # csv keeps newlines in quoted fields
    if fmt == "jsonl":
        return _record_frames(_jsonl_records(uri, lines, params.column))
    return _record_frames(_csv_records(uri, lines, params.column))


def _frame(lines: Any, raws: Any) -> pl.DataFrame:
    return pl.DataFrame({"line": lines, "raw": raws}, schema={"line": pl.Int64, "raw": pl.String})


def _record_frames(records: Iterator[Record]) -> Iterator[pl.DataFrame]:
    while chunk := list(itertools.islice(records, _RECORDS)):
        lines, raws = zip(*chunk, strict=True)
        yield _frame(lines, raws)


def _text_frames(chunks: Iterator[pl.Series]) -> Iterator[pl.DataFrame]:
    """One record a line, its ending stripped."""
    first = 1
    for lines in chunks:
        yield _frame(pl.int_range(first, first + len(lines), eager=True), lines.str.strip_chars_end("\r\n"))
        first += len(lines)


def _tsv_frames(uri: str, chunks: Iterator[pl.Series], column: str) -> Iterator[pl.DataFrame]:
    """The ``column`` field of every non-empty line after the header, split on tabs (no quoting); a chunk
    holding a carriage return inside a line, or a field too long for the csv module, goes through it."""
    lines = next(chunks, pl.Series(dtype=pl.String))
    try:
        header = next(csv.reader(lines[:1].to_list(), delimiter="\t", quoting=csv.QUOTE_NONE), None)
    except csv.Error as exc:
        raise CorpusInputError(f"{uri}: malformed at line 1 ({exc})") from None
    if header is None:
        raise CorpusInputError(f"{uri}: no header line")
    if column not in header:
        raise CorpusInputError(f"{uri}: no column {column!r} (columns: {header})")
    position, first, lines = header.index(column), 2, lines[1:]
    while lines is not None:
        plain = not lines.str.contains("\r", literal=True).any() and (lines.str.len_chars().max() or 0) <= _FIELD_LIMIT
        frame, malformed = (_split_tsv(lines, first), None) if plain else _csv_tsv(lines.to_list(), first)
        frame = frame.with_columns(
            count=pl.col("fields").list.len(), raw=pl.col("fields").list.get(position, null_on_oob=True)
        )
        problems = [malformed] if malformed else []
        if not (short := frame.filter(pl.col("count") <= position)).is_empty():
            line, count = short["line"][0], short["count"][0]
            problems.append((line, f"line {line} has {count} field(s), no {column!r}"))
        if problems:  # the records before the first problem are read (a limit may end the reading there)
            line, message = min(problems)
            yield frame.filter(pl.col("line") < line).select("line", "raw")
            raise CorpusInputError(f"{uri}: {message}")
        yield frame.select("line", "raw")
        first += len(lines)
        lines = next(chunks, None)


def _split_tsv(lines: pl.Series, first: int) -> pl.DataFrame:
    """Lines without carriage returns: their tab-separated fields, empty lines left out (as csv does)."""
    frame = pl.DataFrame({"line": pl.int_range(first, first + len(lines), eager=True), "body": lines})
    return frame.filter(pl.col("body") != "").select("line", fields=pl.col("body").str.split("\t"))


def _csv_tsv(lines: list[str], first: int) -> tuple[pl.DataFrame, tuple[int, str] | None]:
    """The csv module's reading of the lines (one record a line: TSV corpora carry bare quotes inside
    sentences, so no quoting), empty lines left out, up to the first it refuses: its number and why."""
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    rows: list[tuple[int, list[str]]] = []
    malformed = None
    try:
        rows.extend((first + reader.line_num - 1, row) for row in reader if row)
    except csv.Error as exc:
        line = first + reader.line_num - 1
        malformed = (line, f"malformed at line {line} ({exc})")
    frame = pl.DataFrame(
        {"line": [r[0] for r in rows], "fields": [r[1] for r in rows]},
        schema={"line": pl.Int64, "fields": pl.List(pl.String)},
    )
    return frame, malformed


def _line_chunks(uri: str, stream: io.BufferedReader, max_chars: int) -> Iterator[pl.Series]:
    """The source's lines as text (their ``\\n`` taken off), a chunk at a time while every line of the chunk is
    plainly fine, then line by line from the first chunk that is not (:func:`_exact_lines`)."""
    line_no, offset, blank = 0, 0, True
    limit = 4 * max_chars + 2  # the most bytes max_chars UTF-8 characters and a line ending take
    while chunk := stream.read(_CHUNK):
        if not chunk.endswith(b"\n"):
            chunk += stream.readline(limit)
        lines = _plain_lines(chunk, stream, max_chars, bom=line_no == 0)
        if lines is None:
            rest = io.BufferedReader(_Prepended(chunk, stream), _CHUNK)
            exact = _exact_lines(uri, rest, max_chars, line_no, offset, blank)
            while piece := list(itertools.islice(exact, _RECORDS)):
                yield pl.Series([line.removesuffix("\n") for line in piece], dtype=pl.String)
            return
        line_no, offset = line_no + len(lines), offset + len(chunk)
        blank = blank and not any(not line.isspace() for line in lines.to_list() if line)
        yield lines
    if blank:
        raise CorpusInputError(f"{uri}: the input is empty")


def _plain_lines(chunk: bytes, stream: io.BufferedReader, max_chars: int, bom: bool) -> pl.Series | None:
    """A chunk's lines (decoded and split by polars), or None when it is not valid UTF-8, ends inside a line
    longer than the read limit, or holds a line that may be longer than ``max_chars``."""
    if not chunk.endswith(b"\n") and stream.peek(1):
        return None
    body = (chunk.removeprefix(_BOM) if bom else chunk).removesuffix(b"\n")
    try:
        text = pl.Series([body], dtype=pl.Binary).cast(pl.String)  # validates the UTF-8
    except pl.exceptions.ComputeError:
        return None
    lines = text.str.split("\n").explode()
    return None if (lines.str.len_chars().max() or 0) > max_chars else lines


def _exact_lines(
    uri: str, stream: io.BufferedReader, max_chars: int, line_no: int, offset: int, blank: bool
) -> Iterator[str]:
    """The lines from line ``line_no + 1`` (at byte ``offset``) on, each read with a bounded buffer: a line
    longer than ``max_chars`` is refused, its length counted without holding it; a source of blank lines is
    empty."""
    limit = 4 * max_chars + 2
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


def _jsonl_records(uri: str, lines: Iterator[str], column: str) -> Iterator[Record]:
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


def _csv_records(uri: str, lines: Iterator[str], column: str) -> Iterator[Record]:
    """CSV follows RFC 4180 (a quoted field may span lines): the csv module reads it, a record at a time."""
    reader = csv.reader(lines)
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


def _parquet_frames(uri: str, data: bytes, column: str, max_chars: int) -> Iterator[pl.DataFrame]:
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
    return _parquet_batches(uri, parquet, column, max_chars)


def _parquet_batches(uri: str, parquet: pq.ParquetFile, column: str, max_chars: int) -> Iterator[pl.DataFrame]:
    """Every row group's values; the rows before a value longer than ``max_chars``, then its refusal."""
    first = 1
    for batch in parquet.iter_batches(columns=[column]):
        values = pl.Series("raw", batch.column(0), pl.String)
        over = values.str.len_chars().gt(max_chars).fill_null(False).arg_true()
        end = values.len() if over.is_empty() else int(over[0])
        yield _frame(pl.int_range(first, first + end, eager=True), values.head(end))
        if not over.is_empty():
            raise CorpusInputError(
                f"{uri}: row {first + end} holds {values.str.len_chars()[end]} characters, more than"
                f" max_line_chars={max_chars}"
            )
        first += values.len()
