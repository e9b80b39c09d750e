"""The input's kept rows, held on local disk so that memory follows the batch size, not the input: the rows
as Arrow IPC files (one per batch, in input order), and their ids by bucket (the first hex digit of the id;
one Arrow IPC stream each, every id beside its row's position in the input). De-duplication then holds one
bucket at a time, and the mask of rows kept (a byte a row); the shards are read back in input order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from tasks.core.staged_ids import bucket_of
from tasks.stages.stage_corpus.normalise import SCHEMA

_ID_SCHEMA = pa.schema([("position", pa.int64()), ("sentence_id", pa.large_binary())])


class Spill:
    """Batches of rows (``normalise.SCHEMA``) and their ids by bucket, written to ``folder``."""

    def __init__(self, folder: Path) -> None:
        self._folder, self._files, self.rows = folder, list[Path](), 0
        self._names: set[str] = set()
        self._writers: dict[str, Any] = {}

    def add(self, rows: pl.DataFrame) -> None:
        """Spill ``rows`` (``normalise.SCHEMA``, and ``raw_id``: the bytes of each id)."""
        if not rows.height:
            return
        path = self._folder / f"{len(self._files):08d}.arrow"
        rows.select(list(SCHEMA)).write_ipc(path)
        self._files.append(path)
        positions = pl.int_range(self.rows, self.rows + rows.height, dtype=pl.Int64).alias("position")
        ids = rows.select(positions, sentence_id="raw_id", bucket=bucket_of(pl.col("sentence_id")))
        for (bucket,), part in ids.partition_by("bucket", as_dict=True, include_key=False).items():
            self._writer(str(bucket)).write_table(part.to_arrow().cast(_ID_SCHEMA))
        self.rows += rows.height

    def close(self) -> None:
        """Finish the bucket streams: after this, rows can no longer be added."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def buckets(self) -> Iterator[tuple[str, pl.DataFrame]]:
        """Each bucket holding rows, and its rows' ``position`` and ``sentence_id``, in input order."""
        for bucket in sorted(self._names):
            yield bucket, self.bucket(bucket)

    def bucket(self, name: str) -> pl.DataFrame:
        """The ``position`` and ``sentence_id`` (raw bytes) of the rows in bucket ``name``, in input order."""
        self.close()
        if name not in self._names:
            return pl.DataFrame(schema={"position": pl.Int64, "sentence_id": pl.Binary})
        with pa.OSFile(str(self._bucket_path(name))) as source:
            return pl.DataFrame(ipc.open_stream(source).read_all())

    def ids(self, bucket: str, keep: np.ndarray) -> pl.Series:
        """The ids in ``bucket`` of the rows ``keep`` (a mask over every row) selects."""
        frame = self.bucket(bucket)
        return frame.filter(pl.Series(keep[frame["position"].to_numpy()], dtype=pl.Boolean))["sentence_id"]

    def shards(self, keep: np.ndarray, shard_rows: int) -> Iterator[pl.DataFrame]:
        """The rows ``keep`` (a mask over every row, in order) selects, ``shard_rows`` at a time."""
        held, offset = pl.DataFrame(schema=SCHEMA), 0
        for path in self._files:
            rows = pl.read_ipc(path)
            held = pl.concat([held, rows.filter(pl.Series(keep[offset : offset + rows.height]))])
            offset += rows.height
            while held.height >= shard_rows:
                yield held.head(shard_rows)
                held = held.slice(shard_rows)
        if held.height:
            yield held

    def _writer(self, bucket: str) -> Any:
        if bucket not in self._writers:
            self._writers[bucket] = ipc.new_stream(str(self._bucket_path(bucket)), _ID_SCHEMA)
            self._names.add(bucket)
        return self._writers[bucket]

    def _bucket_path(self, bucket: str) -> Path:
        return self._folder / f"ids-{bucket}.arrows"
