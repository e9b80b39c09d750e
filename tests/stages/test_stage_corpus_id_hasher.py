"""The sentence-id helper process: the same ids as ``sentences.sentence_id``, whatever the texts' Arrow
layout, and a clear error when the process is gone."""

import random

import polars as pl
import pytest

from tasks.core import sentences
from tasks.stages.stage_corpus.id_hasher import HasherError, IdHasher


def _texts(count: int) -> list[str]:
    rng = random.Random(7)
    return [
        "".join(
            chr(rng.choice([rng.randrange(32, 127), rng.randrange(160, 0x2FFF)])) for _ in range(rng.randrange(1, 60))
        )
        for _ in range(count)
    ]


def _hex(digests: pl.Series) -> list[str]:
    return [digest.hex() for digest in digests]


def test_ids_equal_the_python_function_for_batches_slices_and_chunks():
    texts = _texts(3000)
    series = pl.Series(texts, dtype=pl.String)
    chunked = pl.concat([series.slice(0, 1000), series.slice(1000)], rechunk=False)
    with IdHasher() as hasher:
        assert _hex(hasher.digests(series)) == list(map(sentences.sentence_id, texts))
        assert _hex(hasher.digests(series.slice(1234, 50))) == list(map(sentences.sentence_id, texts[1234:1284]))
        assert _hex(hasher.digests(chunked)) == list(map(sentences.sentence_id, texts))
        assert _hex(hasher.digests(pl.Series([], dtype=pl.String))) == []
        assert _hex(hasher.digests(pl.Series(["again"]))) == [sentences.sentence_id("again")]


def test_null_texts_are_refused():
    with IdHasher() as hasher, pytest.raises(ValueError, match="null"):
        hasher.digests(pl.Series(["a", None]))


def test_a_helper_that_died_is_named():
    with IdHasher() as hasher:
        hasher._process.kill()
        hasher._process.wait()
        with pytest.raises(HasherError, match=f"pid {hasher._process.pid}"):
            hasher.digests(pl.Series(["a sentence"]))
