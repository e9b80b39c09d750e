"""The batched sentence encoder every stage shares (teacher encoding, student inference, evaluation).

Loads a sentence-transformers folder (Transformer -> Pooling -> optional Dense -> optional
Normalize, as its ``modules.json`` says) or a plain Hugging Face encoder (mean pooling) with
``transformers`` directly, and encodes with token-length-bucketed batches under
``torch.inference_mode`` and an optional autocast dtype (bf16 on CPUs with AVX-512 BF16,
fp16/bf16 on CUDA; ``auto``: bf16 where native, else fp32, :mod:`tasks.ml.precision`). Embeddings come
back as float32 in input order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from pydantic import BaseModel, RootModel, ValidationError
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as transformers_logging

from tasks.ml import models, precision
from tasks.ml.precision import Choice

log = logging.getLogger(__name__)

OnRows = Callable[[int], object]  # told the row count of each batch encoded
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
_TANH = "torch.nn.modules.activation.Tanh"
_ACTIVATIONS = {_TANH: torch.tanh, "torch.nn.modules.linear.Identity": lambda x: x}
ConfigT = TypeVar("ConfigT", bound=BaseModel)


class SentenceBertConfig(BaseModel):
    """``sentence_bert_config.json``: the token length the encoder truncates at."""

    max_seq_length: int | None = None
    do_lower_case: bool = False


class DenseConfig(BaseModel):
    """A Dense module's ``config.json``, as sentence-transformers writes it."""

    in_features: int
    out_features: int
    bias: bool = True
    activation_function: str = _TANH


class ModuleEntry(BaseModel):
    """One module of ``modules.json``: its class (``type``) and its subfolder."""

    type: str
    path: str = ""

    @property
    def kind(self) -> str:
        """The class name without its package, e.g. ``Pooling``."""
        return self.type.rsplit(".", 1)[-1]


class ModuleList(RootModel[list[ModuleEntry]]):
    """``modules.json``: the modules of a sentence-transformers folder, in order."""


def read_config(path: Path, shape: type[ConfigT]) -> ConfigT:
    """The JSON file ``path`` parsed as ``shape`` (keys it does not name are ignored); a
    :class:`~tasks.ml.models.ModelError` naming the file when it is not one."""
    try:
        return shape.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise models.ModelError(f"{path}: not a valid {path.name}: {exc}") from None


@dataclass(frozen=True)
class Modules:
    """The modules of a sentence-transformers folder (its ``modules.json``), each kind's subfolder; a plain
    Hugging Face folder has none but its transformer, in the folder itself."""

    transformer: str = ""
    pooling: str | None = None
    dense: str | None = None
    normalize: bool = False

    @classmethod
    def read(cls, folder: Path) -> Modules:
        """The modules ``folder`` holds; a kind listed twice: its last subfolder."""
        path = folder / "modules.json"
        if not path.is_file():
            return cls()
        found = {module.kind: module.path for module in read_config(path, ModuleList).root}
        return cls(found.get("Transformer", ""), found.get("Pooling"), found.get("Dense"), "Normalize" in found)


@dataclass(frozen=True)
class Pooling:
    mode: Literal["mean", "cls", "max"] = "mean"

    @classmethod
    def from_folder(cls, folder: Path) -> Pooling:
        config = json.loads((folder / "config.json").read_text())
        for mode, key in (
            ("cls", "pooling_mode_cls_token"),
            ("max", "pooling_mode_max_tokens"),
            ("mean", "pooling_mode_mean_tokens"),
        ):
            if config.get(key):
                return cls(mode)
        raise models.ModelError(f"{folder}: unsupported pooling config {config}")

    def save(self, folder: Path, hidden: int) -> None:
        """Write ``config.json`` in ``folder``, as sentence-transformers' Pooling does."""
        folder.mkdir(exist_ok=True)
        config = {
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": self.mode == "cls",
            "pooling_mode_mean_tokens": self.mode == "mean",
            "pooling_mode_max_tokens": self.mode == "max",
        }
        (folder / "config.json").write_text(json.dumps(config))

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        if self.mode == "cls":
            return hidden[:, 0]
        expanded = mask.unsqueeze(-1).to(hidden.dtype)
        if self.mode == "max":
            return hidden.masked_fill(expanded == 0, -1e9).max(dim=1).values
        return (hidden * expanded).sum(dim=1) / expanded.sum(dim=1).clamp(min=1e-9)


