"""A search hit: one corpus sentence near a query, as the index, the search service and ``hpd search`` pass it
(light to import: an answer from the service needs neither torch nor FAISS)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hit:
    """The ``rank``-th nearest corpus sentence to a query (1 first) and its cosine ``score``."""

    rank: int
    score: float
    sentence_id: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        """The hit as the service's JSON answers hold it."""
        return {"rank": self.rank, "score": self.score, "sentence_id": self.sentence_id, "text": self.text}

    def line(self) -> str:
        """The hit as ``hpd search`` prints it."""
        return f"{self.rank:>3}  {self.score:.4f}  {self.text}"
