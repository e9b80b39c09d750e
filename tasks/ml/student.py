"""The HPD student: an encoder with mean pooling and a learnable Dense(hidden -> k) head.

Three initialisations of the head, which matter most at small training budgets:
- ``random``: PyTorch's default for a linear layer (HPD's choice);
- ``pca``: the top-k principal components of the student's own pooled embeddings, each scaled to
  the spread of the matching target dimension (so tanh is not saturated);
- ``ridge``: the closed-form ridge regression from the pooled embeddings to the targets
  (through atanh when the activation is tanh), fitted on a sample of the training set.
A warm start in its start's PCA basis keeps that student's own head instead (:func:`keep_head`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.utils import logging as transformers_logging

from tasks.core import manifest, storage, uris
from tasks.core.catalog import Stage
from tasks.ml import models
from tasks.ml.choices import Activation, Init
from tasks.ml.encoder import Dense, Modules, SentenceEncoder, transformer_folder

MODEL_FOLDER = "model"  # the exported sentence-transformers folder inside a distill run's outputs
ACTIVATIONS = {"tanh": "torch.nn.modules.activation.Tanh", "identity": "torch.nn.modules.linear.Identity"}


class StudentError(ValueError):
    """A student that cannot be built as configured."""


def build(
    spec: str,
    k: int,
    activation: Activation = "tanh",
    layers: int | None = None,
    max_seq_length: int | None = None,
    dropout: float | None = None,
    device: str = "cpu",
) -> SentenceEncoder:
    """Load the student encoder, keep its first ``layers`` transformer layers, add the Dense head."""
    encoder = SentenceEncoder.load(spec, device=device, max_seq_length=max_seq_length)
    if layers is not None:
        stack = _layer_stack(encoder.transformer, spec)
        if layers > len(stack):
            raise StudentError(f"student {spec!r} has {len(stack)} layers, cannot keep {layers}")
        del stack[layers:]
        encoder.transformer.config.num_hidden_layers = layers
    if dropout is not None:
        for module in encoder.transformer.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = dropout
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if hasattr(encoder.transformer.config, name):
                setattr(encoder.transformer.config, name, dropout)
    if getattr(encoder.transformer, "pooler", None) is not None:
        encoder.transformer.pooler = None  # unused by mean pooling; DDP needs every parameter to get a gradient
    hidden = encoder.transformer.config.hidden_size
    encoder.dense = Dense(hidden, k, activation=ACTIVATIONS[activation]).to(encoder.device)
    encoder.normalize = False  # HPD regresses the raw head output onto the projected targets
    return encoder


def keep_head(encoder: SentenceEncoder, spec: str) -> None:
    """Give ``encoder`` (built from ``spec`` by :func:`build`) the Dense head ``spec``'s folder has: a warm start's
    own, which must have the shape and activation of the one :func:`build` made; a :class:`StudentError` if not."""
    folder = models.resolve(spec)
    modules = Modules.read(folder)
    kept = Dense.from_folder(folder / modules.dense) if modules.dense is not None else None
    made = encoder.dense
    if kept is None or made is None:
        raise StudentError(f"student {spec!r} has no Dense head to keep")
    shape = (made.linear.in_features, made.linear.out_features, made.activation_name)
    if (kept.linear.in_features, kept.linear.out_features, kept.activation_name) != shape:
        raise StudentError(
            f"student {spec!r}: its Dense head is not the {shape[0]} -> {shape[1]} {shape[2]} head asked for"
        )
    encoder.dense = kept.to(encoder.device)


def as_sentence_transformer(encoder: SentenceEncoder) -> Any:
    """A ``SentenceTransformer`` over ``encoder``'s own transformer and head: the same parameters (not copies),
    the same embeddings, for sentence-transformers' trainer to train the encoder through."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense as STDense
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()  # quietly: these weights are replaced at once
    transformers_logging.disable_progress_bar()
    try:
        transformer = Transformer(str(transformer_folder(encoder.model_id)), max_seq_length=encoder.max_seq_length)
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()
    transformer.model = encoder.transformer
    hidden = encoder.transformer.config.hidden_size
    modules = [transformer, Pooling(hidden, pooling_mode=encoder.pooling.mode)]
    if encoder.dense is not None:
        linear = encoder.dense.linear
        activation = torch.nn.Tanh() if encoder.dense.activation_name == ACTIVATIONS["tanh"] else torch.nn.Identity()
        dense = STDense(hidden, linear.out_features, linear.bias is not None, activation_function=activation)
        dense.linear = linear
        modules.append(dense)
    return SentenceTransformer(modules=modules, device=str(encoder.device))


def _layer_stack(transformer: torch.nn.Module, spec: str) -> torch.nn.ModuleList:
    stack = getattr(getattr(transformer, "encoder", None), "layer", None)
    if not isinstance(stack, torch.nn.ModuleList):
        raise StudentError(f"student {spec!r}: cannot find its transformer layers to cut")
    return stack


def freeze(encoder: SentenceEncoder, layers: int, spec: str) -> None:
    """Stop training the embeddings and the first ``layers`` transformer layers (none when 0)."""
    if not layers:
        return
    stack = _layer_stack(encoder.transformer, spec)
    if layers > len(stack):
        raise StudentError(f"student {spec!r} has {len(stack)} layers, cannot freeze {layers}")
    embeddings = getattr(encoder.transformer, "embeddings", None) or encoder.transformer.get_input_embeddings()
    for module in (embeddings, *stack[:layers]):
        module.requires_grad_(False)


