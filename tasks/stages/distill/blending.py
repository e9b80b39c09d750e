"""Blending the final weights with the initial ones (``blend_initial``), a checkpoint-averaging lever.

After training, each fraction ``a`` of ``blend_initial`` gives the weights ``(1 - a) * initial + a * final``
(the initial weights: the base model with its initialised head, as evaluated at step 0; the final ones: those
training ended with), as WiSE-FT interpolates a pretrained model with its fine-tuned self: a student that
learns the targets can forget what its base model knew, and the line between them often scores above both
ends. Each blend is scored as an evaluation is (the same validation, the same ``select_on`` criterion), and
a blend is exported only when it scores strictly better than the best weights (which may be the initial
ones). Pure functions; the trainer loads and scores.
"""

from __future__ import annotations

from typing import Any

from tasks.stages.distill.state import selection_score


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


def choose(best: dict[str, Any], blends: list[dict[str, Any]], select_on: str) -> dict[str, Any] | None:
    """The blend evaluation (of ``blends``) to export instead of the best weights' evaluation ``best``: the
    best-scoring blend by ``select_on`` when it scores strictly better than ``best``; None otherwise (a tie
    keeps the best weights). Among equally scoring blends, the first."""
    if not blends:
        return None
    winner = min(blends, key=lambda record: selection_score(record, select_on))
    return winner if selection_score(winner, select_on) < selection_score(best, select_on) else None
