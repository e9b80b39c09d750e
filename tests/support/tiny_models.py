"""Tiny randomly initialised models with a real tokenizer, built locally for fast tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from tasks.ml import models


def build_sentence_model(
    path: Path, hidden: int = 32, layers: int = 2, seed: int = 0, normalize: bool = True, pooling: str = "mean"
) -> Path:
    """A sentence-transformers folder: random tiny BERT + pooling (+ Normalize), MiniLM's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(models.resolve(models.DEFAULT_STUDENT))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": pooling == "max",
            }
        )
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    return path


def build_marian(path: Path, corpus: list[str], seed: int = 0) -> Path:
    """A tiny random MarianMT folder with a real SentencePiece tokenizer trained on ``corpus``."""
    import sentencepiece
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    path.mkdir(parents=True, exist_ok=True)
    (path / "corpus.txt").write_text("\n".join(corpus))
    sentencepiece.SentencePieceTrainer.train(
        input=str(path / "corpus.txt"),
        model_prefix=str(path / "sp"),
        vocab_size=150,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path / "sp.model"))
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    vocab["<pad>"] = len(vocab)
    (path / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = MarianTokenizer(
        vocab=str(path / "vocab.json"),
        source_spm=str(path / "sp.model"),
        target_spm=str(path / "sp.model"),
        source_lang="en",
        target_lang="xx",
    )
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=vocab["</s>"],
    )
    torch.manual_seed(seed)
    MarianMTModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
