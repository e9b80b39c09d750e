"""What is promoted: the one way the pipeline reads ``models/current.json`` and ``indexes/current.json``.

Each accessor reads its pointer once (:func:`tasks.core.catalog.read_pointer`, which refuses a pointer naming
anything outside the store) and returns a typed record with the etag it was read at, so that a promotion can move
the pointer by compare-and-swap against what it read. :class:`PromotedModel` also carries the distill manifest
version the pointer serves (read verified by its kept version, never the run's latest) and what that student has
learned (:class:`tasks.core.learned.Learned`). Nothing else in ``tasks/`` reads a pointer
(``tests/test_architecture.py`` fails on another ``read_pointer`` call).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from tasks.core import catalog, learned, manifest, storage
from tasks.core.catalog import Pointer, Stage


@dataclass(frozen=True)
class PromotedModel:
    """The promoted student: its pointer, the etag it was read at, and the distill manifest version it serves."""

    store: str
    pointer: catalog.ModelPointer
    etag: str | None
    distilled: manifest.Manifest

    @property
    def model_run(self) -> str:
        return self.pointer.model_run

    @property
    def learned(self) -> learned.Learned:
        """What the promoted student has learned from."""
        return learned.of(self.store, self.distilled)


@dataclass(frozen=True)
class PromotedIndex:
    """The promoted index: its pointer (segment table, build manifest version, the student that encoded it) and
    the etag it was read at."""

    store: str
    pointer: catalog.IndexPointer
    etag: str | None

    def distilled(self) -> manifest.Manifest:
        """The distill manifest version whose student encoded the index (and encodes its queries)."""
        return manifest.read_at(self.store, catalog.distill_manifest_uri(self.store, self.pointer))


def model(store: str) -> PromotedModel | None:
    """The promoted model, None while nothing is promoted; a :class:`manifest.ManifestError` naming the distill
    manifest version when the pointer names one that does not read."""
    store = storage.to_uri(store)
    pointer, etag = catalog.read_pointer(store, Pointer.MODEL)
    if pointer is None:
        return None
    return PromotedModel(store, pointer, etag, manifest.read_at(store, catalog.distill_manifest_uri(store, pointer)))


def unlearned(store: str, partitions: set[date]) -> list[date]:
    """Those of ``partitions`` the promoted model has not learned from (all of them while none is promoted), sorted."""
    found = model(store)
    return sorted(partitions if found is None else partitions - set(found.learned.partitions))


def distill_run(store: str, name: str) -> manifest.Manifest | None:
    """The distill run ``name``: the version the model pointer serves when it is the promoted run (a later run
    under its name changes nothing), else its latest; None when none is published."""
    current = model(store)
    if current is not None and current.model_run == name:
        return current.distilled
    return manifest.read(storage.to_uri(store), Stage.DISTILL, name)


def model_etag(store: str) -> str | None:
    """The version of ``models/current.json`` now (None: nothing promoted), to promote against."""
    return pointer_etag(store, Pointer.MODEL)


def pointer(store: str) -> catalog.ModelPointer | None:
    """The model pointer alone (no manifest is read): for what only follows what it names."""
    found, _ = catalog.read_pointer(storage.to_uri(store), Pointer.MODEL)
    return found


def model_run(store: str) -> str | None:
    """The promoted model run's name, None while nothing is promoted (the pointer alone: no manifest is read)."""
    found = pointer(store)
    return None if found is None else found.model_run


def index(store: str) -> PromotedIndex | None:
    """The promoted index, None while nothing is promoted."""
    store = storage.to_uri(store)
    pointer, etag = catalog.read_pointer(store, Pointer.INDEX)
    return None if pointer is None else PromotedIndex(store, pointer, etag)


def pointer_etag(store: str, pointer: Pointer) -> str | None:
    """The version of ``pointer`` now (None: it does not exist yet), to move it against."""
    return read(store, pointer)[1]


def read(store: str, pointer: Pointer) -> tuple[catalog.ModelPointer | catalog.IndexPointer | None, str | None]:
    """Either pointer as it is now and its etag: for what treats both alike (settling a promotion, gc)."""
    return catalog.read_pointer(storage.to_uri(store), pointer)
