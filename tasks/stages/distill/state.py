"""A distillation run's progress and randomness: what a checkpoint must carry to resume it exactly."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel

from tasks.stages.distill.data import Position
from tasks.stages.distill.evaluation import Evaluation


@dataclass
class TrainState:
    step: int = 0
    position: Position = field(default_factory=Position)
    best_score: float = math.inf  # the selection score of the best evaluation, lower is better
    best_val_mse: float = math.inf  # the validation MSE of the best evaluation
    best_step: int = 0
    evals_since_best: int = 0
    stopped_early: bool = False
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[Evaluation] = field(default_factory=list)

    def record_eval(self, evaluation: Evaluation, patience: int | None, select_on: str = "val_mse") -> bool:
        """Record an evaluation; True when it is the best so far by ``select_on`` (val_mse lowest, sts_dev
        highest). After ``patience`` evaluations without improvement the run stops early."""
        self.evals.append(evaluation)
        score = evaluation.score(select_on)
        if score < self.best_score:
            self.best_score, self.best_val_mse, self.best_step = score, evaluation.val_mse, evaluation.step
            self.evals_since_best = 0
            return True
        self.evals_since_best += 1
        if patience and self.evals_since_best >= patience:
            self.stopped_early = True
        return False

    def best_value(self, select_on: str) -> float:
        """The best evaluation's score by ``select_on`` as evaluated (its val_mse, or its sts_dev): the inverse of
        :meth:`Evaluation.score` on :attr:`best_score`."""
        return self.best_val_mse if select_on == "val_mse" else -self.best_score

    def to_dict(self) -> dict[str, Any]:
        """The state as a checkpoint carries it: plain types only."""
        return {**asdict(self), "evals": [evaluation.as_record() for evaluation in self.evals]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainState:
        """The state :meth:`to_dict` wrote, checked as it loads."""
        return cls(**dict(_SavedState.model_validate(raw)))


class _SavedState(BaseModel):
    """A checkpoint's train state: :class:`TrainState`'s fields."""

    step: int
    position: Position
    best_score: float
    best_val_mse: float
    best_step: int
    evals_since_best: int
    stopped_early: bool
    losses: list[tuple[int, float]]
    evals: list[Evaluation]


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_states() -> dict[str, Any]:
    """This process's Python, NumPy, torch (and CUDA) generator states, as tensors and plain types only, so
    that a checkpoint holding them loads with ``torch.load(..., weights_only=True)`` (NumPy's own state
    is a tuple with an ndarray, which the weights-only unpickler refuses)."""
    import torch

    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    numpy_state = {
        "name": str(name),
        "keys": [int(key) for key in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    states = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` saved."""
    import torch

    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    saved = states["numpy"]
    keys = np.asarray(saved["keys"], dtype=np.uint32)
    np.random.set_state((saved["name"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
