"""Corpus staging throughput against the pandas script a user would otherwise write.

Both read the vendored 88k-sentence TSV.gz, normalise (NFC, whitespace), drop empty lines and
duplicates, and write Parquet; ours also hashes ids, checks the contract, shards and writes the
manifest. Best of 3 runs each, sentences read per second.
"""

from __future__ import annotations

import csv
import tempfile
import time
from datetime import date
from pathlib import Path

import pandas as pd

from bench import CORPUS, REPO, results
from tasks.core import config, storage
from tasks.stages.stage_corpus import StageCorpusParams, run

REPEATS = 3


def _ours(workdir: Path, attempt: int) -> int:
    params = config.parse(
        StageCorpusParams,
        {
            "source": str(CORPUS),
            "column": "sentence",
            "ingest_date": date(2026, 1, 1),
            "store": storage.to_uri(str(workdir / f"ours-{attempt}")),
        },
    )
    return run(params).stats["rows_read"]


def _pandas(workdir: Path, attempt: int) -> int:
    frame = pd.read_csv(CORPUS, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
    text = frame["sentence"].str.normalize("NFC").str.split().str.join(" ")
    out = pd.DataFrame({"source": frame["source"], "text": text})
    out = out[out["text"] != ""].drop_duplicates("text")
    out.to_parquet(workdir / f"pandas-{attempt}.parquet", compression="zstd")
    return len(frame)


def _best_rate(fn, workdir: Path) -> tuple[float, list[float]]:
    times, rows = [], 0
    for attempt in range(REPEATS):
        start = time.perf_counter()
        rows = fn(workdir, attempt)
        times.append(time.perf_counter() - start)
    return rows / min(times), times


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ours, our_times = _best_rate(_ours, Path(tmp))
        baseline, baseline_times = _best_rate(_pandas, Path(tmp))
    return results.write(
        "stage_corpus",
        unit="sentences/s",
        ours=round(ours),
        baseline_name="pandas read_csv+normalise+drop_duplicates+to_parquet",
        baseline=round(baseline),
        higher_is_better=True,
        details={
            "corpus": str(CORPUS.relative_to(REPO)),
            "repeats": REPEATS,
            "ours_seconds": our_times,
            "baseline_seconds": baseline_times,
            "note": "ours also hashes ids, checks the data contract, shards and writes a manifest",
        },
    )


if __name__ == "__main__":
    print(main())
