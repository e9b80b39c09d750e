"""The Airflow assets that link the DAGs, and the extras their events carry (light imports: parsed by DAG files).

- ``CORPUS_PARTITION``: one *partitioned* event per corpus partition ``hpd_ingest`` finished (staged, augmented,
  encoded), its partition key the ingest date; ``hpd_quality_report`` runs once per key, on exactly that partition.
- ``CORPUS_UPDATED``: the same news as a plain event (Airflow queues only partition-aware DAGs on a partitioned
  event), which schedules ``hpd_retrain`` (its policy decides whether to train) and ``hpd_index``; events that
  arrive while a run is going are taken together by the next.
- ``PROMOTED_MODEL``: a student passed the gate and became ``models/current.json``; schedules ``hpd_index``, as
  ``CORPUS_UPDATED`` also does (the index takes a new partition with the promoted student).

Every event's extra names the store it is about, so a consumer works on the producer's store, not its own default.

The URIs use an ``x-`` scheme, Airflow's convention for a scheme of one's own: Airflow leaves such a URI as it is
written, where any other scheme is looked up among every installed provider's URI normalisers (which imports those
providers, the AWS SDK among them, in each process that parses a DAG file).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset

CORPUS_PARTITION = Asset(name="hpd_corpus_partition", uri="x-hpd://sentences/partitions")
CORPUS_UPDATED = Asset(name="hpd_corpus_updated", uri="x-hpd://sentences/updated")
PROMOTED_MODEL = Asset(name="hpd_promoted_model", uri="x-hpd://models/current")


def triggering_extra(context: dict, name: str, asset: Asset | None = None) -> Any:
    """Extra ``name`` of the latest asset event (of ``asset`` only, when given) that triggered this run and carries
    it (None for a manual or timed run, or when no event names it)."""
    events = context.get("triggering_asset_events") or {}
    found = [
        event.extra[name]
        for source, asset_events in events.items()
        if asset is None or _names(source, asset)
        for event in asset_events
        if (event.extra or {}).get(name)
    ]
    return found[-1] if found else None


def _names(source: Any, asset: Asset) -> bool:
    """Whether a key of ``triggering_asset_events`` (an asset, or its name or URI) is ``asset``."""
    return getattr(source, "name", source) == asset.name or getattr(source, "uri", source) == asset.uri
