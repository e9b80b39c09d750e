"""Which corpus partitions a model was trained on, and which encoded partitions no promoted model has seen."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date

from tasks.core import catalog, manifest
from tasks.core.catalog import Pointer, Stage

_PARTITION = re.compile(r"(?:^|/)ingest_date=(\d{4}-\d{2}-\d{2})(?:/|$)")


def partitions_in(keys: Iterable[str]) -> set[date]:
    """The ingest dates named by ``ingest_date=D`` segments of store keys."""
    return {date.fromisoformat(match.group(1)) for key in keys if (match := _PARTITION.search(key))}


def trained_partitions(store: str, model_run: str) -> set[date]:
    """The partitions whose sentences the distill run ``model_run`` read (its manifest's inputs)."""
    distilled = manifest.read(store, Stage.DISTILL, model_run)
    if distilled is None:
        raise manifest.ManifestError(f"{catalog.manifest_uri(store, Stage.DISTILL, model_run)}: no such model run")
    return partitions_in(catalog.store_key(store, i.uri) or i.uri for i in distilled.inputs)


def encoded_partitions(store: str, teacher: str) -> set[date]:
    """The partitions with at least one shard encoded by ``teacher``."""
    return partitions_in(manifest.list_keys(store, Stage.ENCODE_TEACHER, under=catalog.teacher_key_prefix(teacher)))


def untrained_partitions(store: str, teacher: str) -> list[date]:
    """Encoded partitions the promoted model was not trained on (all of them while none is promoted), sorted."""
    promoted, _ = catalog.read_pointer(store, Pointer.MODEL)
    seen = trained_partitions(store, promoted.model_run) if promoted else set()
    return sorted(encoded_partitions(store, teacher) - seen)
