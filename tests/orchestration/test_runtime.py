import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from tasks.core.manifest import Output, StageResult
from tasks.orchestration import assets, runtime


@dataclass
class Event:
    extra: dict = field(default_factory=dict)


def test_partition_date_prefers_the_partition_key_then_the_data_interval():
    start = datetime(2026, 11, 3, tzinfo=UTC)
    assert runtime.partition_date({"partition_key": "2026-11-05", "data_interval_start": start}) == date(2026, 11, 5)
    assert runtime.partition_date({"partition_key": None, "data_interval_start": start}) == date(2026, 11, 3)
    assert runtime.partition_date({"logical_date": start}) == date(2026, 11, 3)


def test_a_run_without_a_store_takes_the_triggering_events_store():
    events = {assets.CORPUS_UPDATED: [Event({"store": "s3://b/old"}), Event({"store": "s3://b/new"})]}
    assert runtime.run_params({"params": {"store": None}, "triggering_asset_events": events})["store"] == "s3://b/new"
    named = {"params": {"store": "file:///x"}, "triggering_asset_events": events}
    assert runtime.run_params(named)["store"] == "file:///x"
    assert runtime.run_params({"params": {"store": None}})["store"] is None


def test_the_model_to_index_comes_from_params_then_the_promotion_event_and_no_model_skips(tmp_path):
    store = f"file://{tmp_path}"
    promoted = {assets.PROMOTED_MODEL: [Event({"store": store, "model_run": "run-7"})]}
    assert runtime.model_to_index({"params": {}, "triggering_asset_events": promoted}) == "run-7"
    assert runtime.model_to_index({"params": {"model_run": "mine"}, "triggering_asset_events": promoted}) == "mine"
    drifted = {assets.CORPUS_UPDATED: [Event({"store": store, "model_run": "drift-reference"})]}
    with pytest.raises(AirflowSkipException, match="no model is promoted yet"):  # a drift event names no model to index
        runtime.model_to_index({"params": {"store": store}, "triggering_asset_events": drifted})


def _validated(passed: bool) -> StageResult:
    baseline = {"STS-B test": 80.41, "SICK-R test": 78.03}
    stats = {
        "sts": {
            "teacher": {"STS-B test": 84.1, "SICK-R test": 80.2},
            "teacher + PCA": {"STS-B test": 83.9, "SICK-R test": 79.8},
            "student": {"STS-B test": 61.234, "SICK-R test": 58.0},
            "baseline (base model + PCA)": baseline,
        },
        "retrieval": {"recall_at_10_vs_teacher": 0.5, "corpus_sample": 100, "stsb_pairs_ge4": 9, "mrr_stsb_ge4": 0.7},
        "gate": {
            "passed": passed,
            "reasons": ["STS-B test 61.23 < min_stsb 70.00"] if not passed else ["all checks passed"],
            "reference": "baseline",
            "reference_scores": baseline,
        },
    }
    outputs = (Output("file:///s/validation/m/f/metrics.json", "0" * 64, None, 1),)
    outputs += (Output("file:///s/validation/m/f/report.html", "1" * 64, None, 1),)
    return StageResult("file:///s/manifests/validate/m.json", False, stats, outputs)


def test_a_failed_gate_fails_the_task_with_reasons_scores_and_report():
    with pytest.raises(runtime.QualityGateFailed) as failed:
        runtime.gate_verdict(_validated(passed=False))
    message = str(failed.value)
    assert "STS-B test 61.23 < min_stsb 70.00" in message
    assert "STS-B test 61.23, SICK-R test 58.00" in message and "baseline: STS-B test 80.41" in message
    assert "Nothing was promoted" in message and message.endswith("file:///s/validation/m/f/report.html")


def test_a_passed_gate_returns_the_decision_and_the_report():
    verdict = runtime.gate_verdict(_validated(passed=True))
    assert verdict.passed and verdict.report == "file:///s/validation/m/f/report.html"
    assert verdict.scores["STS-B test"] == 61.234


def test_a_validation_without_its_gate_record_is_named():
    result = _validated(passed=True)
    del result.stats["gate"]
    with pytest.raises(ValueError, match="the stats of file:///s/manifests/validate/m.json: not a ValidateStats"):
        runtime.gate_verdict(result)


class _Outlets(dict):
    def __missing__(self, asset):
        self[asset] = Event()
        return self[asset]


def _drift_context(store: str) -> dict:
    return {
        "params": {"store": store, "drift_threshold": 0.25},
        "partition_key": "2026-11-05",
        "outlet_events": _Outlets(),
    }


def test_a_flagged_drift_emits_a_corpus_update_with_reason_drift(tmp_path):
    context = _drift_context(tmp_path.as_uri())
    drift = {"flagged": True, "score": 0.41, "threshold": 0.25, "model_run": "m", "manifest": "manifests/drift/x.json"}
    extra = runtime.announce_drift(context, drift)
    assert context["outlet_events"][assets.CORPUS_UPDATED].extra == extra
    assert extra == {
        "store": tmp_path.as_uri(),
        "ingest_date": "2026-11-05",
        "reason": "drift",
        "score": 0.41,
        "threshold": 0.25,
        "model_run": "m",
        "manifest": "manifests/drift/x.json",
    }


def test_no_drift_skips_the_announcement_and_emits_nothing(tmp_path):
    context = _drift_context(tmp_path.as_uri())
    with pytest.raises(AirflowSkipException):
        runtime.announce_drift(context, {"flagged": False, "model_run": None})
    assert context["outlet_events"] == {}


def test_without_a_promoted_model_the_drift_task_says_so_and_succeeds(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    assert runtime.partition_drift(_drift_context(tmp_path.as_uri())) == {"flagged": False, "model_run": None}
    assert any("no promoted model" in message for message in caplog.messages)
