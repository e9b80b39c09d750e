import logging
import math
from datetime import date

import numpy as np
import pyarrow as pa
import pytest

from tasks.core import config, sentences, storage
from tasks.stages import quality, stage_corpus
from tests.support.synthetic import correlated_embeddings, publish_teacher_shards

DAY = date(2026, 11, 1)


def _sentences(ids, texts):
    return pa.table({"sentence_id": ids, "text": texts})


def _embeddings(vectors, ids=None, dim=None):
    vectors = np.asarray(vectors, dtype=np.float32)
    ids = ids or [f"{i:032d}" for i in range(len(vectors))]
    return pa.table(
        {
            "sentence_id": ids,
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim or vectors.shape[1]),
        }
    )


def test_clean_sentences_pass():
    good = _sentences([sentences.sentence_id(t) for t in ("a b", "c d")], ["a b", "c d"])
    result = quality.check("sentences", good, "mem://good", max_chars=100)
    assert result["rows"] == 2 and all(e["success"] for e in result["expectations"])


@pytest.mark.parametrize(
    ("table", "expectation", "bad_row"),
    [
        (_sentences(["a" * 32, "a" * 32], ["x", "y"]), "expect_column_values_to_be_unique", "'text': 'x'"),
        (_sentences(["a" * 32, "b" * 32], ["x", None]), "expect_column_values_to_not_be_null", "'sentence_id': 'bbbb"),
        (_sentences(["a" * 32, "b" * 32], ["x", "y" * 50]), "expect_column_values_to_be_between", "'text_length': 50"),
    ],
)
def test_injected_bad_sentences_are_caught(table, expectation, bad_row):
    with pytest.raises(quality.QualityError) as err:
        quality.check("sentences", table, "file:///bad.parquet", max_chars=20)
    message = str(err.value)
    assert message.startswith("file:///bad.parquet: 1 of 5 expectations of suite 'sentences' failed")
    assert expectation in message and bad_row in message


def _unit(rows, dim, seed=0):
    x = np.random.default_rng(seed).normal(size=(rows, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("vectors", "dim", "expectation"),
    [
        (np.vstack([_unit(3, 4), [[math.nan, 0, 0, 1]]]), 4, "'finite'"),
        (_unit(4, 4), 3, "'dim'"),
        (np.vstack([_unit(3, 4), [[3.0, 0, 0, 0]]]), 4, "'norm'"),
    ],
)
def test_injected_bad_embeddings_are_caught(vectors, dim, expectation):
    settings = {"dim": dim, "min_norm": 0.5, "max_norm": 1.5}
    with pytest.raises(quality.QualityError, match=expectation):
        quality.check("embeddings", _embeddings(vectors, dim=4), "file:///e.parquet", **settings)


def test_duplicate_embedding_ids_and_collapsed_targets():
    with pytest.raises(quality.QualityError, match="expect_column_values_to_be_unique"):
        quality.check(
            "embeddings", _embeddings(_unit(2, 4), ids=["x", "x"]), "file:///e", dim=4, min_norm=0.5, max_norm=1.5
        )
    targets = np.column_stack([np.random.default_rng(0).normal(size=50), np.full(50, 0.25)])
    table = pa.table(
        {
            "sentence_id": [str(i) for i in range(50)],
            "target": pa.FixedSizeListArray.from_arrays(pa.array(targets.ravel().astype(np.float32)), 2),
        }
    )
    with pytest.raises(quality.QualityError, match="'dimension': 1"):
        quality.check("targets", table, "file:///t", min_variance=1e-8)


def test_the_stage_checks_a_partition(store_root, tmp_path, caplog):
    source = tmp_path / "raw.txt"
    source.write_text("first sentence\nsecond sentence\n")
    stage_corpus.run(
        config.parse(stage_corpus.StageCorpusParams, {"store": store_root, "source": str(source), "ingest_date": DAY})
    )
    params = config.parse(quality.QualityParams, {"store": store_root, "ingest_date": DAY, "teacher": None})
    caplog.set_level(logging.INFO, logger="tasks")
    result = quality.run(params)
    assert result.stats == {"checks": 1, "rows": 2, "passed": True}
    [shard] = sentences.shards(store_root, DAY)
    suite = len(quality.suite_spec("sentences")["expectations"])
    assert f"quality: suite sentences on {shard} (2 rows): {suite} of {suite} expectations passed" in caplog.messages
    assert quality.run(params).skipped


def test_the_stage_fails_on_bad_teacher_embeddings_and_publishes_nothing(store_root):
    vectors = correlated_embeddings(20, 6, seed=3)  # norms far from 1: not a normalised teacher
    publish_teacher_shards(store_root, "synthetic", DAY, vectors, shard_rows=10)
    params = config.parse(quality.QualityParams, {"store": store_root, "ingest_date": DAY, "teacher": "synthetic"})
    with pytest.raises(quality.QualityError, match="expect_column_values_to_be_between"):
        quality.run(params)
    assert storage.list_uris(f"{store_root}/quality") == []
