"""The quality gate and the promotion it allows.

The student's STS-B and SICK-R scores must meet the configured minima and must not fall more than
``max_regression`` points below the reference: the currently promoted model, or, for the first
run, the same-size baseline. A passing model moves ``models/current.json`` by compare-and-swap.
"""

from __future__ import annotations

from tasks.core import catalog
from tasks.core.catalog import Pointer
from tasks.stages.params import ValidateParams
from tasks.stages.validate.errors import ValidationError

GATED = ("STS-B test", "SICK-R test")
BASELINE = "baseline (base model + PCA)"


def reference(promoted: catalog.ModelPointer | None, sts_table: dict[str, dict[str, float]]) -> tuple[str, dict]:
    """(name, scores) of what the student is compared with: the promoted model, else the baseline."""
    if promoted:
        return "promoted model " + promoted.model_run, promoted.scores
    return "baseline", sts_table[BASELINE]


def decide(scores: dict, reference_scores: dict, reference_name: str, params: ValidateParams) -> dict:
    """The promotion decision: minima and no regression beyond the margin, with every reason."""
    reasons = []
    for name, minimum in zip(GATED, (params.min_stsb, params.min_sickr), strict=True):
        if minimum is not None and scores[name] < minimum:
            reasons.append(f"{name} {scores[name]:.2f} is below the minimum {minimum:.2f}")
        if scores[name] < reference_scores[name] - params.max_regression:
            reasons.append(
                f"{name} {scores[name]:.2f} regresses more than {params.max_regression:.2f} below "
                f"the {reference_name}'s {reference_scores[name]:.2f}"
            )
    return {
        "passed": not reasons,
        "reasons": reasons or ["all checks passed"],
        "reference": reference_name,
        "reference_scores": {n: reference_scores[n] for n in GATED},
    }


def promote_model(store: str, model_run: str, scores: dict, manifest_uri: str, etag: str | None) -> None:
    """Point ``models/current.json`` at ``model_run``, unless another promotion happened since ``etag``."""
    try:
        catalog.move_pointer(store, catalog.ModelPointer(model_run, scores, manifest_uri), etag)
    except catalog.PointerMoved:
        raise ValidationError(
            f"{catalog.pointer_uri(store, Pointer.MODEL)}: another promotion happened since this "
            f"validation started; {model_run} was not promoted"
        ) from None
