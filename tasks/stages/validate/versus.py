"""This model run against the promoted one, for the validation report: both students' STS deltas, how far their
neighbours agree on the corpus sample (measured by :func:`scoring.measure`), and the rows of ``hpd runs compare``
that differ (params, input partitions, metrics, gate margins, durations)."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import Any

from tasks.core import catalog, manifest, runs
from tasks.stages.validate.promotion import GATED

log = logging.getLogger(__name__)


def against_promoted(  # noqa: PLR0913 - what a comparison is made of, each needed
    store: str,
    distilled: manifest.Manifest,
    report: dict[str, Any],
    params: dict[str, Any],
    neighbours: dict[str, Any] | None,
    promoted: catalog.ModelPointer | None,
) -> dict[str, Any] | None:
    """The comparison of the run being validated (``report``: its measurements and gate decision so far,
    ``params``: the validation's, as its manifest will record them) with the promoted run; None when nothing
    else is promoted. A promoted run whose manifests are gone is reported as such."""
    if promoted is None or promoted.model_run == distilled.key:
        return None
    try:
        theirs = runs.read_run(store, promoted.model_run, promoted.model_run)
    except manifest.ManifestError as exc:
        log.warning("validate %s: not compared with the promoted run: %s", distilled.key, exc)
        return {"run": promoted.model_run, "error": str(exc)}
    measured = {"sts": report["sts"], "retrieval": report["retrieval"], "gate": report["gate"], "timings": {}}
    ours = replace(
        runs.read_run(store, distilled.key, promoted.model_run),
        gate=runs.PASSED if report["gate"]["passed"] else runs.FAILED,
        validation={**measured, "params": params},
    )
    student = report["sts"]["student"]
    return {
        "run": promoted.model_run,
        "sts_delta": {s: round(student[s] - promoted.scores[s], 2) for s in GATED if s in promoted.scores},
        "neighbours": neighbours,
        "differences": [asdict(row) for row in runs.compare_runs(ours, theirs).rows if row.differs],
    }
