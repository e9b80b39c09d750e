"""The drift stage: how far a partition has moved from the data a model was trained on.

The reference is the training data of a model run (default: the promoted one, ``models/current.json``):
the merged profiles of the partitions its distillation read, under its teacher's PCA run. The partition
and every reference partition are profiled on demand (:mod:`tasks.stages.profiles`); the comparison
(:func:`tasks.ml.drift_stats.compare`: score, components, flag, both profiles' statistics) is published as
``drift/ingest_date=D/<fp12>/drift_stats.json`` with a manifest whose inputs are the model run's distill manifest
and the profiles, so it reruns when either changes. A flagged partition is logged as a warning; the
``hpd_quality_report`` DAG turns it into a retrain trigger. :func:`between_runs` is the same comparison
between two model runs' training data, for the validation report.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tasks.core import catalog, manifest, partitions, promoted
from tasks.core.catalog import Stage
from tasks.core.stage_records import DriftScore, PartitionDrift, Record
from tasks.ml import drift_stats
from tasks.stages import profiles
from tasks.stages.params import DistillParams, DriftParams
from tasks.stages.profiles import DriftError

log = logging.getLogger(__name__)
DEFAULT_THRESHOLD: float = DriftParams.model_fields["threshold"].default


class _AgainstRun(Record):
    reference_run: str
    partitions: list[str]
    reference_partitions: list[str]


class TrainingDrift(DriftScore, _AgainstRun):
    """The drift of a model run's training data (``partitions``) from another run's (``reference_run``, trained on
    ``reference_partitions``), then the score (pydantic orders fields from the last base to the first)."""


def run(params: DriftParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Score partition ``params.ingest_date`` against a model run's training data; publish the comparison."""
    model_run = params.model_run or promoted.model_run(params.store)
    if model_run is None:
        raise DriftError(f"{params.store}: no promoted model (models/current.json) and no --model-run to compare with")
    distilled = partitions.distill_manifest(params.store, model_run)
    trained = DistillParams.model_validate(distilled.params)
    days = sorted(partitions.partitions_read(params.store, distilled))
    partition = profiles.ensure(params.store, trained.teacher, trained.pca_name, params.ingest_date)
    references = {day: profiles.ensure(params.store, trained.teacher, trained.pca_name, day) for day in days}
    distill_uri = catalog.manifest_uri(params.store, Stage.DISTILL, model_run)
    stage_run = manifest.StageRun(
        stage=Stage.DRIFT,
        key=catalog.partition_key(params.ingest_date),
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[manifest.Input(distill_uri, distilled.fingerprint), *_unique([partition, *references.values()])],
    )
    if skipped := stage_run.skip_result(force):
        return skipped
    with stage_run.phase("compare"):
        result = _compare([partition], list(references.values()), params.threshold)
    found = PartitionDrift(
        model_run=model_run, reference_partitions=[d.isoformat() for d in days], **result.model_dump()
    )
    _log_drift(stage_run.key, found)
    stage_run.stats = found.model_dump()
    uri = catalog.drift_uri(params.store, params.ingest_date, stage_run.fingerprint)
    stage_run.write_output(uri, json.dumps(stage_run.stats, indent=2).encode())
    return stage_run.publish()


def between_runs(store: str, distilled: manifest.Manifest, reference_run: str | None) -> TrainingDrift | None:
    """The drift of ``distilled``'s training data from ``reference_run``'s (None when there is no reference run),
    both under ``distilled``'s PCA run, flagged at the drift stage's default threshold."""
    if reference_run is None:
        return None
    trained = DistillParams.model_validate(distilled.params)
    ours = sorted(partitions.partitions_read(store, distilled))
    theirs = sorted(partitions.trained_partitions(store, reference_run))
    profile = {day: profiles.ensure(store, trained.teacher, trained.pca_name, day) for day in {*ours, *theirs}}
    result = _compare([profile[d] for d in ours], [profile[d] for d in theirs], DEFAULT_THRESHOLD)
    return TrainingDrift(
        reference_run=reference_run,
        partitions=[d.isoformat() for d in ours],
        reference_partitions=[d.isoformat() for d in theirs],
        **result.model_dump(),
    )


def _compare(ours: list[manifest.Output], references: list[manifest.Output], threshold: float) -> DriftScore:
    """The comparison of the merged profiles ``ours`` with the merged profiles ``references``."""
    if not ours or not references:
        raise DriftError("a model run that read no corpus partition has no training data to compare")
    return drift_stats.compare(
        drift_stats.merged(profiles.read(o) for o in ours),
        drift_stats.merged(profiles.read(r) for r in references),
        threshold,
    )


def _unique(outputs: list[manifest.Output]) -> list[manifest.Input]:
    return list({o.uri: o.as_input() for o in outputs}.values())


def _log_drift(key: str, found: PartitionDrift) -> None:
    components = ", ".join(f"{name} {value:.3f}" for name, value in found.components.items())
    log.log(
        logging.WARNING if found.flagged else logging.INFO,
        "drift %s: score %.3f against the training data of %s (%s)%s; %s",
        key,
        found.score,
        found.model_run,
        ", ".join(found.reference_partitions),
        f" reaches the threshold {found.threshold}: DRIFT" if found.flagged else f" below {found.threshold}",
        components,
    )


def render(key: str, stats: dict[str, Any]) -> str:
    """A drift result (the stage's stats) as text: the verdict, each component with its weight, and both
    profiles side by side."""
    found = PartitionDrift.parse(stats, f"the drift stats of {key}")
    verdict = "DRIFT" if found.flagged else "no drift"
    lines = [
        f"{key} against the training data of {found.model_run} ({', '.join(found.reference_partitions)}): "
        f"score {found.score:.3f}, threshold {found.threshold}: {verdict}",
        "",
        f"{'component':<26}{'value':>10}{'weight':>10}",
        *(f"{n:<26}{found.components[n]:>10.3f}{found.weights[n]:>10.2f}" for n in drift_stats.WEIGHTS),
        "",
        f"{'statistic':<26}{'partition':>12}{'reference':>12}",
    ]
    for name in drift_stats.STATISTICS:
        lines.append(f"{name:<26}{_shown(found.partition[name]):>12}{_shown(found.reference[name]):>12}")
    return "\n".join(lines)


def _shown(value: float) -> str:
    """A count as it is, a measure to 4 significant digits."""
    return str(value) if isinstance(value, int) else f"{value:.4g}"
