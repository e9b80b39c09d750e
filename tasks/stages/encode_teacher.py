"""Encode teacher: each ``sentences`` shard of a partition -> one ``teacher_embeddings`` shard.

Shards are independent units, each with its own manifest
(keyed ``<teacher>/ingest_date=D/<shard>`` by the catalog): a shard whose manifest
matches is skipped, so a killed run resumes where it stopped, and Airflow can fan out one mapped
task per group of shards (:func:`tasks.core.sentences.shards` lists them, ``shards`` selects a group). Memory is
bounded by one shard. Each shard is read verified against the sha256 its writer's manifest records; a
mismatch (:class:`tasks.core.storage.IntegrityError`) or non-finite embeddings fail the shard, naming it;
nothing is published for it.

A composite teacher (``a+b``, :mod:`tasks.ml.teachers`) runs each member as its own encode_teacher run,
then writes each shard's members' embeddings, L2-normalised and side by side, as the composite's shard
(its manifest lists the sentences shard and the members' shards it read).
"""

from __future__ import annotations

import logging
from datetime import date

import numpy as np
import pyarrow as pa

from tasks.core import catalog, manifest, parquet_shards, sentences, storage
from tasks.core.catalog import Dataset, Stage
from tasks.core.progress import Progress, format_duration
from tasks.ml import teachers
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
    if teachers.is_composite(params.teacher):
        return _run_composite(params, force, progress)
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
    return _partition_result(params, partition, results)


def _partition_result(
    params: EncodeTeacherParams, partition: str, results: list[manifest.StageResult]
) -> manifest.StageResult:
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


def _shard_run(
    params: EncodeTeacherParams, shard: manifest.Output, extra_inputs: list[manifest.Input] | None = None
) -> manifest.StageRun:
    """The run encoding one sentences shard; its input checksum comes from the writing stage's manifest (a
    composite teacher's run also lists its members' embeddings)."""
    identity = params.model_dump(mode="json", exclude={"shards", "threads", "device", "batch_size"})
    return manifest.StageRun(
        stage=Stage.ENCODE_TEACHER,
        key=catalog.teacher_shard_key(params.teacher, params.ingest_date, shard.uri),
        store=params.store,
        params=identity,
        inputs=[shard.as_input(), *(extra_inputs or [])],
    )


def _load_encoder(params: EncodeTeacherParams):
    import torch

    from tasks.ml import precision
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
        precision.resolve(params.dtype, device),
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
    written = _write_embeddings(params, stage_run, shard_uri, staged.column("sentence_id"), embeddings)
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


def _write_embeddings(
    params: EncodeTeacherParams,
    stage_run: manifest.StageRun,
    shard_uri: str,
    ids: pa.ChunkedArray,
    embeddings: np.ndarray,
) -> parquet_shards.Shard:
    """Publish one shard's embeddings (in the sentences shard's row order) as a run's output."""
    value_type = pa.float16() if params.output_dtype == "float16" else pa.float32()
    flat = pa.array(embeddings.astype(params.output_dtype).ravel(), value_type)
    dim = embeddings.shape[1]
    table = pa.table({"sentence_id": ids, "embedding": pa.FixedSizeListArray.from_arrays(flat, dim)})
    prefix = catalog.teacher_prefix(params.store, params.teacher, params.ingest_date)
    with stage_run.phase("write"):
        written = parquet_shards.write_shard(
            prefix,
            catalog.derived_stem(shard_uri),
            table,
            Dataset.TEACHER_EMBEDDINGS,
            dim=dim,
            model_id=params.teacher,
            value_type=params.output_dtype,
        )
    stage_run.add_shard(written)
    return written


def _run_composite(params: EncodeTeacherParams, force: bool, progress: bool) -> manifest.StageResult:
    """A composite teacher (:mod:`tasks.ml.teachers`): each member encodes the partition as its own
    encode_teacher run (skipped where done; ``force`` applies to the combining only), then each sentences
    shard's member embeddings, read verified, are combined into the composite's shard."""
    names = teachers.members(params.teacher)
    for member in names:
        run(params.model_copy(update={"teacher": member}), progress=progress)
    shards = _selected_shards(params)
    partition = catalog.teacher_partition(params.teacher, params.ingest_date)
    results = []
    with Progress(f"encode_teacher {partition}", sum(s.rows or 0 for s in shards), bar=progress, logger=log) as bar:
        for shard in shards:
            encoded = [_member_output(params, member, shard) for member in names]
            stage_run = _shard_run(params, shard, extra_inputs=[o.as_input() for o in encoded])
            result = stage_run.skip_result(force)
            if result is None:
                result = _combine_shard(params, stage_run, shard, encoded)
            bar.update(shard.rows or 0)
            results.append(result)
    return _partition_result(params, partition, results)


def _member_output(params: EncodeTeacherParams, member: str, shard: manifest.Output) -> manifest.Output:
    """The embeddings shard a member's published run wrote for ``shard``."""
    key = catalog.teacher_shard_key(member, params.ingest_date, shard.uri)
    published = manifest.read(params.store, Stage.ENCODE_TEACHER, key)
    if published is None or len(published.outputs) != 1:
        raise EncodeError(f"{shard.uri}: no embeddings of teacher member {member!r} (encode_teacher {key})")
    return published.outputs[0]


def _combine_shard(
    params: EncodeTeacherParams, stage_run: manifest.StageRun, shard: manifest.Output, encoded: list[manifest.Output]
) -> manifest.StageResult:
    """The members' rows of one shard, verified and checked to hold the same sentence ids row for row, combined
    and published."""
    with stage_run.phase("read"):
        tables = [storage.read_parquet(o.uri, columns=["sentence_id", "embedding"], sha256=o.sha256) for o in encoded]
    ids = tables[0].column("sentence_id")
    for output, table in zip(encoded[1:], tables[1:], strict=True):
        if not table.column("sentence_id").equals(ids):
            raise EncodeError(f"{output.uri}: its sentence ids are not those of {encoded[0].uri}, row for row")
    with stage_run.phase("encode"):
        embeddings = teachers.combine([parquet_shards.vectors(table, "embedding") for table in tables])
    written = _write_embeddings(params, stage_run, shard.uri, ids, embeddings)
    stage_run.stats = {"rows": written.rows, "members": len(encoded)}
    log.info("encode_teacher %s: %d rows combined from %d members", stage_run.key, written.rows, len(encoded))
    return stage_run.publish()
