import numpy as np
import pytest

from tasks.ml import sts


def test_vendored_sets_load_whole():
    stsb, sick = sts.stsb_test(), sts.sick_r_test()
    assert len(stsb.scores) == 1379 and stsb.scores.min() >= 0 and stsb.scores.max() <= 5
    assert len(sick.scores) == 4927 and sick.scores.min() >= 1 and sick.scores.max() <= 5
    assert stsb.first[0] == "A girl is styling her hair."


def test_cosine_and_spearman_by_hand():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    b = np.array([[2.0, 0.0], [1.0, -1.0], [1.0, 1.0]])
    np.testing.assert_allclose(sts.cosine(a, b), [1.0, 0.0, np.sqrt(0.5)])
    # ranks of predicted (3, 1, 2) against gold (3, 1, 2): perfect; reversed gold: -100
    assert sts.spearman_x100(np.array([0.9, 0.1, 0.5]), np.array([5.0, 1.0, 2.0])) == pytest.approx(100.0)
    assert sts.spearman_x100(np.array([0.9, 0.1, 0.5]), np.array([1.0, 5.0, 2.0])) == pytest.approx(-100.0)
    # one swapped pair among 4: rho = 1 - 6*2/(4*15) = 0.8
    assert sts.spearman_x100(np.array([1, 2, 3, 4.0]), np.array([1, 2, 4, 3.0])) == pytest.approx(80.0)


def test_score_encodes_each_sentence_once():
    pairs = sts.PairSet("t", ["a", "b", "c"], ["b", "c", "a"], np.array([3.0, 2.0, 1.0]))
    calls = []
    vectors = {"a": [1.0, 0.0], "b": [1.0, 0.2], "c": [0.0, 1.0]}

    def encode(texts):
        calls.append(list(texts))
        return np.array([vectors[t] for t in texts])

    assert sts.score(encode, pairs) == pytest.approx(100.0)
    assert calls == [["a", "b", "c"]]
