"""What a published validation reports to experiment tracking (:mod:`tasks.stages.tracking`)."""

from __future__ import annotations

from tasks.core import catalog, manifest, storage
from tasks.core.reports import VALIDATED_CARD, VALIDATION_REPORT
from tasks.stages import tracking
from tasks.stages.params import ValidateParams
from tasks.stages.validate.records import ValidationReport

ARTIFACTS = (VALIDATION_REPORT, VALIDATED_CARD)  # the validation's files an MLflow run carries


def report(
    params: ValidateParams,
    stage_run: manifest.StageRun,
    found: ValidationReport,
    uri: str,
    distilled: manifest.Manifest,
) -> tracking.Report:
    """The validation ``found`` of ``params.model_run`` (the student of ``distilled``), published by ``stage_run``
    (manifest at ``uri``): every STS score by encoder and pair set (``sts.student.sts_b_test``), retrieval, the gate
    (1 passed, 0 failed) and the distillation's fidelity as it recorded it; the report and the card (read back
    verified) as artifacts, and the student's folder in the store to register."""
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
    from tasks.ml import student  # torch: only where a validation ran

    return tracking.Report(
        stage="validate",
        name=params.model_run,
        params=tracking.params_of(params),
        metrics={name: float(value) for name, value in metrics.items()},
        tags=tags,
        artifacts=_artifacts(stage_run),
        model_source=student.model_folder(distilled),
    )


def _artifacts(stage_run: manifest.StageRun) -> dict[str, str]:
    """The :data:`ARTIFACTS` among the run's outputs, by name, read back verified."""
    files = {o.uri.rsplit("/", 1)[-1]: o for o in stage_run.outputs}
    return {
        name: storage.read_bytes(files[name].uri, sha256=files[name].sha256).decode()
        for name in ARTIFACTS
        if name in files
    }
