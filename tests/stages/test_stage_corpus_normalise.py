"""The polars normalisation of corpus staging against the Python one it must equal, on random Unicode
(seeded: hypothesis is not among the project's dependencies)."""

import random
import sys

import polars as pl
import pytest

from tasks.core import sentences
from tasks.stages.stage_corpus import normalise
from tasks.stages.stage_corpus.id_hasher import IdHasher

# Whitespace of every kind, controls, combining marks and pieces that compose under NFC, mixed into any text.
TRICKY = list(" \t\n\r\x0b\x0c\x1c\x00\x07\x1b\x7f\x85\x9f\xa0\u1680\u2000\u2028\u2029\u202f\u205f\u3000\u180e")
TRICKY += ["e\u0301", "\u0301", "\u1100\u1161", "\u0378", "\U000e0000", "\ufeff", "\u212b", "A\u030a"]
PLANES = [(0x20, 0x7F), (0x80, 0x800), (0x800, 0x3400), (0xA000, 0xD800), (0xE000, 0x10000), (0x10000, 0x30000)]


def _char(rng: random.Random) -> str:
    """A random character: often a tricky one, else any code point of a random range (no surrogates)."""
    if rng.random() < 0.3:
        return rng.choice(TRICKY)
    low, high = rng.choice([*PLANES, (0x30000, sys.maxunicode + 1)])
    return chr(rng.randrange(low, high))


@pytest.mark.parametrize("seed", range(20))
def test_polars_normalisation_equals_the_python_one(seed):
    rng = random.Random(seed)
    texts = ["".join(_char(rng) for _ in range(rng.randrange(0, 40))) for _ in range(500)]
    assert normalise.normalise_series(pl.Series(texts, dtype=pl.String)).to_list() == list(
        map(sentences.normalise_text, texts)
    )


def test_unassigned_characters_go_through_the_python_function():
    # U+0378 is unassigned in Python's Unicode database: NFC of text holding it is only defined by that version.
    texts = ["a\u0378e\u0301  b", None, "  plain \t text ", "Cafe\u0301\u3000au\x00lait"]
    assert normalise.normalise_series(pl.Series(texts, dtype=pl.String)).to_list() == [
        "a\u0378\u00e9 b",
        "",
        "plain text",
        "Caf\u00e9 au lait",
    ]


def test_kept_rows_drop_empty_and_over_long_texts_and_carry_the_sentence_id():
    batch = pl.DataFrame({"line": [1, 2, 3, 4], "raw": [" Caf\u00e9 ", "\t", None, "x" * 11]})
    with IdHasher() as hasher:
        kept, dropped = normalise.kept_rows(batch, "file:///raw.txt", max_chars=10, hasher=hasher)
    sid = sentences.sentence_id("Caf\u00e9")
    assert kept.rows() == [(sid, "Caf\u00e9", "file:///raw.txt", 1, bytes.fromhex(sid))]
    assert dropped == {"empty": 2, "too_long": 1}
