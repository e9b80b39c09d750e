"""Teacher specs: one model, or several joined by ``+`` whose embeddings are concatenated.

HPD's targets come from a teacher's embeddings. A composite teacher (``all-mpnet-base-v2+all-MiniLM-L6-v2``)
gives each member's embedding L2-normalised and concatenated (768 + 384 = 1,152-d, scaled back to unit norm),
so the PCA that follows keeps what the members agree on: the targets score above the big teacher's alone on
STS and start much closer to a student built from a member (``bench/distill_quality``'s two-teacher lever).
Each member is encoded once by its own encode_teacher run and combined from the store, so a second teacher
costs its own encoding only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SEPARATOR = "+"


def members(spec: str) -> list[str]:
    """The models of a teacher spec, in order (one for a plain model spec)."""
    parts = [part.strip() for part in spec.split(SEPARATOR)]
    if len(parts) > 1 and (not all(parts) or len(set(parts)) != len(parts)):
        raise ValueError(f"teacher {spec!r}: a composite teacher joins distinct, non-empty model specs with '+'")
    return parts


def is_composite(spec: str) -> bool:
    return len(members(spec)) > 1


def combine(embeddings: Sequence[np.ndarray]) -> np.ndarray:
    """Each member's rows L2-normalised, side by side, scaled by 1/sqrt(members) so that a combined row is
    unit-norm as a single teacher's is and each member weighs the same (float32)."""
    unit = [e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12) for e in embeddings]
    return (np.hstack(unit) / np.sqrt(len(unit))).astype(np.float32)


class CompositeTeacher:
    """Encodes with every member and combines, as a composite teacher's shards are written."""

    def __init__(self, spec: str, encoders: list[Any]) -> None:
        self.model_id, self.encoders = spec, encoders

    @property
    def dim(self) -> int:
        return sum(encoder.dim for encoder in self.encoders)

    def encode(self, texts: list[str], batch_size: int = 64, dtype: str = "fp32") -> np.ndarray:
        return combine([encoder.encode(texts, batch_size=batch_size, dtype=dtype) for encoder in self.encoders])


def load(spec: str, device: str = "cpu", max_seq_length: int | None = None) -> Any:
    """The teacher's encoder: a :class:`~tasks.ml.encoder.SentenceEncoder`, or a :class:`CompositeTeacher`."""
    from tasks.ml.encoder import SentenceEncoder

    names = members(spec)
    if len(names) == 1:
        return SentenceEncoder.load(spec, device=device, max_seq_length=max_seq_length)
    return CompositeTeacher(spec, [SentenceEncoder.load(name, device, max_seq_length) for name in names])
