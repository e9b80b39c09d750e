"""The ``sentences`` dataset's shared ground: normalisation, sentence ids, rows, published shards.

Both the corpus staging and the augmentation stage write this dataset; every other stage reads it
through the shard lists in those stages' manifests.
"""

from __future__ import annotations

import hashlib
import unicodedata
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks import contracts, datasets, manifest, storage

DATASET = "sentences"
WRITER_STAGES = ("stage_corpus", "augment")
COLUMNS = ("sentence_id", "text", "source", "line", "parent_id", "aug_method", "aug_params")


def normalise(text: str) -> str:
    """Unicode NFC with whitespace runs collapsed to one space and the ends stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def sentence_id(text: str) -> str:
    """Stable content hash of a normalised sentence: blake2b-128, hex. Part of the data contract."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def hashed_below(sentence_ids: list[str], fraction: float, salt: str) -> np.ndarray:
    """Rows whose seeded hash of the sentence id falls below ``fraction``: a uniform, deterministic,
    order-free selection (samples, validation splits)."""
    if fraction >= 1.0:
        return np.ones(len(sentence_ids), dtype=bool)
    scale = float(1 << 64)
    return np.array([int.from_bytes(hashlib.blake2b(f"{salt}:{sid}".encode(), digest_size=8).digest(), "big")
                     / scale < fraction for sid in sentence_ids], dtype=bool)


def partition_key(ingest_date: date) -> str:
    return f"ingest_date={ingest_date.isoformat()}"


def table(rows: dict[str, list], ingest_date: date) -> pa.Table:
    """A contract-checked ``sentences`` table from column lists (lineage columns may be absent)."""
    n = len(rows["sentence_id"])
    columns = {
        "sentence_id": pa.array(rows["sentence_id"], pa.string()),
        "text": pa.array(rows["text"], pa.string()),
        "source": pa.array(rows["source"], pa.string()),
        "line": pa.array(rows["line"], pa.int64()),
        "ingest_date": pa.array([ingest_date] * n, pa.date32()),
    }
    for name in ("parent_id", "aug_method", "aug_params"):
        columns[name] = pa.array(rows[name], pa.string()) if name in rows else pa.nulls(n, pa.string())
    return contracts.load(DATASET).conform(pa.table(columns))


def publish_partition(stage_run: manifest.StageRun, prefix: str, table: pa.Table, shard_rows: int,
                      previous_outputs: set[str]) -> dict:
    """Write ``table`` as content-addressed shards under ``prefix``, publish the run's manifest, then delete
    the shards of the manifest it replaces that it no longer lists. Returns the published manifest."""
    with stage_run.phase("write_shards"):
        for index, start in enumerate(range(0, table.num_rows, shard_rows)):
            stage_run.add_shard(datasets.write_shard(prefix, f"part-{index:05d}", table.slice(start, shard_rows),
                                                     DATASET))
    published = stage_run.publish()
    for stale in previous_outputs - {o["uri"] for o in published["outputs"]}:
        storage.delete(stale)
    return published


def staged_days(store: str) -> list[date]:
    """Every partition the corpus staging has published, in date order."""
    return [date.fromisoformat(key.removeprefix("ingest_date=")) for key in manifest.list_keys(store, "stage_corpus")]


def published(store: str, ingest_date: date, stages: tuple[str, ...] = WRITER_STAGES) -> list[dict]:
    """A partition's published shards as the writing stages' manifests record them (uri, sha256, rows, ...)."""
    key = partition_key(ingest_date)
    return [o for stage in stages for o in (manifest.read(store, stage, key) or {}).get("outputs", [])]


def shards(store: str, ingest_date: date, stages: tuple[str, ...] = WRITER_STAGES) -> list[str]:
    """URIs of a partition's published shards."""
    return [o["uri"] for o in published(store, ingest_date, stages)]


def already_staged(store: str, candidate_ids: list[str], exclude_key: str | None = None,
                   stages: tuple[str, ...] = ("stage_corpus",)) -> set[str]:
    """Which of ``candidate_ids`` a partition published by ``stages`` (except ``exclude_key``'s) holds.
    One shard's id column at a time is matched against the candidates, so memory follows the candidates,
    not the size of the store."""
    if not candidate_ids:
        return set()
    candidates = pa.array(candidate_ids, pa.string())
    found: set[str] = set()
    for stage in stages:
        for key in manifest.list_keys(store, stage):
            if key == exclude_key:
                continue
            for output in (manifest.read(store, stage, key) or {"outputs": []})["outputs"]:
                ids = storage.read_parquet(output["uri"], columns=["sentence_id"]).column("sentence_id")
                found.update(pc.filter(ids, pc.is_in(ids, value_set=candidates)).to_pylist())
    return found
