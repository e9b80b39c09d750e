import math
from datetime import date

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core import contracts, parquet_shards, sentences, storage


def _embeddings(rows, dim=4, value=0.5, value_type=None):
    value_type = value_type or pa.float32()
    return pa.table(
        {
            "sentence_id": pa.array([f"id{i}" for i in range(rows)]),
            "embedding": pa.array([[value] * dim for _ in range(rows)], pa.list_(value_type, dim)),
        }
    )


def test_every_contract_loads_and_builds_a_schema():
    for name in ("sentences", "teacher_embeddings", "projected_targets", "student_embeddings", "index_ids"):
        contract = contracts.load(name)
        kwargs = {"dim": 8, "model_id": "m"} if contract.embedding_field else {}
        schema = contract.arrow_schema(**kwargs)
        assert contracts.identify(schema) == (name, contract.version)


def test_embedding_schema_records_dimension_and_model():
    table = contracts.load("teacher_embeddings").conform(_embeddings(3), dim=4, model_id="teacher/x")
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 4)
    assert table.schema.metadata[contracts.META_DIM] == b"4"
    assert table.schema.metadata[contracts.META_MODEL] == b"teacher/x"


def test_float16_only_where_the_contract_allows_it():
    half = _embeddings(2, value_type=pa.float16())
    assert contracts.load("teacher_embeddings").conform(half, 4, "m", "float16").num_rows == 2
    with pytest.raises(contracts.ContractError, match="embedding"):
        contracts.load("student_embeddings").conform(half, 4, "m", "float16")


@pytest.mark.parametrize(
    ("table", "column"),
    [
        (_embeddings(2).drop_columns(["embedding"]), "embedding"),
        (_embeddings(2, dim=5), "embedding"),
        (_embeddings(2).append_column("extra", pa.array([1, 2])), "extra"),
        (_embeddings(2).set_column(0, "sentence_id", pa.array([1, 2])), "sentence_id"),
        (_embeddings(2).set_column(0, "sentence_id", pa.array(["a", None])), "sentence_id"),
        (_embeddings(2, value=math.nan), "embedding"),
        (_embeddings(2, value=math.inf), "embedding"),
    ],
    ids=["missing", "wrong-dim", "extra", "wrong-type", "null", "nan", "inf"],
)
def test_violations_are_refused_naming_the_column(table, column):
    with pytest.raises(contracts.ContractError, match=column):
        contracts.load("teacher_embeddings").conform(table, dim=4, model_id="m")


def test_refused_shard_publishes_nothing(tmp_path):
    prefix = storage.to_uri(str(tmp_path / "teacher"))
    with pytest.raises(contracts.ContractError, match="embedding"):
        parquet_shards.write_shard(prefix, "part-00000", _embeddings(3, value=math.nan), "teacher_embeddings", 4, "m")
    assert storage.list_uris(prefix) == []


def test_shards_are_content_addressed_and_deterministic(tmp_path):
    prefix = storage.to_uri(str(tmp_path / "teacher"))
    first = parquet_shards.write_shard(prefix, "part-00000", _embeddings(3), "teacher_embeddings", 4, "m")
    again = parquet_shards.write_shard(prefix, "part-00000", _embeddings(3), "teacher_embeddings", 4, "m")
    assert first == again
    assert first.uri.endswith(f"part-00000-{first.sha256[:8]}.parquet")
    assert storage.read_parquet(first.uri).schema.metadata[contracts.META_DIM] == b"4"


def test_only_the_columns_a_contract_marks_are_dictionary_encoded(tmp_path):
    """A dictionary of unique values (ids, texts) only costs time: sentences dictionary-encode their source,
    date and augmentation columns, nothing else."""
    rows = 50
    table = sentences.table(
        {
            "sentence_id": [f"{i:032x}" for i in range(rows)],
            "text": [f"sentence {i}" for i in range(rows)],
            "source": ["file:///corpus.txt"] * rows,
            "line": list(range(1, rows + 1)),
        },
        date(2026, 11, 30),
    )
    shard = parquet_shards.write_shard(storage.to_uri(str(tmp_path / "s")), "part-00000", table, "sentences")
    columns = pq.ParquetFile(shard.uri.removeprefix("file://")).metadata.row_group(0)
    encoded = {columns.column(i).path_in_schema: columns.column(i).has_dictionary_page for i in range(8)}
    assert contracts.load("sentences").dictionary_columns == ["source", "ingest_date", "aug_method", "aug_params"]
    assert encoded == {name: name in ("source", "ingest_date", "aug_method", "aug_params") for name in encoded}
    assert storage.read_parquet(shard.uri).equals(table)
