import re

import numpy as np
import pytest

from tasks.core import catalog
from tasks.ml import teachers


def test_a_plain_spec_is_one_member_and_a_composite_several():
    assert teachers.members("all-mpnet-base-v2") == ["all-mpnet-base-v2"]
    assert teachers.members("all-mpnet-base-v2+/models/mini") == ["all-mpnet-base-v2", "/models/mini"]
    assert teachers.is_composite("a+b") and not teachers.is_composite("a")


@pytest.mark.parametrize("spec", ["a+", "+a", "a++b", "a+a"])
def test_a_composite_of_empty_or_repeated_members_is_refused(spec):
    with pytest.raises(ValueError, match=re.escape(f"teacher '{spec}'")):
        teachers.members(spec)


def test_combine_normalises_each_member_then_sets_them_side_by_side():
    first = np.array([[3.0, 4.0], [0.0, 2.0]])
    second = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    combined = teachers.combine([first, second])
    assert combined.dtype == np.float32 and combined.shape == (2, 5)
    half = np.sqrt(0.5)
    np.testing.assert_allclose(combined[0], np.array([0.6, 0.8, 1.0, 0.0, 0.0]) * half, rtol=1e-6)
    np.testing.assert_allclose(combined[1], np.array([0.0, 1.0, 0.0, 0.0, 0.0]) * half, rtol=1e-6)  # zero stays zero
    assert np.linalg.norm(combined[0]) == pytest.approx(1.0)


def test_a_composite_teachers_store_name_joins_its_members_names():
    assert catalog.slug("sentence-transformers/all-mpnet-base-v2+/models/mini") == "all-mpnet-base-v2--mini"
    assert catalog.slug("a+..") == "a--_"
