"""A student as one ONNX graph for serving: transformer, pooling, Dense head (and normalisation) together.

:func:`export` traces a :class:`~tasks.ml.encoder.SentenceEncoder` with PyTorch's TorchScript-based ONNX
exporter (opset 17; ``input_ids`` and ``attention_mask`` in, ``sentence_embedding`` out, batch and sequence
lengths dynamic). ``int8`` then quantises the weights of its matrix products (per output channel, 7 bits)
with ONNX Runtime's dynamic quantisation (activations are quantised on the fly), and is kept only if it scores within
:data:`MAX_INT8_LOSS` of the PyTorch model on the STS dev sets; otherwise the fp32 graph is kept. The graph
lives in the exported sentence-transformers folder (``onnx/``), beside the weights it was traced from.
The transformer is traced with its eager attention, whose MatMul/Softmax pattern ONNX Runtime's BERT fusions
recognise, and the traced graph is fused (attention, embedding + LayerNorm, skip + LayerNorm, bias + GELU)
before it is quantised; a fusion that fails, or moves an embedding by more than :data:`FUSED_ATOL`, is dropped.
:class:`OnnxEncoder` runs it with ONNX Runtime and encodes as ``SentenceEncoder.encode`` does (same tokenizer,
same length limit, batches of similar length), tokenising one query with its own copy of the fast tokenizer's
backend.
"""

from __future__ import annotations

import copy
import logging
import math
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from tasks.ml import models, sts
from tasks.ml.encoder import SentenceBertConfig, SentenceEncoder, length_batches, read_config

Variant = Literal["fp32", "int8"]
INT8_GRAPH = "encoder_int8.onnx"  # the int8 graph's file name
FILES: dict[Variant, str] = {"int8": f"onnx/{INT8_GRAPH}", "fp32": "onnx/encoder.onnx"}
MAX_INT8_LOSS = 0.3  # STS dev points (mean of STS-B dev and SICK-R dev, Spearman x100) int8 may lose
OPSET = 17
TRACED = "traced.onnx"  # the unfused graph's file name in build_graphs' scratch folder
FUSED_ATOL = 1e-4  # the largest |difference| a fused fp32 graph may show from the traced one (_CHECK_TEXTS)
_CHECK_TEXTS = [
    "a sentence to trace the graph with",
    "x",
    "a considerably longer sentence, with punctuation and numbers like 1,626.49, to check the fused graph on",
]

log = logging.getLogger(__name__)


class _Graph(torch.nn.Module):
    """The encoder's forward pass on the two tensors a tokenizer gives: what the exporter traces."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        embeddings: torch.Tensor = self.encoder({"input_ids": input_ids, "attention_mask": attention_mask})
        return embeddings


@dataclass(frozen=True)
class StsScores:
    """STS dev scores (:func:`tasks.ml.sts.dev_score`) of the PyTorch model and of each graph tried."""

    pytorch: float
    fp32: float
    int8: float | None = None

    @property
    def int8_loss(self) -> float:
        """The points the int8 graph loses to the PyTorch model (infinite when none was tried)."""
        return math.inf if self.int8 is None else self.pytorch - self.int8

    def as_record(self) -> dict[str, float]:
        """The scores as published, to 2 decimals: ``torch``, then each graph tried by its variant."""
        scores = {"torch": self.pytorch, "fp32": self.fp32, "int8": self.int8}
        return {name: round(score, 2) for name, score in scores.items() if score is not None}


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export` wrote: the graph's file in the folder, its variant and the one asked for, whether
    it is fused, the int8 bound it was held to, and the STS dev scores."""

    file: str
    variant: Variant
    asked: Variant
    fused: bool
    max_int8_loss: float
    sts_dev: StsScores

    def as_record(self) -> dict[str, Any]:
        """The record the distillation run publishes (``onnx`` in its stats and metrics)."""
        return {
            "file": self.file,
            "variant": self.variant,
            "asked": self.asked,
            "fused": self.fused,
            "max_int8_loss": self.max_int8_loss,
            "sts_dev": self.sts_dev.as_record(),
        }


@dataclass(frozen=True)
class Graphs:
    """The graphs :func:`build_graphs` writes: fp32 (fused, or as traced when the fusions do not hold) and, when
    asked for, its int8 quantisation."""

    fp32: Path
    int8: Path | None = None

    @property
    def fused(self) -> bool:
        """Whether the fp32 graph is the fused one."""
        return self.fp32.name != TRACED

    def items(self) -> list[tuple[Variant, Path]]:
        """Each graph with its variant, fp32 first."""
        return [("fp32", self.fp32)] if self.int8 is None else [("fp32", self.fp32), ("int8", self.int8)]

    def scores(self, encoder: SentenceEncoder, pytorch: float) -> StsScores:
        """The STS dev score of each graph, encoding as ``encoder`` does, beside ``pytorch``, the encoder's."""

        def score(graph: Path) -> float:
            return sts.dev_score(OnnxEncoder(graph, encoder.tokenizer, encoder.max_seq_length).encode)

        return StsScores(pytorch, score(self.fp32), None if self.int8 is None else score(self.int8))


