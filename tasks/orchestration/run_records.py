"""Typed records of an Airflow run: the DAG params the runtime reads itself (those that feed a stage field go to
the stage's own model through :func:`tasks.orchestration.runtime.pick`), the stage stats it reads, and what one
task hands the next through XCom, parsed once where a task receives them (XCom carries them as plain JSON)."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, Field

from tasks.stages.params import DEFAULT_STUDENT


class DagParams(BaseModel):
    """What every DAG's params hold: the store (None: the triggering events' store, else the default)."""

    store: str | None = None


class IngestParams(DagParams):
    """``hpd_ingest``'s: how many mapped encode tasks a partition's shards are split into."""

    shard_groups: int = Field(gt=0)


class RetrainParams(DagParams):
    """``hpd_retrain``'s: the teacher and the student's base, the partitions named (None: those ``max_train_rows``
    selects), the model run's name (None: one derived from the Airflow run id) and the retrain policy's settings."""

    teacher: str
    student: str = DEFAULT_STUDENT
    student_layers: int | None = None
    k: int | None = Field(None, description="the PCA's dimension (None: any, as kept)")
    mode: str | None = Field(None, description="the PCA's mode (None: any, as kept)")
    partitions: list[date] | None = None
    name: str | None = None
    force: bool = Field(False, description="retrain whatever the retrain policy decides")
    retrain_fraction: float = Field(
        1.0,
        ge=0,
        description="retrain once the rows staged since the promoted model's training reach this share of the "
        "rows it has learned from, its warm starts' included (volume retrains then come each time the corpus grows "
        "by 1 + f times, and the rows they learn from add up to at most (1 + f) / f times those staged)",
    )
    max_model_age_days: float = Field(
        30.0, gt=0, description="retrain a model trained longer ago than this, once new rows came"
    )
    max_train_rows: int | None = Field(
        100_000,
        gt=0,
        description="teacher rows a retrain learns from: the new partitions' teacher samples, then a replay sample "
        "of older partitions' (empty: every partition)",
    )
    warm_start: bool = Field(
        True, description="start from the promoted student rather than the base model (when it has the same base)"
    )


class QualityReportParams(DagParams):
    """``hpd_quality_report``'s: the drift score at which a partition is flagged."""

    drift_threshold: float


class IndexParams(DagParams):
    """``hpd_index``'s: the model run to index (None: the triggering promotion's, else the promoted one)."""

    model_run: str | None = None


class WrittenRows(BaseModel):
    """What a partition's announcement reads of its staging and augmentation runs' stats."""

    rows_written: int = 0


class Verdict(BaseModel):
    """The validate task's result: the gate's decision and reasons, the student's scores and the report's URI."""

    passed: bool
    reasons: list[str]
    scores: dict[str, float]
    report: str | None


class DriftResult(BaseModel):
    """The drift task's result: whether it is flagged, against which model run (None while none is promoted) and,
    when measured, the score, the threshold, and the drift manifest's store key (the stage's other stats too)."""

    flagged: bool
    model_run: str | None
    score: float | None = None
    threshold: float | None = None
    manifest: str | None = None
