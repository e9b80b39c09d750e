"""bench/scale.py's helpers: the derived sentences are distinct once normalised, the synthetic teacher's rows
are unit-norm and reproducible."""

from __future__ import annotations

import numpy as np

from bench import scale
from tasks.core.sentences import normalise_text


def test_derived_sentences_are_distinct_and_normal():
    base = [f"Sentence number {i} says something ." for i in range(97)]
    texts = [scale.derived(i, base) for i in range(97 * 60)]
    assert len({normalise_text(t) for t in texts}) == len(texts)
    assert all(normalise_text(t) == t for t in texts)
    assert texts[:97] == base


def test_synthetic_teacher_rows_are_unit_norm_and_seeded_by_the_texts():
    teacher = scale.SyntheticTeacher()
    seen = []
    first = teacher.encode(["a", "b", "c"], on_rows=seen.append)
    assert first.shape == (3, scale.DIM) and first.dtype == np.float32 and seen == [3]
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(first, teacher.encode(["a", "b", "c"]))
    assert not np.array_equal(first, teacher.encode(["x", "b", "c"]))
