"""The staging spill: rows back in input order, ids by bucket with their input positions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.core import sentences
from tasks.stages.stage_corpus.normalise import SCHEMA
from tasks.stages.stage_corpus.spill import Spill


def _rows(texts: list[str], first_line: int) -> pl.DataFrame:
    ids = [sentences.sentence_id(t) for t in texts]
    rows = pl.DataFrame(
        {
            "sentence_id": ids,
            "text": texts,
            "source": "file:///corpus.txt",
            "line": range(first_line, first_line + len(texts)),
        },
        schema=SCHEMA,
    )
    return rows.with_columns(raw_id=pl.Series([bytes.fromhex(i) for i in ids], dtype=pl.Binary))


def _spill(tmp_path: Path, batches: list[list[str]]) -> Spill:
    spill, line = Spill(tmp_path), 1
    for texts in batches:
        spill.add(_rows(texts, line))
        line += len(texts)
    return spill


TEXTS = [f"sentence number {i}" for i in range(200)]


def test_buckets_hold_every_raw_id_once_by_first_hex_digit_with_its_input_position(tmp_path: Path) -> None:
    spill = _spill(tmp_path, [TEXTS[:120], [], TEXTS[120:]])
    found = {bucket: ids for bucket, ids in spill.buckets()}
    assert spill.rows == 200
    assert len(found) > 1
    for bucket, ids in found.items():
        assert ids["sentence_id"].bin.encode("hex").str.starts_with(bucket).all()
        assert ids["position"].is_sorted()
    every = pl.concat(found.values()).sort("position")
    assert every["position"].to_list() == list(range(200))
    assert [raw.hex() for raw in every["sentence_id"]] == [sentences.sentence_id(t) for t in TEXTS]


def test_shards_and_ids_follow_the_mask_in_input_order(tmp_path: Path) -> None:
    spill = _spill(tmp_path, [TEXTS[:70], TEXTS[70:150], TEXTS[150:]])
    keep = np.arange(200) % 3 != 0
    shards = list(spill.shards(keep, shard_rows=50))
    assert [s.height for s in shards] == [50, 50, 33]
    kept = [t for t, k in zip(TEXTS, keep, strict=True) if k]
    assert pl.concat(shards)["text"].to_list() == kept
    assert pl.concat(shards)["line"].to_list() == [i + 1 for i in range(200) if keep[i]]
    ids = pl.concat([spill.ids(bucket, keep) for bucket in "0123456789abcdef"])
    assert sorted(raw.hex() for raw in ids) == sorted(sentences.sentence_id(t) for t in kept)


def test_an_empty_spill_has_no_buckets_and_no_shards(tmp_path: Path) -> None:
    spill = _spill(tmp_path, [[]])
    assert spill.rows == 0
    assert list(spill.buckets()) == []
    assert list(spill.shards(np.zeros(0, dtype=bool), shard_rows=10)) == []
