"""Promotion as part of a stage run's transaction.

A promoting run (build_index moving ``indexes/current.json``, validate moving ``models/current.json``) reads the
pointer before it runs, publishes its manifest with the version of the pointer it read (``promotion.seen_etag``
in its stats), then moves the pointer by compare-and-swap against that version. A rerun that finds the run's
work published (a skip) settles the promotion instead of reporting a bare skip (:func:`settle`):

- the pointer names the published run: it is promoted, nothing to do;
- the pointer is still the version the run read: the run stopped between its publish and its move (a crash, a
  kill, a retry after a lost connection), so the rerun completes the move, by compare-and-swap;
- the pointer moved since the run read it: another promotion came after, and this run is superseded; nothing
  moves (a rerun never takes a pointer back from a newer promotion).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tasks.core import catalog, manifest, promoted, uris
from tasks.core.catalog import IndexPointer, ModelPointer, Pointer

log = logging.getLogger(__name__)


class Settlement(StrEnum):
    """What a rerun of a published promoting run found."""

    PROMOTED = "promoted already"
    UNFINISHED = "published but its pointer move unfinished"
    SUPERSEDED = "superseded: the pointer moved since this run read it"


@dataclass(frozen=True)
class Promotion:
    """The version (etag) of the pointer a promoting run read before it ran; None: there was no pointer yet."""

    seen_etag: str | None

    def as_stats(self) -> dict[str, Any]:
        """The record the run's manifest stats carry."""
        return {"promotion": {"seen_etag": self.seen_etag}}

    @classmethod
    def recorded(cls, stats: dict[str, Any]) -> Promotion | None:
        """The record in a published run's ``stats``; None when it has none (a run that did not promote)."""
        record = stats.get("promotion")
        return cls(record.get("seen_etag")) if isinstance(record, dict) else None


def settle(
    store: str, pointer: catalog.Pointer, names_it: Callable[[Any], bool], stats: dict[str, Any]
) -> tuple[Settlement, str | None]:
    """Where the promotion of a published run stands (``names_it``: whether a pointer value names that run;
    ``stats``: its manifest's), and the pointer's current etag, to move it against when it is unfinished."""
    current, etag = promoted.read(store, pointer)
    if current is not None and names_it(current):
        return Settlement.PROMOTED, etag
    recorded = Promotion.recorded(stats)
    if recorded is not None and etag == recorded.seen_etag:
        return Settlement.UNFINISHED, etag
    return Settlement.SUPERSEDED, etag


def move(store: str, value: ModelPointer | IndexPointer, seen_etag: str | None, published: manifest.Manifest) -> bool:
    """Move the pointer of ``value``'s kind to it by compare-and-swap against ``seen_etag``, for the published run
    ``published``: True when this run moved it; False when it moved since to this very work (the same run, or one
    of the same stage, key and fingerprint: a concurrent identical run won, and what it promoted is this), logged;
    :class:`catalog.PointerMoved` when it moved to anything else."""
    pointer = Pointer.MODEL if isinstance(value, ModelPointer) else Pointer.INDEX
    try:
        catalog.move_pointer(store, value, seen_etag)
    except catalog.PointerMoved:
        if not _names_same_work(store, pointer, published):
            raise
        where = uris.redact(catalog.pointer_uri(store, pointer))
        log.info(
            "%s %s: %s already names this work (a concurrent identical run)", published.stage, published.key, where
        )
        return False
    return True


def _names_same_work(store: str, pointer: Pointer, published: manifest.Manifest) -> bool:
    """Whether ``pointer`` now names ``published``'s run, or a run of the same stage, key and fingerprint."""
    current, _ = promoted.read(store, pointer)
    if current is None:
        return False
    named = current.validation if isinstance(current, ModelPointer) else current.manifest
    try:
        run = manifest.read_at(store, named)
    except manifest.ManifestError:
        return False
    return (run.stage, run.key, run.fingerprint) == (published.stage, published.key, published.fingerprint)


def resume(
    store: str, pointer: Pointer, published: manifest.Manifest, names_it: Callable[[Any], bool]
) -> tuple[bool, str | None]:
    """On a rerun of the published promoting run ``published``: where its promotion stands, logged; whether its
    move is unfinished (the caller completes it) and the pointer's etag to move it against."""
    if Promotion.recorded(published.stats) is None:
        log.info("%s %s: not promoted when it ran (promotion off, or its gate failed)", published.stage, published.key)
        return False, None
    settled, etag = settle(store, pointer, names_it, published.stats)
    log.info("%s %s: %s", published.stage, published.key, settled)
    return settled is Settlement.UNFINISHED, etag
