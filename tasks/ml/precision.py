"""What the compute dtype ``auto`` means on this machine: bf16 where the hardware runs it natively, else fp32.

bf16 autocast is the fast path on a GPU and on CPUs with AVX-512 BF16 or AMX; on a CPU without them PyTorch
emulates it, many times slower than fp32 (measured here on an AVX2-only EPYC: all-mpnet-base-v2 encodes
9.3 sentences/s in fp32 against 0.6 in bf16). A deployment's workers differ, so the stages default to
``auto`` and record what it resolved to.
"""

from __future__ import annotations

from typing import Literal

Dtype = Literal["fp32", "bf16", "fp16"]
Choice = Literal["auto", "fp32", "bf16", "fp16"]


def native_bf16(device: str) -> bool:
    """Whether ``device`` (``cpu`` or ``cuda``) runs bf16 matrix products natively."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's probes of cpuinfo
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


def resolve(choice: Choice, device: str) -> Dtype:
    """``choice``, with ``auto`` made bf16 where :func:`native_bf16`, else fp32."""
    if choice != "auto":
        return choice
    return "bf16" if native_bf16(device) else "fp32"
