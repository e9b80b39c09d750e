"""A student as one ONNX graph for serving: transformer, pooling, Dense head (and normalisation) together.

:func:`export` traces a :class:`~tasks.ml.encoder.SentenceEncoder` with PyTorch's TorchScript-based ONNX
exporter (opset 17; ``input_ids`` and ``attention_mask`` in, ``sentence_embedding`` out, batch and sequence
lengths dynamic). ``int8`` then quantises the weights of its matrix products with ONNX Runtime's dynamic
quantisation (activations are quantised on the fly), and is kept only if it scores within
:data:`MAX_INT8_LOSS` of the PyTorch model on the STS dev sets; otherwise the fp32 graph is kept. The graph
lives in the exported sentence-transformers folder (``onnx/``), beside the weights it was traced from.
:class:`OnnxEncoder` runs it with ONNX Runtime and encodes as ``SentenceEncoder.encode`` does (same tokenizer,
same length limit, batches of similar length).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from tasks.ml import sts
from tasks.ml.encoder import SentenceEncoder, length_batches

Variant = Literal["fp32", "int8"]
FILES: dict[Variant, str] = {"int8": "onnx/encoder_int8.onnx", "fp32": "onnx/encoder.onnx"}
MAX_INT8_LOSS = 0.3  # STS dev points (mean of STS-B dev and SICK-R dev, Spearman x100) int8 may lose
OPSET = 17

log = logging.getLogger(__name__)


class _Graph(torch.nn.Module):
    """The encoder's forward pass on the two tensors a tokenizer gives: what the exporter traces."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder({"input_ids": input_ids, "attention_mask": attention_mask})


def export(encoder: SentenceEncoder, folder: Path, variant: Variant) -> dict[str, Any]:
    """Write ``encoder`` (whose sentence-transformers folder is ``folder``) as an ONNX graph in ``folder``:
    ``variant``, or fp32 when int8 loses more than :data:`MAX_INT8_LOSS` on STS dev. What was written, with
    the STS dev scores of the PyTorch model and of each graph tried."""
    on_cpu = encoder if encoder.device.type == "cpu" else copy.deepcopy(encoder).cpu()
    training = on_cpu.training
    try:
        scores = {"torch": sts.dev_score(on_cpu.eval().encode)}
        with tempfile.TemporaryDirectory(prefix="hpd-onnx-") as scratch:
            graphs = {"fp32": _trace(on_cpu, Path(scratch) / "encoder.onnx")}
            if variant == "int8":
                graphs["int8"] = _quantised(graphs["fp32"])
            for name, graph in graphs.items():
                scores[name] = sts.dev_score(OnnxEncoder(graph, on_cpu.tokenizer, on_cpu.max_seq_length).encode)
            kept: Variant = (
                "int8" if variant == "int8" and scores["torch"] - scores["int8"] <= MAX_INT8_LOSS else "fp32"
            )
            if kept != variant:
                log.warning(
                    "onnx: int8 loses %.2f STS dev points, more than %s: fp32 kept",
                    scores["torch"] - scores["int8"],
                    MAX_INT8_LOSS,
                )
            (folder / FILES[kept]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(graphs[kept], folder / FILES[kept])
    finally:
        on_cpu.train(training)
    rounded = {name: round(score, 2) for name, score in scores.items()}
    return {"file": FILES[kept], "variant": kept, "asked": variant, "max_int8_loss": MAX_INT8_LOSS, "sts_dev": rounded}


def _trace(encoder: SentenceEncoder, target: Path) -> Path:
    """The fp32 graph of ``encoder`` (in eval mode), written to ``target``."""
    sample = encoder.tokenize(["a sentence to trace the graph with"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes: the shapes are dynamic
        torch.onnx.export(
            _Graph(encoder),
            (sample["input_ids"], sample["attention_mask"]),
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
    return target


def _quantised(traced: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = traced.with_name("encoder_int8.onnx")
    quantize_dynamic(str(traced), str(target), weight_type=QuantType.QInt8)
    return target


def exported_graph(folder: Path) -> Path | None:
    """The ONNX graph an exported student folder holds (int8 first), or None."""
    return next((folder / name for name in FILES.values() if (folder / name).is_file()), None)


class OnnxEncoder:
    """An ONNX graph of a student, run by ONNX Runtime; encodes like :meth:`SentenceEncoder.encode`."""

    def __init__(self, graph: Path, tokenizer: Any, max_seq_length: int, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.graph, self.tokenizer, self.max_seq_length = graph, tokenizer, max_seq_length
        self.session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        self.dim = int(self.session.get_outputs()[0].shape[1])

    @classmethod
    def load(cls, folder: Path, threads: int | None = None) -> OnnxEncoder:
        """The graph of an exported student folder (:func:`exported_graph`), with the folder's tokenizer."""
        from transformers import AutoTokenizer

        graph = exported_graph(folder)
        if graph is None:
            raise FileNotFoundError(f"{folder}: no ONNX graph ({' or '.join(FILES.values())})")
        config = json.loads((folder / "sentence_bert_config.json").read_text())
        return cls(graph, AutoTokenizer.from_pretrained(folder), int(config["max_seq_length"]), threads)

    @property
    def variant(self) -> str:
        return "int8" if self.graph.name == Path(FILES["int8"]).name else "fp32"

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``texts`` (float32, input order)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for positions, padded in length_batches(self.tokenizer, texts, self.max_seq_length, batch_size, "np"):
            batch = {name: padded[name].astype(np.int64) for name in ("input_ids", "attention_mask")}
            out[positions] = self.session.run(None, batch)[0]
        return out
