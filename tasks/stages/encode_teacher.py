"""Encode teacher: each ``sentences`` shard of a partition -> one ``teacher_embeddings`` shard.

Shards are independent units, each with its own manifest
(keyed ``<teacher>/ingest_date=D/<shard>`` by the catalog): a shard whose manifest
matches is skipped, so a killed run resumes where it stopped, and Airflow can fan out one mapped
task per group of shards (:func:`tasks.core.sentences.shards` lists them, ``shards`` selects a group). Memory is
bounded by one shard. Each shard is read verified against the sha256 its writer's manifest records; a
mismatch (:class:`tasks.core.storage.IntegrityError`) or non-finite embeddings fail the shard, naming it;
nothing is published for it.
"""

from __future__ import annotations

import logging
from datetime import date

import numpy as np
import pyarrow as pa

from tasks.core import catalog, datasets, manifest, sentences, storage
from tasks.core.catalog import Dataset, Stage
from tasks.core.progress import Progress, format_duration
from tasks.stages.params import EncodeTeacherParams

log = logging.getLogger(__name__)


class EncodeError(ValueError):
    """A shard that cannot be encoded; the message names it."""


def encoded(
    store: str, teacher: str, ingest_date: date, stages: tuple[Stage, ...] = catalog.SENTENCE_WRITERS
) -> list[tuple[manifest.Output, manifest.Manifest | None]]:
    """Each current sentences shard of a partition (as ``stages``' manifests record it, checksum included)
    with the manifest of its teacher embeddings, or None where it is not encoded yet."""
    return [
        (shard, manifest.read(store, Stage.ENCODE_TEACHER, catalog.teacher_shard_key(teacher, ingest_date, shard.uri)))
        for shard in sentences.published(store, ingest_date, stages)
    ]


def output_shards(store: str, teacher: str, ingest_date: date) -> list[str]:
    """Published teacher-embedding shards of a partition, one per current sentences shard that is encoded."""
    return [o.uri for _, published in encoded(store, teacher, ingest_date) if published for o in published.outputs]


def run(params: EncodeTeacherParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Encode every (selected) sentences shard of the partition that is not done yet."""
    shards = _selected_shards(params)
    partition = catalog.teacher_partition(params.teacher, params.ingest_date)
    encoder = None
    results = []
    rows = sum(shard.rows or 0 for shard in shards)
    with Progress(f"encode_teacher {partition}", rows, bar=progress, logger=log) as reporter:
        for shard in shards:
            stage_run = _shard_run(params, shard)
            result = stage_run.skip_result(force)
            if result is None:
                encoder = encoder or _load_encoder(params)
                result = _encode_shard(params, encoder, stage_run, shard, reporter)
            else:
                reporter.skip(shard.rows or 0)
            results.append(result)
    encoded_now = sum(not r.skipped for r in results)
    outputs = tuple(o for r in results for o in r.outputs)
    inputs = tuple(i for r in results for i in r.inputs)
    stats = {
        "shards": len(results),
        "encoded": encoded_now,
        "skipped": len(results) - encoded_now,
        "rows": sum(o.rows or 0 for o in outputs),
    }
    log.info("encode_teacher %s: %d shard(s) encoded, %d skipped", partition, encoded_now, stats["skipped"])
    prefix = catalog.manifests_prefix(params.store, Stage.ENCODE_TEACHER, partition)
    return manifest.StageResult(prefix, skipped=encoded_now == 0, stats=stats, outputs=outputs, inputs=inputs)


def _selected_shards(params: EncodeTeacherParams) -> list[manifest.Output]:
    """The partition's sentences shards at the selected positions (all by default)."""
    shards = sentences.published(params.store, params.ingest_date)
    if manifest.read(params.store, Stage.STAGE_CORPUS, catalog.partition_key(params.ingest_date)) is None:
        raise EncodeError(f"{params.store}: no sentences staged for ingest_date={params.ingest_date}")
    selected = params.shards if params.shards is not None else range(len(shards))
    unknown = [i for i in selected if not 0 <= i < len(shards)]
    if unknown:
        raise EncodeError(f"shards {unknown} out of range: the partition has {len(shards)} shard(s)")
    return [shards[i] for i in selected]


def _shard_run(params: EncodeTeacherParams, shard: manifest.Output) -> manifest.StageRun:
    """The run encoding one sentences shard; its input checksum comes from the writing stage's manifest."""
    identity = params.model_dump(mode="json", exclude={"shards", "threads", "device", "batch_size"})
    return manifest.StageRun(
        stage=Stage.ENCODE_TEACHER,
        key=catalog.teacher_shard_key(params.teacher, params.ingest_date, shard.uri),
        store=params.store,
        params=identity,
        inputs=[shard.as_input()],
    )


def _load_encoder(params: EncodeTeacherParams):
    import torch

    from tasks.ml.encoder import SentenceEncoder

    if params.threads:
        torch.set_num_threads(params.threads)
    device = params.device if params.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    encoder = SentenceEncoder.load(params.teacher, device=device, max_seq_length=params.max_seq_length)
    log.info(
        "encode_teacher: teacher %s on %s (%d threads): dim %d, max_seq_length %d, dtype %s, batch %d",
        params.teacher,
        device,
        torch.get_num_threads(),
        encoder.dim,
        encoder.max_seq_length,
        params.dtype,
        params.batch_size,
    )
    return encoder


def _encode_shard(
    params: EncodeTeacherParams, encoder, stage_run: manifest.StageRun, shard: manifest.Output, reporter: Progress
) -> manifest.StageResult:
    """Read the shard, verified against the checksum its writer recorded (:class:`storage.IntegrityError`
    before anything is encoded or written), encode it, publish its embeddings, then its manifest."""
    shard_uri = shard.uri
    with stage_run.phase("read"):
        staged = storage.read_parquet(shard_uri, columns=["sentence_id", "text"], sha256=shard.sha256)
    with stage_run.phase("encode"):
        embeddings = encoder.encode(
            staged.column("text").to_pylist(), batch_size=params.batch_size, dtype=params.dtype, on_rows=reporter.update
        )
    bad = ~np.isfinite(embeddings).all(axis=1)
    if bad.any():
        first = staged.column("sentence_id")[int(np.flatnonzero(bad)[0])].as_py()
        raise EncodeError(
            f"{shard_uri}: {int(bad.sum())} sentence(s) got NaN or infinite embeddings "
            f"(first: {first}); nothing published for this shard"
        )
    value_type = pa.float16() if params.output_dtype == "float16" else pa.float32()
    flat = pa.array(embeddings.astype(params.output_dtype).ravel(), value_type)
    table = pa.table(
        {"sentence_id": staged.column("sentence_id"), "embedding": pa.FixedSizeListArray.from_arrays(flat, encoder.dim)}
    )
    prefix = catalog.teacher_prefix(params.store, params.teacher, params.ingest_date)
    with stage_run.phase("write"):
        written = datasets.write_shard(
            prefix,
            catalog.derived_stem(shard_uri),
            table,
            Dataset.TEACHER_EMBEDDINGS,
            dim=encoder.dim,
            model_id=params.teacher,
            value_type=params.output_dtype,
        )
    stage_run.add_shard(written)
    seconds = stage_run.timings_s["encode"]
    stage_run.stats = {"rows": written.rows, "sentences_per_s": round(written.rows / max(seconds, 1e-9), 2)}
    log.info(
        "encode_teacher %s: %d rows encoded in %s, %.1f rows/s",
        stage_run.key,
        written.rows,
        format_duration(seconds),
        stage_run.stats["sentences_per_s"],
    )
    return stage_run.publish()