class Dense(torch.nn.Module):
    """sentence-transformers' Dense module: linear layer + activation."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        activation: str = _TANH,
    ) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise models.ModelError(f"unsupported Dense activation {activation!r}")
        self.linear = torch.nn.Linear(in_features, out_features, bias=bias)
        self.activation_name = activation

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return _ACTIVATIONS[self.activation_name](self.linear(features))

    @classmethod
    def from_folder(cls, folder: Path) -> Dense:
        config = read_config(folder / "config.json", DenseConfig)
        dense = cls(config.in_features, config.out_features, config.bias, config.activation_function)
        weights = folder / "model.safetensors"
        state = load_file(weights) if weights.is_file() else torch.load(folder / "pytorch_model.bin", weights_only=True)
        dense.load_state_dict(state)
        return dense

    def save(self, folder: Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` in ``folder``, as sentence-transformers' Dense does."""
        from safetensors.torch import save_file

        folder.mkdir(exist_ok=True)
        config = DenseConfig(
            in_features=self.linear.in_features,
            out_features=self.linear.out_features,
            bias=self.linear.bias is not None,
            activation_function=self.activation_name,
        )
        (folder / "config.json").write_text(json.dumps(config.model_dump()))
        weights = {name: tensor.detach().cpu().contiguous() for name, tensor in self.state_dict().items()}
        save_file(weights, folder / "model.safetensors")


def _load_transformer(folder: Path) -> torch.nn.Module:
    """The transformer, quietly (no load report or progress bar); warns only about missing weights that
    matter: a pooler head (unused by sentence pooling, and dropped from our exports) is not reported."""
    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        transformer, info = AutoModel.from_pretrained(folder, output_loading_info=True)
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()
    missing = [key for key in info["missing_keys"] if not key.startswith("pooler.")]
    if missing:
        log.warning("%s: weights missing from the checkpoint, randomly initialised: %s", folder, missing)
    return transformer


@dataclass(frozen=True)
class TokenizerSettings:
    """A fast tokenizer's padding and truncation as loaded. Each encoding call sets them, and what a tokenizer
    saves must not depend on which calls came last (an export after a resume saves what one without does)."""

    padding: dict[str, Any] | None = None
    truncation: dict[str, Any] | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerSettings:
        backend = getattr(tokenizer, "backend_tokenizer", None)  # None: a slow tokenizer, which keeps none
        return cls() if backend is None else cls(backend.padding, backend.truncation)

    def restore(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return
        if self.padding is None:
            backend.no_padding()
        else:
            backend.enable_padding(**self.padding)
        if self.truncation is None:
            backend.no_truncation()
        else:
            backend.enable_truncation(**self.truncation)


class SentenceEncoder(torch.nn.Module):
    """A loaded encoder: transformer, pooling, optional dense head and normalisation.

    A ``torch.nn.Module``: the distillation stage trains it (and wraps it in DDP) as it is.
    """

    def __init__(
        self,
        model_id: str,
        tokenizer,
        transformer: torch.nn.Module,
        pooling: Pooling,
        dense: Dense | None,
        normalize: bool,
        max_seq_length: int,
    ) -> None:
        super().__init__()
        self.model_id, self.tokenizer, self.pooling = model_id, tokenizer, pooling
        self.transformer, self.dense = transformer, dense
        self.normalize, self.max_seq_length = normalize, max_seq_length
        self._loaded_settings = TokenizerSettings.of(tokenizer)

    @property
    def device(self) -> torch.device:
        """Where the weights are (follows ``.to()``)."""
        return next(self.transformer.parameters()).device

    @classmethod
    def load(cls, spec: str, device: str = "cpu", max_seq_length: int | None = None) -> SentenceEncoder:
        folder = models.resolve(spec)
        modules = Modules.read(folder)
        transformer_dir = folder / modules.transformer
        bert_config = transformer_dir / "sentence_bert_config.json"
        configured_len = read_config(bert_config, SentenceBertConfig).max_seq_length if bert_config.is_file() else None
        tokenizer = AutoTokenizer.from_pretrained(transformer_dir)
        transformer = _load_transformer(transformer_dir)
        pooling = Pooling.from_folder(folder / modules.pooling) if modules.pooling is not None else Pooling()
        dense = Dense.from_folder(folder / modules.dense) if modules.dense is not None else None
        limit = max_seq_length or configured_len or min(tokenizer.model_max_length, 512)
        encoder = cls(spec, tokenizer, transformer, pooling, dense, modules.normalize, int(limit))
        encoder.require_finite_weights(str(folder))
        return encoder.to(torch.device(device)).eval()

    def require_finite_weights(self, source: str) -> None:
        """A :class:`ModelError` naming ``source`` and the first weight that holds a NaN or an infinity. A tensor's
        sum is finite when every weight is (a tenth of the time of checking each); only a sum that is not (a NaN,
        an infinity, or finite weights that overflow) is checked weight by weight."""
        for name, tensor in self.state_dict().items():
            if not tensor.is_floating_point() or math.isfinite(float(tensor.sum())):
                continue
            if not bool(torch.isfinite(tensor).all()):
                raise models.ModelError(f"{source}: weight {name} holds NaN or infinite values; refused")

    def save(self, folder: Path) -> None:
        """Write a sentence-transformers folder (Transformer, Pooling, [Dense], [Normalize]; safetensors)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(folder, safe_serialization=True)
        self._loaded_settings.restore(self.tokenizer)
        self.tokenizer.save_pretrained(folder)
        config = SentenceBertConfig(max_seq_length=self.max_seq_length)
        (folder / "sentence_bert_config.json").write_text(json.dumps(config.model_dump()))
        self.pooling.save(folder / "1_Pooling", self.transformer.config.hidden_size)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        if self.dense is not None:
            self.dense.save(folder / "2_Dense")
            modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        if self.normalize:
            index = len(modules)
            path, kind = f"{index}_Normalize", "sentence_transformers.models.Normalize"
            modules.append({"idx": index, "name": str(index), "path": path, "type": kind})
        (folder / "modules.json").write_text(json.dumps(modules, indent=2))

    @property
    def dim(self) -> int:
        return self.dense.linear.out_features if self.dense else self.transformer.config.hidden_size

    def encode(
        self, texts: list[str], batch_size: int = 64, dtype: Choice = "fp32", on_rows: OnRows | None = None
    ) -> np.ndarray:
        """Embeddings of ``texts`` (float32, input order); ``on_rows(n)`` is told of each batch of n done
        (e.g. :meth:`tasks.core.progress.Progress.update`)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for positions, batch in device_batches(self.tokenizer, texts, self.max_seq_length, batch_size, self.device):
                out[positions] = self.forward(batch, dtype).cpu().numpy()
                if on_rows is not None:
                    on_rows(len(positions))
        return out

    def forward(self, batch: dict[str, torch.Tensor], dtype: Choice = "fp32") -> torch.Tensor:
        """Pooled (and projected, normalised) embeddings of one tokenised batch; differentiable. ``auto``:
        :func:`tasks.ml.precision.resolve` on this encoder's device."""
        dtype = precision.resolve(dtype, self.device.type)
        autocast = torch.autocast(self.device.type, dtype=_AUTOCAST.get(dtype, torch.float32), enabled=dtype != "fp32")
        with autocast:
            hidden = self.transformer(**batch).last_hidden_state
        embeddings = self.pooling(hidden, batch["attention_mask"])
        if self.dense is not None:
            embeddings = self.dense(embeddings)
        if self.normalize:
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        return embeddings

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_seq_length, return_tensors="pt"
        )
        return {k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}


