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
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core import catalog, finite, manifest, parquet_shards, sentences, storage, teacher_sample
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


def output_records(store: str, teacher: str, ingest_date: date) -> list[manifest.Output]:
    """Published teacher-embedding shards of a partition (as their manifests record them), one per current
    sentences shard that is encoded."""
    return [o for _, published in encoded(store, teacher, ingest_date) if published for o in published.outputs]


def output_shards(store: str, teacher: str, ingest_date: date) -> list[str]:
    """URIs of :func:`output_records`."""
    return [o.uri for o in output_records(store, teacher, ingest_date)]


@dataclass(frozen=True)
class EncodedRows:
    """The rows of a sentences shard the teacher encoded (its sample): ids, texts and embeddings, row for row."""

    ids: list[str]
    texts: list[str]
    vectors: np.ndarray


def read_encoded(shard: manifest.Output, embedded: manifest.Output) -> EncodedRows:
    """The rows of the sentences ``shard`` that its teacher shard ``embedded`` holds, with their texts, both read
    verified against the checksums their manifests record; an :class:`EncodeError` naming ``embedded`` when it
    holds an id the shard does not."""
    staged = storage.read_parquet(shard.uri, columns=["sentence_id", "text"], sha256=shard.sha256)
    table = storage.read_parquet(embedded.uri, columns=["sentence_id", "embedding"], sha256=embedded.sha256)
    text_of = dict(zip(staged.column("sentence_id").to_pylist(), staged.column("text").to_pylist(), strict=True))
    ids = table.column("sentence_id").to_pylist()
    if missing := [sid for sid in ids if sid not in text_of]:
        raise EncodeError(f"{embedded.uri}: {len(missing)} sentence id(s) not in {shard.uri}, e.g. {missing[0]}")
    return EncodedRows(ids, [text_of[sid] for sid in ids], parquet_shards.vectors(table, "embedding", embedded.uri))


