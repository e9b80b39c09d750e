"""User STS pair files: CSV or TSV with a header holding ``sentence1``, ``sentence2`` and ``score``."""

from __future__ import annotations

import csv
import io

import numpy as np

from tasks.core import storage
from tasks.ml import sts
from tasks.stages.validate.errors import ValidateError


def read_pairs(uri: str) -> sts.PairSet:
    """The pairs of the file at ``uri`` (any store URI or path)."""
    uri = storage.to_uri(uri)
    text = storage.read_bytes(uri).decode("utf-8-sig", errors="strict")
    dialect = "excel-tab" if uri.endswith((".tsv", ".tsv.gz")) or "\t" in text.split("\n", 1)[0] else "excel"
    rows = list(csv.DictReader(io.StringIO(text), dialect=dialect))
    missing = {"sentence1", "sentence2", "score"} - set(rows[0] if rows else {})
    if not rows or missing:
        raise ValidateError(f"{uri}: needs columns sentence1, sentence2, score (missing {sorted(missing)})")
    try:
        scores = np.array([float(r["score"]) for r in rows])
    except (TypeError, ValueError):
        bad = next(i for i, r in enumerate(rows, start=2) if not _is_number(r["score"]))
        raise ValidateError(f"{uri}: line {bad}: score {rows[bad - 2]['score']!r} is not a number") from None
    return sts.PairSet(uri.rsplit("/", 1)[-1], [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], scores)


def _is_number(value: str | None) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
        return True
    except (TypeError, ValueError):
        return False
