"""Finite numbers only: an array the pipeline reads and did not compute itself (teacher embeddings, projected
targets, a PCA artifact, weights, vectors to index) is refused, naming where it came from, when it holds a NaN
or an infinity, before anything trains, fits or publishes on it."""

from __future__ import annotations

import numpy as np


class NonFiniteError(ValueError):
    """Numbers holding NaN or infinite values; the message names their source."""


def require_finite(values: np.ndarray, source: str, what: str = "value") -> None:
    """Raise :class:`NonFiniteError` naming ``source`` (and the first bad row of a 2-d array) unless every one of
    ``values`` is finite."""
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        where = f", first in row {first // values.shape[1]}" if values.ndim == 2 else ""
        raise NonFiniteError(f"{source}: {int(bad.sum())} NaN or infinite {what}(s){where}")
