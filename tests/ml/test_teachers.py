import re

import numpy as np
import pytest

from tasks.core import catalog
from tasks.ml import teachers

pytestmark = pytest.mark.models


def test_a_plain_spec_is_one_member_and_a_composite_several():
    assert teachers.members("all-mpnet-base-v2") == ["all-mpnet-base-v2"]
    assert teachers.members("all-mpnet-base-v2+/models/mini") == ["all-mpnet-base-v2", "/models/mini"]
    assert teachers.is_composite("a+b") and not teachers.is_composite("a")


@pytest.mark.parametrize("spec", ["a+", "+a", "a++b", "a+a"])
def test_a_composite_of_empty_or_repeated_members_is_refused(spec):
    with pytest.raises(ValueError, match=re.escape(f"teacher '{spec}'")):
        teachers.members(spec)


def test_a_composite_member_may_carry_a_weight():
    assert teachers.weighted_members("a+0.5*/models/mini") == [("a", 1.0), ("/models/mini", 0.5)]
    assert teachers.members("a + 2 * b") == ["a", "b"]
    assert teachers.weighted_members("/models/odd*name") == [("/models/odd*name", 1.0)]  # a plain spec as it is


@pytest.mark.parametrize("weight", ["x", "0", "-1", "inf", "nan", ""])
def test_a_weight_that_is_not_a_positive_number_is_refused(weight):
    spec = f"a+{weight}*b"
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


def test_combine_scales_each_member_by_its_weight_and_keeps_rows_unit_norm():
    first, second = np.array([[3.0, 4.0]]), np.array([[0.0, 2.0, 0.0]])
    combined = teachers.combine([first, second], [1.0, 0.5])
    np.testing.assert_allclose(combined[0], np.array([0.6, 0.8, 0.0, 0.5, 0.0]) / np.sqrt(1.25), rtol=1e-6)
    assert np.linalg.norm(combined[0]) == pytest.approx(1.0)
    np.testing.assert_array_equal(teachers.combine([first, second], [1.0, 1.0]), teachers.combine([first, second]))


def test_a_composite_teachers_store_name_joins_its_members_names():
    assert catalog.slug("sentence-transformers/all-mpnet-base-v2+/models/mini") == "all-mpnet-base-v2--mini"
    assert catalog.slug("a+..") == "a--_"
    assert catalog.slug("a+0.5*/models/mini") == "a--0.5x-mini"  # a weighted composite is another teacher
    assert catalog.slug(".5*a+b") == "_5x-a--b"


def test_a_loaded_composite_teacher_encodes_as_its_shards_are_combined(tmp_path):
    from tasks.ml.encoder import SentenceEncoder
    from tests.support.tiny_models import build_sentence_model

    first, second = build_sentence_model(tmp_path / "a"), build_sentence_model(tmp_path / "b", hidden=16, seed=1)
    texts = ["a man plays a guitar", "two dogs run"]
    composite = teachers.load(f"{first}+{second}")
    assert isinstance(composite, teachers.CompositeTeacher) and composite.dim == 48
    members = [SentenceEncoder.load(str(path)).encode(texts) for path in (first, second)]
    np.testing.assert_allclose(composite.encode(texts), teachers.combine(members), atol=1e-6)
    weighted = teachers.load(f"{first}+0.5*{second}")
    np.testing.assert_allclose(weighted.encode(texts), teachers.combine(members, [1.0, 0.5]), atol=1e-6)
    assert isinstance(teachers.load(str(first)), SentenceEncoder)
