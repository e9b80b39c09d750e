"""Typed records of what the distill, validate and drift stages publish and the rest of the pipeline reads: whether a
retrain exports its start's weights, the STS table, the retrieval checks, the quality gate's verdict with its rules,
and a drift score.

A record is parsed once where a manifest's stats are read (``GateVerdict.model_validate(stats["gate"])``) and
written with ``model_dump()``: the published names, in the published order, the values as they are (NaN
included, which ``mode="json"`` would turn into null)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

GATED = ("STS-B test", "SICK-R test")  # the pair sets the quality gate checks
BASELINE = "baseline (base model + PCA)"  # the same-size baseline's row of the STS table
Statistic = int | float  # a count stays an int (pydantic's smart union keeps each as it comes)


class RecordError(ValueError):
    """A document that is not the record it should be; the message names where it was read and each bad field."""


class Record(BaseModel):
    """A frozen record that reads and writes its fields under their published names."""

    model_config = ConfigDict(frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    @classmethod
    def parse(cls, document: object, source: str) -> Self:
        """``document`` (read from ``source``) as this record; a :class:`RecordError` naming ``source`` if not."""
        try:
            return cls.model_validate(document)
        except ValidationError as exc:
            bad = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'the record'}: {error['msg']}"
                for error in exc.errors(include_url=False)
            )
            raise RecordError(f"{source}: not a {cls.__name__} record ({bad})") from None


class StsTable(Record):
    """STS scores (Spearman x100 of cosine similarity) by encoder, then by pair set."""

    teacher: dict[str, float]
    teacher_pca: dict[str, float] = Field(alias="teacher + PCA")
    student: dict[str, float]
    baseline: dict[str, float] = Field(alias="baseline (base model + PCA)")  # BASELINE

    def rows(self) -> dict[str, dict[str, float]]:
        """The table as published: encoder -> pair set -> score."""
        return self.model_dump()


class Retrieval(Record):
    """Recall@10 of the student's neighbours against the teacher's over a corpus sample, and the MRR of
    retrieving the paired sentence of the STS-B test pairs scored >= 4."""

    recall_at_10_vs_teacher: float
    corpus_sample: int
    stsb_pairs_ge4: int
    mrr_stsb_ge4: float


class GateRule(Record):
    """One rule the gate applied to one gated score: a minimum, or no regression below the reference."""

    score: str
    rule: Literal["minimum", "regression"]
    value: float
    threshold: float
    passed: bool

    @property
    def margin(self) -> float:
        """How far the score is above the threshold (below when negative)."""
        return self.value - self.threshold


class GateVerdict(Record):
    """The quality gate's decision, its reasons, the reference the student was held to, and each rule (none
    recorded by validations from before the rules were)."""

    passed: bool
    reasons: list[str]
    reference: str
    reference_scores: dict[str, float]
    rules: list[GateRule] = []


class DistillOutcome(Record):
    """What the pipeline reads of a distill manifest's stats before validating it: whether the run exports its warm
    start's own weights (no trained checkpoint or blend beat them on the dev sets; False for a run from before)."""

    exports_its_start: bool = False


class ValidateStats(Record):
    """What the pipeline reads of a validate manifest's stats: the STS table, retrieval and the gate's verdict."""

    sts: StsTable
    retrieval: Retrieval
    gate: GateVerdict


class DriftScore(Record):
    """How far data moved from a reference: each component in [0, 1], their weights, the weighted score, whether
    it reaches the threshold, and both sides' statistics."""

    score: float
    threshold: float
    flagged: bool
    components: dict[str, float]
    weights: dict[str, float]
    partition: dict[str, Statistic]
    reference: dict[str, Statistic]


class _AgainstModelRun(Record):
    model_run: str
    reference_partitions: list[str]


class PartitionDrift(DriftScore, _AgainstModelRun):
    """The drift stage's stats: the model run whose training data (``reference_partitions``) is the reference,
    then the score (pydantic orders fields from the last base to the first: these come first, as published)."""