# Lists of at most this many sentences keep their batches for the next encoder of the same tokenizer (up to
# KEPT_LISTS lists): a validation scores each STS pair set with the student, its baseline and the teacher's members.
KEPT_TEXTS, KEPT_LISTS = 20_000, 8
_kept_batches: dict[tuple[Any, ...], list[tuple[np.ndarray, Any]]] = {}


def device_batches(
    tokenizer: Any, texts: list[str], max_length: int, batch_size: int, device: torch.device
) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """:func:`length_batches` of ``texts`` as a model's input on ``device``: each batch's positions in ``texts``
    and its ``input_ids`` and ``attention_mask`` tensors."""
    for positions, padded in length_batches(tokenizer, texts, max_length, batch_size, "pt"):
        yield positions, {name: padded[name].to(device) for name in ("input_ids", "attention_mask")}


def length_batches(
    tokenizer: Any, texts: list[str], max_length: int, batch_size: int, tensors: str
) -> Iterator[tuple[np.ndarray, Any]]:
    """Batches of similar token length (longest first), so padding is minimal: each batch's positions in
    ``texts`` and its padded ``input_ids`` and ``attention_mask`` (``tensors``: "pt" or "np"). The batches of a
    short list are kept (``KEPT_TEXTS``), for the same list and a tokenizer of the same definition."""
    definition = _definition(tokenizer)
    if definition is None or len(texts) > KEPT_TEXTS:
        return _length_batches(tokenizer, texts, max_length, batch_size, tensors)
    key = (definition, max_length, batch_size, tensors, tuple(texts))
    if key not in _kept_batches:
        while len(_kept_batches) >= KEPT_LISTS:
            del _kept_batches[next(iter(_kept_batches))]
        _kept_batches[key] = list(_length_batches(tokenizer, texts, max_length, batch_size, tensors))
    return iter(_kept_batches[key])


def _length_batches(
    tokenizer: Any, texts: list[str], max_length: int, batch_size: int, tensors: str
) -> Iterator[tuple[np.ndarray, Any]]:
    encoded = tokenizer(texts, truncation=True, max_length=max_length, return_attention_mask=False).input_ids
    order = np.argsort([-len(ids) for ids in encoded], kind="stable")
    for start in range(0, len(order), batch_size):
        positions = order[start : start + batch_size]
        yield positions, tokenizer.pad({"input_ids": [encoded[i] for i in positions]}, return_tensors=tensors)


def _definition(tokenizer: Any) -> tuple[str, Any, str] | None:
    """What a fast tokenizer does (its serialised definition's digest, its padding token and side), computed once
    per tokenizer; None for another kind."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    if not hasattr(tokenizer, "_hpd_definition"):
        digest = hashlib.sha256(backend.to_str().encode()).hexdigest()
        tokenizer._hpd_definition = (digest, tokenizer.pad_token_id, tokenizer.padding_side)
    return tokenizer._hpd_definition


def transformer_folder(spec: str) -> Path:
    """Where model ``spec``'s transformer (config, weights, tokenizer) lies."""
    folder = models.resolve(spec)
    return folder / Modules.read(folder).transformer
