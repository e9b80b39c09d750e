"""Corpus staging's readers past their first chunk: what the line-at-a-time reader would say, said from
wherever in a large source the problem is, and the csv module's reading of TSV kept."""

import csv
import gzip
from datetime import date

import pytest

from tasks.core import config, storage
from tasks.core.sentences import shards as partition_shards
from tasks.stages.stage_corpus import CorpusInputError, StageCorpusParams, run

DAY = date(2026, 11, 1)
BIG = 30_000  # lines of about 40 bytes: past the 1 MiB chunk


def _run(store, path, **extra):
    return run(config.parse(StageCorpusParams, {"store": store, "source": str(path), "ingest_date": DAY, **extra}))


def _rows(store):
    return [row for uri in partition_shards(store, DAY) for row in storage.read_parquet(uri).to_pylist()]


def _lines(n):
    return [f"sentence number {i:06d} of a big source" for i in range(n)]


@pytest.fixture
def store(tmp_path):
    return storage.to_uri(str(tmp_path / "store"))


@pytest.mark.parametrize("name", ["big.txt", "big.txt.gz"])
def test_bad_utf8_far_into_a_source_names_its_line_and_byte(store, tmp_path, name):
    lines = _lines(BIG)
    body = ("\n".join(lines[: BIG - 5]) + "\n").encode()
    data = "\ufeff".encode() + body + b"bad \xff byte\n" + "\n".join(lines[BIG - 4 :]).encode()
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    offset = len("\ufeff".encode() + body) + 4
    with pytest.raises(CorpusInputError, match=rf"not valid UTF-8 at line {BIG - 4} \(byte {offset}\)"):
        _run(store, tmp_path / name)
    assert storage.list_uris(store) == []


def test_an_over_long_line_far_into_a_source_is_measured_whole(store, tmp_path):
    lines = _lines(BIG)
    lines[BIG - 10] = "é" * 3_000_000  # longer than the chunk, and than the read limit
    (tmp_path / "big.txt").write_text("\n".join(lines))
    with pytest.raises(
        CorpusInputError, match=rf"line {BIG - 9} holds 3000000 characters, more than max_line_chars=1000"
    ):
        _run(store, tmp_path / "big.txt", max_line_chars=1000)


def test_a_big_text_source_keeps_every_line_number(store, tmp_path):
    lines = _lines(BIG)
    lines[20_000] = "  "  # blank, dropped; its number is not reused
    (tmp_path / "big.txt").write_bytes(("\n".join(lines) + "\r\n").encode())
    result = _run(store, tmp_path / "big.txt", batch_rows=7_000)
    rows = _rows(store)
    assert result.stats["rows_read"] == BIG and result.stats["dropped"]["empty"] == 1
    assert [r["line"] for r in rows] == [i + 1 for i in range(BIG) if i != 20_000]
    assert rows[-1]["text"] == lines[-1]


def test_tsv_reads_as_the_csv_module_reads_it(store, tmp_path):
    body = ["id\tsentence\tnote"] + [f"{i}\t{text}\tx" for i, text in enumerate(_lines(BIG))]
    body[100] = '100\tsay "hi" \x00 there\tquoted'  # bare quotes and a NUL: no quoting in TSV
    body[BIG - 3] = "\r"  # an empty line (with its carriage return), skipped
    body[BIG - 2] = "7\tcarriage\rreturn\tx"  # the csv module refuses a carriage return inside a field
    (tmp_path / "big.tsv").write_text("\n".join(body))
    with pytest.raises(CorpusInputError, match=rf"malformed at line {BIG - 1} \(new-line character seen"):
        _run(store, tmp_path / "big.tsv", column="sentence")
    expected = list(csv.reader(body[: BIG - 2], delimiter="\t", quoting=csv.QUOTE_NONE))
    result = _run(store, tmp_path / "big.tsv", column="sentence", limit=BIG - 4)  # stops before the bad line
    assert result.stats["rows_read"] == BIG - 4
    assert [r["text"] for r in _rows(store)][:2] == [expected[1][1], expected[2][1]]
    assert _rows(store)[99]["text"] == 'say "hi" there'


def test_a_tsv_line_without_the_column_is_refused_after_the_chunk_before_it(store, tmp_path):
    body = ["id\tsentence"] + [f"{i}\t{text}" for i, text in enumerate(_lines(BIG))]
    body[BIG - 1] = "only-an-id"
    (tmp_path / "big.tsv").write_text("\n".join(body))
    with pytest.raises(CorpusInputError, match=rf"line {BIG} has 1 field\(s\), no 'sentence'"):
        _run(store, tmp_path / "big.tsv", column="sentence")
    assert _run(store, tmp_path / "big.tsv", column="sentence", limit=BIG - 2).stats["rows_read"] == BIG - 2


def test_a_parquet_value_too_long_is_refused_only_when_read(store, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["first", "second", "x" * 50, "fourth"]
    pq.write_table(pa.table({"text": texts}), tmp_path / "s.parquet")
    with pytest.raises(CorpusInputError, match=r"row 3 holds 50 characters, more than max_line_chars=20"):
        _run(store, tmp_path / "s.parquet", max_line_chars=20)
    assert _run(store, tmp_path / "s.parquet", max_line_chars=20, limit=2).stats["rows_written"] == 2
