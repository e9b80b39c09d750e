"""The validate stage: measure a distilled student, apply the quality gate, write the report, promote."""

from __future__ import annotations

import json
import logging

from tasks.core import catalog, manifest, partitions, promoted, storage, uris
from tasks.core.catalog import Stage
from tasks.core.promotion import Promotion
from tasks.core.reports import VALIDATED_CARD, VALIDATION_REPORT
from tasks.core.stage_records import ValidateStats
from tasks.ml import sts
from tasks.stages import drift, tracking
from tasks.stages.params import ValidateParams
from tasks.stages.validate import card, promotion, scoring, tracked, versus
from tasks.stages.validate.errors import ValidateError
from tasks.stages.validate.pairs import read_pairs
from tasks.stages.validate.records import DriftNotMeasured, ValidationReport

log = logging.getLogger(__name__)


def run(params: ValidateParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Measure the student of ``params.model_run``, apply the gate, promote on success."""
    track = tracking.tracker()  # tracking on without MLflow fails here, before measuring
    pair_sets = [sts.stsb_test(), sts.sick_r_test(), *(read_pairs(uri) for uri in params.pair_files)]
    distilled = manifest.read(params.store, Stage.DISTILL, params.model_run)
    if distilled is None:
        raise ValidateError(f"{params.store}: no published distill run {params.model_run!r}")
    distill_uri = distilled.version_uri(params.store)  # the run as read now: a later one under its name changes nothing
    stage_run = manifest.StageRun(
        stage=Stage.VALIDATE,
        key=params.model_run,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[manifest.Input(distill_uri, distilled.fingerprint)],
    )
    current = promoted.model(params.store)
    if skipped := stage_run.skip_result(force):
        return _settled(params, skipped)
    other = current if current and current.model_run != params.model_run else None
    pointer, promoted_etag = (current.pointer, current.etag) if current else (None, None)
    with stage_run.phase("encode_and_score"):
        measured = scoring.measure(params, distilled, pair_sets, other, progress)
    fidelity = distilled.stats.get("exported")
    _log_measurements(params.model_run, measured, fidelity)
    with stage_run.phase("drift"):
        training_drift = _training_drift(params.store, distilled, pointer.model_run if pointer else None)
    reference_name, reference_scores = promotion.reference(pointer, measured.sts)
    decision = promotion.decide(
        measured.sts.student, reference_scores, reference_name, params, measured.dev_vs_promoted
    )
    report = ValidationReport(
        sts=measured.sts,
        fidelity=fidelity,
        retrieval=measured.retrieval,
        gate=decision,
        drift=training_drift,
        versus_promoted=versus.against_promoted(
            params.store,
            distilled,
            ValidateStats(sts=measured.sts, retrieval=measured.retrieval, gate=decision),
            manifest.recorded_params(stage_run.params),
            measured.neighbours_vs_promoted,
            pointer,
        ),
    )
    _write_report(stage_run, distilled, report, measured.plots)
    return _published(params, stage_run, report, promoted_etag, track, distilled)


def _published(
    params: ValidateParams,
    stage_run: manifest.StageRun,
    report: ValidationReport,
    promoted_etag: str | None,
    track: tracking.Tracker | None,
    distilled: manifest.Manifest,
) -> manifest.StageResult:
    """Publish the validation, report it to ``track`` (when tracking is on) and promote when its gate passed; the
    registry's champion follows the promotion."""
    passed = report.gate.passed
    recorded = Promotion(promoted_etag).as_stats() if passed and params.promote else {}
    stage_run.stats = {**report.model_dump(), **recorded}
    result = stage_run.publish()
    assert result.manifest is not None
    logged = track.log(tracked.report(params, stage_run, report, result.manifest_uri, distilled)) if track else None
    _promote(params, passed, result.manifest, promoted_etag)
    if track is not None and logged is not None and passed and params.promote:
        track.crown(logged)
    return result


def _settled(params: ValidateParams, skipped: manifest.StageResult) -> manifest.StageResult:
    """A skipped run, its promotion settled first when it promotes (:func:`promotion.settle_model`)."""
    if params.promote and skipped.manifest is not None:
        promotion.settle_model(params.store, skipped.manifest)
    return skipped


def _promote(params: ValidateParams, passed: bool, published: manifest.Manifest, etag: str | None) -> None:
    """Promote the validated run when its gate passed and promote is on; else say why not."""
    if passed and params.promote:
        promotion.promote_model(params.store, published, etag)
    else:
        why = "the gate failed" if params.promote else "promote is off"
        log.info("validate %s: not promoted (%s)", params.model_run, why)


def _write_report(
    stage_run: manifest.StageRun, distilled: manifest.Manifest, report: ValidationReport, plots: scoring.Plots
) -> None:
    """``metrics.json`` (unrounded), ``report.html`` and the validated model card of the validation, as the run's
    outputs."""
    from tasks.stages.validate.report import render
    from tasks.stages.validate.report_parts import run_header

    store, model_run = stage_run.store, distilled.key
    prefix = catalog.validation_prefix(store, model_run, stage_run.run_id)
    page = render(
        f"Validation of {model_run}",
        report,
        plots,
        [*stage_run.inputs, *distilled.inputs],
        scoring.quality_results(store, partitions.partitions_read(store, distilled)),
        run_header(store, distilled, stage_run.started_at),
        catalog.store_key(store, storage.join(prefix, VALIDATION_REPORT)),
    )
    stage_run.write_output(storage.join(prefix, "metrics.json"), json.dumps(report.model_dump(), indent=2).encode())
    stage_run.write_output(storage.join(prefix, VALIDATION_REPORT), page.encode())
    if (validated := card.render(store, distilled, report, stage_run.run_id)) is not None:
        stage_run.write_output(storage.join(prefix, VALIDATED_CARD), validated.encode())
    log.info("validate %s: report %s", model_run, uris.redact(storage.join(prefix, VALIDATION_REPORT)))


def _training_drift(
    store: str, distilled: manifest.Manifest, promoted_run: str | None
) -> drift.TrainingDrift | DriftNotMeasured | None:
    """The drift of the run's training data from the promoted model's; what kept it from being measured (a
    reference partition the run's teacher never encoded, say) is reported, and fails nothing."""
    try:
        return drift.between_runs(store, distilled, promoted_run)
    except drift.DriftError as exc:
        log.warning("validate %s: drift not measured: %s", distilled.key, exc)
        return DriftNotMeasured(reference_run=promoted_run, error=str(exc))


def _log_measurements(model_run: str, measured: scoring.Measurements, fidelity: dict | None) -> None:
    """Each encoder's STS scores, the distillation fidelity and the retrieval checks."""
    for encoder, scores in measured.sts.rows().items():
        shown = ", ".join(f"{pair_set} {score:.2f}" for pair_set, score in scores.items())
        log.info("validate %s: STS of %s: %s", model_run, encoder, shown)
    log.info("validate %s: fidelity of the exported weights %s", model_run, fidelity)
    retrieval = measured.retrieval.model_dump().items()
    log.info("validate %s: retrieval %s", model_run, ", ".join(f"{k}={v}" for k, v in retrieval))
