import numpy as np
import pytest

from tasks.ml import sts


def test_vendored_sets_load_whole():
    stsb, sick = sts.stsb_test(), sts.sick_r_test()
    assert len(stsb.scores) == 1379 and stsb.scores.min() >= 0 and stsb.scores.max() <= 5
    assert len(sick.scores) == 4927 and sick.scores.min() >= 1 and sick.scores.max() <= 5
    assert stsb.first[0] == "A girl is styling her hair."


def test_dev_sets_are_apart_from_the_test_sets():
    stsb_dev, sick_dev = sts.stsb_dev(), sts.sick_r_dev()
    assert (len(stsb_dev.scores), len(sick_dev.scores)) == (1500, 500)
    assert stsb_dev.first[0] == "A man with a hard hat is dancing."
    for dev, test in ((stsb_dev, sts.stsb_test()), (sick_dev, sts.sick_r_test())):
        shared = set(zip(dev.first, dev.second, strict=True)) & set(zip(test.first, test.second, strict=True))
        assert len(shared) < 0.02 * len(dev.scores)  # a few stock pairs recur in the source data


def test_training_sentences_are_the_training_splits_distinct_sentences_without_scores():
    texts = sts.training_sentences()
    assert texts == sorted(set(texts)) and all(t == t.strip() and t for t in texts)
    assert "A plane is taking off." in texts  # STS-B train's first pair
    assert "A group of kids is playing in a yard and an old man is standing in the background" in texts  # SICK train
    assert 14_000 < len(texts) < 5_749 * 2 + 4_500 * 2
    assert not set(texts) & {"5.000", "4.500"}  # no score column


def test_dev_score_is_the_mean_of_both_dev_sets():
    def by_length(texts):
        return np.array([[len(t), 1.0] for t in texts])

    expected = (sts.score(by_length, sts.stsb_dev()) + sts.score(by_length, sts.sick_r_dev())) / 2
    assert sts.dev_score(by_length) == pytest.approx(expected)
    assert sts.dev_score(by_length) != pytest.approx(sts.score(by_length, sts.stsb_dev()))


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


def test_a_remembering_encoder_encodes_each_text_once_across_calls():
    asked: list[list[str]] = []

    def encode(texts: list[str]) -> np.ndarray:
        asked.append(list(texts))
        return np.array([[len(t), t.count("a")] for t in texts], dtype=np.float32).reshape(len(texts), 2)

    remembering = sts.remembering(encode)
    first = remembering(["a cat", "a dog", "a cat"])
    second = remembering(["a dog", "banana", "a cat"])
    assert asked == [["a cat", "a dog"], ["banana"]]  # each distinct text once, in its first order
    np.testing.assert_array_equal(first, encode(["a cat", "a dog", "a cat"]))
    np.testing.assert_array_equal(second, encode(["a dog", "banana", "a cat"]))
    assert remembering([]).shape == (0, 2)
