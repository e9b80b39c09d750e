import pytest

from tasks.core import config
from tasks.stages.stage_corpus import StageCorpusParams


def test_values_are_coerced_and_the_store_becomes_a_uri(tmp_path):
    params = config.parse(
        StageCorpusParams, {"source": "in.txt", "ingest_date": "2026-11-30", "shard_rows": "10", "store": str(tmp_path)}
    )
    assert params.shard_rows == 10
    assert params.ingest_date.isoformat() == "2026-11-30"
    assert params.store == f"file://{tmp_path}"


def test_default_store_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HPD_STORE", str(tmp_path / "elsewhere"))
    params = config.parse(StageCorpusParams, {"source": "in.txt", "ingest_date": "2026-11-30"})
    assert params.store == f"file://{tmp_path}/elsewhere"


def test_every_wrong_value_is_named():
    with pytest.raises(config.ConfigError) as err:
        config.parse(StageCorpusParams, {"ingest_date": "yesterday", "shard_rows": 0, "format": "xml", "colour": "red"})
    message = str(err.value)
    assert "\n" not in message and "StageCorpusParams" not in message
    for name in ("source", "ingest_date", "shard_rows", "format", "colour"):
        assert f" {name}: " in message
    assert "'yesterday'" in message
    assert [where for where, _ in err.value.problems] == [
        ("source",),
        ("ingest_date",),
        ("format",),
        ("shard_rows",),
        ("colour",),
    ]
