"""A fitted PCA projection and the streaming moments it is fitted from (shared by the PCA stage,
validation and the index build)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from tasks.core import catalog, finite, manifest, storage
from tasks.core.catalog import Stage
from tasks.ml.choices import Mode

ARTIFACT = "pca.safetensors"


class PCAError(ValueError):
    """The PCA cannot be fitted or applied; the message names the input."""


@dataclass(frozen=True)
class Projection:
    """A fitted projection: ``components`` (k×D), ``mean`` (D), ``explained_variance`` (k)."""

    components: np.ndarray
    mean: np.ndarray
    explained_variance: np.ndarray
    explained_variance_ratio: np.ndarray
    mode: Mode
    rows: int

    def apply(self, embeddings: np.ndarray) -> np.ndarray:
        x = embeddings.astype(np.float64) - (self.mean if self.mode == "centered" else 0.0)
        return (x @ self.components.T.astype(np.float64)).astype(np.float32)

    def to_safetensors(self) -> bytes:
        from safetensors.numpy import save

        tensors = {
            "components": self.components.astype(np.float32),
            "mean": self.mean.astype(np.float32),
            "explained_variance": self.explained_variance.astype(np.float64),
            "explained_variance_ratio": self.explained_variance_ratio.astype(np.float64),
        }
        # One metadata entry: safetensors writes several in no fixed order, and equal fits must give equal bytes.
        return save(tensors, metadata={"hpd": json.dumps({"mode": self.mode, "rows": self.rows}, sort_keys=True)})

    @classmethod
    def from_safetensors(cls, body: bytes, uri: str = "<bytes>") -> Projection:
        from safetensors.numpy import load

        try:
            tensors = load(body)
            header_size = int.from_bytes(body[:8], "little")  # safetensors: u64 size, then a JSON header
            stored = json.loads(body[8 : 8 + header_size]).get("__metadata__", {})
            meta = json.loads(stored["hpd"]) if "hpd" in stored else stored
        except Exception as exc:
            raise PCAError(f"{uri}: not a PCA artifact ({exc})") from None
        for name in ("components", "mean", "explained_variance"):
            finite.require_finite(tensors[name], f"{uri} ({name})")
        return cls(
            tensors["components"],
            tensors["mean"],
            tensors["explained_variance"],
            tensors["explained_variance_ratio"],
            meta.get("mode", "uncentered"),
            int(meta.get("rows", 0)),
        )


class MomentAccumulator:
    """Streaming count, mean and covariance of row vectors (float64, shifted for stability)."""

    def __init__(self, dim: int) -> None:
        self.dim, self.rows = dim, 0
        self.shift: np.ndarray | None = None
        self.total = np.zeros(dim)
        self.gram = np.zeros((dim, dim))

    def add(self, chunk: np.ndarray) -> None:
        if not len(chunk):
            return
        x = chunk.astype(np.float64)
        if self.shift is None:
            self.shift = x.mean(axis=0)
        x -= self.shift
        self.rows += len(x)
        self.total += x.sum(axis=0)
        self.gram += x.T @ x

    def fit(self, k: int, mode: Mode) -> Projection:
        if self.rows < 2:
            raise PCAError(f"PCA needs at least 2 rows, got {self.rows}")
        if k > self.dim:
            raise PCAError(f"k={k} exceeds the embedding dimension {self.dim}")
        shifted_mean = self.total / self.rows
        covariance = (self.gram - self.rows * np.outer(shifted_mean, shifted_mean)) / (self.rows - 1)
        eigenvalues, eigenvectors = np.linalg.eigh(covariance)
        order = np.argsort(eigenvalues)[::-1][:k]
        components = eigenvectors[:, order].T
        # scikit-learn's sign convention: the largest-magnitude loading of each component is positive.
        signs = np.sign(components[np.arange(k), np.abs(components).argmax(axis=1)])
        components *= signs[:, None]
        variance = np.clip(eigenvalues[order], 0.0, None)
        return Projection(
            components,
            shifted_mean + self.shift,
            variance,
            variance / max(float(np.trace(covariance)), 1e-30),
            mode,
            self.rows,
        )


def load_projection(store: str, teacher: str, name: str) -> Projection:
    """The projection a published PCA run lists."""
    return published_projection(store, teacher, name)[1]


def published_projection(store: str, teacher: str, name: str) -> tuple[manifest.Output, Projection]:
    """The artifact a published PCA run lists, as its manifest records it, and the projection read from it
    (verified against the recorded sha256)."""
    published = manifest.read(store, Stage.FIT_PCA, catalog.pca_key(teacher, name))
    if published is None:
        raise PCAError(f"{store}: no PCA run {name!r} for teacher {teacher!r}")
    artifact = published.output_named(ARTIFACT)
    return artifact, Projection.from_safetensors(storage.read_bytes(artifact.uri, sha256=artifact.sha256), artifact.uri)
