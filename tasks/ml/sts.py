"""Semantic textual similarity: the vendored STS-B and SICK-R sets, and their score.

The test sets measure; the dev sets (STS-B dev, SICK trial) are the ones a run may tune or select on; the training
splits' sentences, without their scores, are text a run may learn from.

STS is scored as SentEval, SimCSE and HPD do: Spearman's rank correlation between the cosine
similarity of the two sentence embeddings and the gold score, times 100.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import numpy as np
from scipy.stats import spearmanr

Encode = Callable[[list[str]], np.ndarray]


class STSDataError(ValueError):
    """A pair file that cannot be read; the message names it."""


@dataclass(frozen=True)
class PairSet:
    name: str
    first: list[str]
    second: list[str]
    scores: np.ndarray


def sts_file(*parts: str) -> Traversable:
    """A file of the STS sets shipped with the package (``tasks/ml/sts_sets``: STS Benchmark and SICK)."""
    return resources.files(__package__).joinpath("sts_sets", *parts)


def stsb_test() -> PairSet:
    """STS Benchmark test (1,379 pairs, 0-5)."""
    return _stsb("STS-B test", "sts-test.csv")


def sick_r_test() -> PairSet:
    """SICK relatedness, test annotations (4,927 pairs, 1-5)."""
    return _sick("SICK-R test", "SICK_test_annotated.txt")


def stsb_dev() -> PairSet:
    """STS Benchmark dev (1,500 pairs): for tuning and selection, never for the reported score."""
    return _stsb("STS-B dev", "sts-dev.csv")


def sick_r_dev() -> PairSet:
    """SICK relatedness, trial annotations (500 pairs): for tuning and selection."""
    return _sick("SICK-R dev", "SICK_trial.txt")


def training_sentences() -> list[str]:
    """The distinct sentences of the training splits (STS-B train, SICK train), without their scores: unlabelled
    in-domain text a distillation may learn from (sorted; neither a dev nor a test pair's score is used)."""
    splits = (_stsb("STS-B train", "sts-train.csv"), _sick("SICK train", "SICK_train.txt"))
    return sorted({text.strip() for pairs in splits for text in (*pairs.first, *pairs.second)} - {""})


def dev_score(encode: Encode) -> float:
    """The mean of STS-B dev and SICK-R dev: the score a run selects its weights on."""
    return float(np.mean([score(encode, pairs) for pairs in (stsb_dev(), sick_r_dev())]))


def _stsb(name: str, file: str) -> PairSet:
    """An STS Benchmark file; uses the first 7 tab-separated columns."""
    path = sts_file("stsbenchmark", file)
    rows = [line.rstrip("\n").split("\t")[:7] for line in path.read_text(encoding="utf-8").splitlines()]
    return PairSet(name, [r[5] for r in rows], [r[6] for r in rows], np.array([float(r[4]) for r in rows]))


def _sick(name: str, file: str) -> PairSet:
    path = sts_file("sick", file)
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return PairSet(
        name,
        [r["sentence_A"] for r in rows],
        [r["sentence_B"] for r in rows],
        np.array([float(r["relatedness_score"]) for r in rows]),
    )


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def spearman_x100(predicted: np.ndarray, gold: np.ndarray) -> float:
    return float(spearmanr(predicted, gold).statistic * 100)


def remembering(encode: Encode) -> Encode:
    """``encode`` that encodes each distinct text once, however often it is asked for (a model's vectors of the
    pair sets it is scored on, then plotted and ranked)."""
    vectors: dict[str, np.ndarray] = {}

    def encode_once(texts: list[str]) -> np.ndarray:
        if missing := list(dict.fromkeys(t for t in texts if t not in vectors)):
            vectors.update(zip(missing, encode(missing), strict=True))
        return np.stack([vectors[t] for t in texts]) if texts else encode(texts)

    return encode_once


def score(encode: Encode, pairs: PairSet) -> float:
    """Spearman x100 of cosine similarity against the gold scores; each distinct sentence encoded once."""
    unique = sorted(set(pairs.first) | set(pairs.second))
    index = {text: i for i, text in enumerate(unique)}
    embeddings = encode(unique)
    first = embeddings[[index[t] for t in pairs.first]]
    second = embeddings[[index[t] for t in pairs.second]]
    return spearman_x100(cosine(first, second), pairs.scores)
