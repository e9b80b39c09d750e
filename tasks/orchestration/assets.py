"""The Airflow assets that link the DAGs, and the extras their events carry (light imports: parsed by DAG files).

- ``CORPUS_PARTITION``: one *partitioned* event per corpus partition ``hpd_ingest`` finished (staged, augmented,
  encoded), its partition key the ingest date; ``hpd_quality_report`` runs once per key, on exactly that partition.
- ``CORPUS_UPDATED``: the same news as a plain event (Airflow queues only partition-aware DAGs on a partitioned
  event), which schedules ``hpd_retrain``; events that arrive while a retrain runs are taken together by the next.
- ``PROMOTED_MODEL``: a student passed the gate and became ``models/current.json``; schedules ``hpd_index``.

Every event's extra names the store it is about, so a consumer works on the producer's store, not its own default.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset

CORPUS_PARTITION = Asset(name="hpd_corpus_partition", uri="hpd://sentences/partitions")
CORPUS_UPDATED = Asset(name="hpd_corpus_updated", uri="hpd://sentences/updated")
PROMOTED_MODEL = Asset(name="hpd_promoted_model", uri="hpd://models/current")


def triggering_extras(context: dict) -> list[dict[str, Any]]:
    """The extras of the asset events that triggered this run, oldest first (none for a manual or timed run)."""
    events = context.get("triggering_asset_events") or {}
    extras = [dict(event.extra or {}) for asset_events in events.values() for event in asset_events]
    return extras


def triggering_store(context: dict) -> str | None:
    """The store named by the events that triggered this run (the latest one's), if any."""
    stores = [extra["store"] for extra in triggering_extras(context) if extra.get("store")]
    return stores[-1] if stores else None
