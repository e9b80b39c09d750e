"""Whether a retrain is worth running now, and why: the policy ``hpd_retrain`` applies before it trains.

New partitions do not retrain by themselves: the index takes them with the promoted student (``hpd_index``).
A retrain runs, in this order of reasons, when:

- ``forced``: the run says so (its ``force`` param, or partitions named in its params), or it is a backfill run;
- ``no model``: nothing is promoted yet;
- ``drift``: a partition the promoted model was not trained on is flagged by the drift stage against it;
- ``volume``: the rows staged since the promoted model's training (sentences and augmented ones) reach
  ``retrain_fraction`` of the rows it has learned from (those staged in the partitions it, and when it was
  warm-started the students it started from, were trained on), so volume retrains come as the corpus grows by a
  factor of ``1 + retrain_fraction``, not every few days of a bounded training set;
- ``age``: there are new rows, and the promoted model was trained more than ``max_model_age_days`` ago.

Otherwise it does not, and the decision says what it measured. With no new partition at all nothing but a
forced run retrains.

A retrain learns from a bounded set (:func:`training_partitions`): the partitions the promoted model has not
learned from and, filling what is left of ``max_train_rows``, a replay sample of older ones, so its cost follows
the new data, not the store; it may start from the promoted student (``warm_start``) rather than the base model.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from tasks.core import catalog, lineage, manifest
from tasks.core.catalog import Dataset, Pointer, Stage

FORCED, NO_MODEL, DRIFT, VOLUME, AGE = "forced", "no model", "drift", "volume", "age"


@dataclass(frozen=True)
class Policy:
    """The thresholds of a retrain decision (``hpd_retrain``'s params)."""

    retrain_fraction: float
    max_model_age_days: float


@dataclass(frozen=True)
class Decision:
    """Whether to retrain, the reason (one of the module's reasons, or None), and what the decision read."""

    retrain: bool
    reason: str | None
    explanation: str
    facts: dict[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def forced(why: str) -> Decision:
    return Decision(True, FORCED, why)


def decide(store: str, teacher: str, policy: Policy, now: datetime | None = None) -> Decision:
    """The decision for ``store``'s partitions encoded by ``teacher`` (see the module docstring)."""
    promoted, _ = catalog.read_pointer(store, Pointer.MODEL)
    new = lineage.untrained_partitions(store, teacher)
    if promoted is None:
        return Decision(bool(new), NO_MODEL if new else None, _no_model(new), {"new_partitions": _days(new)})
    if not new:
        return Decision(False, None, "no new data: every encoded partition is in the promoted model's training data")
    distilled = manifest.served_distill(store, promoted)
    facts = {
        "model_run": promoted.model_run,
        "new_partitions": _days(new),
        "drifted": _days([day for day in new if _drifted(store, day, promoted.model_run)]),
        "new_rows": sum(lineage.staged_rows(store, day) for day in new),
        "learned_rows": _learned_rows(store, distilled),
        "model_age_days": round(_age_days(distilled, now or datetime.now(UTC)), 3),
    }
    return _judged(facts, policy)


def training_partitions(store: str, teacher: str, max_rows: int | None, after_promoted: bool = True) -> list[date]:
    """The partitions a retrain learns from: every encoded one when ``max_rows`` is None; else the new ones (those
    the promoted model has not learned from; every one when not ``after_promoted``), newest first while they fit in
    ``max_rows`` (at least one), then older ones drawn at random, seeded by the new ones (a rerun draws the same),
    while they fit. Sorted."""
    encoded = lineage.encoded_partitions(store, teacher)
    if max_rows is None:
        return sorted(encoded)
    new = lineage.unlearned(store, encoded) if after_promoted else sorted(encoded)
    older = sorted(encoded - set(new))
    random.Random(hashlib.sha256(",".join(_days(new)).encode()).hexdigest()).shuffle(older)
    chosen, rows = [], 0
    for day in [*sorted(new, reverse=True), *older]:
        if rows >= max_rows:
            break
        day_rows = lineage.staged_rows(store, day)
        if chosen and rows + day_rows > max_rows:
            continue
        chosen.append(day)
        rows += day_rows
    return sorted(chosen)


def _judged(facts: dict[str, Any], policy: Policy) -> Decision:
    share = facts["new_rows"] / max(facts["learned_rows"], 1)
    facts["new_share"] = round(share, 4)
    measured = (
        f"{facts['new_rows']} new rows in {len(facts['new_partitions'])} partition(s), {share:.1%} of the "
        f"{facts['learned_rows']} {facts['model_run']} has learned from; model {facts['model_age_days']:.1f} days old"
    )
    if facts["drifted"]:
        return Decision(True, DRIFT, f"drift flagged on {', '.join(facts['drifted'])}; {measured}", facts)
    if share >= policy.retrain_fraction:
        return Decision(True, VOLUME, f"{measured}: at least retrain_fraction {policy.retrain_fraction:.1%}", facts)
    if facts["model_age_days"] > policy.max_model_age_days:
        return Decision(True, AGE, f"{measured}: older than max_model_age_days {policy.max_model_age_days}", facts)
    limits = f"retrain_fraction {policy.retrain_fraction:.1%}, max_model_age_days {policy.max_model_age_days}"
    return Decision(False, None, f"not worth a retrain: {measured}; no drift flagged; below {limits}", facts)


def _no_model(new: list[date]) -> str:
    if not new:
        return "no model is promoted and no partition is encoded yet: nothing to learn"
    return f"no model is promoted yet: training on {len(new)} encoded partition(s)"


def _days(days: list[date]) -> list[str]:
    return [day.isoformat() for day in days]


def _drifted(store: str, day: date, model_run: str) -> bool:
    """Whether the drift stage flagged partition ``day`` against ``model_run``'s training data."""
    scored = manifest.read(store, Stage.DRIFT, catalog.partition_key(day))
    return scored is not None and scored.stats.get("model_run") == model_run and bool(scored.stats.get("flagged"))


def _learned_rows(store: str, distilled: manifest.Manifest) -> int:
    """The rows staged in the partitions a distill run's student has learned from (its ``learned_rows`` stat; a run
    from before it: the rows of projected targets it read)."""
    if "learned_rows" in distilled.stats:
        return int(distilled.stats["learned_rows"])
    return sum(i.rows or 0 for i in distilled.inputs if catalog.dataset_at(store, i.uri) == Dataset.PROJECTED_TARGETS)


def _age_days(distilled: manifest.Manifest, now: datetime) -> float:
    """Days since the distill run ended."""
    ended = datetime.fromisoformat(distilled.document["ended_at"])
    return (now - ended).total_seconds() / 86400
