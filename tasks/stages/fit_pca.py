"""Fit PCA: teacher embeddings -> a k-dim projection, and the student's projected targets.

The fit streams over every teacher shard of the selected partitions, accumulating the row count,
the sum and XᵀX (float64, shifted by the first chunk's mean for numerical stability), then takes
an eigendecomposition of the D×D covariance: memory is O(D²) whatever the row count. An optional
cap samples rows by a seeded hash of the sentence id (uniform, deterministic, no extra pass).
Every teacher shard is read verified against the sha256 its encode_teacher manifest records: all of
them in the fit, before anything is written, and each again for its targets; in both passes the next
shard is read (and hashed) in a background thread while this one is computed on.

Two projection modes share the same components (those of scikit-learn's PCA):
``uncentered`` applies them to the raw embeddings, as HPD's code does; ``centered`` subtracts the
mean first. The artifact (``pca.safetensors``: components, mean, explained variance and ratio;
``summary.json``) records the mode.

The projected targets are written as a dataset (``targets/<teacher>/<run>/``, one shard per
teacher shard, same row order) rather than applied on the fly by the distillation stage: the
student re-reads its targets every epoch and k-dim rows are D/k times smaller to read than teacher
rows; the data-quality suite can check exactly what the student learns from; and each target
shard's lineage (teacher shard + PCA artifact) is a manifest entry.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core import catalog, manifest, parquet_shards, prefetch, promoted, sentences, spaces, storage
from tasks.core.catalog import Dataset, Stage
from tasks.core.progress import Progress
from tasks.ml.projection import ARTIFACT, MomentAccumulator, PCAError, Projection
from tasks.stages import encode_teacher
from tasks.stages.params import FitPCAParams

CHUNK_ROWS = 8192

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitSummary:
    """What a fit found (``summary.json``, in this field order): the projection's set-up, the rows it was fitted on
    of those available, and the variance its components explain."""

    teacher: str
    mode: str
    k: int
    dim: int
    rows_fitted: int
    rows_available: int
    sample_fraction: float
    explained_variance_ratio_sum: float
    explained_variance_ratio: list[float]
    basis_from: str | None = None

    def as_record(self) -> dict[str, Any]:
        """The record ``summary.json`` holds."""
        return asdict(self)

    def stats(self) -> dict[str, Any]:
        """The manifest's stats: the rows fitted and available, and the variance explained."""
        return {
            "rows_fitted": self.rows_fitted,
            "rows_available": self.rows_available,
            "explained_variance_ratio_sum": self.explained_variance_ratio_sum,
        }

    def log(self, key: str) -> None:
        """Log the fit of PCA run ``key``."""
        ratios = self.explained_variance_ratio
        log.info(
            "fit_pca %s: fitted k=%d (%s) on %d of %d rows, dim %d: explained variance ratio %.4f in all, "
            "first component %.4f, last %.4f",
            key,
            self.k,
            self.mode,
            self.rows_fitted,
            self.rows_available,
            self.dim,
            self.explained_variance_ratio_sum,
            ratios[0],
            ratios[-1],
        )


def teacher_shards(store: str, teacher: str, partitions: list[date] | None) -> list[manifest.Output]:
    """The teacher embeddings of every current sentences shard of the partitions (default: every staged
    partition); a shard not encoded yet is an error naming it."""
    if partitions is None:
        partitions = sentences.staged_days(store)
    pairs = [pair for day in partitions for pair in encode_teacher.encoded(store, teacher, day)]
    missing = [shard.uri for shard, published in pairs if published is None]
    if missing:
        raise PCAError(
            f"{len(missing)} sentences shard(s) not encoded by {teacher!r} yet, e.g. {missing[0]}; "
            f"run encode-teacher first"
        )
    return [o for _, published in pairs if published for o in published.outputs]


