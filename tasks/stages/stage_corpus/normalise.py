"""A batch of raw records as normalised, filtered, identified rows: :func:`tasks.core.sentences.normalise_text`
as polars expressions, with the same result for every input.

Whitespace is Python's own (``str.isspace``) and control characters the same C0/DEL/C1 set. Unicode NFC is
stable across Unicode versions for assigned characters only, so a text holding a character that Python's
Unicode database does not assign is normalised by the Python function instead.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections import Counter
from functools import cache

import numpy as np
import polars as pl

from tasks.core import sentences
from tasks.stages.stage_corpus.id_hasher import IdHasher

SCHEMA = {"sentence_id": pl.String, "text": pl.String, "source": pl.String, "line": pl.Int64}


def _char_class(chosen: np.ndarray) -> str:
    """A regex character class of the code points ``chosen`` (a mask over every one) marks, as ranges."""
    edges = np.flatnonzero(np.diff(chosen.astype(np.int8), prepend=0, append=0)).reshape(-1, 2)
    return "[" + "".join(f"\\x{{{a:x}}}-\\x{{{b - 1:x}}}" if b - a > 1 else f"\\x{{{a:x}}}" for a, b in edges) + "]"


def _runs(spaces: str, others: str) -> str:
    """Runs of ``spaces`` (a class holding the space and ``others``) other than one plain space: the only
    ones normalisation changes, so text that is already normal costs no replacement."""
    return f"{others}{spaces}*|\\x20{spaces}+"


@cache
def _patterns() -> tuple[str, str]:
    """Runs of whitespace or control characters to collapse; a character Python's Unicode database leaves
    unassigned."""
    codes = np.arange(sys.maxunicode + 1, dtype="<u4")
    every = codes.tobytes().decode("utf-32-le", "surrogatepass")  # every code point, in order, in one string
    others = np.zeros(len(every), dtype=bool)
    others[[m.start() for m in re.finditer(r"\s", every)]] = True  # re's \s on str is str.isspace
    others[(codes < 0x20) | ((codes >= 0x7F) & (codes < 0xA0))] = True
    spaces, others[0x20] = others.copy(), False
    unassigned = np.fromiter(map("Cn".__eq__, map(unicodedata.category, every)), dtype=bool, count=len(every))
    return _runs(_char_class(spaces), _char_class(others)), _char_class(unassigned)


def _ascii(raw: pl.Expr) -> pl.Expr:
    """Normalisation of ASCII text: NFC leaves it as it is; controls and whitespace are ``[\\x00-\\x20\\x7f]``."""
    return raw.str.replace_all(_runs(r"[\x00-\x20\x7f]", r"[\x00-\x1f\x7f]"), " ").str.strip_chars(" ")


def _unicode(raw: pl.Expr) -> pl.Expr:
    runs, _ = _patterns()
    return raw.str.normalize("NFC").str.replace_all(runs, " ").str.strip_chars(" ")


def normalise_series(raw: pl.Series) -> pl.Series:
    """``sentences.normalise_text`` of every value (None as empty): ASCII and Unicode texts by polars expressions,
    texts holding a character Python's Unicode database leaves unassigned by the Python function itself."""
    _, unassigned = _patterns()
    frame = pl.DataFrame({"raw": raw.fill_null("")}).with_row_index()
    wide = pl.col("raw").str.contains(r"[^\x00-\x7f]")
    texts = frame.select(_ascii(pl.col("raw"))).to_series()
    unicode = frame.filter(wide).with_columns(
        text=_unicode(pl.col("raw")), exotic=pl.col("raw").str.contains(unassigned)
    )
    if unicode.height:
        texts = texts.scatter(unicode["index"], unicode["text"])
    for row, text in unicode.filter(pl.col("exotic")).select("index", "raw").iter_rows():
        texts = texts.scatter(row, sentences.normalise_text(text))
    return texts.alias("text")


def kept_rows(batch: pl.DataFrame, source: str, max_chars: int, hasher: IdHasher) -> tuple[pl.DataFrame, Counter[str]]:
    """The rows of ``batch`` (``line``, ``raw``) that are neither empty nor longer than ``max_chars`` once
    normalised, with their ids (``SCHEMA``, and ``raw_id``: the id's bytes, computed by ``hasher``), and how
    many were dropped for each of those reasons."""
    frame = batch.select("line", text=normalise_series(batch["raw"]))
    length = pl.col("text").str.len_chars()
    counts = frame.select(empty=(length == 0).sum(), too_long=(length > max_chars).sum()).row(0, named=True)
    kept = frame.filter((length > 0) & (length <= max_chars))
    raw = hasher.digests(kept["text"])
    kept = kept.with_columns(raw.bin.encode("hex").alias("sentence_id"), raw, source=pl.lit(source, pl.String))
    return kept.select(*SCHEMA, "raw_id"), Counter(counts)
