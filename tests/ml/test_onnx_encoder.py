"""The student as one ONNX graph: traced from the PyTorch encoder, int8 kept only within the STS bound."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.ml import onnx_encoder
from tasks.ml.encoder import Dense, SentenceEncoder
from tasks.ml.onnx_encoder import OnnxEncoder
from tests.support.tiny_models import build_sentence_model

TEXTS = [
    "a short one",
    "a considerably longer sentence with many more tokens than the others, and then a few more words",
    "x",
    "mid length text of a kind",
]


def _student(tmp_path: Path) -> tuple[SentenceEncoder, Path]:
    """A tiny student with a Dense(16, tanh) head, saved as our exports are."""
    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "base", normalize=False)))
    torch.manual_seed(1)
    encoder.dense = Dense(32, 16)
    folder = tmp_path / "model"
    encoder.save(folder)
    return encoder.eval(), folder


def test_the_fp32_graph_encodes_as_the_pytorch_student(tmp_path: Path) -> None:
    encoder, folder = _student(tmp_path)
    record = onnx_encoder.export(encoder, folder, "fp32")
    assert record["file"] == "onnx/encoder.onnx" and record["variant"] == "fp32"
    assert record["sts_dev"]["fp32"] == pytest.approx(record["sts_dev"]["torch"], abs=0.01)
    graph = OnnxEncoder.load(folder)
    assert graph.variant == "fp32" and graph.dim == 16
    for batch_size in (1, 3):
        np.testing.assert_allclose(graph.encode(TEXTS, batch_size), encoder.encode(TEXTS), atol=1e-5)


def test_int8_is_kept_within_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_encoder, "MAX_INT8_LOSS", float("inf"))
    encoder, folder = _student(tmp_path)
    record = onnx_encoder.export(encoder, folder, "int8")
    assert record["variant"] == "int8" and set(record["sts_dev"]) == {"torch", "fp32", "int8"}
    assert not (folder / onnx_encoder.FILES["fp32"]).exists()
    graph = OnnxEncoder.load(folder)
    assert graph.variant == "int8"
    int8, fp32 = graph.encode(TEXTS), encoder.encode(TEXTS)
    cosine = (int8 * fp32).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(fp32, axis=1)
    assert (cosine > 0.9).all() and not np.allclose(int8, fp32, atol=1e-5)


def test_int8_beyond_the_bound_falls_back_to_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(onnx_encoder, "MAX_INT8_LOSS", -1000.0)
    encoder, folder = _student(tmp_path)
    with caplog.at_level(logging.WARNING, logger=onnx_encoder.__name__):
        record = onnx_encoder.export(encoder, folder, "int8")
    assert record["variant"] == "fp32" and record["asked"] == "int8"
    assert onnx_encoder.exported_graph(folder) == folder / "onnx/encoder.onnx"
    assert "fp32 kept" in caplog.text


def test_export_leaves_a_training_student_in_training_mode(tmp_path: Path) -> None:
    encoder, folder = _student(tmp_path)
    onnx_encoder.export(encoder.train(), folder, "fp32")
    assert encoder.training


def test_a_folder_without_a_graph_is_refused_by_name(tmp_path: Path) -> None:
    _, folder = _student(tmp_path)
    assert onnx_encoder.exported_graph(folder) is None
    with pytest.raises(FileNotFoundError, match=str(folder)):
        OnnxEncoder.load(folder)
