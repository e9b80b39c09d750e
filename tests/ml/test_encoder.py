import json
import re

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from tasks.ml import encoder, models, precision
from tasks.ml.encoder import Dense, SentenceEncoder
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

TEXTS = [
    "a short one",
    "a considerably longer sentence with many more tokens than the others",
    "mid length text",
    "x",
    "another sentence of middling length here",
]


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_matches_sentence_transformers_in_input_order(tmp_path, pooling):
    folder = build_sentence_model(tmp_path / "m", pooling=pooling, normalize=pooling == "mean")
    ours = SentenceEncoder.load(str(folder)).encode(TEXTS, batch_size=2)
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, batch_size=2)
    assert ours.dtype == np.float32 and ours.shape == (5, 32)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_bf16_autocast_stays_close_to_fp32(tmp_path):
    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "m")))
    fp32, bf16 = encoder.encode(TEXTS), encoder.encode(TEXTS, dtype="bf16")
    assert ((fp32 * bf16).sum(axis=1) > 0.99).all()
    assert not np.array_equal(fp32, bf16)


def test_batching_does_not_change_embeddings(tmp_path):
    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "m")))
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=1), encoder.encode(TEXTS, batch_size=5), atol=1e-5)


def test_a_second_encoder_of_the_same_tokenizer_reuses_the_batches_and_encodes_the_same(tmp_path, monkeypatch):
    first = SentenceEncoder.load(str(build_sentence_model(tmp_path / "a")))
    second = SentenceEncoder.load(str(build_sentence_model(tmp_path / "b", seed=1)))
    texts = [f"{text} {tmp_path.name} {n}" for n in range(3) for text in TEXTS]  # a list no other test encodes
    made = list(encoder.length_batches(first.tokenizer, texts, first.max_seq_length, 4, "pt"))
    kept = list(encoder.length_batches(second.tokenizer, texts, second.max_seq_length, 4, "pt"))
    assert len(kept) == 4 and all(k[1] is m[1] for k, m in zip(kept, made, strict=True))  # the same batches
    shorter = list(encoder.length_batches(second.tokenizer, texts, 8, 4, "pt"))  # other settings: made anew
    assert shorter[0][1]["input_ids"].shape[1] == 8 < made[0][1]["input_ids"].shape[1]
    embeddings = second.encode(texts, batch_size=4)
    monkeypatch.setattr(encoder, "KEPT_TEXTS", 0)  # nothing kept: every batch tokenised again
    np.testing.assert_array_equal(second.encode(texts, batch_size=4), embeddings)


def test_only_missing_weights_that_matter_are_reported(tmp_path, caplog, capfd):
    """A checkpoint without its pooler head (as our exports are) loads quietly; one missing encoder
    weights warns, naming the folder and the keys."""
    from safetensors.torch import load_file, save_file

    folder = build_sentence_model(tmp_path / "model")
    weights = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if not k.startswith("pooler.")},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    with caplog.at_level("WARNING"):
        SentenceEncoder.load(str(folder))
    assert not caplog.records and "pooler" not in capfd.readouterr().err

    dropped = next(k for k in weights if "encoder.layer.1" in k)
    save_file(
        {k: v for k, v in weights.items() if k != dropped}, folder / "model.safetensors", metadata={"format": "pt"}
    )
    with caplog.at_level("WARNING"):
        SentenceEncoder.load(str(folder))
    (record,) = caplog.records
    assert str(folder) in record.getMessage() and dropped.removeprefix("bert.") in record.getMessage()


def test_auto_dtype_encodes_as_the_dtype_it_resolves_to(tmp_path, monkeypatch):
    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "m")))
    for native, same_as in ((False, "fp32"), (True, "bf16")):
        monkeypatch.setattr(precision, "native_bf16", lambda device, native=native: native)
        np.testing.assert_array_equal(encoder.encode(TEXTS, dtype="auto"), encoder.encode(TEXTS, dtype=same_as))


def test_a_saved_folder_keeps_the_sentence_transformers_configs(tmp_path):
    """The configs a save writes are sentence-transformers' own, byte for byte, and load back as they were."""
    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "m", normalize=False)))
    encoder.dense = Dense(32, 16, bias=False)
    encoder.save(tmp_path / "saved")
    saved = tmp_path / "saved"
    assert (saved / "sentence_bert_config.json").read_text() == '{"max_seq_length": 64, "do_lower_case": false}'
    assert (saved / "2_Dense" / "config.json").read_text() == (
        '{"in_features": 32, "out_features": 16, "bias": false, "activation_function": '
        '"torch.nn.modules.activation.Tanh"}'
    )
    loaded = SentenceEncoder.load(str(saved))
    assert loaded.dim == 16 and loaded.dense is not None and loaded.dense.linear.bias is None
    np.testing.assert_allclose(loaded.encode(TEXTS), encoder.encode(TEXTS), atol=1e-6)


def test_a_saved_tokenizer_is_as_loaded_whatever_was_encoded_before(tmp_path):
    """Encoding sets a fast tokenizer's padding and truncation; a save writes them as they were loaded, so an
    export does not depend on which calls came before it (a resumed distill run's encodes others)."""
    folder = build_sentence_model(tmp_path / "m")
    loaded = json.loads((folder / "tokenizer.json").read_text())
    encoder = SentenceEncoder.load(str(folder))
    encoder.tokenizer(TEXTS, padding="longest", truncation=True, max_length=7)
    encoder.tokenizer(TEXTS[:1])
    encoder.save(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "tokenizer.json").read_text())
    assert (saved["padding"], saved["truncation"]) == (loaded["padding"], loaded["truncation"])


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("modules.json", '[{"path": "", "type": "sentence_transformers.models.Transformer"}, {"path": "1_Pooling"}]'),
        ("sentence_bert_config.json", '{"max_seq_length": "long"}'),
        ("sentence_bert_config.json", '{"max_seq_length": 64,'),
        ("2_Dense/config.json", '{"out_features": 16}'),
    ],
)
def test_a_malformed_config_is_refused_naming_the_file(tmp_path, file, text):
    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "m", normalize=False)))
    encoder.dense = Dense(32, 16)
    encoder.save(tmp_path / "saved")
    (tmp_path / "saved" / file).write_text(text)
    with pytest.raises(models.ModelError, match=re.escape(str(tmp_path / "saved" / file))):
        SentenceEncoder.load(str(tmp_path / "saved"))


def test_weights_with_a_nan_are_refused_naming_the_folder_and_the_weight(tmp_path):
    import torch

    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "m", normalize=False)))
    encoder.dense = Dense(32, 16, bias=True)
    with torch.no_grad():
        encoder.dense.linear.bias[3] = float("inf")
    encoder.save(tmp_path / "saved")
    with pytest.raises(models.ModelError, match=f"^{re.escape(str(tmp_path / 'saved'))}: weight dense.linear.bias "):
        SentenceEncoder.load(str(tmp_path / "saved"))


def test_finite_weights_whose_sum_overflows_are_accepted_and_a_nan_among_them_is_not(tmp_path):
    import torch

    encoder = SentenceEncoder.load(str(build_sentence_model(tmp_path / "m", normalize=False)))
    encoder.dense = Dense(32, 16, bias=True)
    with torch.no_grad():
        encoder.dense.linear.bias[:] = 3e38  # each finite, their float32 sum infinite
    encoder.require_finite_weights("big")
    with torch.no_grad():
        encoder.dense.linear.bias[5] = float("nan")
    with pytest.raises(models.ModelError, match="^big: weight dense.linear.bias holds NaN"):
        encoder.require_finite_weights("big")