def pooled_embeddings(encoder: SentenceEncoder, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """The student's pooled (pre-head) embeddings, float64."""
    head, normalize = encoder.dense, encoder.normalize
    encoder.dense, encoder.normalize = None, False
    try:
        return encoder.encode(texts, batch_size=batch_size).astype(np.float64)
    finally:
        encoder.dense, encoder.normalize = head, normalize


def initialise_head(
    encoder: SentenceEncoder,
    init: Init,
    texts: list[str],
    targets: np.ndarray,
    activation: Activation,
    ridge_alpha: float = 1.0,
) -> dict:
    """Set the Dense head's weights; returns a record of what was done (for the manifest)."""
    if init == "random":
        return {"init": "random"}
    pooled = pooled_embeddings(encoder, texts)
    mean = pooled.mean(axis=0)
    centered = pooled - mean
    goal = np.arctanh(np.clip(targets, -0.999, 0.999)) if activation == "tanh" else targets.astype(np.float64)
    if init == "ridge":
        gram = centered.T @ centered + ridge_alpha * np.eye(centered.shape[1])
        weight = np.linalg.solve(gram, centered.T @ (goal - goal.mean(axis=0))).T
        bias = goal.mean(axis=0) - weight @ mean
    else:  # pca
        k = targets.shape[1]
        if k > centered.shape[1]:
            raise StudentError(f"pca init needs k <= hidden size, got k={k} > {centered.shape[1]}")
        _, singular, components = np.linalg.svd(centered, full_matrices=False)
        spread = singular[:k] / np.sqrt(max(len(centered) - 1, 1))
        weight = components[:k] * (goal.std(axis=0) / np.maximum(spread, 1e-12))[:, None]
        bias = goal.mean(axis=0) - weight @ mean
    with torch.no_grad():
        encoder.dense.linear.weight.copy_(torch.as_tensor(weight, dtype=torch.float32))
        encoder.dense.linear.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return {"init": init, "rows": len(texts), **({"ridge_alpha": ridge_alpha} if init == "ridge" else {})}


def _published_model(store: str, run: str) -> manifest.Manifest:
    """Distill run ``run``'s latest manifest."""
    published = manifest.read(store, Stage.DISTILL, run)
    if published is None:
        raise StudentError(f"{store}: no published distill run {run!r}")
    return published


def model_folder(published: manifest.Manifest) -> str:
    """The exported sentence-transformers folder (``.../model``) a distill manifest lists."""
    return published.output_named(f"{MODEL_FOLDER}/modules.json").uri.removesuffix("/modules.json")


def exported_prefix(store: str, run: str) -> str:
    """The exported sentence-transformers folder (``.../model``) of distill run ``run``'s latest."""
    return model_folder(_published_model(store, run))


def fetch_exported(store: str, run: str, into: Path) -> Path:
    """Download the exported student of distill run ``run``'s latest into ``into`` (:func:`fetch_published`)."""
    return fetch_published(_published_model(store, run), into)


def fetch_published(published: manifest.Manifest, into: Path) -> Path:
    """Download the exported student a distill manifest (a latest or a kept version) lists into ``into``. Every
    file's URI comes from the manifest, so each is checked before anything is downloaded (see
    :func:`local_files`), and its bytes are verified against the digest the manifest records
    (:class:`~tasks.core.storage.IntegrityError`)."""
    folder = model_folder(published)
    checked = [(o.sha256, local_files([o.uri], folder, into)) for o in published.outputs]
    for sha256, files in checked:
        for uri, path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(storage.read_bytes(uri, sha256=sha256))
    return into


def local_files(outputs: list[str], folder: str, into: Path) -> list[tuple[str, Path]]:
    """``(uri, local path)`` of each of ``outputs`` listed under the model folder ``folder``: the URI,
    normalised, must lie below ``folder`` (:func:`tasks.core.uris.contained`) and the path must resolve
    inside ``into``; otherwise a :class:`StudentError` naming the URI (and nothing is written)."""
    prefix, root = uris.to_uri(folder) + "/", into.resolve()
    files = []
    for uri in (u for u in outputs if u.startswith(prefix)):
        try:
            inside = uris.contained(folder, uri)
        except uris.StorageError:
            raise StudentError(f"{uri}: listed as a file of the exported model but outside {folder}") from None
        path = (root / inside[len(prefix) :]).resolve()
        if not path.is_relative_to(root) or path == root:
            raise StudentError(f"{uri}: would be written to {path}, outside the download folder {root}")
        files.append((inside, path))
    return files


def head_note(record: dict[str, Any]) -> str:
    """The head initialisation record in words."""
    how = {
        "ridge": "ridge regression",
        "pca": "principal components",
        "random": "random",
        "warm_start": "kept from the warm start (step 0 is that student)",
    }
    init = str(record.get("init", "random"))
    note = how.get(init, init)
    if rows := record.get("rows"):
        note += f" fitted on {rows:,} training rows"
    if (alpha := record.get("ridge_alpha")) is not None:
        note += f" (alpha {alpha:g})"
    if (step := record.get("resumed_from_step")) is not None:
        note += f"; resumed from the checkpoint of step {step:,}"
    return note
