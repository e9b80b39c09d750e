"""Checkpoints of a distillation run in the store (``students/<run>/checkpoints/``, placed by the catalog).

Each checkpoint holds the model, optimizer, scheduler and scaler states, the best weights so far,
the run's progress and every process's RNG states; ``latest.json`` names the newest with the run's
fingerprint, so only a run with the same inputs and params resumes from it. The two newest are kept.
"""

from __future__ import annotations

import io
import json
from typing import Any

from tasks.core import catalog, storage

LATEST = "latest.json"


class Checkpoints:
    """The checkpoints of one run (``run``) with one fingerprint."""

    def __init__(self, store: str, run: str, fingerprint: str) -> None:
        self.prefix = catalog.checkpoints_prefix(store, run)
        self.fingerprint = fingerprint

    def latest(self) -> dict[str, Any] | None:
        """The ``latest.json`` pointer (uri, step, init record) when it belongs to this fingerprint."""
        uri = storage.join(self.prefix, LATEST)
        if not storage.exists(uri):
            return None
        pointer = json.loads(storage.read_bytes(uri))
        return pointer if pointer.get("fingerprint") == self.fingerprint else None

    def save(self, step: int, payload: dict[str, Any], init_record: dict[str, Any]) -> str:
        """Publish the checkpoint of ``step``, point ``latest.json`` at it, drop all but the newest two."""
        import torch

        buffer = io.BytesIO()
        torch.save({"fingerprint": self.fingerprint, **payload}, buffer)
        uri = storage.join(self.prefix, f"step-{step:08d}.pt")
        storage.write_bytes(uri, buffer.getvalue())
        pointer = {"uri": uri, "step": step, "fingerprint": self.fingerprint, "init": init_record}
        storage.write_bytes(storage.join(self.prefix, LATEST), json.dumps(pointer).encode())
        older = sorted(u for u in storage.list_uris(self.prefix) if u.endswith(".pt") and u != uri)
        for stale in older[:-1]:  # keep this checkpoint and the one before it
            storage.delete(stale)
        return uri

    @staticmethod
    def load(uri: str) -> dict[str, Any]:
        """The payload of checkpoint ``uri``, on the CPU (RNG states must stay CPU tensors)."""
        import torch

        return torch.load(io.BytesIO(storage.read_bytes(uri)), map_location="cpu", weights_only=False)
