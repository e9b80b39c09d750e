"""The input's kept rows, held on local disk (Arrow IPC files, one per batch, in input order) so that memory
follows the batch size, not the input; read back as the ids column and as shards of the rows kept."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

from tasks.stages.stage_corpus.normalise import SCHEMA


class Spill:
    """Batches of rows (``normalise.SCHEMA``) written to ``folder``."""

    def __init__(self, folder: Path) -> None:
        self._folder, self._files = folder, list[Path]()

    def add(self, rows: pl.DataFrame) -> None:
        if rows.height:
            path = self._folder / f"{len(self._files):08d}.arrow"
            rows.write_ipc(path)
            self._files.append(path)

    def ids(self) -> pl.Series:
        """Every row's sentence id, in input order."""
        if not self._files:
            return pl.Series("sentence_id", [], pl.String)
        return pl.scan_ipc(self._files).select("sentence_id").collect().to_series()

    def shards(self, keep: pl.Series, shard_rows: int) -> Iterator[pl.DataFrame]:
        """The rows ``keep`` (a mask over every row, in order) selects, ``shard_rows`` at a time."""
        held, offset = pl.DataFrame(schema=SCHEMA), 0
        for path in self._files:
            rows = pl.read_ipc(path)
            held = pl.concat([held, rows.filter(keep.slice(offset, rows.height))])
            offset += rows.height
            while held.height >= shard_rows:
                yield held.head(shard_rows)
                held = held.slice(shard_rows)
        if held.height:
            yield held
