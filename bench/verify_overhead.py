"""Verified reads against unverified reads of the real read path: ``storage.read_parquet`` of published
shards with and without the sha256 their manifest records.

Data: the vendored 88k-sentence corpus staged by the stage-corpus stage into 20k-row ``sentences``
shards, read as encode-teacher reads them (``sentence_id``, ``text``), and 768-d teacher-like shards of
the same rows (random unit vectors, float32, published as ``teacher_embeddings`` shards), read as fit-pca
reads them (``sentence_id``, ``embedding``). Same files, same process, page cache warm: every repeat reads
every shard of a kind both ways, which way goes first alternating per repeat so drift (other load,
allocator) cancels. A pass reads every shard of a kind once; the median pass per kind and mode gives MB/s (Parquet
bytes) and rows/s. The headline is both kinds together (one pass of each, as the two stages read them);
each kind on its own, and the bare sha256 rate on the same bytes, are in ``details``.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
import time
from datetime import date

import numpy as np
import pyarrow as pa

from bench import CORPUS, REPO, results
from tasks.core import catalog, config, datasets, manifest, storage
from tasks.core.catalog import Dataset, Stage
from tasks.stages.stage_corpus import StageCorpusParams, run

REPEATS = {"sentences": 31, "teacher_embeddings": 9}  # passes per mode; a sentences pass is ~30x cheaper
SHARD_ROWS = 20_000
DIM = 768
DAY = date(2026, 1, 1)
TEACHER = "teacher-like"
MODES = ("verified", "unverified")
COLUMNS = {"sentences": ["sentence_id", "text"], "teacher_embeddings": ["sentence_id", "embedding"]}
Record = manifest.Output | datasets.Shard


def _staged(store: str) -> list[manifest.Output]:
    params = config.parse(
        StageCorpusParams,
        {"source": str(CORPUS), "column": "sentence", "ingest_date": DAY, "store": store, "shard_rows": SHARD_ROWS},
    )
    run(params)
    published = manifest.read(store, Stage.STAGE_CORPUS, catalog.partition_key(DAY))
    assert published is not None
    return list(published.outputs)


def _teacher_like(store: str, staged: list[manifest.Output]) -> list[datasets.Shard]:
    """A teacher-embeddings shard per staged shard: its sentence ids with random unit vectors."""
    rng, shards = np.random.default_rng(0), []
    for shard in staged:
        ids = storage.read_parquet(shard.uri, columns=["sentence_id"], sha256=shard.sha256).column("sentence_id")
        vectors = rng.standard_normal((len(ids), DIM), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        table = pa.table(
            {"sentence_id": ids, "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}
        )
        prefix = catalog.teacher_prefix(store, TEACHER, DAY)
        stem = catalog.derived_stem(shard.uri)
        shards.append(datasets.write_shard(prefix, stem, table, Dataset.TEACHER_EMBEDDINGS, dim=DIM, model_id=TEACHER))
    return shards


def _pass(shards: list[Record], columns: list[str], verified: bool) -> float:
    """Seconds to read every shard once, with or without its recorded sha256."""
    start = time.perf_counter()
    for shard in shards:
        storage.read_parquet(shard.uri, columns=columns, sha256=shard.sha256 if verified else None)
    return time.perf_counter() - start


def _hash_rate(shards: list[Record]) -> float:
    """MB/s of hashlib's sha256 alone over the shards' bytes (in memory), best of 3: the check's floor."""
    bodies = [storage.read_bytes(s.uri) for s in shards]
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        for body in bodies:
            hashlib.sha256(body).hexdigest()
        seconds.append(time.perf_counter() - start)
    return sum(map(len, bodies)) / min(seconds) / 1e6


def _measure(kinds: dict[str, list[Record]]) -> dict[tuple[str, bool], list[float]]:
    """Pass times per (kind, verified), interleaved: the mode that goes first alternates per repeat."""
    times: dict[tuple[str, bool], list[float]] = {(k, v): [] for k in kinds for v in (True, False)}
    for kind, shards in kinds.items():  # warm-up: page cache, allocator, imports
        _pass(shards, COLUMNS[kind], True)
        _pass(shards, COLUMNS[kind], False)
    for kind, shards in kinds.items():
        for repeat in range(REPEATS[kind]):
            for verified in (True, False) if repeat % 2 == 0 else (False, True):
                times[kind, verified].append(_pass(shards, COLUMNS[kind], verified))
    return times


def _rates(shards: list[Record], seconds: float) -> dict[str, float]:
    megabytes = sum(s.bytes for s in shards) / 1e6
    rows = sum(s.rows or 0 for s in shards)
    return {
        "seconds": round(seconds, 5),
        "mb_per_s": round(megabytes / seconds, 1),
        "rows_per_s": round(rows / seconds),
    }


def _summary(kinds: dict[str, list[Record]], times: dict[tuple[str, bool], list[float]]) -> dict:
    by_kind = {}
    for kind, shards in kinds.items():
        verified = _rates(shards, statistics.median(times[kind, True]))
        unverified = _rates(shards, statistics.median(times[kind, False]))
        by_kind[kind] = {
            "shards": len(shards),
            "rows": sum(s.rows or 0 for s in shards),
            "mb": round(sum(s.bytes for s in shards) / 1e6, 2),
            "columns": COLUMNS[kind],
            "verified": verified,
            "unverified": unverified,
            "ratio": round(verified["mb_per_s"] / unverified["mb_per_s"], 3),
            "sha256_alone_mb_per_s": round(_hash_rate(shards), 1),
            "pass_seconds": {mode: [round(t, 5) for t in times[kind, mode == "verified"]] for mode in MODES},
        }
    return by_kind


def main() -> dict:
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        store = storage.to_uri(tmp)
        staged = _staged(store)
        kinds: dict[str, list[Record]] = {"sentences": list(staged), "teacher_embeddings": _teacher_like(store, staged)}
        times = _measure(kinds)
        by_kind = _summary(kinds, times)
    megabytes = sum(k["mb"] for k in by_kind.values())
    both = {mode: sum(k[mode]["seconds"] for k in by_kind.values()) for mode in MODES}
    return results.write(
        "verify_overhead",
        unit="MB/s",
        ours=round(megabytes / both["verified"], 1),
        baseline_name="the same read_parquet unverified (sentences + 768-d teacher-like shards; per kind in details)",
        baseline=round(megabytes / both["unverified"], 1),
        higher_is_better=True,
        details={
            "corpus": str(CORPUS.relative_to(REPO)),
            "load_average_at_start": [round(x, 2) for x in load],
            "repeats": REPEATS,
            "shard_rows": SHARD_ROWS,
            "headline": "one pass over the sentences shards and one over the teacher-like shards, median pass per kind",
            "rows_per_s": {mode: round(sum(k["rows"] for k in by_kind.values()) / s) for mode, s in both.items()},
            "by_kind": by_kind,
            "note": "teacher-like shards hold random unit vectors, not a real teacher's; page cache warm",
        },
    )


if __name__ == "__main__":
    print(main())
