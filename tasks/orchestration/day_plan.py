"""A new day, decided once: what ``hpd_retrain`` does today and why, as one typed record (:class:`DayPlan`).

A day's data goes through three DAGs. ``hpd_ingest`` stages the day's sentences, then augments and teacher-encodes
a bounded sample of them (``teacher_sample`` rows per partition: what the PCA, a retrain, drift and the quality
checks read; :mod:`tasks.core.teacher_sample`). ``hpd_index`` makes every staged sentence searchable the same day,
encoded by the promoted student. ``hpd_retrain`` then plans (:func:`plan`), and its first task's plan says:

- whether to retrain, the reason and what was measured (:class:`Decision`, the policy below);
- the partitions it learns from (:func:`training_partitions`: the new ones, then a replay sample of older ones, while
  their teacher rows fit in ``max_train_rows``) and how many teacher rows they hold;
- the weights it starts from: the promoted student when ``warm_start`` and it has the base asked for (a backfill's
  run starts from the base model, so its model does not depend on the order the days came in), and then the PCA
  basis that student learned, kept so that its targets stay in the embedding space the index is in;
- the model run's name.

The plan is logged and pushed as the task's ``plan`` XCom; every later task of the run reads it and nothing else to
decide. The retrain policy: a retrain runs, in this order of reasons, when

- ``forced``: the run says so (its ``force`` param, or partitions named in its params), or it is a backfill run;
- ``no model``: nothing is promoted yet;
- ``drift``: a partition the promoted model was not trained on is flagged by the drift stage against it;
- ``volume``: the rows staged since the promoted model's training (sentences and augmented ones) reach
  ``retrain_fraction`` of the rows it has learned from (:mod:`tasks.core.learned`: those staged in the partitions
  it, and the students it was warm-started from, were trained on), so volume retrains come as the corpus grows by a
  factor of ``1 + retrain_fraction``, not every few days of a bounded training set;
- ``age``: there are new rows, and the promoted model was trained more than ``max_model_age_days`` ago.

Otherwise it does not, and the decision says what it measured. With no new partition nothing but a forced run
retrains.
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Literal

from tasks.core import catalog, manifest, partitions, promoted, spaces
from tasks.core.catalog import Stage
from tasks.core.stage_records import PartitionDrift, Record
from tasks.orchestration.run_records import RetrainParams
from tasks.stages.params import DistillParams, FitPCAParams

Reason = Literal["forced", "no model", "drift", "volume", "age"]
FORCED, NO_MODEL, DRIFT, VOLUME, AGE = "forced", "no model", "drift", "volume", "age"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """The thresholds of a retrain decision (``hpd_retrain``'s params)."""

    retrain_fraction: float
    max_model_age_days: float


class Facts(Record):
    """What a decision measured: the partitions no promoted model has learned, and, with a model promoted, those
    flagged for drift, the new rows against the rows it has learned from, and its age."""

    new_partitions: list[str] = []
    model_run: str | None = None
    drifted: list[str] = []
    new_rows: int = 0
    learned_rows: int = 0
    new_share: float = 0.0
    model_age_days: float = 0.0

    def judged(self, policy: Policy) -> Decision:
        """The decision these facts make under ``policy``: drift, volume, age, or no retrain."""
        measured = (
            f"{self.new_rows} new rows in {len(self.new_partitions)} partition(s), {self.new_share:.1%} of the "
            f"{self.learned_rows} {self.model_run} has learned from; model {self.model_age_days:.1f} days old"
        )
        if self.drifted:
            why = f"drift flagged on {', '.join(self.drifted)}; {measured}"
            return Decision(retrain=True, reason=DRIFT, explanation=why, facts=self)
        if self.new_share >= policy.retrain_fraction:
            why = f"{measured}: at least retrain_fraction {policy.retrain_fraction:.1%}"
            return Decision(retrain=True, reason=VOLUME, explanation=why, facts=self)
        if self.model_age_days > policy.max_model_age_days:
            why = f"{measured}: older than max_model_age_days {policy.max_model_age_days}"
            return Decision(retrain=True, reason=AGE, explanation=why, facts=self)
        limits = f"retrain_fraction {policy.retrain_fraction:.1%}, max_model_age_days {policy.max_model_age_days}"
        why = f"not worth a retrain: {measured}; no drift flagged; below {limits}"
        return Decision(retrain=False, reason=None, explanation=why, facts=self)


class Decision(Record):
    """Whether to retrain, the reason (None: no retrain) and what the decision measured."""

    retrain: bool
    reason: Reason | None
    explanation: str
    facts: Facts = Facts()


class DayPlan(Record):
    """What ``hpd_retrain`` does today (see the module docstring): the decision, then, when it retrains, the
    partitions and the teacher rows it learns from, the model run it warm-starts from (None: the base model) and
    whose PCA basis it keeps (None: a PCA is fitted), and the name of the distill run."""

    decision: Decision
    partitions: list[date] = []
    teacher_rows: int = 0
    warm_start: str | None = None
    pca_basis: str | None = None
    model_run: str | None = None

    def summary(self) -> str:
        """One line for the log: the decision, then what a retrain learns from and where it starts."""
        if not self.decision.retrain:
            return f"not retraining: {self.decision.explanation}"
        basis = "its PCA basis kept" if self.pca_basis else "a PCA fitted"
        start = f"warm-started from {self.warm_start}, {basis}" if self.warm_start else "from the base model"
        days = ", ".join(day.isoformat() for day in self.partitions)
        return (
            f"retraining ({self.decision.reason}): {self.decision.explanation}; model run {self.model_run} learns "
            f"{self.teacher_rows} teacher rows of {len(self.partitions)} partition(s) ({days}), {start}"
        )


def plan(store: str, params: RetrainParams, run_name: str, backfill: bool = False) -> DayPlan:
    """Today's plan for ``store`` (see the module docstring): ``params`` are the run's, ``run_name`` names the model
    run when ``params.name`` does not, and a ``backfill`` run retrains from the base model over every partition."""
    decision = _decision(store, params, backfill)
    if not decision.retrain:
        return DayPlan(decision=decision)
    days = params.partitions or training_partitions(
        store, params.teacher, params.max_train_rows, after_promoted=not backfill
    )
    name = params.name or run_name
    start = None if backfill or not params.warm_start else warm_start_for(store, params, name)
    return DayPlan(
        decision=decision,
        partitions=days,
        teacher_rows=sum(partitions.teacher_rows(store, params.teacher, day) for day in days),
        warm_start=start,
        pca_basis=None if start is None else kept_basis(store, params, start),
        model_run=name,
    )


def _decision(store: str, params: RetrainParams, backfill: bool) -> Decision:
    if params.force or params.partitions:
        named = None if params.partitions is None else _days(params.partitions)
        return forced(f"forced by the run's params (force={params.force}, partitions={named})")
    if backfill:
        return forced("a backfill run")
    return decide(store, params.teacher, Policy(params.retrain_fraction, params.max_model_age_days))


def forced(why: str) -> Decision:
    return Decision(retrain=True, reason=FORCED, explanation=why)


def decide(store: str, teacher: str, policy: Policy, now: datetime | None = None) -> Decision:
    """The retrain decision for ``store``'s partitions encoded by ``teacher`` (see the module docstring)."""
    model = promoted.model(store)
    new = promoted.unlearned(store, partitions.encoded_partitions(store, teacher))
    if model is None:
        return Decision(
            retrain=bool(new),
            reason=NO_MODEL if new else None,
            explanation=_no_model(new),
            facts=Facts(new_partitions=_days(new)),
        )
    if not new:
        return Decision(
            retrain=False,
            reason=None,
            explanation="no new data: every encoded partition is in the promoted model's training data",
        )
    new_rows, learned_rows = sum(partitions.staged_rows(store, day) for day in new), model.learned.rows
    facts = Facts(
        new_partitions=_days(new),
        model_run=model.model_run,
        drifted=_days([day for day in new if _drifted(store, day, model.model_run)]),
        new_rows=new_rows,
        learned_rows=learned_rows,
        new_share=round(new_rows / max(learned_rows, 1), 4),
        model_age_days=round(_age_days(model.distilled, now or datetime.now(UTC)), 3),
    )
    return facts.judged(policy)


def warm_start_for(store: str, params: RetrainParams, name: str) -> str | None:
    """The model run distill run ``name`` starts from: as recorded when it ran before (a rerun trains, or skips,
    as it did); else the promoted one, when its student has the base this run asks for (``student``,
    ``student_layers``); else None."""
    if (earlier := manifest.read(store, Stage.DISTILL, name)) is not None:
        return _Started.model_validate(earlier.params).warm_start
    model = promoted.model(store)
    if model is None:
        return None
    trained = _Started.model_validate(model.distilled.params)
    same = (trained.student, trained.student_layers) == (params.student, params.student_layers)
    log.info(
        "warm start: %s", f"from the promoted {model.model_run}" if same else "none (no promoted model of this base)"
    )
    return model.model_run if same else None


def kept_basis(store: str, params: RetrainParams, start: str) -> str | None:
    """``start`` when a retrain warm-started from it keeps the PCA basis its student learned, so that the new
    student encodes into the same space: its run recorded the basis, which its PCA run fitted with the ``k`` and
    ``mode`` asked for now; else None (a basis is fitted), with the reason logged."""
    distilled = promoted.distill_run(store, start)
    recorded = None if distilled is None else spaces.basis(store, distilled)
    if distilled is None or recorded is None:
        log.info("PCA basis: a new fit (%s records no basis: distilled before runs recorded theirs)", start)
        return None
    trained = DistillParams.model_validate(distilled.params)
    fitted = manifest.read(store, Stage.FIT_PCA, catalog.pca_key(trained.teacher, trained.pca_name))
    if fitted is None or recorded.sha256 not in {o.sha256 for o in fitted.outputs}:
        log.info("PCA basis: a new fit (the PCA run %s of %s was fitted again since)", trained.pca_name, start)
        return None
    kept = FitPCAParams.model_validate(fitted.params)
    if (params.k or kept.k, params.mode or kept.mode) != (kept.k, kept.mode):
        log.info("PCA basis: a new fit (%s learned a %s basis of k=%d)", start, kept.mode, kept.k)
        return None
    return start


class _Started(Record):
    """What a distill run's params say of where it started."""

    student: str
    student_layers: int | None = None
    warm_start: str | None = None


def training_partitions(store: str, teacher: str, max_rows: int | None, after_promoted: bool = True) -> list[date]:
    """The partitions a retrain learns from: every encoded one when ``max_rows`` is None; else the new ones (those
    the promoted model has not learned from; every one when not ``after_promoted``), newest first while their
    teacher rows fit in ``max_rows`` (at least one), then older ones drawn at random, seeded by the new ones (a rerun
    draws the same), while they fit. Sorted."""
    encoded = partitions.encoded_partitions(store, teacher)
    if max_rows is None:
        return sorted(encoded)
    new = promoted.unlearned(store, encoded) if after_promoted else sorted(encoded)
    older = sorted(encoded - set(new))
    random.Random(hashlib.sha256(",".join(_days(new)).encode()).hexdigest()).shuffle(older)
    chosen, rows = [], 0
    for day in [*sorted(new, reverse=True), *older]:
        if rows >= max_rows:
            break
        day_rows = partitions.teacher_rows(store, teacher, day)
        if chosen and rows + day_rows > max_rows:
            continue
        chosen.append(day)
        rows += day_rows
    return sorted(chosen)


def _no_model(new: list[date]) -> str:
    if not new:
        return "no model is promoted and no partition is encoded yet: nothing to learn"
    return f"no model is promoted yet: training on {len(new)} encoded partition(s)"


def _days(days: list[date]) -> list[str]:
    return [day.isoformat() for day in days]


def _drifted(store: str, day: date, model_run: str) -> bool:
    """Whether the drift stage flagged partition ``day`` against ``model_run``'s training data."""
    uri = catalog.manifest_uri(store, Stage.DRIFT, catalog.partition_key(day))
    scored = manifest.read(store, Stage.DRIFT, catalog.partition_key(day))
    if scored is None:
        return False
    found = PartitionDrift.parse(scored.stats, f"the stats of {uri}")
    return found.model_run == model_run and found.flagged


class _Ended(Record):
    ended_at: datetime


def _age_days(distilled: manifest.Manifest, now: datetime) -> float:
    """Days since the distill run ended."""
    ended = _Ended.parse(distilled.document, f"distill run {distilled.key!r}").ended_at
    return (now - ended).total_seconds() / 86400
