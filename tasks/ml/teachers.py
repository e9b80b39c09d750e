"""Teacher specs: one model, or several joined by ``+`` whose embeddings are concatenated.

HPD's targets come from a teacher's embeddings. A composite teacher (``all-mpnet-base-v2+all-MiniLM-L6-v2``)
gives each member's embedding L2-normalised and concatenated (768 + 384 = 1,152-d, scaled back to unit norm),
so the PCA that follows keeps what the members agree on: the targets score above the big teacher's alone on
STS and start much closer to a student built from a member (``bench/distill_quality``'s two-teacher lever).
A member may carry a weight (``0.5*all-MiniLM-L6-v2``: its block scaled by 0.5 before the rescaling; 1 when
none is given), which sets how much of the PCA's variance, and so of the targets, it accounts for.
Each member is encoded once by its own encode_teacher run and combined from the store, so a second teacher
costs its own encoding only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tasks.core import teacher_spec


def members(spec: str) -> list[str]:
    """The models of a teacher spec, in order (one for a plain model spec), without their weights."""
    return [model for model, _ in weighted_members(spec)]


def weighted_members(spec: str) -> list[tuple[str, float]]:
    """Each member's model and weight, in order: a composite's ``0.5*model`` weighs 0.5, a member without a
    weight 1 (a plain model spec is one member of weight 1, taken as it is)."""
    split = teacher_spec.split(spec)
    if len(split) == 1:
        return [(split[0].model, 1.0)]
    models = [member.model for member in split]
    if not all(models) or len(set(models)) != len(models):
        raise ValueError(f"teacher {spec!r}: a composite teacher joins distinct, non-empty model specs with '+'")
    return [(member.model, _weight(member, spec)) for member in split]


def weights(spec: str) -> list[float]:
    """The members' weights, in order (:func:`weighted_members`)."""
    return [weight for _, weight in weighted_members(spec)]


def _weight(member: teacher_spec.Member, spec: str) -> float:
    if member.weight is None:
        return 1.0
    try:
        value = float(member.weight)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"teacher {spec!r}: {member.weight!r} is not a positive weight ('<weight>*<model>')")
    return value


def is_composite(spec: str) -> bool:
    return len(members(spec)) > 1


def combine(embeddings: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
    """Each member's rows L2-normalised and scaled by its weight (default: all 1), side by side, scaled by
    1/sqrt(sum of squared weights) so that a combined row is unit-norm as a single teacher's is (float32)."""
    weights = [1.0] * len(embeddings) if weights is None else list(weights)
    unit = [
        w * e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        for e, w in zip(embeddings, weights, strict=True)
    ]
    return (np.hstack(unit) / np.sqrt(sum(w * w for w in weights))).astype(np.float32)


class CompositeTeacher:
    """Encodes with every member and combines, as a composite teacher's shards are written."""

    def __init__(self, spec: str, encoders: list[Any]) -> None:
        self.model_id, self.encoders = spec, encoders

    @property
    def dim(self) -> int:
        return sum(encoder.dim for encoder in self.encoders)

    def encode(self, texts: list[str], batch_size: int = 64, dtype: str = "fp32") -> np.ndarray:
        encoded = [encoder.encode(texts, batch_size=batch_size, dtype=dtype) for encoder in self.encoders]
        return combine(encoded, weights(self.model_id))


def load(spec: str, device: str = "cpu", max_seq_length: int | None = None) -> Any:
    """The teacher's encoder: a :class:`~tasks.ml.encoder.SentenceEncoder`, or a :class:`CompositeTeacher`."""
    from tasks.ml.encoder import SentenceEncoder

    names = members(spec)
    if len(names) == 1:
        return SentenceEncoder.load(spec, device=device, max_seq_length=max_seq_length)
    return CompositeTeacher(spec, [SentenceEncoder.load(name, device, max_seq_length) for name in names])
