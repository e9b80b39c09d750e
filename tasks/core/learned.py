"""What a distilled student has learned from: the corpus partitions its run read and, when it was warm-started,
those its start had learned, with the rows staged in them (the retrain policy's measure of what a model has seen).

The distill stage records it in its manifest's stats (:meth:`Learned.as_stats`); :func:`of` reads it back, typed,
and falls back for a run published before the record (the partitions it read)."""

from __future__ import annotations

from datetime import date

from pydantic import Field

from tasks.core import manifest, partitions
from tasks.core.stage_records import Record


class Learned(Record):
    """The partitions a student has learned from (its own run's and its warm starts') and the rows staged in
    them, under the stats names the distill stage publishes."""

    partitions: list[date] = Field(alias="learned_partitions")
    rows: int = Field(alias="learned_rows")

    def as_stats(self) -> dict[str, object]:
        """The record as the distill manifest's stats carry it."""
        return self.model_dump(mode="json")


class _Recorded(Record):
    """The record as a distill manifest may carry it (None: a run from before it)."""

    partitions: list[date] | None = Field(None, alias="learned_partitions")
    rows: int | None = Field(None, alias="learned_rows")


def of(store: str, distilled: manifest.Manifest) -> Learned:
    """What the distill run ``distilled`` has learned: as it recorded it, with the partitions it read; for a run
    from before the record, the partitions it read and the rows staged in them."""
    recorded = _Recorded.parse(distilled.stats, f"the stats of distill run {distilled.key!r}")
    days = sorted(set(recorded.partitions or ()) | partitions.partitions_read(store, distilled))
    rows = recorded.rows if recorded.rows is not None else sum(partitions.staged_rows(store, day) for day in days)
    return _learned(days, rows)


def after_warm_start(store: str, read: set[date], start: manifest.Manifest | None) -> Learned:
    """What a student trained on the partitions ``read`` has learned, starting from ``start``'s student (None:
    the base model): the partitions of both, and the rows staged in them."""
    days = sorted(read | (set() if start is None else set(of(store, start).partitions)))
    return _learned(days, sum(partitions.staged_rows(store, day) for day in days))


def _learned(days: list[date], rows: int) -> Learned:
    return Learned.model_validate({"learned_partitions": days, "learned_rows": rows})
