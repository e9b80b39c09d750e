"""Peak memory of the PCA stage's streaming fit against scikit-learn's in-memory PCA, on the same shards.

Synthetic 768-d embeddings (decaying spectrum, fixed random rotation, non-zero mean) written with
pyarrow as plain Parquet shards of 10k rows (``sentence_id`` string + ``embedding``
FixedSizeList<float32>[768], the layout the stage reads), at 20k and 200k rows; k=128. Each fit
runs in a fresh process; peak memory is that process's max RSS. Ours: the fit-pca stage's own
computation over the shard URIs, ``fit_pca.accumulate`` (shard by shard, chunk by chunk, O(D²)
moments) then ``accumulator.fit(128, "uncentered")`` -- no store, manifests or target writing. The
baseline reads the ``embedding`` column of every shard into one array and calls
``PCA(128).fit``, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import results

DIM, K, SHARD_ROWS = 768, 128, 10_000
ROW_COUNTS = (20_000, 200_000)


def _embeddings(rows: int, seed: int) -> np.ndarray:
    """Correlated rows: independent normals scaled by a decaying spectrum, rotated by a fixed random
    orthogonal basis and offset by a fixed mean (the same distribution for every ``seed``)."""
    fixed = np.random.default_rng(12345)
    basis, _ = np.linalg.qr(fixed.normal(size=(DIM, DIM)))
    mean = fixed.normal(0.0, 0.3, DIM)
    spectrum = np.exp(-np.arange(DIM) / 60.0)
    latent = np.random.default_rng(seed).normal(size=(rows, DIM)) * spectrum
    return (latent @ basis.T + mean).astype(np.float32)


def _write_shards(folder: Path, rows: int) -> None:
    folder.mkdir(parents=True)
    for shard in range(rows // SHARD_ROWS):
        block = _embeddings(SHARD_ROWS, seed=shard)
        ids = pa.array([f"s{shard:04d}-{i:05d}" for i in range(SHARD_ROWS)], pa.string())
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(block.ravel(), pa.float32()), DIM)
        pq.write_table(
            pa.table({"sentence_id": ids, "embedding": embedding}),
            folder / f"part-{shard:05d}.parquet",
            compression="zstd",
        )


def _child(folder: str, which: str) -> None:
    """One fit in this (fresh) process; prints its time, peak RSS and explained-variance sum as JSON."""
    import resource
    import time

    from tasks.core import storage

    uris = [storage.to_uri(str(p)) for p in sorted(Path(folder).glob("*.parquet"))]
    if which == "ours":
        from tasks.stages import fit_pca

        start = time.perf_counter()
        projection = fit_pca.accumulate(uris, 1.0, 0, False).fit(K, "uncentered")
        ratio_sum = float(projection.explained_variance_ratio.sum())
    else:
        from sklearn.decomposition import PCA

        start = time.perf_counter()
        table = pa.concat_tables([storage.read_parquet(u, columns=["embedding"]) for u in uris])
        pca = PCA(n_components=K).fit(table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, DIM))
        ratio_sum = float(pca.explained_variance_ratio_.sum())
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "explained_variance_ratio_sum": round(ratio_sum, 6),
            }
        )
    )


def _measure(folder: Path, which: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.pca_fit", "--child", str(folder), which],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> dict:
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rows in ROW_COUNTS:
            folder = Path(tmp) / str(rows)
            _write_shards(folder, rows)
            measured[rows] = {"ours": _measure(folder, "ours"), "sklearn": _measure(folder, "sklearn")}
    big = measured[ROW_COUNTS[-1]]
    return results.write(
        "pca_fit",
        unit="MB peak RSS",
        ours=round(big["ours"]["peak_mb"]),
        baseline_name="scikit-learn PCA(128).fit on all rows read into memory",
        baseline=round(big["sklearn"]["peak_mb"]),
        higher_is_better=False,
        details={
            "dim": DIM,
            "k": K,
            "shard_rows": SHARD_ROWS,
            "rows_of_headline": ROW_COUNTS[-1],
            "data": "synthetic correlated float32 embeddings in plain Parquet shards "
            "(sentence_id, embedding FixedSizeList<float32>[768])",
            "ours": "tasks.stages.fit_pca.accumulate over the shard URIs (all rows) + "
            "MomentAccumulator.fit(128, 'uncentered'); no store or manifests, no targets written",
            "baseline": "embedding column of every shard concatenated into one float32 array + "
            "sklearn.decomposition.PCA(n_components=128).fit",
            "by_rows": {str(r): m for r, m in measured.items()},
            "ours_peak_growth_mb_20k_to_200k": round(
                measured[ROW_COUNTS[-1]]["ours"]["peak_mb"] - measured[ROW_COUNTS[0]]["ours"]["peak_mb"], 1
            ),
            "note": "each fit in a fresh process; peak = max RSS including the interpreter and imports; "
            "timings include reading the shards",
        },
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(*sys.argv[2:4])
    else:
        print(main())
