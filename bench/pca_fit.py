"""Streaming PCA fit against scikit-learn's in-memory PCA on the same teacher shards.

Synthetic 768-d embeddings (decaying spectrum, non-zero mean) in 10k-row shards, k=128. Each fit
runs in a fresh process; peak memory is that process's max RSS. Ours streams shard by shard; the
baseline loads every shard into one array and calls ``PCA(128).fit``, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from tests.synthetic import correlated_embeddings, publish_teacher_shards

from bench import results
from tasks.core import storage

DIM, K, SHARD_ROWS = 768, 128, 10_000
ROW_COUNTS = (20_000, 200_000)
TEACHER = "synthetic-768"



def _child(store: str, which: str) -> None:
    """One fit in this (fresh) process; prints its time and peak RSS as JSON."""
    import resource
    import time

    if which == "ours":
        from tasks.core import config
        from tasks.stages import fit_pca

        params = config.parse(fit_pca.FitPCAParams, {"store": store, "teacher": TEACHER, "k": K,
                                                     "write_targets": False})
        start = time.perf_counter()
        fit_pca.run(params, force=True)
    else:
        import pyarrow as pa
        from sklearn.decomposition import PCA

        start = time.perf_counter()
        uris = [u for u in storage.list_uris(f"{store}/teacher") if u.endswith(".parquet")]
        table = pa.concat_tables([storage.read_parquet(u) for u in uris])
        PCA(n_components=K).fit(table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, DIM))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _measure(store: str, which: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.pca_fit", "--child", store, which], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> dict:
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rows in ROW_COUNTS:
            store = storage.to_uri(f"{tmp}/{rows}")
            for shard in range(rows // SHARD_ROWS):
                block = correlated_embeddings(SHARD_ROWS, DIM, seed=shard)
                publish_teacher_shards(store, TEACHER, date(2026, 1, 1), block, SHARD_ROWS, first_shard=shard)
            measured[rows] = {"ours": _measure(store, "ours"), "sklearn": _measure(store, "sklearn")}
    big = measured[ROW_COUNTS[-1]]
    return results.write(
        "pca_fit", unit="MB peak RSS", ours=round(big["ours"]["peak_mb"]),
        baseline_name="scikit-learn PCA(128).fit on all rows in memory", baseline=round(big["sklearn"]["peak_mb"]),
        higher_is_better=False,
        details={"dim": DIM, "k": K, "shard_rows": SHARD_ROWS, "rows_of_headline": ROW_COUNTS[-1],
                 "by_rows": {str(r): m for r, m in measured.items()},
                 "ours_peak_growth_mb_20k_to_200k": round(measured[ROW_COUNTS[-1]]["ours"]["peak_mb"]
                                                         - measured[ROW_COUNTS[0]]["ours"]["peak_mb"], 1),
                 "note": "each fit in a fresh process; peak = max RSS including the interpreter and imports"})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(*sys.argv[2:4])
    else:
        print(main())
