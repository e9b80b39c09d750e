"""What a distillation run minimises: the MSE to the targets, plus optionally a (1 - cosine) term, an in-batch
similarity-structure term and an in-batch neighbourhood (relational KL) term, on the targets' similarities or on
the teacher's own, full-dimensional ones (``relation_on``); as a loss module for
sentence-transformers' trainer (:class:`HPDLoss`)."""

from __future__ import annotations

from typing import Any

import torch

from tasks.stages.params import DistillParams


class HPDLoss(torch.nn.Module):
    """The loss of one micro-batch of ``n`` rows: its summed squared error over ``n * k`` plus the extra terms
    over ``n``. The trainer divides it by the micro-batches of a step and DDP averages it over the processes,
    so a step's gradient is that of the squared error summed over the global batch, over its size (plus the
    extra terms, each computed within its micro-batch). Records the summed squared error and the rows it covers
    (``squared_error``, ``rows``) for the logged loss, which is the MSE alone; :meth:`take` reads and clears
    them."""

    def __init__(self, model: Any, params: DistillParams) -> None:
        super().__init__()
        self.model, self.params = model, params  # ``model``: the trainer swaps in its DDP-wrapped one
        self.squared_error, self.rows = 0.0, 0

    def forward(self, features: list[dict[str, torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        """``labels``: each row's target (k columns), then its teacher embedding when the neighbourhood term
        follows the teacher's similarities (``relation_on``), which it then does instead of the target's."""
        output = self.model(features[0])["sentence_embedding"].float()
        k = output.shape[1]
        goal, relation = labels[:, :k].to(output), labels[:, k:].to(output)
        sse = ((output - goal) ** 2).sum()
        self.squared_error += float(sse.detach())
        self.rows += len(output)
        neighbours = relation if relation.shape[1] else None
        return (sse / k + extra_loss(self.params, output, goal, neighbours)) / len(output)

    def take(self) -> tuple[float, int]:
        """The summed squared error and rows since the last call."""
        taken = self.squared_error, self.rows
        self.squared_error, self.rows = 0.0, 0
        return taken


def extra_loss(params: DistillParams, output: Any, goal: Any, neighbours: Any = None) -> Any:
    """The cosine, similarity-structure and neighbourhood terms, summed over these rows (0 when all are off);
    the neighbourhood term follows the similarities of ``neighbours`` (default: the targets)."""
    import torch.nn.functional as F

    total = output.new_zeros(())
    if params.cosine_weight:
        total = total + params.cosine_weight * (1 - F.cosine_similarity(output, goal, dim=1)).sum()
    if params.structure_weight and len(output) > 1:
        student_sims, target_sims = (F.normalize(x, dim=1) @ F.normalize(x, dim=1).T for x in (output, goal))
        total = total + params.structure_weight * ((student_sims - target_sims) ** 2).mean(dim=1).sum()
    if params.relation_weight and len(output) > 2:
        teacher = goal if neighbours is None else neighbours
        total = total + params.relation_weight * neighbourhood_kl(output, teacher, params.relation_temperature)
    return total


def neighbourhood_kl(output: Any, goal: Any, temperature: float) -> Any:
    """KL(targets || student) of each row's softmax over its cosine similarities to the batch's other rows (at
    ``temperature``), summed over the rows and scaled by ``temperature**2`` so its gradient keeps its size across
    temperatures (as in Hinton et al.'s distillation): it teaches who a sentence's neighbours are, not its
    coordinates."""
    import torch.nn.functional as F

    others = ~torch.eye(len(output), dtype=torch.bool, device=output.device)
    student, target = (
        F.log_softmax((F.normalize(x, dim=1) @ F.normalize(x, dim=1).T)[others].view(len(x), -1) / temperature, dim=1)
        for x in (output, goal)
    )
    return temperature**2 * F.kl_div(student, target, reduction="sum", log_target=True)
