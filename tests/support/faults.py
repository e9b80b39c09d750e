"""Faults a test plants in a model's output."""

from __future__ import annotations

import numpy as np
import pytest


def nan_in_encodings(monkeypatch: pytest.MonkeyPatch, row: int, column: int) -> None:
    """Every ``SentenceEncoder.encode`` call returns a NaN at (``row``, ``column``), the rest as encoded."""
    from tasks.ml.encoder import SentenceEncoder

    encode = SentenceEncoder.encode

    def with_a_nan(self, texts, **options):  # noqa: ANN001, ANN202 - the patched method's own signature
        vectors = encode(self, texts, **options)
        vectors[row, column] = np.nan
        return vectors

    monkeypatch.setattr(SentenceEncoder, "encode", with_a_nan)
