"""Finite numbers only: arrays read from the store are refused, naming their source, when one value is not."""

import numpy as np
import pyarrow as pa
import pytest

from tasks.core import finite, parquet_shards


def test_a_nan_or_an_infinity_is_named_with_its_source_and_first_row():
    finite.require_finite(np.ones((3, 4)), "fine.parquet")
    values = np.ones((3, 4))
    values[1, 2], values[2, 0] = np.nan, -np.inf
    with pytest.raises(finite.NonFiniteError, match=r"^shard\.parquet: 2 NaN or infinite target\(s\), first in row 1$"):
        finite.require_finite(values, "shard.parquet", "target")
    with pytest.raises(finite.NonFiniteError, match=r"^pca: 1 NaN or infinite value\(s\)$"):
        finite.require_finite(np.array([0.0, np.inf]), "pca")


def test_vectors_read_from_a_source_are_checked_and_others_left_to_their_reader():
    table = pa.table({"embedding": pa.FixedSizeListArray.from_arrays(pa.array([1.0, np.nan, 3.0, 4.0]), 2)})
    assert np.isnan(parquet_shards.vectors(table, "embedding")).sum() == 1  # the quality checks count them
    with pytest.raises(finite.NonFiniteError, match=r"^s3://b/e\.parquet: 1 NaN or infinite embedding value"):
        parquet_shards.vectors(table, "embedding", "s3://b/e.parquet")
    big = pa.table({"embedding": pa.FixedSizeListArray.from_arrays(pa.array([1e39, 0.0]), 2)})
    with pytest.raises(finite.NonFiniteError):  # finite in float64, infinite as the float32 the stages use
        parquet_shards.vectors(big, "embedding", "wide.parquet")
