"""The day's plan on a store: the retrain policy (no model, no new data, new data not worth a retrain, each reason
to retrain) and what a retrain then learns from and starts from."""

from datetime import datetime, timedelta

import pytest

from tasks.core import catalog, config, manifest
from tasks.core.catalog import Stage
from tasks.orchestration import day_plan
from tasks.orchestration.day_plan import Policy
from tasks.orchestration.run_records import RetrainParams
from tasks.stages import drift
from tests.support.policy_store import NEW, TRAINED, promoted_store, stage_new_partition

pytestmark = pytest.mark.models

DEFAULT = Policy(retrain_fraction=0.25, max_model_age_days=30)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return promoted_store(tmp_path_factory.mktemp("policy"))


def test_with_no_model_it_trains_on_what_is_encoded_and_with_nothing_encoded_it_does_not(tmp_path, prepared):
    empty = f"file://{tmp_path}/empty"
    assert day_plan.decide(empty, prepared["teacher"], DEFAULT) == day_plan.Decision(
        retrain=False,
        reason=None,
        explanation="no model is promoted and no partition is encoded yet: nothing to learn",
        facts=day_plan.Facts(new_partitions=[]),
    )


def test_each_reason_and_none(prepared):
    store, teacher = prepared["store"], prepared["teacher"]
    nothing = day_plan.decide(store, teacher, DEFAULT)
    assert not nothing.retrain and nothing.explanation.startswith("no new data")

    stage_new_partition(prepared, rows=12)  # 12 new rows against the 80 trained on: 15%
    small = day_plan.decide(store, teacher, DEFAULT)
    assert (small.retrain, small.reason) == (False, None)
    assert small.facts.new_partitions == [NEW.isoformat()] and small.facts.new_rows == 12
    assert small.facts.learned_rows == 80 and small.facts.new_share == 0.15
    assert small.explanation.startswith("not worth a retrain: 12 new rows in 1 partition(s), 15.0% of the 80 tiny")

    volume = day_plan.decide(store, teacher, Policy(retrain_fraction=0.1, max_model_age_days=30))
    assert (volume.retrain, volume.reason) == (True, day_plan.VOLUME)
    assert "at least retrain_fraction 10.0%" in volume.explanation

    ended = datetime.fromisoformat(prepared["distilled"].document["ended_at"])
    old = day_plan.decide(store, teacher, DEFAULT, now=ended + timedelta(days=31))
    assert (old.retrain, old.reason) == (True, day_plan.AGE) and old.facts.model_age_days == pytest.approx(31)

    flagged = drift.run(config.parse(drift.DriftParams, {"store": store, "ingest_date": NEW, "threshold": 1e-6}))
    assert flagged.stats["flagged"] and flagged.stats["model_run"] == "tiny"
    drifted = day_plan.decide(store, teacher, DEFAULT)
    assert (drifted.retrain, drifted.reason, drifted.facts.drifted) == (
        True,
        day_plan.DRIFT,
        [NEW.isoformat()],
    )
    assert manifest.read(store, Stage.DRIFT, catalog.partition_key(NEW)) is not None


def test_the_plan_names_what_a_retrain_learns_from_where_it_starts_and_the_basis_it_keeps(tmp_path_factory):
    prepared = promoted_store(tmp_path_factory.mktemp("plan"))
    store, teacher = prepared["store"], prepared["teacher"]
    params = RetrainParams(teacher=teacher, student=prepared["student"], k=8, mode="uncentered")
    quiet = day_plan.plan(store, params, "run-1")
    assert not quiet.decision.retrain and quiet.partitions == [] and quiet.model_run is None
    assert quiet.summary().startswith("not retraining: no new data")

    stage_new_partition(prepared, rows=12)
    forced = day_plan.plan(store, params.model_copy(update={"force": True}), "run-2")
    assert (forced.decision.reason, forced.partitions, forced.teacher_rows) == (day_plan.FORCED, [TRAINED, NEW], 92)
    assert (forced.warm_start, forced.pca_basis, forced.model_run) == ("tiny", "tiny", "run-2")
    assert "run-2 learns 92 teacher rows of 2 partition(s) (2026-11-01, 2026-11-02), warm-started from tiny" in (
        forced.summary()
    )
    bounded = day_plan.plan(store, params.model_copy(update={"force": True, "max_train_rows": 12}), "run-2")
    assert (bounded.partitions, bounded.teacher_rows) == ([NEW], 12)  # the new partition first, no room for more
    assert day_plan.DayPlan.parse(forced.model_dump(mode="json"), "xcom") == forced  # what the tasks hand on

    other_k = day_plan.plan(store, params.model_copy(update={"force": True, "k": 4}), "run-3")
    assert (other_k.warm_start, other_k.pca_basis) == ("tiny", None)  # warm-started, but another basis asked for
    backfill = day_plan.plan(store, params, "run-4", backfill=True)
    assert backfill.decision.reason == day_plan.FORCED and backfill.partitions == [TRAINED, NEW]
    assert (backfill.warm_start, backfill.pca_basis) == (None, None)  # from the base model, whatever came before
