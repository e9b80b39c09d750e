"""The embedding space a student encodes into, and the PCA basis that defines it.

A student is distilled to reproduce its teacher's embeddings projected on a PCA basis: two students trained to
the same basis (a warm-started retrain keeps its start's, ``fit-pca --basis-from``) encode into the same k-dim
space, and a query of one can be searched among vectors of the other; students of different bases cannot. The
distill stage lists the basis it learned (the PCA artifact, ``pca.safetensors``) among its run's inputs, so the
space of a student is the sha256 of that artifact: the same wherever the store is copied. A student whose run
records no basis (one distilled before runs recorded it) is a space of its own, named by its manifest version.
"""

from __future__ import annotations

from tasks.core import catalog, manifest
from tasks.core.catalog import Stage

BASIS_FILE = "pca.safetensors"  # the PCA artifact's name (tasks.ml.projection.ARTIFACT)


def basis(store: str, distilled: manifest.Manifest) -> manifest.Input | None:
    """The PCA artifact a distill run learned to reproduce (as its manifest records it), None for a run from
    before runs recorded it."""
    for item in distilled.inputs:
        key = catalog.store_key(store, item.uri) or ""
        if key.startswith("pca/") and key.endswith("/" + BASIS_FILE):
            return item
    return None


def of(store: str, distilled: manifest.Manifest) -> str:
    """The embedding space of a distill run's student: ``pca:<sha256 of its basis>``, or, for a run that records
    none, ``model:<its manifest version's store key>`` (a space of its own)."""
    found = basis(store, distilled)
    if found is not None:
        return f"pca:{found.sha256}"
    version = distilled.version_uri(store) if Stage(distilled.stage) is Stage.DISTILL else distilled.key
    return f"model:{catalog.store_key(store, version) or version}"
