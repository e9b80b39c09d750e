"""Stage corpus: raw sentence files -> the ``sentences`` dataset, one ``ingest_date`` partition.

Reads plain text (one sentence per line), JSONL, CSV, TSV or Parquet, each optionally gzipped;
normalises (Unicode NFC, collapsed whitespace); drops empty and over-long lines; de-duplicates by
the sentence id (a hash of the normalised text) within the input and against every partition
already staged; writes ``sentences/ingest_date=D/part-NNNNN-<sha8>.parquet`` shards and the
partition's manifest, which lists the shards and counts the dropped rows by reason.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from tasks.core import catalog, manifest, sentences, storage
from tasks.core.catalog import Stage
from tasks.stages.params import StageCorpusParams

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


class CorpusInputError(ValueError):
    """A raw input that cannot be read as sentences; the message names the URI."""


def run(params: StageCorpusParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Stage ``params.source`` into the ``sentences`` partition of ``params.ingest_date``."""
    key = catalog.partition_key(params.ingest_date)
    raw = {uri: _read_source(uri, params.max_input_bytes) for uri in _source_uris(params.source)}
    stage_run = manifest.StageRun(
        stage=Stage.STAGE_CORPUS,
        key=key,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[manifest.Input(uri, manifest.sha256_hex(data), None, len(data)) for uri, data in raw.items()],
    )
    if skipped := stage_run.skip_result(force):
        return skipped
    with stage_run.phase("read_normalise_dedup"):
        rows, dropped, records_read = _read_sentences(params, raw, progress)
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


def _read_sentences(
    params: StageCorpusParams, raw: dict[str, bytes], progress: bool
) -> tuple[dict[str, list], Counter[str], dict[str, int]]:
    """The normalised sentences kept from the raw files (columns), the drop counts by reason, and how
    many records were read from each file (at most ``params.limit`` in all)."""
    dropped: Counter[str] = Counter()
    rows: dict[str, list] = {name: [] for name in ("sentence_id", "text", "source", "line")}
    seen: set[str] = set()
    records_read: dict[str, int] = {}
    for uri, data in raw.items():
        remaining = None if params.limit is None else params.limit - sum(records_read.values())
        fmt = _format_of(uri, params.format)
        records = itertools.islice(_records(uri, data, fmt, params.column, params.max_input_bytes), remaining)
        records_read[uri] = 0
        for line_no, raw_text in tqdm(
            records, desc=f"stage {uri.rsplit('/', 1)[-1]}", unit=" lines", disable=not progress
        ):
            records_read[uri] += 1
            if raw_text and len(raw_text) > params.max_line_chars:
                raise CorpusInputError(
                    f"{uri}: line {line_no} holds {len(raw_text)} characters, more than max_line_chars="
                    f"{params.max_line_chars}"
                )
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


def _source_uris(source: str) -> list[str]:
    uri = storage.to_uri(source)
    if storage.exists(uri):
        return [uri]
    found = [u for u in storage.list_uris(uri) if not u.rsplit("/", 1)[-1].startswith((".", "_"))]
    if not found:
        raise CorpusInputError(f"{uri}: no such file, and no raw files under it")
    return found


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


def _read_source(uri: str, max_bytes: int) -> bytes:
    """A raw file's bytes, refused before reading when it is larger than ``max_bytes``."""
    if (size := storage.size(uri)) > max_bytes:
        raise CorpusInputError(f"{uri}: {size} bytes, more than max_input_bytes={max_bytes}")
    return storage.read_bytes(uri)


def _gunzip(uri: str, data: bytes, max_bytes: int) -> bytes:
    """``data`` decompressed (every gzip member), refused as soon as it grows beyond ``max_bytes``."""
    out, rest = bytearray(), data
    while rest:
        inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        try:
            chunk = rest
            while chunk and len(out) <= max_bytes:
                out += inflater.decompress(chunk, max_bytes + 1 - len(out))
                chunk = inflater.unconsumed_tail
        except zlib.error as exc:
            raise CorpusInputError(f"{uri}: corrupt gzip data ({exc})") from None
        if len(out) > max_bytes:
            raise CorpusInputError(f"{uri}: decompresses to more than max_input_bytes={max_bytes} bytes")
        if not inflater.eof:
            raise CorpusInputError(f"{uri}: corrupt gzip data (truncated)")
        rest = inflater.unused_data
    return bytes(out)


def _records(uri: str, data: bytes, fmt: str, column: str, max_bytes: int) -> Iterator[tuple[int, str | None]]:
    """(1-based line or row number, raw text) for every record of one raw file."""
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(uri, data, max_bytes)
    if not data.strip():
        raise CorpusInputError(f"{uri}: the input is empty")
    if fmt == "parquet":
        yield from _parquet_records(uri, data, column)
        return
    text = _decode(uri, data)
    if fmt == "text":
        yield from enumerate(text.splitlines(), start=1)
    elif fmt == "jsonl":
        yield from _jsonl_records(uri, text, column)
    elif fmt in ("csv", "tsv"):
        yield from _delimited_records(uri, text, column, tsv=fmt == "tsv")
    else:
        raise CorpusInputError(f"{uri}: unknown format {fmt!r}")


def _decode(uri: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CorpusInputError(f"{uri}: not valid UTF-8 at line {line} (byte {exc.start})") from None


def _jsonl_records(uri: str, text: str, column: str) -> Iterator[tuple[int, str | None]]:
    for line_no, line in enumerate(text.splitlines(), start=1):
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


def _delimited_records(uri: str, text: str, column: str, tsv: bool) -> Iterator[tuple[int, str]]:
    # TSV corpora carry bare quotes inside sentences: no quoting there; CSV follows RFC 4180.
    reader = csv.reader(
        io.StringIO(text, newline=""),
        delimiter="\t" if tsv else ",",
        quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL,
    )
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


def _parquet_records(uri: str, data: bytes, column: str) -> Iterator[tuple[int, str | None]]:
    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
    except pa.ArrowException as exc:
        raise CorpusInputError(f"{uri}: not a Parquet file ({exc})") from None
    if column not in parquet.schema_arrow.names:
        raise CorpusInputError(f"{uri}: no column {column!r} (columns: {parquet.schema_arrow.names})")
    values = parquet.read(columns=[column]).column(column)
    if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
        raise CorpusInputError(f"{uri}: column {column!r} is {values.type}, not text")
    yield from enumerate(values.to_pylist(), start=1)
