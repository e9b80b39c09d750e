"""Drift statistics: a profile of a partition (teacher embeddings and text) and a score against a reference.

A :class:`Profile` holds sums, so the profiles of several partitions merge exactly into one (the reference:
every partition a model trained on). From them come the reported statistics: the embeddings' L2 norm (mean,
sd), their mean direction (unit vector), the explained variance ratio under a projection (the variance the
k components capture over the total, around the partition's own mean) and its relative reconstruction error
around the PCA's mean ``m`` (the mean of the data it was fitted on): ``Σ‖x' − CᵀCx'‖² / Σ‖x'‖²`` with
``x' = x − m``, in either mode, so that a shift of the mean away from the components counts); the text's
length in characters (mean, quantiles) and its vocabulary (the counts of the :data:`VOCABULARY_SIZE` most
frequent lower-cased word tokens).

:func:`compare` scores a partition against a reference with four components, each in [0, 1]:

- ``direction``: cosine distance of the mean directions, ``1 − cos``, clipped to [0, 1];
- ``reconstruction``: relative change of the reconstruction error, ``|e − e_ref| / e_ref``, capped at 1;
- ``length``: population stability index of the text lengths over :data:`LENGTH_EDGES`, capped at 1
  (by convention PSI above 0.25 is a major shift);
- ``vocabulary``: ``1 − Σ_t min(p_t, q_t)``, one minus the overlap of the two token distributions (each
  normalised over its kept vocabulary).

The drift score is their weighted mean (:data:`WEIGHTS`, summing to 1); a score at or above the threshold
is flagged.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from tasks.core.stage_records import DriftScore
from tasks.ml.projection import Projection

VOCABULARY_SIZE = 2000
LENGTH_EDGES = (0, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # characters; the last bucket is open
WEIGHTS = {"direction": 0.3, "reconstruction": 0.2, "length": 0.2, "vocabulary": 0.3}
QUANTILES = (0.1, 0.5, 0.9)
STATISTICS = (  # what Profile.summary reports, in this order
    "rows",
    "norm_mean",
    "norm_sd",
    "explained_variance_ratio",
    "reconstruction_error",
    "length_mean",
    *(f"length_p{round(q * 100)}" for q in QUANTILES),
    "tokens",
    "vocabulary_kept",
)
_EPSILON = 1e-4  # PSI: the share given to an empty bucket
_TOKEN = re.compile(r"\w+")


@dataclass(frozen=True)
class Profile:
    """Sums over a partition's rows; :meth:`merge` adds two, :meth:`summary` derives the statistics."""

    rows: int
    norm_sum: float
    norm_sq_sum: float
    vector_sum: list[float]
    projected_sum: list[float]
    projected_sq_sum: float
    energy_sum: float
    residual_sum: float
    length_counts: dict[int, int]
    tokens: int
    vocabulary: dict[str, int] = field(default_factory=dict)

    def merge(self, other: Profile) -> Profile:
        return Profile(
            self.rows + other.rows,
            self.norm_sum + other.norm_sum,
            self.norm_sq_sum + other.norm_sq_sum,
            (np.asarray(self.vector_sum) + np.asarray(other.vector_sum)).tolist(),
            (np.asarray(self.projected_sum) + np.asarray(other.projected_sum)).tolist(),
            self.projected_sq_sum + other.projected_sq_sum,
            self.energy_sum + other.energy_sum,
            self.residual_sum + other.residual_sum,
            dict(Counter(self.length_counts) + Counter(other.length_counts)),
            self.tokens + other.tokens,
            _top(Counter(self.vocabulary) + Counter(other.vocabulary)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "length_counts": {str(k): v for k, v in sorted(self.length_counts.items())}}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Profile:
        """The profile :meth:`to_dict` wrote (JSON keys the text lengths as strings)."""
        read = cls(**record)
        return replace(read, length_counts={int(k): v for k, v in read.length_counts.items()})

    def mean_direction(self) -> np.ndarray:
        mean = np.asarray(self.vector_sum) / max(self.rows, 1)
        return mean / max(float(np.linalg.norm(mean)), 1e-30)

    def reconstruction_error(self) -> float:
        return self.residual_sum / max(self.energy_sum, 1e-30)

    def summary(self) -> dict[str, Any]:
        """The statistics a report shows (rounded)."""
        n = max(self.rows, 1)
        mean, projected_mean = np.asarray(self.vector_sum) / n, np.asarray(self.projected_sum) / n
        total = self.norm_sq_sum / n - float(mean @ mean)
        captured = self.projected_sq_sum / n - float(projected_mean @ projected_mean)
        lengths = _quantiles(self.length_counts)
        return {
            "rows": self.rows,
            "norm_mean": round(self.norm_sum / n, 6),
            "norm_sd": round(float(np.sqrt(max(self.norm_sq_sum / n - (self.norm_sum / n) ** 2, 0.0))), 6),
            "explained_variance_ratio": round(captured / max(total, 1e-30), 6),
            "reconstruction_error": round(self.reconstruction_error(), 6),
            "length_mean": round(sum(k * v for k, v in self.length_counts.items()) / n, 2),
            **{f"length_p{round(q * 100)}": value for q, value in lengths.items()},
            "tokens": self.tokens,
            "vocabulary_kept": len(self.vocabulary),
        }


def profile(texts: list[str], embeddings: np.ndarray, projection: Projection) -> Profile:
    """The profile of rows ``texts`` with their teacher ``embeddings``, under ``projection``."""
    x = embeddings.astype(np.float64)
    norms = np.linalg.norm(x, axis=1)
    components = projection.components.astype(np.float64)
    projected = x @ components.T
    shifted = x - projection.mean.astype(np.float64)
    residual = shifted - (shifted @ components.T) @ components
    tokens = Counter(token for text in texts for token in _TOKEN.findall(text.lower()))
    return Profile(
        rows=len(x),
        norm_sum=float(norms.sum()),
        norm_sq_sum=float((norms**2).sum()),
        vector_sum=x.sum(axis=0).tolist(),
        projected_sum=projected.sum(axis=0).tolist(),
        projected_sq_sum=float((projected**2).sum()),
        energy_sum=float((shifted**2).sum()),
        residual_sum=float((residual**2).sum()),
        length_counts=dict(Counter(len(text) for text in texts)),
        tokens=sum(tokens.values()),
        vocabulary=_top(tokens),
    )


def merged(profiles: Iterable[Profile]) -> Profile:
    """One profile of all ``profiles`` (at least one)."""
    items = iter(profiles)
    total = next(items)
    for item in items:
        total = total.merge(item)
    return total


def compare(partition: Profile, reference: Profile, threshold: float) -> DriftScore:
    """The drift of ``partition`` from ``reference``: each component, the weighted score, and the flag."""
    reference_error = reference.reconstruction_error()
    components = {
        "direction": float(np.clip(1.0 - partition.mean_direction() @ reference.mean_direction(), 0.0, 1.0)),
        "reconstruction": min(
            1.0, abs(partition.reconstruction_error() - reference_error) / max(reference_error, 1e-30)
        ),
        "length": min(1.0, population_stability(_buckets(partition.length_counts), _buckets(reference.length_counts))),
        "vocabulary": 1.0 - min(1.0, vocabulary_overlap(partition.vocabulary, reference.vocabulary)),
    }
    score = sum(WEIGHTS[name] * value for name, value in components.items())
    return DriftScore(
        score=round(score, 6),
        threshold=threshold,
        flagged=score >= threshold,
        components={name: round(value, 6) for name, value in components.items()},
        weights=WEIGHTS,
        partition=partition.summary(),
        reference=reference.summary(),
    )


def population_stability(counts: np.ndarray, reference: np.ndarray) -> float:
    """PSI ``Σ (p − q) ln(p / q)`` of two histograms over the same buckets (empty buckets count as a tiny share)."""
    p = np.maximum(counts / max(counts.sum(), 1), _EPSILON)
    q = np.maximum(reference / max(reference.sum(), 1), _EPSILON)
    return float(((p - q) * np.log(p / q)).sum())


def vocabulary_overlap(counts: dict[str, int], reference: dict[str, int]) -> float:
    """``Σ_t min(p_t, q_t)`` of two token distributions: 1 for equal ones, 0 for disjoint ones."""
    total, reference_total = max(sum(counts.values()), 1), max(sum(reference.values()), 1)
    return sum(min(n / total, reference[t] / reference_total) for t, n in counts.items() if t in reference)


def _buckets(length_counts: dict[int, int]) -> np.ndarray:
    histogram = np.zeros(len(LENGTH_EDGES))
    for length, count in length_counts.items():
        histogram[np.searchsorted(LENGTH_EDGES, length, side="right") - 1] += count
    return histogram


def _quantiles(length_counts: dict[int, int]) -> dict[float, int]:
    """The text-length quantiles :data:`QUANTILES` (lower, from the exact counts)."""
    if not length_counts:
        return dict.fromkeys(QUANTILES, 0)
    lengths = np.array(sorted(length_counts))
    cumulative = np.cumsum([length_counts[k] for k in lengths])
    return {q: int(lengths[np.searchsorted(cumulative, q * cumulative[-1])]) for q in QUANTILES}


def _top(tokens: Counter[str]) -> dict[str, int]:
    """The :data:`VOCABULARY_SIZE` most frequent tokens, ties by token, most frequent first."""
    return dict(sorted(tokens.items(), key=lambda item: (-item[1], item[0]))[:VOCABULARY_SIZE])
