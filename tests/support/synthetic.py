"""Synthetic teacher embeddings published the way the encode_teacher stage publishes them."""

from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa

from tasks.core import catalog, manifest, parquet_shards, sentences
from tasks.core.catalog import Stage


def correlated_embeddings(rows: int, dim: int, seed: int = 0, offset: float = 0.5, mixing_seed: int = 0) -> np.ndarray:
    """Rows with a decaying spectrum and a non-zero mean, like real sentence embeddings.

    Calls with the same ``mixing_seed`` draw from the same distribution, so data can be generated in blocks.
    """
    mixing = np.random.default_rng(mixing_seed).normal(size=(dim, dim)) * np.geomspace(1.0, 0.01, dim)[:, None]
    return (np.random.default_rng(seed).normal(size=(rows, dim)) @ mixing + offset).astype(np.float32)


def publish_teacher_shards(
    store: str, teacher: str, day: date, embeddings: np.ndarray, shard_rows: int, first_shard: int = 0
) -> list[str]:
    """Write ``embeddings`` as teacher shards ``first_shard``, ... of partition ``day`` the way the stages
    do: a sentences shard each (added to the partition's stage_corpus manifest) and its teacher shard
    with an encode_teacher manifest."""
    dim, uris = embeddings.shape[1], []
    sentences_prefix = catalog.sentences_prefix(store, Stage.STAGE_CORPUS, day)
    teacher_prefix = catalog.teacher_prefix(store, teacher, day)
    staged = manifest.StageRun(
        stage=Stage.STAGE_CORPUS,
        key=catalog.partition_key(day),
        store=store,
        params={"synthetic": first_shard},
        inputs=[],
    )
    previous = staged.previous()
    staged.outputs = list(previous.outputs) if previous else []
    for index, start in enumerate(range(0, len(embeddings), shard_rows), start=first_shard):
        block = embeddings[start : start + shard_rows]
        texts = [f"synthetic sentence {day:%Y%m%d}-{index}-{i}" for i in range(len(block))]
        ids = [sentences.sentence_id(t) for t in texts]
        source = parquet_shards.write_shard(
            sentences_prefix,
            f"part-{index:05d}",
            sentences.table(
                {"sentence_id": ids, "text": texts, "source": ["synthetic"] * len(ids), "line": list(range(len(ids)))},
                day,
            ),
            "sentences",
        )
        staged.add_shard(source)
        table = pa.table(
            {"sentence_id": ids, "embedding": pa.FixedSizeListArray.from_arrays(pa.array(block.ravel()), dim)}
        )
        shard = parquet_shards.write_shard(
            teacher_prefix, catalog.derived_stem(source.uri), table, "teacher_embeddings", dim=dim, model_id=teacher
        )
        run = manifest.StageRun(
            stage=Stage.ENCODE_TEACHER,
            key=catalog.teacher_shard_key(teacher, day, source.uri),
            store=store,
            params={"synthetic": True},
            inputs=[manifest.Input(source.uri, source.sha256, source.rows)],
        )
        run.add_shard(shard)
        run.publish()
        uris.append(shard.uri)
    staged.publish()
    return uris