def export(encoder: SentenceEncoder, folder: Path, variant: Variant) -> OnnxExport:
    """Write ``encoder`` (whose sentence-transformers folder is ``folder``) as an ONNX graph in ``folder``:
    ``variant``, or fp32 when int8 loses more than :data:`MAX_INT8_LOSS` on STS dev. What was written, with
    the STS dev scores of the PyTorch model and of each graph tried."""
    on_cpu = encoder if encoder.device.type == "cpu" else copy.deepcopy(encoder).cpu()
    training = on_cpu.training
    try:
        pytorch = sts.dev_score(on_cpu.eval().encode)
        with tempfile.TemporaryDirectory(prefix="hpd-onnx-") as scratch:
            graphs = build_graphs(on_cpu, Path(scratch), int8=variant == "int8")
            scores = graphs.scores(on_cpu, pytorch)
            kept: Variant = "int8" if variant == "int8" and scores.int8_loss <= MAX_INT8_LOSS else "fp32"
            if kept != variant:
                log.warning(
                    "onnx: int8 loses %.2f STS dev points, more than %s: fp32 kept", scores.int8_loss, MAX_INT8_LOSS
                )
            (folder / FILES[kept]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dict(graphs.items())[kept], folder / FILES[kept])
    finally:
        on_cpu.train(training)
    return OnnxExport(FILES[kept], kept, variant, graphs.fused, MAX_INT8_LOSS, scores)


def build_graphs(encoder: SentenceEncoder, scratch: Path, int8: bool) -> Graphs:
    """The graphs of ``encoder`` (on the CPU, in eval mode), written in ``scratch``: fp32 (fused when the fusions
    hold, else as traced, named :data:`TRACED`) and, with ``int8``, its dynamic int8 quantisation."""
    fp32 = _fused(encoder, _trace(encoder, scratch / TRACED), scratch / "encoder.onnx")
    return Graphs(fp32, _quantised(fp32) if int8 else None)


def _trace(encoder: SentenceEncoder, target: Path) -> Path:
    """The fp32 graph of ``encoder`` (in eval mode), written to ``target``; traced with the transformer's eager
    attention (the same arithmetic as SDPA, in the pattern :func:`_fused` recognises), then set back."""
    sample = encoder.tokenizer(["a sentence to trace the graph with"], return_tensors="pt")
    transformer: Any = encoder.transformer
    attention = getattr(transformer.config, "_attn_implementation", None)
    if attention not in (None, "eager"):
        transformer.set_attn_implementation("eager")
    try:
        _export(encoder, (sample.input_ids, sample.attention_mask), target)
    finally:
        if attention not in (None, "eager"):
            transformer.set_attn_implementation(attention)
    return target


def _export(encoder: SentenceEncoder, inputs: tuple[torch.Tensor, torch.Tensor], target: Path) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes: the shapes are dynamic
        torch.onnx.export(
            _Graph(encoder).train(encoder.training),  # the exporter sets the wrapper's mode back on all it holds
            inputs,  # input_ids, attention_mask
            str(target),
            dynamo=False,
            opset_version=OPSET,
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "sentence_embedding": {0: "batch"},
            },
        )


def _fused(encoder: SentenceEncoder, traced: Path, target: Path) -> Path:
    """``traced`` with ONNX Runtime's BERT fusions (``optimize_model``), written to ``target``; ``traced`` itself
    when the fusion fails or moves an embedding of :data:`_CHECK_TEXTS` by more than :data:`FUSED_ATOL`."""
    from onnxruntime.transformers.optimizer import optimize_model  # type: ignore[import-untyped]

    config: Any = getattr(encoder.transformer, "config", None)
    heads, hidden = getattr(config, "num_attention_heads", 0), getattr(config, "hidden_size", 0)
    try:
        optimize_model(str(traced), model_type="bert", num_heads=heads, hidden_size=hidden).save_model_to_file(
            str(target)
        )
        graphs = [OnnxEncoder(g, encoder.tokenizer, encoder.max_seq_length) for g in (traced, target)]
    except Exception as exc:  # an architecture the fusions do not know: the traced graph serves as it is
        log.warning("onnx: fusing the graph failed (%s): the unfused graph is kept", exc)
        return traced
    difference = float(np.abs(graphs[1].encode(_CHECK_TEXTS) - graphs[0].encode(_CHECK_TEXTS)).max())
    if difference > FUSED_ATOL:
        log.warning(
            "onnx: the fused graph differs by %.2g, more than %s: the unfused graph is kept", difference, FUSED_ATOL
        )
        return traced
    return target


