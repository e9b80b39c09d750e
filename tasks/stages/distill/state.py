"""A distillation run's progress and randomness: what a checkpoint must carry to resume it exactly."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, fields
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


@dataclass(frozen=True)
class _NumpyState:
    """NumPy's legacy generator state, its key array as plain ints."""

    name: str
    keys: list[int]
    pos: int
    has_gauss: int
    cached_gaussian: float


@dataclass(frozen=True)
class RngStates:
    """This process's Python, NumPy, torch (and CUDA) generator states."""

    python: Any
    numpy: _NumpyState
    torch: Any
    cuda: Any = None

    @classmethod
    def capture(cls) -> RngStates:
        import torch

        name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
        numpy_state = _NumpyState(str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached_gaussian))
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls(random.getstate(), numpy_state, torch.get_rng_state(), cuda)

    def restore(self) -> None:
        import torch

        version, internal, gauss_next = self.python
        random.setstate((version, tuple(internal), gauss_next))
        saved = self.numpy
        keys = np.asarray(saved.keys, dtype=np.uint32)
        np.random.set_state((saved.name, keys, saved.pos, saved.has_gauss, saved.cached_gaussian))
        torch.set_rng_state(self.torch)
        if self.cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.cuda)

    def as_payload(self) -> dict[str, Any]:
        """The states as tensors and plain types only (no CUDA entry without CUDA)."""
        payload = {"python": self.python, "numpy": asdict(self.numpy), "torch": self.torch}
        return payload if self.cuda is None else {**payload, "cuda": self.cuda}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> RngStates:
        parts = dict(payload)
        return cls(**{**parts, "numpy": _NumpyState(**parts.pop("numpy"))})


def rng_states() -> dict[str, Any]:
    """This process's generator states, as tensors and plain types only, so that a checkpoint holding them loads
    with ``torch.load(..., weights_only=True)`` (NumPy's own state is a tuple with an ndarray, which the
    weights-only unpickler refuses)."""
    return RngStates.capture().as_payload()


def restore_rng(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` saved."""
    RngStates.from_payload(states).restore()


@dataclass
class Snapshot:
    """What a checkpoint carries, tensors and plain types only: the model, optimizer, scheduler and fp16 scaler
    states, the best weights (and the initial ones when blending), the train state and every process's RNG
    states, in rank order."""

    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any]
    best_weights: dict[str, Any] | None
    state: dict[str, Any]
    rng: list[dict[str, Any]]
    initial_weights: dict[str, Any] | None = None

    def as_payload(self) -> dict[str, Any]:
        """The payload ``torch.save`` writes (no initial weights unless blending)."""
        payload = dict(vars(self))
        if self.initial_weights is None:
            payload.pop("initial_weights")
        return payload

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Snapshot:
        """The snapshot in a loaded checkpoint ``payload`` (a missing part: ``TypeError``)."""
        names = {field.name for field in fields(cls)}
        return cls(**{name: value for name, value in payload.items() if name in names})
