"""This model run against the promoted one, for the validation report: both students' STS deltas, how far their
neighbours agree on the corpus sample (measured by :func:`scoring.measure`), and the rows of ``hpd runs compare``
that differ (params, input partitions, metrics, gate margins, durations)."""

from __future__ import annotations

import logging
from typing import Any

from tasks.core import catalog, manifest, runs
from tasks.core.stage_records import GATED, ValidateStats
from tasks.stages.validate.records import NeighbourOverlap, NotCompared, VersusPromoted

log = logging.getLogger(__name__)


def against_promoted(  # noqa: PLR0913 - what a comparison is made of, each needed
    store: str,
    distilled: manifest.Manifest,
    measured: ValidateStats,
    params: dict[str, Any],
    neighbours: NeighbourOverlap | None,
    promoted: catalog.ModelPointer | None,
) -> VersusPromoted | NotCompared | None:
    """The comparison of the run being validated (``measured``: its measurements and gate decision,
    ``params``: the validation's, as its manifest will record them) with the promoted run; None when nothing
    else is promoted. A promoted run whose manifests are gone is reported as such."""
    if promoted is None or promoted.model_run == distilled.key:
        return None
    try:
        theirs = runs.read_run(store, promoted.model_run, promoted.model_run)
    except manifest.ManifestError as exc:
        log.warning("validate %s: not compared with the promoted run: %s", distilled.key, exc)
        return NotCompared(run=promoted.model_run, error=str(exc))
    ours = runs.read_run(store, distilled.key, promoted.model_run).model_copy(
        update={
            "gate": runs.PASSED if measured.gate.passed else runs.FAILED,
            "validation": runs.Validation(
                sts=measured.sts, retrieval=measured.retrieval, gate=measured.gate, params=params, timings={}
            ),
        }
    )
    student = measured.sts.student
    return VersusPromoted(
        run=promoted.model_run,
        sts_delta={s: round(student[s] - promoted.scores[s], 2) for s in GATED if s in promoted.scores},
        neighbours=neighbours,
        differences=[row for row in runs.compare_runs(ours, theirs).rows if row.differs],
    )
