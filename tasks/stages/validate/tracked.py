"""What a published validation reports to experiment tracking (:mod:`tasks.stages.tracking`)."""

from __future__ import annotations

from tasks.core import catalog, manifest
from tasks.stages import tracking
from tasks.stages.params import ValidateParams
from tasks.stages.validate.records import ValidationReport


def report(params: ValidateParams, stage_run: manifest.StageRun, found: ValidationReport, uri: str) -> tracking.Report:
    """The validation ``found`` of ``params.model_run``, published by ``stage_run`` (manifest at ``uri``): every
    STS score by encoder and pair set (``sts.student.sts_b_test``), retrieval, the gate (1 passed, 0 failed) and
    the distillation's fidelity as it recorded it."""
    sts = {
        tracking.metric_name("sts", encoder, pair_set): score
        for encoder, scores in found.sts.rows().items()
        for pair_set, score in scores.items()
    }
    retrieval = found.retrieval
    fidelity = {
        tracking.metric_name("fidelity", name): value
        for name, value in (found.fidelity or {}).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    metrics = {
        **sts,
        "retrieval.recall_at_10_vs_teacher": retrieval.recall_at_10_vs_teacher,
        "retrieval.mrr_stsb_ge4": retrieval.mrr_stsb_ge4,
        "gate.passed": 1.0 if found.gate.passed else 0.0,
        **fidelity,
    }
    tags = {
        "hpd.run_id": stage_run.run_id,
        "hpd.manifest": catalog.store_key(stage_run.store, uri) or "",
        "hpd.code_version": manifest.code_version(),
        "hpd.gate": "passed" if found.gate.passed else "failed",
        "hpd.gate_reference": found.gate.reference,
    }
    return tracking.Report(
        stage="validate",
        name=params.model_run,
        params=tracking.params_of(params),
        metrics={name: float(value) for name, value in metrics.items()},
        tags=tags,
    )
