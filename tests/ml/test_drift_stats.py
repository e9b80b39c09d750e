import json

import numpy as np
import pytest

from tasks.ml import drift_stats
from tasks.ml.projection import MomentAccumulator


def _data(rows: int, dim: int = 6, seed: int = 0, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.array([3.0, 2.0, 1.0, 0.1, 0.1, 0.1])[:dim]
    return rng.normal(size=(rows, dim)) * scales + np.r_[1.0, np.zeros(dim - 1)] + shift * np.r_[np.zeros(dim - 1), 1]


def _projection(x: np.ndarray, k: int = 3, mode: str = "uncentered"):
    moments = MomentAccumulator(x.shape[1])
    moments.add(x)
    return moments.fit(k, mode)


TEXTS = ["a cat sat on the mat", "the dog barked", "a bird sang in the tree today"]


def test_a_partition_has_no_drift_from_itself():
    x = _data(300)
    profile = drift_stats.profile(TEXTS * 100, x, _projection(x))
    result = drift_stats.compare(profile, profile, threshold=0.25)
    assert str(result.score) == "0.0" and not result.flagged  # not -0.0 either
    assert result.components == dict.fromkeys(drift_stats.WEIGHTS, 0.0)
    assert sum(drift_stats.WEIGHTS.values()) == pytest.approx(1.0)


def test_profiles_merge_exactly_and_survive_json():
    x, texts = _data(200), TEXTS * 66 + ["one more"] * 2
    projection = _projection(x)
    whole = drift_stats.profile(texts, x, projection)
    parts = drift_stats.merged(
        [drift_stats.profile(texts[:50], x[:50], projection), drift_stats.profile(texts[50:], x[50:], projection)]
    )
    assert parts.summary() == pytest.approx(whole.summary())
    assert parts.vocabulary == whole.vocabulary and parts.length_counts == whole.length_counts
    assert drift_stats.Profile.from_dict(json.loads(json.dumps(whole.to_dict()))) == whole


@pytest.mark.parametrize("mode", ["uncentered", "centered"])
def test_statistics_of_known_data(mode):
    x = _data(500)
    x[:, 3:] = 0.0  # the data lies in the span of the first three components
    summary = drift_stats.profile(["ab cd"] * 250 + ["abcd"] * 250, x, _projection(x, 3, mode)).summary()
    norms = np.linalg.norm(x, axis=1)
    assert summary["norm_mean"] == pytest.approx(norms.mean(), abs=1e-5)
    assert summary["norm_sd"] == pytest.approx(norms.std(), abs=1e-5)
    assert summary["explained_variance_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert summary["reconstruction_error"] == pytest.approx(0.0, abs=1e-6)
    assert (summary["length_mean"], summary["length_p10"], summary["length_p90"]) == (4.5, 4, 5)
    assert (summary["tokens"], summary["vocabulary_kept"]) == (750, 3)
    assert tuple(summary) == drift_stats.STATISTICS


def test_moved_embeddings_raise_the_embedding_components():
    x = _data(400)
    projection = _projection(x)
    reference = drift_stats.profile(TEXTS * 100 + ["x"] * 100, x, projection)
    moved = drift_stats.profile(TEXTS * 100 + ["x"] * 100, _data(400, seed=1, shift=4.0), projection)
    same = drift_stats.profile(TEXTS * 100 + ["x"] * 100, _data(400, seed=1), projection)
    far, near = (
        drift_stats.compare(moved, reference, 0.25).components,
        drift_stats.compare(same, reference, 0.25).components,
    )
    assert far["direction"] > 10 * near["direction"] and far["reconstruction"] > 10 * near["reconstruction"]
    assert far["length"] == near["length"] == 0.0 and far["vocabulary"] == near["vocabulary"] == 0.0


def test_population_stability_and_vocabulary_overlap():
    assert drift_stats.population_stability(np.array([5.0, 5.0]), np.array([50.0, 50.0])) == 0.0
    assert drift_stats.population_stability(np.array([10.0, 0.0]), np.array([0.0, 10.0])) > 10
    assert drift_stats.vocabulary_overlap({"a": 2, "b": 2}, {"a": 1, "b": 1}) == 1.0
    assert drift_stats.vocabulary_overlap({"a": 1}, {"b": 1}) == 0.0
    assert drift_stats.vocabulary_overlap({"a": 3, "b": 1}, {"a": 1, "c": 1}) == pytest.approx(0.5)


def test_the_vocabulary_keeps_the_most_frequent_tokens(monkeypatch):
    monkeypatch.setattr(drift_stats, "VOCABULARY_SIZE", 2)
    profile = drift_stats.profile(["b a b c c c"], np.ones((1, 6)), _projection(_data(20)))
    assert profile.vocabulary == {"c": 3, "b": 2} and profile.tokens == 6
