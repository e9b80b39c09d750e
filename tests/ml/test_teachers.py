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


def test_a_loaded_composite_teacher_encodes_as_its_shards_are_combined(tmp_path):
    from tasks.ml.encoder import SentenceEncoder
    from tests.support.tiny_models import build_sentence_model

    first, second = build_sentence_model(tmp_path / "a"), build_sentence_model(tmp_path / "b", hidden=16, seed=1)
    texts = ["a man plays a guitar", "two dogs run"]
    composite = teachers.load(f"{first}+{second}")
    assert isinstance(composite, teachers.CompositeTeacher) and composite.dim == 48
    members = [SentenceEncoder.load(str(path)).encode(texts) for path in (first, second)]
    np.testing.assert_allclose(composite.encode(texts), teachers.combine(members), atol=1e-6)
    assert isinstance(teachers.load(str(first)), SentenceEncoder)
