"""The optimisation of a distillation run: AdamW, linear warm-up then linear decay (the trainer clips the
gradients and, with fp16, scales them)."""

from __future__ import annotations

from typing import Any

from tasks.stages.params import DistillParams


class Optimization:
    """AdamW (fused) over the trained parameters (no weight decay on biases and LayerNorm weights) and its
    schedule."""

    def __init__(self, model: Any, params: DistillParams, total_steps: float) -> None:
        import torch

        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        exempt = [p for n, p in trained if n.endswith("bias") or "LayerNorm" in n]
        decayed = [p for n, p in trained if not (n.endswith("bias") or "LayerNorm" in n)]
        self.optimizer = torch.optim.AdamW(
            [{"params": decayed, "weight_decay": params.weight_decay}, {"params": exempt, "weight_decay": 0.0}],
            lr=params.lr,
            fused=True,  # one kernel over all tensors, as sentence-transformers' trainer steps by default
        )
        warmup = int(params.warmup_ratio * total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: (
                (s + 1) / max(warmup, 1) if s < warmup else max(0.0, (total_steps - s) / max(total_steps - warmup, 1))
            ),
        )

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, optimizer: dict[str, Any], scheduler: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(scheduler)
