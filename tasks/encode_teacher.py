"""Encode teacher: each ``sentences`` shard of a partition -> one ``teacher_embeddings`` shard.

Shards are independent units, each with its own manifest
(``manifests/encode_teacher/<teacher>/ingest_date=D/<shard>.json``): a shard whose manifest
matches is skipped, so a killed run resumes where it stopped, and Airflow can fan out one mapped
task per group of shards (:func:`tasks.sentences.shards` lists them, ``shards`` selects a group). Memory is
bounded by one shard. Non-finite embeddings fail the shard, naming it; nothing is published for it.
"""

from __future__ import annotations

from datetime import date
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field
from tqdm import tqdm

from tasks import datasets, manifest, models, sentences, storage
from tasks.config import StageParams

STAGE = "encode_teacher"
DATASET = "teacher_embeddings"


class EncodeError(ValueError):
    """A shard that cannot be encoded; the message names it."""


class EncodeTeacherParams(StageParams):
    ingest_date: date = Field(description="the sentences partition to encode")
    teacher: str = Field(models.DEFAULT_TEACHER, description="packaged model, local folder or cached hub id")
    dtype: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="compute dtype (autocast)")
    output_dtype: Literal["float32", "float16"] = Field("float32", description="stored embedding type")
    batch_size: int = Field(64, gt=0)
    threads: int | None = Field(None, gt=0, description="torch intra-op threads (default: torch's)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_seq_length: int | None = Field(None, gt=0, description="default: the model's own")
    shards: list[int] | None = Field(None, description="encode only these input shard positions")


def encoded(store: str, teacher: str, ingest_date: date,
            stages: tuple[str, ...] = sentences.WRITER_STAGES) -> list[tuple[str, dict | None]]:
    """Each current sentences shard of a partition (as ``stages`` published it) with the manifest of its
    teacher embeddings, or None where it is not encoded yet."""
    return [(uri, manifest.read(store, STAGE, datasets.teacher_shard_key(teacher, ingest_date, uri)))
            for uri in sentences.shards(store, ingest_date, stages)]


def output_shards(store: str, teacher: str, ingest_date: date) -> list[str]:
    """Published teacher-embedding shards of a partition, one per current sentences shard that is encoded."""
    return [o["uri"] for _, published in encoded(store, teacher, ingest_date) if published
            for o in published["outputs"]]


def run(params: EncodeTeacherParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Encode every (selected) sentences shard of the partition that is not done yet."""
    shards = sentences.published(params.store, params.ingest_date)
    if manifest.read(params.store, "stage_corpus", sentences.partition_key(params.ingest_date)) is None:
        raise EncodeError(f"{params.store}: no sentences staged for ingest_date={params.ingest_date}")
    selected = params.shards if params.shards is not None else range(len(shards))
    unknown = [i for i in selected if not 0 <= i < len(shards)]
    if unknown:
        raise EncodeError(f"shards {unknown} out of range: the partition has {len(shards)} shard(s)")
    encoder = None
    done, encoded = [], 0
    for position in tqdm(selected, desc=f"encode_teacher {params.ingest_date}", unit=" shard",
                         disable=not progress):
        shard_uri = shards[position]["uri"]
        stage_run = _shard_run(params, shards[position])
        if not force and (published := stage_run.completed()) is not None:
            done.append(published)
            continue
        if encoder is None:
            encoder = _load_encoder(params)
        done.append(_encode_shard(params, encoder, stage_run, shard_uri))
        encoded += 1
    summary = {"stats": {"shards": len(done), "encoded": encoded, "skipped": len(done) - encoded,
                         "rows": sum(o["rows"] for m in done for o in m["outputs"])},
               "outputs": [o for m in done for o in m["outputs"]]}
    manifests = storage.join(params.store, "manifests", STAGE, datasets.teacher_partition(params.teacher,
                                                                                           params.ingest_date))
    return manifest.StageResult(manifests, skipped=encoded == 0, manifest=summary)


def _shard_run(params: EncodeTeacherParams, shard: dict) -> manifest.StageRun:
    """The run encoding one sentences shard; its input checksum comes from the writing stage's manifest."""
    identity = params.model_dump(mode="json", exclude={"shards", "threads", "device", "batch_size"})
    return manifest.StageRun(
        stage=STAGE, key=datasets.teacher_shard_key(params.teacher, params.ingest_date, shard["uri"]),
        store=params.store, params=identity,
        inputs=[{"uri": shard["uri"], "sha256": shard["sha256"], "rows": shard["rows"], "bytes": shard["bytes"]}],
    )


def _load_encoder(params: EncodeTeacherParams):
    import torch

    from tasks.encoder import SentenceEncoder

    if params.threads:
        torch.set_num_threads(params.threads)
    device = params.device if params.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    return SentenceEncoder.load(params.teacher, device=device, max_seq_length=params.max_seq_length)


def _encode_shard(params: EncodeTeacherParams, encoder, stage_run: manifest.StageRun, shard_uri: str) -> dict:
    with stage_run.phase("read"):
        sentences = storage.read_parquet(shard_uri, columns=["sentence_id", "text"])
    with stage_run.phase("encode"):
        embeddings = encoder.encode(sentences.column("text").to_pylist(), batch_size=params.batch_size,
                                    dtype=params.dtype)
    bad = ~np.isfinite(embeddings).all(axis=1)
    if bad.any():
        first = sentences.column("sentence_id")[int(np.flatnonzero(bad)[0])].as_py()
        raise EncodeError(f"{shard_uri}: {int(bad.sum())} sentence(s) got NaN or infinite embeddings "
                          f"(first: {first}); nothing published for this shard")
    value_type = pa.float16() if params.output_dtype == "float16" else pa.float32()
    flat = pa.array(embeddings.astype(params.output_dtype).ravel(), value_type)
    table = pa.table({"sentence_id": sentences.column("sentence_id"),
                      "embedding": pa.FixedSizeListArray.from_arrays(flat, encoder.dim)})
    prefix = storage.join(params.store, "teacher", models.slug(params.teacher),
                          f"ingest_date={params.ingest_date.isoformat()}")
    with stage_run.phase("write"):
        shard = datasets.write_shard(prefix, datasets.derived_stem(shard_uri), table, DATASET, dim=encoder.dim,
                                     model_id=params.teacher, value_type=params.output_dtype)
    stage_run.add_shard(shard)
    stage_run.stats = {"rows": shard.rows, "sentences_per_s": round(shard.rows / max(
        stage_run.timings_s["encode"], 1e-9), 2)}
    return stage_run.publish()