def run(params: EncodeTeacherParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Encode the teacher sample of every (selected) sentences shard of the partition that is not done yet."""
    shards, sample = _selected_shards(params), _sample(params)
    if teachers.is_composite(params.teacher):
        return _run_composite(params, (shards, sample), force, progress)
    return _run_member(params, (shards, sample), force, progress)


def _run_member(
    params: EncodeTeacherParams,
    selected: tuple[list[manifest.Output], teacher_sample.Sample],
    force: bool,
    progress: bool,
) -> manifest.StageResult:
    """Encode the sample of each of the selected shards with one model."""
    shards, sample = selected
    partition = catalog.teacher_partition(params.teacher, params.ingest_date)
    encoder: list[Any] = []  # loaded on the first shard with rows to encode
    results = []
    with Progress(f"encode_teacher {partition}", _rows(shards, sample), bar=progress, logger=log) as reporter:
        for shard in shards:
            stage_run = _shard_run(params, shard, sample)
            result = stage_run.skip_result(force)
            if result is None:
                result = _encode_shard(params, encoder, stage_run, (shard, sample.of(shard.uri)), reporter)
            else:
                reporter.skip(len(sample.of(shard.uri)))
            results.append(result)
    return _partition_result(params, partition, results, sample)


def _sample(params: EncodeTeacherParams) -> teacher_sample.Sample:
    """The partition's teacher sample (``teacher_sample`` rows of it, or every row), logged."""
    sample = teacher_sample.of_partition(params.store, params.ingest_date, params.teacher_sample, params.sample_seed)
    log.info(
        "encode_teacher %s: the teacher sample (%s) holds %d of the partition's %d rows",
        catalog.partition_key(params.ingest_date),
        teacher_sample.describe(params.teacher_sample),
        sample.rows,
        sample.rows_available,
    )
    return sample


def _rows(shards: list[manifest.Output], sample: teacher_sample.Sample) -> int:
    return sum(len(sample.of(shard.uri)) for shard in shards)


def _partition_result(
    params: EncodeTeacherParams, partition: str, results: list[manifest.StageResult], sample: teacher_sample.Sample
) -> manifest.StageResult:
    encoded_now = sum(not r.skipped for r in results)
    outputs = tuple(o for r in results for o in r.outputs)
    inputs = tuple(i for r in results for i in r.inputs)
    stats = {
        "shards": len(results),
        "encoded": encoded_now,
        "skipped": len(results) - encoded_now,
        "rows": sum(o.rows or 0 for o in outputs),
        "rows_available": sample.rows_available,
    }
    log.info(
        "encode_teacher %s: %d shard(s) encoded, %d skipped; the teacher holds %d of %d rows",
        partition,
        encoded_now,
        stats["skipped"],
        stats["rows"],
        sample.rows_available,
    )
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


# Settings that do not change what a shard's embeddings are: outside the manifest's identity.
RUNTIME = {"shards", "threads", "device", "batch_size"}
SAMPLE_SETTINGS = {"teacher_sample", "sample_seed"}  # what decides the rows encoded, recorded as the sample's digest


def _shard_run(
    params: EncodeTeacherParams,
    shard: manifest.Output,
    sample: teacher_sample.Sample,
    extra_inputs: list[manifest.Input] | None = None,
) -> manifest.StageRun:
    """The run encoding one sentences shard's sampled rows; its input checksum comes from the writing stage's
    manifest (a composite teacher's run also lists its members' embeddings), and its identity holds the digest of
    the rows sampled, so a shard reruns when its sample changes."""
    identity = params.model_dump(mode="json", exclude=RUNTIME)
    identity["sample"] = {"rows": len(sample.of(shard.uri)), "ids_sha256": sample.digest(shard.uri)}
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
    params: EncodeTeacherParams,
    encoder: list[Any],
    stage_run: manifest.StageRun,
    sampled: tuple[manifest.Output, tuple[str, ...]],
    reporter: Progress,
) -> manifest.StageResult:
    """Read the shard, verified against the checksum its writer recorded (:class:`storage.IntegrityError`
    before anything is encoded or written), keep its sampled rows, encode those the key's previous run did not
    (:func:`_reusable`), publish their embeddings, then the manifest. ``encoder``: the model, once loaded."""
    shard, ids = sampled
    with stage_run.phase("read"):
        staged = storage.read_parquet(shard.uri, columns=["sentence_id", "text"], sha256=shard.sha256)
        staged = staged.filter(pa.array(np.isin(staged.column("sentence_id").to_pylist(), list(ids))))
    reused = _reusable(params, stage_run)
    texts, row_ids = staged.column("text").to_pylist(), staged.column("sentence_id").to_pylist()
    todo = [row for row, sid in enumerate(row_ids) if sid not in reused]
    reporter.update(len(row_ids) - len(todo))
    with stage_run.phase("encode"):
        fresh = _encoded([texts[row] for row in todo], params, encoder, reporter)
    embeddings = _assembled(row_ids, reused, dict(zip(todo, fresh, strict=True)))
    if not row_ids:  # nothing of this shard sampled: an empty shard of the teacher's dimension
        embeddings = np.zeros((0, _model(params, encoder).dim), np.float32)
    _require_finite(shard.uri, row_ids, embeddings)
    written = _write_embeddings(params, stage_run, shard.uri, staged.column("sentence_id"), embeddings)
    seconds = stage_run.timings_s["encode"]
    stage_run.stats = {
        "rows": written.rows,
        "encoded": len(todo),
        "reused": written.rows - len(todo),
        "shard_rows": shard.rows,
        "sentences_per_s": round(len(todo) / max(seconds, 1e-9), 2),
    }
    log.info(
        "encode_teacher %s: %d sampled rows of %s: %d encoded in %s (%.1f rows/s), %d reused",
        stage_run.key,
        written.rows,
        shard.rows,
        len(todo),
        format_duration(seconds),
        stage_run.stats["sentences_per_s"],
        written.rows - len(todo),
    )
    return stage_run.publish()


def _encoded(texts: list[str], params: EncodeTeacherParams, encoder: list[Any], reporter: Progress) -> np.ndarray:
    """``texts`` encoded by the teacher."""
    if not texts:
        return np.zeros((0, 0), np.float32)
    return _model(params, encoder).encode(
        texts, batch_size=params.batch_size, dtype=params.dtype, on_rows=reporter.update
    )


