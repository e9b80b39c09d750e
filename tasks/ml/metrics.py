"""Retrieval and fidelity metrics, each a plain function of arrays (tested on hand-computed cases)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def nearest(corpus: np.ndarray, queries: np.ndarray, k: int, exclude_self: bool = False) -> np.ndarray:
    """Indices of the ``k`` most cosine-similar corpus rows per query (exact search); with
    ``exclude_self`` the queries are corpus rows ``0..len(queries)-1`` and each skips itself."""
    scores = l2_normalise(queries) @ l2_normalise(corpus).T
    if exclude_self:
        scores[np.arange(len(queries)), np.arange(len(queries))] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each row's true neighbours that were found (both ``queries × k`` index arrays)."""
    k = truth.shape[1]
    return float(np.mean([len(set(f[:k]) & set(t)) / k for f, t in zip(found, truth, strict=True)]))


def mean_reciprocal_rank(queries: np.ndarray, candidates: np.ndarray, answers: np.ndarray) -> float:
    """MRR of retrieving candidate ``answers[i]`` for query ``i`` among all candidates by cosine."""
    scores = l2_normalise(queries) @ l2_normalise(candidates).T
    correct = scores[np.arange(len(queries)), answers]
    ranks = 1 + (scores > correct[:, None]).sum(axis=1)
    return float(np.mean(1.0 / ranks))


class Fidelity(NamedTuple):
    """How close student outputs come to their targets."""

    mse: float
    mean_cosine: float


def fidelity(predicted: np.ndarray, targets: np.ndarray) -> Fidelity:
    """Mean squared error and mean cosine between student outputs and teacher targets."""
    predicted, targets = np.asarray(predicted, np.float64), np.asarray(targets, np.float64)
    cosine = (l2_normalise(predicted) * l2_normalise(targets)).sum(axis=1)
    return Fidelity(float(((predicted - targets) ** 2).mean()), float(cosine.mean()))