def run(params: FitPCAParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Fit the projection over the teacher shards, publish it, and write the projected targets."""
    shards = teacher_shards(params.store, params.teacher, params.partitions)
    if not shards:
        raise PCAError(
            f"{params.store}: no teacher embeddings of {params.teacher!r} for partitions {params.partitions or 'any'}"
        )
    kept = _kept_basis(params)
    stage_run = manifest.StageRun(
        stage=Stage.FIT_PCA,
        key=catalog.pca_key(params.teacher, params.name),
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[s.as_input() for s in shards] + ([kept[0]] if kept else []),
    )
    if skipped := stage_run.skip_result(force):
        return skipped
    total_rows = sum(s.rows or 0 for s in shards)
    fraction = min(1.0, params.max_rows / total_rows) if params.max_rows else 1.0
    artifact, summary = _fitted(params, stage_run, (shards, fraction), kept, progress)
    summary.log(stage_run.key)
    with stage_run.phase("write_artifact"):
        # A folder per fingerprint: a rerun never overwrites what the published manifest lists.
        prefix = catalog.pca_prefix(params.store, params.teacher, params.name, stage_run.fingerprint)
        stage_run.write_output(storage.join(prefix, ARTIFACT), artifact)
        stage_run.write_output(storage.join(prefix, "summary.json"), json.dumps(summary.as_record(), indent=2).encode())
    projection = Projection.from_safetensors(artifact)
    if params.write_targets:
        with stage_run.phase("write_targets"):
            targets_prefix = catalog.targets_prefix(params.store, params.teacher, params.name)
            model_id = f"{params.teacher}+pca-{params.name}"
            with Progress(f"fit_pca {stage_run.key} targets", total_rows, bar=progress, logger=log) as reporter:
                for shard, table in prefetch.ahead(shards, _read):
                    stage_run.add_shard(_write_targets(shard, table, projection, targets_prefix, model_id))
                    reporter.update(shard.rows or 0)
    stage_run.stats = summary.stats()
    return stage_run.publish()


def _fitted(
    params: FitPCAParams,
    stage_run: manifest.StageRun,
    rows: tuple[list[manifest.Output], float],
    kept: tuple[manifest.Input, bytes] | None,
    progress: bool,
) -> tuple[bytes, FitSummary]:
    """The artifact (fitted over the shards' rows sampled at ``fraction``, or the ``kept`` basis as it is) and the
    summary of the fit."""
    shards, fraction = rows
    if kept is not None:
        projection = Projection.from_safetensors(kept[1], kept[0].uri)
        log.info("fit_pca %s: keeping the basis of distill run %s (%s)", stage_run.key, params.basis_from, kept[0].uri)
        if len(projection.components) != params.k or projection.mode != params.mode:
            raise PCAError(
                f"{kept[0].uri}: a {projection.mode} basis of k={len(projection.components)}, not the "
                f"{params.mode} k={params.k} asked for"
            )
        body, dim = kept[1], projection.components.shape[1]
    else:
        log.info(
            "fit_pca %s: %d rows available, sample fraction %.4g",
            stage_run.key,
            sum(s.rows or 0 for s in shards),
            fraction,
        )
        with stage_run.phase("accumulate"):
            accumulator = accumulate(shards, fraction, params.seed, progress)
        with stage_run.phase("eigendecomposition"):
            projection = accumulator.fit(params.k, params.mode)
        body, dim = projection.to_safetensors(), accumulator.dim
    return body, FitSummary(
        teacher=params.teacher,
        mode=params.mode,
        k=params.k,
        dim=dim,
        rows_fitted=projection.rows,
        rows_available=sum(s.rows or 0 for s in shards),
        sample_fraction=fraction,
        explained_variance_ratio_sum=float(projection.explained_variance_ratio.sum()),
        explained_variance_ratio=projection.explained_variance_ratio.round(6).tolist(),
        basis_from=params.basis_from,
    )


def _kept_basis(params: FitPCAParams) -> tuple[manifest.Input, bytes] | None:
    """The PCA artifact the distill run ``basis_from`` learned (its record, its bytes read verified), or None."""
    if params.basis_from is None:
        return None
    distilled = promoted.distill_run(params.store, params.basis_from)
    if distilled is None:
        raise PCAError(f"{params.store}: no published distill run {params.basis_from!r} to keep the PCA basis of")
    found = spaces.basis(params.store, distilled)
    if found is None:
        raise PCAError(
            f"distill run {params.basis_from!r} records no PCA basis (it was distilled before runs recorded theirs); "
            "fit one instead (no basis_from)"
        )
    return found, storage.read_bytes(found.uri, sha256=found.sha256)


def accumulate(
    shards: Sequence[manifest.Output | str], fraction: float, seed: int, progress: bool
) -> MomentAccumulator:
    """The moments of the rows of every shard whose seeded id hash falls below ``fraction``. A shard given
    as its manifest record is read verified against the recorded sha256; a bare URI (a shard no manifest
    lists, as in the benchmark) is read as it is."""
    accumulator = None
    rows = [None if isinstance(shard, str) else shard.rows for shard in shards]
    total = None if None in rows else sum(rows)
    with Progress("fit_pca accumulate", total, bar=progress, logger=log) as reporter:
        for shard, table in prefetch.ahead(shards, _read):
            for ids, chunk in _chunks(shard if isinstance(shard, str) else shard.uri, table):
                accumulator = accumulator or MomentAccumulator(chunk.shape[1])
                accumulator.add(chunk[sentences.hashed_below(ids, fraction, str(seed))])
                reporter.update(len(ids))
    if accumulator is None:
        raise PCAError(f"no teacher embedding rows in {len(shards)} shard(s)")
    return accumulator


def target_shards(store: str, teacher: str, name: str) -> list[str]:
    """The projected-target shards a published PCA run lists."""
    published = manifest.read(store, Stage.FIT_PCA, catalog.pca_key(teacher, name))
    if published is None:
        raise PCAError(f"{store}: no PCA run {name!r} for teacher {teacher!r}")
    return [o.uri for o in published.outputs_of(Dataset.PROJECTED_TARGETS)]


def _read(shard: manifest.Output | str) -> pa.Table:
    """A teacher shard's ids and embeddings; verified against its recorded sha256 when given its record."""
    uri, sha256 = (shard, None) if isinstance(shard, str) else (shard.uri, shard.sha256)
    return storage.read_parquet(uri, columns=["sentence_id", "embedding"], sha256=sha256)


def _chunks(uri: str, table: pa.Table) -> Iterator[tuple[list[str], np.ndarray]]:
    column = table.column("embedding")
    if not pa.types.is_fixed_size_list(column.type):
        raise PCAError(f"{uri}: embedding column is {column.type}, not a fixed-size list")
    for start in range(0, table.num_rows, CHUNK_ROWS):
        part = table.slice(start, CHUNK_ROWS)
        chunk = parquet_shards.vectors(part, "embedding")
        if not np.isfinite(chunk).all():
            raise PCAError(f"{uri}: NaN or infinite embedding values near row {start}")
        yield part.column("sentence_id").to_pylist(), chunk


def _write_targets(
    teacher: manifest.Output, table: pa.Table, projection: Projection, prefix: str, model_id: str
) -> parquet_shards.Shard:
    ids, targets = [], []
    for chunk_ids, chunk in _chunks(teacher.uri, table):
        ids.extend(chunk_ids)
        targets.append(projection.apply(chunk))
    values = np.concatenate(targets) if targets else np.zeros((0, len(projection.components)), np.float32)
    k = values.shape[1]
    table = pa.table(
        {
            "sentence_id": pa.array(ids, pa.string()),
            "target": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel(), pa.float32()), k),
        }
    )
    stem = teacher.uri.rsplit("/", 1)[1].removesuffix(".parquet")
    return parquet_shards.write_shard(prefix, stem, table, Dataset.PROJECTED_TARGETS, dim=k, model_id=model_id)
