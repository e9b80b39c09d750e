"""The PCA artifact: a round trip through safetensors, and an artifact with a non-finite number refused."""

import numpy as np
import pytest

from tasks.core.finite import NonFiniteError
from tasks.ml.projection import Projection


def _projection(components: np.ndarray) -> Projection:
    return Projection(components, np.zeros(3), np.ones(2), np.array([0.6, 0.4]), "uncentered", 10)


def test_an_artifact_round_trips_and_one_with_a_nan_is_refused_naming_it():
    components = np.arange(6, dtype=np.float32).reshape(2, 3)
    loaded = Projection.from_safetensors(_projection(components).to_safetensors(), "file:///s/pca.safetensors")
    np.testing.assert_array_equal(loaded.components, components)
    components[1, 1] = np.nan
    with pytest.raises(NonFiniteError, match=r"^file:///s/pca\.safetensors \(components\): 1 NaN or infinite"):
        Projection.from_safetensors(_projection(components).to_safetensors(), "file:///s/pca.safetensors")
