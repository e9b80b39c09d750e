"""bench/distill_quality.py's measures: the neighbour overlap@10 with the teacher (the validation report's), and a
cache that computes only what it lacks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import distill_quality
from tasks.ml import sts
from tasks.stages.validate.scoring import CorpusSample

RNG = np.random.default_rng(0)
TEXTS = [f"sentence {i}" for i in range(60)]
TEACHER = RNG.normal(size=(len(TEXTS), 16))


@pytest.fixture
def sample(monkeypatch):
    """A corpus sample of 60 sentences the teacher embedded at random; the calls asking for it."""
    asked = []

    def corpus_sample(store, teacher, size):
        asked.append((store, teacher, size))
        return CorpusSample([str(i) for i in range(len(TEXTS))], TEXTS, TEACHER)

    monkeypatch.setattr(distill_quality.scoring, "corpus_sample", corpus_sample)
    return asked


def test_the_overlap_is_one_for_the_teachers_neighbours_and_low_for_unrelated_ones(sample):
    teacher_like = dict(zip(TEXTS, TEACHER * 3.0, strict=True))  # same directions: the same neighbours
    unrelated = dict(zip(TEXTS, RNG.normal(size=TEACHER.shape), strict=True))
    assert distill_quality.neighbour_overlap(lambda texts: np.stack([teacher_like[t] for t in texts])) == 1.0
    assert distill_quality.neighbour_overlap(lambda texts: np.stack([unrelated[t] for t in texts])) < 0.4
    assert sample[0] == (distill_quality.STORE, "all-mpnet-base-v2", distill_quality.OVERLAP_SAMPLE)


def test_measured_computes_only_what_the_cache_lacks(sample, monkeypatch, tmp_path):
    monkeypatch.setattr(distill_quality, "SCORES", tmp_path / "scores.json")
    pairs = sts.PairSet("tiny", TEXTS[:10], TEXTS[10:20], np.arange(10.0))
    monkeypatch.setattr(distill_quality, "SETS", {"tiny": lambda: pairs})
    vectors = dict(zip(TEXTS, TEACHER, strict=True))
    built = []

    def factory():
        built.append(1)
        return lambda texts: np.stack([vectors[t] for t in texts])

    first = distill_quality.measured("model", factory)
    assert set(first) == {"tiny", distill_quality.OVERLAP} and first[distill_quality.OVERLAP] == 1.0
    assert len(built) == 1  # one encoder for both measures
    assert distill_quality.measured("model", factory) == first and len(built) == 1  # all cached

    cached = json.loads(distill_quality.SCORES.read_text())
    del cached["model"][distill_quality.OVERLAP]  # a cache written before the overlap was measured
    distill_quality.SCORES.write_text(json.dumps(cached))
    assert distill_quality.measured("model", factory) == first and len(built) == 2
    assert len(sample) == 2  # the sample was read for the overlap only
