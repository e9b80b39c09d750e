"""Which corpus partitions a run read or a model was trained on, and what a partition holds: the partitions named
by store keys, by a stage run's inputs and by a distill run's; the rows staged in a partition; the partitions a
teacher has encoded."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date

from tasks.core import catalog, manifest, sentences
from tasks.core.catalog import Stage

_PARTITION = re.compile(r"(?:^|/)ingest_date=(\d{4}-\d{2}-\d{2})(?:/|$)")


def partitions_in(keys: Iterable[str]) -> set[date]:
    """The ingest dates named by ``ingest_date=D`` segments of store keys."""
    return {date.fromisoformat(match.group(1)) for key in keys if (match := _PARTITION.search(key))}


def distill_manifest(store: str, model_run: str) -> manifest.Manifest:
    """The distill manifest of ``model_run``; :class:`manifest.ManifestError` naming it when there is none."""
    distilled = manifest.read(store, Stage.DISTILL, model_run)
    if distilled is None:
        raise manifest.ManifestError(f"{catalog.manifest_uri(store, Stage.DISTILL, model_run)}: no such model run")
    return distilled


def partitions_read(store: str, run: manifest.Manifest) -> set[date]:
    """The partitions of the objects a stage run read (its manifest's inputs)."""
    return partitions_in(catalog.store_key(store, i.uri) or i.uri for i in run.inputs)


def trained_partitions(store: str, model_run: str) -> set[date]:
    """The partitions whose sentences the distill run ``model_run`` read."""
    return partitions_read(store, distill_manifest(store, model_run))


def staged_rows(store: str, day: date) -> int:
    """The rows staging and augmentation published for partition ``day``."""
    return sum(o.rows or 0 for o in sentences.published(store, day))


def encoded_partitions(store: str, teacher: str) -> set[date]:
    """The partitions with at least one shard encoded by ``teacher``."""
    return partitions_in(manifest.list_keys(store, Stage.ENCODE_TEACHER, under=catalog.teacher_key_prefix(teacher)))


def teacher_rows(store: str, teacher: str, day: date) -> int:
    """The rows ``teacher`` has encoded in partition ``day`` (its sample there: what a retrain can learn from it), as
    the encode manifests of the partition's current shards record them."""
    encoded = (
        manifest.read(store, Stage.ENCODE_TEACHER, catalog.teacher_shard_key(teacher, day, shard.uri))
        for shard in sentences.published(store, day)
    )
    return sum(o.rows or 0 for run in encoded if run for o in run.outputs)
