"""Checkpoints of a distillation run in the store (``students/<run>/checkpoints/``, placed by the catalog).

Each checkpoint holds the model, optimizer, scheduler and scaler states, the best weights so far,
the run's progress and every process's RNG states; ``latest.json`` names the newest with the run's
fingerprint, so only a run with the same inputs and params resumes from it. The two newest are kept.

The store is not trusted with code: a checkpoint holds tensors and plain types only (see
:func:`tasks.stages.distill.state.rng_states`) and loads with ``torch.load(..., weights_only=True)``,
so a planted pickle is refused, never run; and ``latest.json`` may only name a ``step-<8 digits>.pt``
of this run's own folder. It names it by store-relative ``key`` (``students/<run>/checkpoints/step-....pt``),
resolved against the store that reads it, so a copied store resumes from its own checkpoints.
"""

from __future__ import annotations

import io
import json
import logging
import re
from typing import Any

from tasks.core import catalog, storage, uris
from tasks.core.progress import format_bytes

LATEST = "latest.json"
STEP_NAME = re.compile(r"step-\d{8}\.pt")
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint or ``latest.json`` pointer that is refused; the message starts with its URI."""


class Checkpoints:
    """The checkpoints of one run (``run``) with one fingerprint."""

    def __init__(self, store: str, run: str, fingerprint: str) -> None:
        self.store = store
        self.prefix = catalog.checkpoints_prefix(store, run)
        self.fingerprint = fingerprint

    def latest(self) -> dict[str, Any] | None:
        """The ``latest.json`` pointer (key, step, init record) when it belongs to this fingerprint."""
        uri = storage.join(self.prefix, LATEST)
        if not storage.exists(uri):
            return None
        try:
            pointer = json.loads(storage.read_bytes(uri))
        except ValueError as exc:
            raise CheckpointError(f"{uri}: corrupted checkpoint pointer ({exc})") from None
        if not isinstance(pointer, dict):
            raise CheckpointError(f"{uri}: corrupted checkpoint pointer (not a JSON object)")
        return pointer if pointer.get("fingerprint") == self.fingerprint else None

    def resume(self) -> tuple[dict[str, Any], str, dict[str, Any]] | None:
        """The latest checkpoint of this fingerprint: its pointer, URI and payload; None when there is none."""
        pointer = self.latest()
        if pointer is None:
            return None
        uri = self.checkpoint_uri(pointer)
        return pointer, uri, self.load(uri)

    def checkpoint_uri(self, pointer: dict[str, Any]) -> str:
        """The checkpoint ``pointer`` names by store-relative key, resolved against this store, when it is a
        ``step-<8 digits>.pt`` directly in :attr:`prefix` (spelt as :meth:`save` spells it); anything else
        (an absolute URI, a key with a ``.`` or ``..`` segment, another folder) is refused unread."""
        where, named = storage.join(self.prefix, LATEST), pointer.get("key")
        try:
            if not isinstance(named, str) or "://" in named:
                raise storage.StorageError(str(named), "not a store-relative key")
            uri = uris.contained(self.prefix, catalog.resolve(self.store, named))
        except storage.StorageError as exc:
            raise CheckpointError(
                f"{where}: names {named!r}, outside this run's checkpoints {self.prefix} ({exc.message}); refused"
            ) from None
        name = uri.rsplit("/", 1)[-1]
        if not STEP_NAME.fullmatch(name) or uri != storage.join(self.prefix, name):
            raise CheckpointError(
                f"{where}: names {named!r}, not a step-<8 digits>.pt checkpoint directly in {self.prefix}; refused"
            )
        return uri

    def save(self, step: int, payload: dict[str, Any], init_record: dict[str, Any]) -> str:
        """Publish the checkpoint of ``step``, point ``latest.json`` at it, drop all but the newest two."""
        import torch

        buffer = io.BytesIO()
        torch.save({"fingerprint": self.fingerprint, **payload}, buffer)
        uri = storage.join(self.prefix, f"step-{step:08d}.pt")
        storage.write_bytes(uri, buffer.getvalue())
        key = catalog.store_key(self.store, uri)
        pointer = {"key": key, "step": step, "fingerprint": self.fingerprint, "init": init_record}
        storage.write_bytes(storage.join(self.prefix, LATEST), json.dumps(pointer).encode())
        log.info("checkpoint of step %d written: %s (%s)", step, uris.redact(uri), format_bytes(len(buffer.getvalue())))
        older = sorted(u for u in storage.list_uris(self.prefix) if u.endswith(".pt") and u != uri)
        for stale in older[:-1]:  # keep this checkpoint and the one before it
            storage.delete(stale)
            log.debug("checkpoint %s deleted", uris.redact(stale))
        return uri

    def load(self, uri: str) -> dict[str, Any]:
        """The payload of checkpoint ``uri``, on the CPU (RNG states must stay CPU tensors). Weights-only:
        tensors and plain types load, any other object (a pickled class or callable) is refused unrun."""
        import torch

        try:
            body = storage.read_bytes(uri)
        except storage.StorageError as exc:
            raise CheckpointError(f"{uri}: corrupted or incompatible checkpoint ({exc.message})") from None
        if not body.startswith(ZIP_MAGIC):
            raise CheckpointError(f"{uri}: corrupted or incompatible checkpoint (not a torch archive); refused")
        try:
            payload = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
        except Exception as exc:  # a damaged archive fails in many ways (zip, unpickling)
            raise _refused(uri, exc) from None
        if not isinstance(payload, dict) or payload.get("fingerprint") != self.fingerprint:
            raise CheckpointError(f"{uri}: corrupted or incompatible checkpoint (not one of this fingerprint's)")
        return payload


def _refused(uri: str, exc: Exception) -> CheckpointError:
    """Why ``torch.load(..., weights_only=True)`` refused ``uri``, without torch's advice to load it unsafely."""
    text = str(exc)
    if type(exc).__name__ != "UnpicklingError" or "WeightsUnpickler error:" not in text:  # not pickle's refusal
        return CheckpointError(f"{uri}: corrupted or incompatible checkpoint ({type(exc).__name__}: {exc})")
    detail = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0].split(" Please", 1)[0]
    return CheckpointError(
        f"{uri}: not a safe checkpoint, refused: it holds more than tensors and plain types "
        f"({' '.join(detail.split())[:300]}); nothing in it was run"
    )
