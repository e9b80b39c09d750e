"""How a distillation run is scored: the student's validation MSE and mean cosine against the held-out targets
(and the STS-B dev score when the run selects on it), as a sentence-transformers evaluator that the trainer
runs on its schedule (:class:`FidelityEvaluator`), and the record of one evaluation (:class:`Evaluation`). The
sentences scored are the same at every evaluation, so their tokenised batches are kept from the first
(:func:`tasks.ml.encoder.device_batches`) and each evaluation runs only the model."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from sentence_transformers.sentence_transformer.evaluation import SentenceEvaluator

from tasks.ml import encoder, metrics, sts
from tasks.stages.distill.data import TrainingData

ENCODE_BATCH = 128
SCORES = ("val_mse", "val_cosine", "sts_dev")


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the weights at ``step`` (of a blend of them with the initial weights when ``blend``)."""

    step: int
    val_mse: float
    val_cosine: float = float("nan")
    sts_dev: float | None = None
    blend: float | None = None

    def score(self, select_on: str) -> float:
        """The score by ``select_on``, lower is better: val_mse, or minus sts_dev."""
        if select_on == "val_mse":
            return float(self.val_mse)
        if self.sts_dev is None:
            raise ValueError(f"evaluation at step {self.step} has no {select_on} score")
        return -float(self.sts_dev)

    def at(self, step: int, blend: float | None = None) -> Evaluation:
        """The same scores, recorded at ``step`` (and for ``blend``)."""
        return Evaluation(step, self.val_mse, self.val_cosine, self.sts_dev, blend)

    def as_record(self) -> dict[str, Any]:
        """The evaluation as the run's metrics, stats and model card write it (no absent score)."""
        blend = {} if self.blend is None else {"blend": self.blend}
        record = {"step": self.step, **blend, "val_mse": self.val_mse, "val_cosine": self.val_cosine}
        return record if self.sts_dev is None else {**record, "sts_dev": self.sts_dev}

    @classmethod
    def from_metrics(cls, step: int, metrics: dict[str, float], prefix: str = "eval_") -> Evaluation:
        """The evaluation in the metrics the trainer reports (each score's name with ``prefix``)."""
        scores = {name: metrics[prefix + name] for name in SCORES if prefix + name in metrics}
        return cls(step, **scores)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Evaluation:
        """The evaluation :meth:`as_record` wrote."""
        known = {field.name for field in fields(cls)}
        return cls(**{name: value for name, value in record.items() if name in known})


class FidelityEvaluator(SentenceEvaluator):
    """Scores a student on the run's validation rows: its metrics ``val_mse``, ``val_cosine`` and, when selecting
    on it, ``sts_dev``; the primary metric is the run's selection criterion."""

    def __init__(self, data: TrainingData, select_on: str) -> None:
        super().__init__()
        self.data, self.with_sts_dev = data, select_on == "sts_dev"
        self.primary_metric, self.greater_is_better = select_on, select_on == "sts_dev"

    def __call__(
        self, model: Any, output_path: str | None = None, epoch: float = -1, steps: int = -1
    ) -> dict[str, float]:
        scores = self.evaluate(model, steps).as_record()
        return {name: value for name, value in scores.items() if name != "step"}

    def evaluate(self, model: Any, step: int) -> Evaluation:
        """``model``'s scores (a ``SentenceTransformer``; left in training mode) as of ``step``."""
        model.eval()
        predicted = encode(model, self.data.val_texts)
        sts_dev = round(sts.dev_score(lambda t: encode(model, t)), 3) if self.with_sts_dev else None
        model.train()
        measured = metrics.fidelity(predicted, self.data.val_targets)
        return Evaluation(step, measured.mse, measured.mean_cosine, sts_dev)


def encode(model: Any, texts: list[str]) -> np.ndarray:
    """What ``model.encode(texts)`` returns (a ``SentenceTransformer``; float32, input order), from batches of
    similar length whose tokenisation is kept for the next call on the same sentences."""
    out = np.empty((len(texts), model.get_embedding_dimension()), dtype=np.float32)
    batches = encoder.device_batches(model.tokenizer, texts, model.max_seq_length, ENCODE_BATCH, model.device)
    with torch.inference_mode():
        for positions, features in batches:
            out[positions] = model(features)["sentence_embedding"].float().cpu().numpy()
    return out
