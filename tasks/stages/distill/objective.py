"""The terms a distillation run may add to its MSE: a (1 - cosine) term and an in-batch similarity-structure term."""

from __future__ import annotations

from typing import Any

from tasks.stages.params import DistillParams


def extra_loss(params: DistillParams, output: Any, goal: Any) -> Any:
    """The cosine and similarity-structure terms, summed over these rows (0 when both are off)."""
    import torch.nn.functional as F

    total = output.new_zeros(())
    if params.cosine_weight:
        total = total + params.cosine_weight * (1 - F.cosine_similarity(output, goal, dim=1)).sum()
    if params.structure_weight and len(output) > 1:
        student_sims, target_sims = (F.normalize(x, dim=1) @ F.normalize(x, dim=1).T for x in (output, goal))
        total = total + params.structure_weight * ((student_sims - target_sims) ** 2).mean(dim=1).sum()
    return total