def _model(params: EncodeTeacherParams, encoder: list[Any]) -> Any:
    """The teacher, loaded into ``encoder`` the first time it is needed."""
    if not encoder:
        encoder.append(_load_encoder(params))
    return encoder[0]


def _reusable(params: EncodeTeacherParams, stage_run: manifest.StageRun) -> dict[str, np.ndarray]:
    """Embeddings the key's previous published run computed with the same settings (its sample aside), by
    sentence id, read verified: a shard whose sample grew encodes only the rows it added. Empty when there is
    none, or it does not read (then everything is encoded again)."""
    previous = stage_run.replaced()
    if previous is None or len(previous.outputs) != 1:
        return {}
    recorded = manifest.recorded_params(stage_run.params)
    settings = {name: value for name, value in recorded.items() if name not in (*SAMPLE_SETTINGS, "sample")}
    if any(previous.params.get(name) != value for name, value in settings.items()):
        return {}
    output = previous.outputs[0]
    try:
        table = storage.read_parquet(output.uri, columns=["sentence_id", "embedding"], sha256=output.sha256)
        vectors = parquet_shards.vectors(table, "embedding", output.uri)
    except (storage.StorageError, finite.NonFiniteError) as exc:
        log.warning("encode_teacher %s: the previous embeddings are not reused (%s)", stage_run.key, exc)
        return {}
    return dict(zip(table.column("sentence_id").to_pylist(), vectors, strict=True))


def _assembled(ids: list[str], reused: dict[str, np.ndarray], fresh: dict[int, np.ndarray]) -> np.ndarray:
    """The embeddings of ``ids`` in order: freshly encoded by row, else reused by id."""
    rows = [fresh[row] if row in fresh else reused[sid] for row, sid in enumerate(ids)]
    return np.stack(rows).astype(np.float32) if rows else np.zeros((0, 0), np.float32)


def _require_finite(shard_uri: str, ids: list[str], embeddings: np.ndarray) -> None:
    bad = ~np.isfinite(embeddings).all(axis=1)
    if bad.any():
        raise EncodeError(
            f"{shard_uri}: {int(bad.sum())} sentence(s) got NaN or infinite embeddings "
            f"(first: {ids[int(np.flatnonzero(bad)[0])]}); nothing published for this shard"
        )


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


def _run_composite(
    params: EncodeTeacherParams,
    selected: tuple[list[manifest.Output], teacher_sample.Sample],
    force: bool,
    progress: bool,
) -> manifest.StageResult:
    """A composite teacher (:mod:`tasks.ml.teachers`): each member encodes the partition as its own
    encode_teacher run (skipped where done; ``force`` applies to the combining only), then each sentences
    shard's member embeddings, read verified, are combined into the composite's shard."""
    names = teachers.members(params.teacher)
    for member in names:
        _run_member(params.model_copy(update={"teacher": member}), selected, False, progress)
    shards, sample = selected
    partition = catalog.teacher_partition(params.teacher, params.ingest_date)
    results = []
    with Progress(f"encode_teacher {partition}", _rows(shards, sample), bar=progress, logger=log) as bar:
        for shard in shards:
            encoded = [_member_output(params, member, shard) for member in names]
            stage_run = _shard_run(params, shard, sample, extra_inputs=[o.as_input() for o in encoded])
            result = stage_run.skip_result(force)
            if result is None:
                result = _combine_shard(params, stage_run, shard, encoded)
            bar.update(len(sample.of(shard.uri)))
            results.append(result)
    return _partition_result(params, partition, results, sample)


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
        vectors = [parquet_shards.vectors(table, "embedding") for table in tables]
        embeddings = teachers.combine(vectors, teachers.weights(params.teacher))
    written = _write_embeddings(params, stage_run, shard.uri, ids, embeddings)
    stage_run.stats = {"rows": written.rows, "members": len(encoded)}
    log.info("encode_teacher %s: %d rows combined from %d members", stage_run.key, written.rows, len(encoded))
    return stage_run.publish()
