"""The stage records: published names and order kept on the way out, a malformed document named on the way in."""

import json

import pytest

from tasks.core.stage_records import BASELINE, GateVerdict, PartitionDrift, RecordError, StsTable, ValidateStats

STS = {
    "teacher": {"STS-B test": 84.1, "SICK-R test": 80.2},
    "teacher + PCA": {"STS-B test": 83.9, "SICK-R test": 79.8},
    "student": {"STS-B test": 79.94, "SICK-R test": 78.09},
    BASELINE: {"STS-B test": 80.41, "SICK-R test": 78.03},
}
GATE = {
    "passed": False,
    "reasons": ["STS-B test 79.94 regresses"],
    "reference": "baseline",
    "reference_scores": {"STS-B test": 80.41, "SICK-R test": 78.03},
    "rules": [{"score": "STS-B test", "rule": "regression", "value": 79.94, "threshold": 79.41, "passed": True}],
}


def test_records_write_what_they_read_in_the_same_order():
    table = StsTable.model_validate(STS)
    assert json.dumps(table.model_dump()) == json.dumps(STS) and table.baseline == STS[BASELINE]
    assert json.dumps(GateVerdict.model_validate(GATE).model_dump()) == json.dumps(GATE)
    drift = {"model_run": "m", "reference_partitions": ["2026-11-01"], "score": 0.1, "threshold": 0.25}
    drift |= {"flagged": False, "components": {"direction": 0.1}, "weights": {"direction": 1.0}}
    drift |= {"partition": {"rows": 10, "norm_mean": 1.0}, "reference": {"rows": 20, "norm_mean": 1.5}}
    assert json.dumps(PartitionDrift.model_validate(drift).model_dump()) == json.dumps(drift)  # counts stay ints


def test_a_rule_knows_its_margin_and_a_verdict_from_before_the_rules_has_none():
    assert GateVerdict.model_validate(GATE).rules[0].margin == pytest.approx(0.53)
    old = GateVerdict.model_validate({k: v for k, v in GATE.items() if k != "rules"})
    assert old.rules == [] and "rules" not in old.model_dump(exclude_unset=True)


def test_a_malformed_stats_document_is_named_with_each_bad_field():
    stats = {"sts": STS, "retrieval": {"recall_at_10_vs_teacher": 0.5}, "gate": {**GATE, "passed": "perhaps"}}
    with pytest.raises(RecordError) as failed:
        ValidateStats.parse(stats, "file:///s/manifests/validate/m.json")
    message = str(failed.value)
    assert message.startswith("file:///s/manifests/validate/m.json: not a ValidateStats record (")
    assert "retrieval.corpus_sample: Field required" in message and "gate.passed: Input should be" in message
