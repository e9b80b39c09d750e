"""User STS pair files: CSV or TSV (optionally gzipped) with a header holding ``sentence1``, ``sentence2`` and
``score``."""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from typing import NamedTuple

import numpy as np

from tasks.core import storage
from tasks.ml import sts
from tasks.stages.validate.errors import ValidateError

GZIP_MAGIC = b"\x1f\x8b"


class _Pair(NamedTuple):
    """One row of a pair file, as written (the score still text)."""

    sentence1: str
    sentence2: str
    score: str


def read_pairs(uri: str) -> sts.PairSet:
    """The pairs of the file at ``uri`` (any store URI or path); a :class:`ValidateError` naming it when it is not
    UTF-8 CSV/TSV text with the three columns and numeric scores."""
    uri = storage.to_uri(uri)
    pairs = _pairs(uri, _text(uri))
    try:
        scores = np.array([float(pair.score) for pair in pairs])
    except ValueError:
        line, bad = next((i, p) for i, p in enumerate(pairs, start=2) if not _is_number(p.score))
        raise ValidateError(f"{uri}: line {line}: score {bad.score!r} is not a number") from None
    texts = [pair.sentence1 for pair in pairs], [pair.sentence2 for pair in pairs]
    return sts.PairSet(uri.rsplit("/", 1)[-1], *texts, scores)


def _text(uri: str) -> str:
    """The file's text: gunzipped when it is gzip, decoded as UTF-8 (a BOM dropped)."""
    body = storage.read_bytes(uri)
    try:
        body = gzip.decompress(body) if body.startswith(GZIP_MAGIC) else body
        text = body.decode("utf-8-sig")
    except (OSError, EOFError, zlib.error) as exc:
        raise ValidateError(f"{uri}: not a readable gzip file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise ValidateError(f"{uri}: not UTF-8 text (byte {exc.start}); pair files are CSV or TSV") from None
    if "\x00" in text:
        raise ValidateError(f"{uri}: binary, not CSV or TSV text (it holds NUL bytes)")
    return text


def _pairs(uri: str, text: str) -> list[_Pair]:
    """The rows under the header, by column name (a short row's missing cells empty)."""
    tab = uri.endswith((".tsv", ".tsv.gz")) or "\t" in text.split("\n", 1)[0]
    try:
        rows = list(csv.reader(io.StringIO(text), dialect="excel-tab" if tab else "excel"))
    except csv.Error as exc:
        raise ValidateError(f"{uri}: not readable CSV ({exc})") from None
    header = rows[0] if rows else []
    missing = [column for column in _Pair._fields if column not in header]
    if len(rows) < 2 or missing:
        raise ValidateError(f"{uri}: needs columns sentence1, sentence2, score (missing {missing})")
    at = [header.index(column) for column in _Pair._fields]
    return [_Pair(*(row[i] if i < len(row) else "" for i in at)) for row in rows[1:] if row]


def _is_number(value: str) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return False
