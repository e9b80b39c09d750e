import numpy as np
import pytest

from tasks.ml import metrics


def test_nearest_by_cosine_and_excluding_self():
    corpus = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.0]])
    assert metrics.nearest(corpus, np.array([[1.0, 0.05]]), k=2).tolist() == [[0, 1]]
    assert metrics.nearest(corpus, corpus[:2], k=1, exclude_self=True).tolist() == [[1], [0]]


def test_recall_by_hand():
    truth = np.array([[1, 2], [3, 4]])
    found = np.array([[2, 9], [4, 3]])
    assert metrics.recall_at_k(found, truth) == pytest.approx((0.5 + 1.0) / 2)


def test_mrr_by_hand():
    candidates = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    queries = np.array([[1.0, 0.1], [0.1, 1.0]])
    # query 0: order 0, 2, 1 -> answer 2 at rank 2; query 1: order 1, 2, 0 -> answer 1 at rank 1
    assert metrics.mean_reciprocal_rank(queries, candidates, np.array([2, 1])) == pytest.approx((0.5 + 1.0) / 2)


def test_fidelity_by_hand():
    result = metrics.fidelity(np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([[1.0, 0.0], [0.0, -2.0]]))
    assert result.mse == pytest.approx((0 + 0 + 0 + 16) / 4)
    assert result.mean_cosine == pytest.approx(0.0)
