"""Synthetic teacher embeddings published the way the encode_teacher stage publishes them."""

from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa

from tasks import datasets, manifest, models, storage


def correlated_embeddings(rows: int, dim: int, seed: int = 0, offset: float = 0.5, mixing_seed: int = 0) -> np.ndarray:
    """Rows with a decaying spectrum and a non-zero mean, like real sentence embeddings.

    Calls with the same ``mixing_seed`` draw from the same distribution, so data can be generated in blocks.
    """
    mixing = np.random.default_rng(mixing_seed).normal(size=(dim, dim)) * np.geomspace(1.0, 0.01, dim)[:, None]
    return (np.random.default_rng(seed).normal(size=(rows, dim)) @ mixing + offset).astype(np.float32)


def publish_teacher_shards(store: str, teacher: str, day: date, embeddings: np.ndarray, shard_rows: int,
                           first_shard: int = 0) -> list[str]:
    """Write ``embeddings`` as teacher shards ``first_shard``, ... of partition ``day``, each with its
    encode_teacher manifest."""
    dim, uris = embeddings.shape[1], []
    prefix = storage.join(store, "teacher", models.slug(teacher), f"ingest_date={day.isoformat()}")
    for index, start in enumerate(range(0, len(embeddings), shard_rows), start=first_shard):
        block = embeddings[start:start + shard_rows]
        ids = [f"{day:%Y%m%d}-{index}-{i}" for i in range(len(block))]
        table = pa.table({"sentence_id": ids,
                          "embedding": pa.FixedSizeListArray.from_arrays(pa.array(block.ravel()), dim)})
        shard = datasets.write_shard(prefix, f"sentences-part-{index:05d}", table, "teacher_embeddings",
                                     dim=dim, model_id=teacher)
        run = manifest.StageRun(stage="encode_teacher", key=f"{models.slug(teacher)}/ingest_date={day}/{index}",
                                store=store, params={"synthetic": True},
                                inputs=[{"uri": shard.uri, "sha256": shard.sha256, "rows": shard.rows}])
        run.add_shard(shard)
        run.publish()
        uris.append(shard.uri)
    return uris
