"""The processes of a distillation run: rank and world size under torchrun, and what they exchange.

Launched with torchrun (``torchrun --nproc-per-node N --no-python hpd distill ...``) each process
joins the process group (NCCL on GPUs, gloo on CPU) before sentence-transformers' trainer starts, which
then joins it too and trains each process on its micro-batches under DistributedDataParallel; rank 0
(the leader) writes checkpoints and the export.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def sum(self, value: float, device: Any) -> float:
        """``value`` summed over every process."""
        if self.world == 1:
            return value
        import torch
        import torch.distributed as torch_dist

        reduced = torch.tensor([value], device=device)
        torch_dist.all_reduce(reduced)
        return float(reduced[0])

    def gather(self, value: Any) -> list[Any]:
        """Every process's ``value``, in rank order."""
        if self.world == 1:
            return [value]
        import torch.distributed as torch_dist

        gathered: list[Any] = [None] * self.world
        torch_dist.all_gather_object(gathered, value)
        return gathered


def init_distributed() -> Distributed:
    """This process's place: one process unless torchrun set ``WORLD_SIZE``; joins the process group."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world == 1:
        return Distributed()
    import torch
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        torch_dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Distributed(torch_dist.get_rank(), torch_dist.get_world_size())


def select_device(requested: str, dist: Distributed) -> str:
    """``cuda`` or ``cpu`` (``auto``: cuda when available); under DDP each process takes its local GPU."""
    import torch

    device = requested if requested != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and dist.world > 1:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return device
