"""The distill stage: shard pairs in, a trained and exported student out, with a manifest."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from tasks.core import catalog, learned, manifest, partitions, promoted, spaces
from tasks.core.catalog import Stage
from tasks.ml import student
from tasks.stages import tracking
from tasks.stages.distill import export
from tasks.stages.distill.data import TrainingData, pca_basis, shard_pairs
from tasks.stages.distill.distributed import Distributed, init_distributed, select_device
from tasks.stages.distill.errors import DistillError
from tasks.stages.distill.trainer import Trainer
from tasks.stages.params import DistillParams

# Knobs that change how a run executes, not what it computes: outside the fingerprint, so changing
# them resumes (or skips) instead of starting over; recorded in the manifest's stats.
RUNTIME = {"threads", "checkpoint_every"}

log = logging.getLogger(__name__)


def run(params: DistillParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Train (or resume) the student on the PCA run's targets and publish the exported model."""
    dist = init_distributed()
    on_teacher = bool(params.relation_weight) and params.relation_on == "teacher"
    pairs = shard_pairs(params.store, params.teacher, params.pca_name, params.partitions, on_teacher)
    basis = pca_basis(params.store, params.teacher, params.pca_name)
    warm = _warm_start(params)
    stage_run = manifest.StageRun(
        stage=Stage.DISTILL,
        key=params.name,
        store=params.store,
        params=params.model_dump(mode="json", exclude=RUNTIME),
        inputs=[
            *(
                item
                for p in pairs
                for item in (
                    manifest.Input(p.sentences_uri, p.sha256[0], p.rows),
                    manifest.Input(p.targets_uri, p.sha256[1], p.rows),
                    *([] if p.relation is None else [p.relation]),
                )
            ),
            basis.as_input(),  # the PCA basis the student learns: its embedding space (tasks.core.spaces)
            *([] if warm is None else [manifest.Input(warm.version_uri(params.store), warm.fingerprint)]),
        ],
    )
    if skipped := stage_run.skip_result(force):
        return skipped
    with stage_run.phase("load_data"):
        data = TrainingData(pairs, params.seed, params.val_fraction, params.val_max_rows)
    log.info(
        "distill %s: %d training and %d validation rows (k=%d) from %d shard pair(s); student %s",
        params.name,
        data.train_rows,
        len(data.val_texts),
        data.dim,
        len(pairs),
        params.student if warm is None else f"warm-started from distill run {params.warm_start}",
    )
    with tempfile.TemporaryDirectory(prefix="hpd-warm-start-") as scratch:
        return _trained(params, stage_run, data, dist, (force, progress), warm, Path(scratch))


def _warm_start(params: DistillParams) -> manifest.Manifest | None:
    """The distill run ``warm_start`` names: the version served when it is the promoted run, else its latest;
    None without one; a :class:`DistillError` when none is published."""
    if params.warm_start is None:
        return None
    found = promoted.distill_run(params.store, params.warm_start)
    if found is None:
        raise DistillError(f"{params.store}: no published distill run {params.warm_start!r} to warm-start from")
    return found


def _keeps_head(params: DistillParams, warm: manifest.Manifest | None) -> bool:
    """Whether a warm start keeps its Dense head: when it learned the same teacher's targets in the same PCA basis
    (the same space: a retrain on ``fit-pca --basis-from`` targets) through the same activation, layers and
    sequence length, so that the run's step 0 is the very model it starts from, and selection can export nothing
    worse on the dev sets."""
    if warm is None:
        return False
    same = all(warm.params.get(name) == getattr(params, name) for name in ("teacher", "activation", "max_seq_length"))
    layers = params.student_layers in (None, warm.params.get("student_layers"))  # no cut below what it was
    basis = pca_basis(params.store, params.teacher, params.pca_name)
    return same and layers and spaces.of(params.store, warm) == f"pca:{basis.sha256}"


def _trained(
    params: DistillParams,
    stage_run: manifest.StageRun,
    data: TrainingData,
    dist: Distributed,
    flags: tuple[bool, bool],
    warm: manifest.Manifest | None,
    scratch: Path,
) -> manifest.StageResult:
    """Train the student (the base model, or ``warm``'s exported student downloaded into ``scratch``) on
    ``data``, then export and publish it (the leader). ``flags``: (force, progress)."""
    import torch

    force, progress = flags
    track = tracking.tracker()  # tracking on without MLflow fails here, before training
    if params.threads:
        torch.set_num_threads(params.threads)
    device = select_device(params.device, dist)
    spec = params.student if warm is None else str(student.fetch_published(warm, scratch))
    trainer = Trainer(params, data, device, dist, stage_run.fingerprint, spec, _keeps_head(params, warm))
    with stage_run.phase("train"):
        init_record = trainer.restore_or_initialise(force)
        trainer.train(progress)
    summary = export.run_summary(trainer, init_record)
    read = partitions.partitions_in(catalog.store_key(params.store, i.uri) or i.uri for i in stage_run.inputs)
    summary.update(learned.after_warm_start(params.store, read, warm).as_stats())
    runtime = {"runtime": params.model_dump(mode="json", include=RUNTIME)}
    if not dist.leader:
        return manifest.StageResult(stage_run.uri, skipped=False, stats={**summary, **runtime}, outputs=())
    with stage_run.phase("export"):
        for uri, body in export.files(trainer, stage_run, summary).items():
            stage_run.write_output(uri, body)
    stage_run.stats = {**summary, **runtime}  # with the ONNX export's record, when one was asked for
    published = stage_run.publish()
    if track is not None:
        track.log(export.report(trainer, stage_run, published.manifest_uri))
    return published
