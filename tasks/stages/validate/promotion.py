"""The quality gate and the promotion it allows.

The student's STS-B and SICK-R scores must meet the configured minima and must not fall more than
``max_regression`` points below the reference: the currently promoted model, or, for the first
run, the same-size baseline. Against a promoted model, the student's mean STS dev score must also not fall more
than ``max_dev_regression`` points below the promoted model's (both measured by this validation): a retrain that
does worse where runs are selected is refused. A passing model moves ``models/current.json`` by compare-and-swap.
"""

from __future__ import annotations

import logging

from tasks.core import catalog, manifest, uris
from tasks.core import promotion as pointer_moves
from tasks.core.catalog import Pointer
from tasks.core.stage_records import BASELINE as BASELINE  # the STS table's row of the same-size baseline
from tasks.core.stage_records import GATED, GateRule, GateVerdict, StsTable, ValidateStats
from tasks.stages.params import ValidateParams
from tasks.stages.validate.errors import ValidateError
from tasks.stages.validate.records import DevVersusPromoted

DEV = "STS dev (mean)"  # the gate rule's name for the mean of STS-B dev and SICK-R trial

log = logging.getLogger(__name__)


def reference(promoted: catalog.ModelPointer | None, sts_table: StsTable) -> tuple[str, dict[str, float]]:
    """(name, scores) of what the student is compared with: the promoted model, else the baseline."""
    if promoted:
        return "promoted model " + promoted.model_run, promoted.scores
    return "baseline", sts_table.baseline


def decide(
    scores: dict[str, float],
    reference_scores: dict[str, float],
    reference_name: str,
    params: ValidateParams,
    dev: DevVersusPromoted | None = None,
) -> GateVerdict:
    """The promotion decision: minima and no regression beyond the margin (and, with ``dev``, none on the dev sets
    against the promoted model), with every reason; each rule's value, threshold and outcome is logged, and the
    decision."""
    reasons: list[str] = []
    rules: list[GateRule] = []
    checks = [
        (name, scores[name], *rule)
        for name, minimum in zip(GATED, (params.min_stsb, params.min_sickr), strict=True)
        for rule in _rules(name, scores[name], minimum, reference_scores[name], reference_name, params)
    ]
    checks += [] if dev is None else [_dev_rule(dev, params.max_dev_regression)]
    for name, score, threshold, rule, failure in checks:
        failed = score < threshold
        log.info("gate %s: %.2f, threshold %.2f (%s): %s", name, score, threshold, rule, "FAIL" if failed else "pass")
        kind = "minimum" if rule == "minimum" else "regression"
        rules.append(GateRule(score=name, rule=kind, value=score, threshold=round(threshold, 4), passed=not failed))
        if failed:
            reasons.append(failure)
    decision = GateVerdict(
        passed=not reasons,
        reasons=reasons or ["all checks passed"],
        reference=reference_name,
        reference_scores={n: reference_scores[n] for n in GATED},
        rules=rules,
    )
    log.info("gate %s: %s", "passed" if not reasons else "failed", "; ".join(decision.reasons))
    return decision


def _rules(
    name: str, score: float, minimum: float | None, reference: float, reference_name: str, params: ValidateParams
) -> list[tuple[float, str, str]]:
    """(threshold, what it is, the reason given when ``score`` falls below it) of each rule on one score."""
    margin = params.max_regression
    rules = [] if minimum is None else [(minimum, "minimum", f"{name} {score:.2f} is below the minimum {minimum:.2f}")]
    regression = f"{name} {score:.2f} regresses more than {margin:.2f} below the {reference_name}'s {reference:.2f}"
    return [*rules, (reference - margin, f"the {reference_name}'s {reference:.2f} less {margin:.2f}", regression)]


def _dev_rule(dev: DevVersusPromoted, tolerance: float) -> tuple[str, float, float, str, str]:
    """(name, score, threshold, what it is, the reason given when it fails) of the rule on the dev sets."""
    theirs = f"the promoted model {dev.run}'s {dev.promoted:.2f}"
    failure = f"{DEV} {dev.student:.2f} regresses more than {tolerance:.2f} below {theirs}"
    return DEV, dev.student, dev.promoted - tolerance, f"{theirs} less {tolerance:.2f}", failure


def promote_model(store: str, published: manifest.Manifest, etag: str | None) -> None:
    """Point ``models/current.json`` at a published validation (its manifest's version, and the version of the
    distill manifest it validated), unless another promotion happened since ``etag``."""
    scores = ValidateStats.parse(published.stats, published.version_uri(store)).sts.student
    pointer = catalog.ModelPointer(published.key, scores, published.version_uri(store), published.inputs[0].uri)
    try:
        moved = pointer_moves.move(store, pointer, etag, published)
    except catalog.PointerMoved:
        raise ValidateError(
            f"{catalog.pointer_uri(store, Pointer.MODEL)}: another promotion happened since this "
            f"validation started; {published.key} was not promoted"
        ) from None
    if moved:
        log.info("promoted %s: %s names it now", published.key, uris.redact(catalog.pointer_uri(store, Pointer.MODEL)))


def settle_model(store: str, published: manifest.Manifest) -> None:
    """On a rerun of a published validation that passed its gate to promote: complete the move of
    ``models/current.json`` it did not finish, or say where its promotion stands (:mod:`tasks.core.promotion`)."""
    uri = published.version_uri(store)
    unfinished, etag = pointer_moves.resume(store, Pointer.MODEL, published, lambda p: p.validation == uri)
    if unfinished:
        promote_model(store, published, etag)
