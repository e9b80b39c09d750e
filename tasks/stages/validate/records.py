"""The validation's records: the neighbour agreement and the comparison with the promoted run, what kept either
comparison from being made, and the report (``metrics.json`` and the validate manifest's stats) they are part of."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from tasks.core.runs import Row
from tasks.core.stage_records import GateVerdict, Record, Retrieval, StsTable
from tasks.stages.drift import TrainingDrift


class BlendScore(Record):
    """One scored blend of the initial and final weights, as the distill run recorded it: the fraction ``blend``
    toward the weights of ``step``, and its scores."""

    model_config = ConfigDict(extra="allow")

    step: int
    blend: float

    def scores(self) -> dict[str, Any]:
        """Its scores, in the recorded order."""
        return dict(self.model_extra or {})


class Fidelity(Record):
    """The exported weights' validation scores as the distill run recorded them (which vary with how it exported:
    the keys stay as they came), with each scored blend's when it blended."""

    model_config = ConfigDict(extra="allow")

    blends: list[BlendScore] = []

    def scores(self) -> dict[str, Any]:
        """The exported weights' scores (and chosen blend), in the recorded order."""
        return dict(self.model_extra or {})


class NeighbourOverlap(Record):
    """The mean share of each sample sentence's 10 nearest sample sentences by this run's student that the promoted
    run's student also ranks among its 10 nearest (1: the same neighbours), over ``queries`` sentences."""

    run: str
    overlap_at_10: float
    queries: int


class DevVersusPromoted(Record):
    """The mean STS dev score (STS-B dev and SICK-R trial, Spearman x100) of this run's student and of the promoted
    ``run``'s, measured alike: what the gate's rule against a retrain that does worse compares."""

    run: str
    student: float
    promoted: float


class VersusPromoted(Record):
    """This run against the promoted ``run``: the student's STS deltas on the gated pair sets (this run minus the
    promoted), the neighbour agreement, and the rows of ``hpd runs compare`` that differ."""

    run: str
    sts_delta: dict[str, float]
    neighbours: NeighbourOverlap | None
    differences: list[Row]


class NotCompared(Record):
    """The promoted ``run`` this run could not be compared with, and why."""

    run: str
    error: str


class DriftNotMeasured(Record):
    """What kept the drift from the reference run's training data from being measured."""

    reference_run: str | None
    error: str


class ValidationReport(Record):
    """What a validation measured and decided: the STS table, the exported weights' fidelity (the distill run's
    record, as it wrote it), retrieval, the gate's verdict, the drift of the training data from the promoted
    model's and the comparison with the promoted run (each None when nothing is promoted)."""

    sts: StsTable
    fidelity: dict[str, Any] | None
    retrieval: Retrieval
    gate: GateVerdict
    drift: TrainingDrift | DriftNotMeasured | None
    versus_promoted: VersusPromoted | NotCompared | None