def _quantised(traced: Path) -> Path:
    """``traced`` with int8 weights, one scale per output channel, in 7 bits (``reduce_range``: the u8 x s8
    products of CPUs without VNNI saturate with 8-bit weights), written beside it. On the demo student of 2ad5cf2
    (STS dev, mean of STS-B and SICK-R): fp32 82.67, one scale per matrix 82.31, per channel 82.53, per channel
    in 7 bits 82.56."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic  # type: ignore[import-untyped]

    target = traced.with_name(INT8_GRAPH)
    # DefaultTensorType: shape inference does not type the outputs of the fused (com.microsoft) operators
    quantize_dynamic(
        str(traced),
        str(target),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=True,
        extra_options={"DefaultTensorType": TensorProto.FLOAT},
    )
    return target


def exported_graph(folder: Path) -> Path | None:
    """The ONNX graph an exported student folder holds (int8 first), or None."""
    return next((folder / name for name in FILES.values() if (folder / name).is_file()), None)


class OnnxEncoder:
    """An ONNX graph of a student, run by ONNX Runtime; encodes like :meth:`SentenceEncoder.encode`.

    Tokenises one query with a private copy of the fast tokenizer's backend, truncating at ``max_seq_length``
    and never padding: no per-call settings through ``transformers``, and, as nothing changes the copy after
    it is made, safe to share between threads. ``threads``: ONNX Runtime's
    intra-op threads (:func:`session_options`)."""

    def __init__(self, graph: Path, tokenizer: Any, max_seq_length: int, threads: int | None = None) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]

        self.graph, self.tokenizer, self.max_seq_length = graph, tokenizer, max_seq_length
        self.session = ort.InferenceSession(str(graph), session_options(threads), providers=["CPUExecutionProvider"])
        self.dim = int(self.session.get_outputs()[0].shape[1])
        self.backend = _truncating_backend(tokenizer, max_seq_length)
        self.pad_id = int(tokenizer.pad_token_id or 0)

    @classmethod
    def load(cls, folder: Path, threads: int | None = None) -> OnnxEncoder:
        """The graph of an exported student folder (:func:`exported_graph`), with the folder's tokenizer."""
        from transformers import AutoTokenizer

        graph = exported_graph(folder)
        if graph is None:
            raise FileNotFoundError(f"{folder}: no ONNX graph ({' or '.join(FILES.values())})")
        path = folder / "sentence_bert_config.json"
        max_seq_length = read_config(path, SentenceBertConfig).max_seq_length
        if max_seq_length is None:
            raise models.ModelError(f"{path}: no max_seq_length")
        return cls(graph, AutoTokenizer.from_pretrained(folder), max_seq_length, threads)

    @property
    def encodes_one_thread_safely(self) -> bool:
        """Whether one query may be encoded from any thread without a lock: it is tokenised by the private backend
        copy (when the tokenizer has one) and run by the session, both safe to share between threads."""
        return self.backend is not None

    @property
    def variant(self) -> str:
        return "int8" if self.graph.name == INT8_GRAPH else "fp32"

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``texts`` (float32, input order)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for positions, batch in self.batches(texts, batch_size):
            out[positions] = self.session.run(None, batch)[0]
        return out

    def batches(self, texts: list[str], batch_size: int) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """:func:`length_batches` of ``texts``, each with its positions in ``texts`` and its padded
        ``input_ids`` and ``attention_mask`` (int64, the graph's input type); one query (a service's usual
        call) straight from the tokenizer's backend, neither sorted nor padded."""
        if len(texts) == 1 and self.backend is not None:
            ids = np.array([self.backend.encode(texts[0]).ids], dtype=np.int64)
            yield np.zeros(1, dtype=np.intp), {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            return
        for positions, padded in length_batches(self.tokenizer, texts, self.max_seq_length, batch_size, "np"):
            yield positions, {name: padded[name].astype(np.int64) for name in ("input_ids", "attention_mask")}


def session_options(threads: int | None = None) -> Any:
    """ONNX Runtime's options for a query encoder: every graph optimisation, ``threads`` intra-op threads
    (ONNX Runtime's default, one per physical core, when None). On 2 cores one query (MiniLM-L6, int8) takes
    7.3 ms with the default 2 threads, 12.8 ms with 1; turning spinning off, stopping it after each run,
    a smaller dynamic block base or a pre-optimised graph file changed nothing measurable."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    return options


def _truncating_backend(tokenizer: Any, max_length: int) -> Any:
    """A copy of ``tokenizer``'s fast backend (a ``tokenizers.Tokenizer``) that truncates at ``max_length`` and
    does not pad, as ``tokenizer(texts, truncation=True, max_length=max_length)`` encodes; None without one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    own.enable_truncation(max_length)
    own.no_padding()
    return own
