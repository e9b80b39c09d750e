"""The student as one ONNX graph: traced from the PyTorch encoder, int8 kept only within the STS bound."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tasks.ml import models, onnx_encoder
from tasks.ml.encoder import Dense, SentenceEncoder
from tasks.ml.onnx_encoder import OnnxEncoder
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

TEXTS = [
    "a short one",
    "a considerably longer sentence with many more tokens than the others, and then a few more words",
    "x",
    "mid length text of a kind",
]


def _ops(graph: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(graph)).graph.node}


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
    assert record.file == "onnx/encoder.onnx" and record.variant == "fp32" and record.fused
    assert record.sts_dev.fp32 == pytest.approx(record.sts_dev.pytorch, abs=0.01) and record.sts_dev.int8 is None
    assert list(record.as_record()) == ["file", "variant", "asked", "fused", "max_int8_loss", "sts_dev"]
    assert list(record.as_record()["sts_dev"]) == ["torch", "fp32"]
    # fused: attention, embeddings + LayerNorm, residual + LayerNorm, bias + GELU each one operator
    fused = {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"}
    assert fused <= _ops(folder / record.file) and "Softmax" not in _ops(folder / record.file)
    assert encoder.transformer.config._attn_implementation == "sdpa"  # traced with eager attention, then set back
    graph = OnnxEncoder.load(folder)
    assert graph.variant == "fp32" and graph.dim == 16
    for batch_size in (1, 3):
        np.testing.assert_allclose(graph.encode(TEXTS, batch_size), encoder.encode(TEXTS), atol=1e-5)


def test_int8_is_kept_within_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_encoder, "MAX_INT8_LOSS", float("inf"))
    encoder, folder = _student(tmp_path)
    record = onnx_encoder.export(encoder, folder, "int8")
    assert record.variant == "int8" and list(record.as_record()["sts_dev"]) == ["torch", "fp32", "int8"]
    assert not (folder / onnx_encoder.FILES["fp32"]).exists()
    assert record.fused and {"QAttention", "DynamicQuantizeLinear"} <= _ops(folder / record.file)
    _assert_weights_per_channel_in_7_bits(folder / record.file)
    graph = OnnxEncoder.load(folder)
    assert graph.variant == "int8"
    int8, fp32 = graph.encode(TEXTS), encoder.encode(TEXTS)
    cosine = (int8 * fp32).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(fp32, axis=1)
    assert (cosine > 0.9).all() and not np.allclose(int8, fp32, atol=1e-5)


def _assert_weights_per_channel_in_7_bits(graph: Path) -> None:
    """Every int8 weight matrix has one scale per output column and values in [-64, 64]."""
    arrays = {init.name: onnx.numpy_helper.to_array(init) for init in onnx.load(str(graph)).graph.initializer}
    weights = {name: a for name, a in arrays.items() if name.endswith("_quantized") and a.dtype == np.int8}
    assert len(weights) >= 2 * 2 + 1  # per layer the attention's and the feed-forward's; the Dense head
    for name, weight in weights.items():
        assert arrays[name.removesuffix("_quantized") + "_scale"].shape == (weight.shape[1],), name
        assert np.abs(weight.astype(int)).max() <= 64, name


def test_int8_beyond_the_bound_falls_back_to_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(onnx_encoder, "MAX_INT8_LOSS", -1000.0)
    encoder, folder = _student(tmp_path)
    with caplog.at_level(logging.WARNING, logger=onnx_encoder.__name__):
        record = onnx_encoder.export(encoder, folder, "int8")
    assert record.variant == "fp32" and record.asked == "int8"
    assert onnx_encoder.exported_graph(folder) == folder / "onnx/encoder.onnx"
    assert "fp32 kept" in caplog.text


def test_export_leaves_a_training_student_in_training_mode(tmp_path: Path) -> None:
    encoder, folder = _student(tmp_path)
    onnx_encoder.export(encoder.train(), folder, "fp32")
    assert encoder.training


@pytest.mark.parametrize("training", [False, True])
def test_building_the_graphs_keeps_the_students_mode(tmp_path: Path, training: bool) -> None:
    encoder, _ = _student(tmp_path)
    graphs = onnx_encoder.build_graphs(encoder.train(training), tmp_path, int8=True)
    assert [variant for variant, _ in graphs.items()] == ["fp32", "int8"] and encoder.training is training
    assert all(m.training is training for m in encoder.modules())


def test_a_folder_without_a_graph_is_refused_by_name(tmp_path: Path) -> None:
    _, folder = _student(tmp_path)
    assert onnx_encoder.exported_graph(folder) is None
    with pytest.raises(FileNotFoundError, match=str(folder)):
        OnnxEncoder.load(folder)


@pytest.mark.parametrize("config", ["{}", '{"max_seq_length": "long"}', "not json"])
def test_a_folder_without_a_length_limit_is_refused_naming_its_config(tmp_path: Path, config: str) -> None:
    _, folder = _student(tmp_path)
    (folder / onnx_encoder.FILES["fp32"]).parent.mkdir()
    (folder / onnx_encoder.FILES["fp32"]).write_bytes(b"")
    (folder / "sentence_bert_config.json").write_text(config)
    with pytest.raises(models.ModelError, match=re.escape(str(folder / "sentence_bert_config.json"))):
        OnnxEncoder.load(folder)


def test_a_fused_graph_beyond_the_tolerance_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(onnx_encoder, "FUSED_ATOL", -1.0)  # no fused graph can be that close
    encoder, folder = _student(tmp_path)
    with caplog.at_level(logging.WARNING, logger=onnx_encoder.__name__):
        record = onnx_encoder.export(encoder, folder, "fp32")
    assert not record.fused and "unfused graph is kept" in caplog.text
    assert "Attention" not in _ops(folder / record.file) and "Softmax" in _ops(folder / record.file)
    np.testing.assert_allclose(OnnxEncoder.load(folder).encode(TEXTS), encoder.encode(TEXTS), atol=1e-5)


def test_batches_tokenise_as_the_transformers_tokenizer(tmp_path: Path) -> None:
    encoder, folder = _student(tmp_path)
    onnx_encoder.export(encoder, folder, "fp32")
    graph = OnnxEncoder.load(folder)
    texts = [*TEXTS, "word " * 200, "Ünïcödé café “quotes”"]  # one beyond max_seq_length (64): truncated
    expected = encoder.tokenizer(texts, truncation=True, max_length=graph.max_seq_length)
    for batch_size in (1, 2, 64):
        seen = 0
        for positions, batch in graph.batches(texts, batch_size):
            assert batch["input_ids"].dtype == np.int64 and batch["attention_mask"].dtype == np.int64
            for row, position in enumerate(positions):
                length = len(expected["input_ids"][position])
                assert batch["input_ids"][row, :length].tolist() == expected["input_ids"][position]
                assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (
                    batch["input_ids"].shape[1] - length
                )
            seen += len(positions)
        assert seen == len(texts)
    for text, ids in zip(texts, expected["input_ids"], strict=True):  # one query: the backend's, unpadded
        (positions, single), *rest = list(graph.batches([text], 64))
        assert not rest and positions.tolist() == [0] and single["attention_mask"].all()
        assert single["input_ids"][0].tolist() == ids
    assert max(len(ids) for ids in expected["input_ids"]) == graph.max_seq_length


def test_encoding_from_several_threads_at_once_matches_one_at_a_time(tmp_path: Path) -> None:
    encoder, folder = _student(tmp_path)
    onnx_encoder.export(encoder, folder, "fp32")
    graph = OnnxEncoder.load(folder)
    expected = [graph.encode([text]) for text in TEXTS]
    failures: list[str] = []

    def worker() -> None:
        for _ in range(20):
            for text, vector in zip(TEXTS, expected, strict=True):
                if not np.array_equal(graph.encode([text]), vector):
                    failures.append(text)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
