"""The validate stage: measure a distilled student, apply the quality gate, write the report, promote."""

from __future__ import annotations

import json

from tasks.core import catalog, manifest, storage
from tasks.core.catalog import Pointer, Stage
from tasks.ml import sts
from tasks.stages.params import ValidateParams
from tasks.stages.validate import promotion, scoring
from tasks.stages.validate.errors import ValidationError
from tasks.stages.validate.pairs import read_pairs


def run(params: ValidateParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Measure the student of ``params.model_run``, apply the gate, promote on success."""
    from tasks.stages.validate.report import render

    distilled = manifest.read(params.store, Stage.DISTILL, params.model_run)
    if distilled is None:
        raise ValidationError(f"{params.store}: no published distill run {params.model_run!r}")
    pair_sets = [sts.stsb_test(), sts.sick_r_test(), *(read_pairs(uri) for uri in params.pair_files)]
    distill_uri = catalog.manifest_uri(params.store, Stage.DISTILL, params.model_run)
    stage_run = manifest.StageRun(
        stage=Stage.VALIDATE,
        key=params.model_run,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[manifest.Input(distill_uri, distilled.fingerprint)],
    )
    promoted, promoted_etag = catalog.read_pointer(params.store, Pointer.MODEL)
    if skipped := stage_run.skip_result(force):
        return skipped
    with stage_run.phase("encode_and_score"):
        measured = scoring.measure(params, distilled, pair_sets)
    reference_name, reference_scores = promotion.reference(promoted, measured.sts)
    decision = promotion.decide(measured.sts["student"], reference_scores, reference_name, params)
    report = {
        "sts": measured.sts,
        "fidelity": distilled.stats.get("exported"),
        "retrieval": measured.retrieval,
        "gate": decision,
    }
    page = render(
        f"Validation of {params.model_run}",
        report,
        measured.plots,
        [*stage_run.inputs, *distilled.inputs],
        scoring.quality_results(params.store),
    )
    prefix = catalog.validation_prefix(params.store, params.model_run, stage_run.fingerprint)
    stage_run.write_output(storage.join(prefix, "metrics.json"), json.dumps(report, indent=2).encode())
    stage_run.write_output(storage.join(prefix, "report.html"), page.encode())
    stage_run.stats = report
    result = stage_run.publish()
    if decision["passed"] and params.promote:
        promotion.promote_model(params.store, params.model_run, measured.sts["student"], stage_run.uri, promoted_etag)
    return result
