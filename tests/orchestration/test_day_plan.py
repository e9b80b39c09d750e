"""The retrain policy on a store: no model, no new data, new data not worth a retrain, and each reason to retrain."""

from datetime import datetime, timedelta

import pytest

from tasks.core import catalog, config, manifest
from tasks.core.catalog import Stage
from tasks.orchestration import retrain_policy
from tasks.orchestration.retrain_policy import Policy
from tasks.stages import drift
from tests.support.policy_store import NEW, promoted_store, stage_new_partition

pytestmark = pytest.mark.models

DEFAULT = Policy(retrain_fraction=0.25, max_model_age_days=30)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return promoted_store(tmp_path_factory.mktemp("policy"))


def test_with_no_model_it_trains_on_what_is_encoded_and_with_nothing_encoded_it_does_not(tmp_path, prepared):
    empty = f"file://{tmp_path}/empty"
    assert retrain_policy.decide(empty, prepared["teacher"], DEFAULT) == retrain_policy.Decision(
        False, None, "no model is promoted and no partition is encoded yet: nothing to learn", {"new_partitions": []}
    )


def test_each_reason_and_none(prepared):
    store, teacher = prepared["store"], prepared["teacher"]
    nothing = retrain_policy.decide(store, teacher, DEFAULT)
    assert not nothing.retrain and nothing.explanation.startswith("no new data")

    stage_new_partition(prepared, rows=12)  # 12 new rows against the 80 trained on: 15%
    small = retrain_policy.decide(store, teacher, DEFAULT)
    assert (small.retrain, small.reason) == (False, None)
    assert small.facts["new_partitions"] == [NEW.isoformat()] and small.facts["new_rows"] == 12
    assert small.facts["learned_rows"] == 80 and small.facts["new_share"] == 0.15
    assert small.explanation.startswith("not worth a retrain: 12 new rows in 1 partition(s), 15.0% of the 80 tiny")

    volume = retrain_policy.decide(store, teacher, Policy(retrain_fraction=0.1, max_model_age_days=30))
    assert (volume.retrain, volume.reason) == (True, retrain_policy.VOLUME)
    assert "at least retrain_fraction 10.0%" in volume.explanation

    ended = datetime.fromisoformat(prepared["distilled"].document["ended_at"])
    old = retrain_policy.decide(store, teacher, DEFAULT, now=ended + timedelta(days=31))
    assert (old.retrain, old.reason) == (True, retrain_policy.AGE) and old.facts["model_age_days"] == pytest.approx(31)

    flagged = drift.run(config.parse(drift.DriftParams, {"store": store, "ingest_date": NEW, "threshold": 1e-6}))
    assert flagged.stats["flagged"] and flagged.stats["model_run"] == "tiny"
    drifted = retrain_policy.decide(store, teacher, DEFAULT)
    assert (drifted.retrain, drifted.reason, drifted.facts["drifted"]) == (
        True,
        retrain_policy.DRIFT,
        [NEW.isoformat()],
    )
    assert manifest.read(store, Stage.DRIFT, catalog.partition_key(NEW)) is not None
