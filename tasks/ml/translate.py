"""Batched translation with a local seq2seq model folder (MarianMT or any Hugging Face seq2seq model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from tasks.ml import models


@dataclass
class Translator:
    name: str
    tokenizer: object
    model: torch.nn.Module
    batch_size: int
    beams: int
    max_tokens: int

    @classmethod
    def load(cls, spec: str, batch_size: int = 16, beams: int = 1, max_tokens: int = 128) -> Translator:
        folder = models.resolve(spec)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        return cls(Path(folder).name, tokenizer, model, batch_size, beams, max_tokens)

    def translate(self, texts: list[str]) -> list[str]:
        """Translations in input order; batches hold texts of similar length."""
        out: list[str] = [""] * len(texts)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                positions = order[start : start + self.batch_size]
                batch = self.tokenizer(
                    [texts[i] for i in positions],
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    return_tensors="pt",
                )
                generated = self.model.generate(
                    **batch, num_beams=self.beams, do_sample=False, max_new_tokens=self.max_tokens
                )
                for i, text in zip(
                    positions, self.tokenizer.batch_decode(generated, skip_special_tokens=True), strict=True
                ):
                    out[i] = text
        return out
