"""A lever of ``bench/distill_quality``: targets from two teachers instead of one.

The teacher's embeddings (read, verified, from the store's encode_teacher shards) and the base student's
(all-MiniLM-L6-v2, 384-d, encoded here in bf16) are each L2-normalised and concatenated (1,152-d); a PCA-128
is fitted on them as fit-pca fits one (uncentered projection) and the projected rows written as hand-built
shard pairs under ``var/bench/two_teachers``; the distill stage's ``Trainer`` then trains the student on
them. The pipeline's stages take one teacher, so this lever runs beside them, not through them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tasks.core import catalog, datasets, manifest, storage
from tasks.core.catalog import Stage
from tasks.ml import models
from tasks.ml.projection import MomentAccumulator, Projection
from tasks.stages.distill.data import ShardPair

BF16 = "bf16"


def _teacher_shards(store: str) -> list[tuple[str, str, str, str]]:
    """(sentences URI and sha256, embeddings URI and sha256) of each encode_teacher output of the default teacher."""
    found = []
    for key in manifest.list_keys(store, Stage.ENCODE_TEACHER, catalog.teacher_key_prefix(models.DEFAULT_TEACHER)):
        published = manifest.read(store, Stage.ENCODE_TEACHER, key)
        for output in published.outputs if published else ():
            found.append((published.inputs[0].uri, published.inputs[0].sha256, output.uri, output.sha256))
    return found


def _both(embeddings: np.ndarray, student: np.ndarray) -> np.ndarray:
    unit = [x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12) for x in (embeddings, student)]
    return np.hstack(unit).astype(np.float32)


def shard_pairs(store: str, folder: Path, k: int = 128) -> tuple[list[ShardPair], Projection]:
    """The two-teacher targets' shard pairs under ``folder`` and their projection (written on first use)."""
    done = folder / "pairs.json"
    if not done.exists():
        _write(store, folder, k)
    pairs = [ShardPair(s, t, ("", ""), rows) for s, t, rows in json.loads(done.read_text())]
    return pairs, Projection.from_safetensors((folder / "projection.safetensors").read_bytes())


def _write(store: str, folder: Path, k: int) -> None:
    """Encode the base student, fit the projection and write the pairs, the projection and their list."""
    from tasks.ml.encoder import SentenceEncoder

    student = SentenceEncoder.load(models.DEFAULT_STUDENT)
    rows = []
    for sentences_uri, sentences_sha, embeddings_uri, embeddings_sha in _teacher_shards(store):
        staged = storage.read_parquet(sentences_uri, columns=["sentence_id", "text"], sha256=sentences_sha)
        teacher = storage.read_parquet(embeddings_uri, columns=["sentence_id", "embedding"], sha256=embeddings_sha)
        text_of = dict(zip(staged.column("sentence_id").to_pylist(), staged.column("text").to_pylist(), strict=True))
        ids = teacher.column("sentence_id").to_pylist()
        texts = [text_of[i] for i in ids]
        rows.append((ids, texts, datasets.vectors(teacher, "embedding"), student.encode(texts, dtype=BF16)))
    moments = MomentAccumulator(rows[0][2].shape[1] + rows[0][3].shape[1])
    for _, _, embeddings, pooled in rows:
        moments.add(_both(embeddings, pooled))
    projection = moments.fit(k, "uncentered")
    folder.mkdir(parents=True, exist_ok=True)
    pairs = []
    for number, (ids, texts, embeddings, pooled) in enumerate(rows):
        targets = projection.apply(_both(embeddings, pooled)).astype(np.float32)
        sentences_uri = storage.to_uri(str(folder / f"sentences-{number}.parquet"))
        targets_uri = storage.to_uri(str(folder / f"targets-{number}.parquet"))
        storage.write_parquet(sentences_uri, pa.table({"sentence_id": ids, "text": texts}))
        flat = pa.FixedSizeListArray.from_arrays(pa.array(targets.reshape(-1)), k)
        storage.write_parquet(targets_uri, pa.table({"sentence_id": ids, "target": flat}))
        pairs.append((sentences_uri, targets_uri, len(ids)))
    (folder / "projection.safetensors").write_bytes(projection.to_safetensors())
    (folder / "pairs.json").write_text(json.dumps(pairs))


def targets_encoder(projection: Projection) -> Any:
    """The two teachers' projected embedding of texts: what the student learns to reproduce."""
    from tasks.ml.encoder import SentenceEncoder

    teacher, student = SentenceEncoder.load(models.DEFAULT_TEACHER), SentenceEncoder.load(models.DEFAULT_STUDENT)
    return lambda texts: projection.apply(_both(teacher.encode(texts, dtype=BF16), student.encode(texts, dtype=BF16)))
