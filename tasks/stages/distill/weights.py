"""The weights a distillation run keeps besides its model's own: the best so far (exported unless a blend beats
them) and, to blend with (``blend_initial``), the initial and the final ones, on the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def cpu_copy(weights: dict[str, Any]) -> dict[str, Any]:
    """A detached copy of ``weights`` (a state dict) on the CPU: the initial weights kept for blending."""
    return {key: value.detach().to("cpu", copy=True) for key, value in weights.items()}


def blend(initial: dict[str, Any], final: dict[str, Any], a: float) -> dict[str, Any]:
    """``(1 - a) * initial + a * final`` for every floating-point tensor, on ``final``'s device and in its dtype;
    any other tensor (an integer buffer such as position ids) is ``final``'s."""
    import torch

    blended = {}
    for key, value in final.items():
        if torch.is_floating_point(value):
            blended[key] = torch.lerp(initial[key].to(value.device, value.dtype), value, a)
        else:
            blended[key] = value
    return blended


@dataclass
class KeptWeights:
    """``model``'s kept weights (state dicts); ``blends``: whether the initial and final ones are kept."""

    model: Any
    blends: bool
    best: dict[str, Any] | None = None
    initial: dict[str, Any] | None = None
    final: dict[str, Any] | None = None

    def keep_best(self) -> None:
        """The model's current weights are the best so far."""
        self.best = {key: value.detach().clone() for key, value in self.model.state_dict().items()}

    def keep_initial(self) -> None:
        """The model's current weights (its best, at step 0) are the initial ones, when blending."""
        self.initial = cpu_copy(self.model.state_dict()) if self.blends else None

    def keep_final(self) -> None:
        """The model's current weights are those training ended with, when blending."""
        self.final = cpu_copy(self.model.state_dict()) if self.initial is not None else None

    def load(self, weights: dict[str, Any] | None) -> None:
        """Load ``weights`` into the model (None: leave it as it is)."""
        if weights is not None:
            self.model.load_state_dict(weights)

    def blend(self, a: float) -> dict[str, Any]:
        """``(1 - a) * initial + a * final``."""
        if self.initial is None or self.final is None:
            raise ValueError("no initial and final weights are kept to blend")
        return blend(self.initial, self.final, a)

    def checkpoint_part(self) -> dict[str, Any]:
        """What a checkpoint carries of them (the initial weights only when blending)."""
        initial = {} if self.initial is None else {"initial_weights": self.initial}
        return {"best_weights": self.best, **initial}

    def restore(self, best: dict[str, Any] | None, initial: dict[str, Any] | None) -> None:
        """Take back what :meth:`checkpoint_part` gave a checkpoint (the initial weights only when blending)."""
        self.best, self.initial = best, initial if self.blends else None
