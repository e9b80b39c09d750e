"""Interleaved, paired timing for benchmarks on a shared machine.

Each round runs every variant once (the order reversed every other round), so load from other work
falls on all variants alike; the garbage collector is off during each timed run, as ``timeit`` has it, so that
no variant pays for a collection of another's garbage. A pair's ratio is reported both from the per-variant
medians and as the median of the per-round ratios. The 1-minute load average is recorded at the start and the end.
"""

from __future__ import annotations

import gc
import os
import statistics
from collections.abc import Callable


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


Timers = dict[str, Callable[[], float]]  # variant -> one run of it, returning its timed seconds


def _without_collections(run: Callable[[], float]) -> float:
    """``run()`` with the garbage collector off (timeit's convention), back on as it was afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return run()
    finally:
        if was_enabled:
            gc.enable()


def interleaved(variants: Timers, rounds: int, warmup_rounds: int = 0) -> dict[str, list[float]]:
    """Seconds of each variant per round; each callable runs its variant once and returns its timed seconds.
    ``warmup_rounds`` untimed rounds run first (kernels set up per input shape are then ready for all)."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(-warmup_rounds, rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            took = _without_collections(variants[name])
            if r >= 0:
                seconds[name].append(took)
            print(f"   {f'round {r + 1}/{rounds}' if r >= 0 else 'warm-up'} {name}: {took:.2f} s", flush=True)
    return seconds


def pair(seconds: dict[str, list[float]], ours: str, baseline: str, work: float) -> dict:
    """``ours`` against ``baseline`` (same work per run: ``work`` items); ratios above 1 mean ours is faster."""
    a, b = seconds[ours], seconds[baseline]
    med_a, med_b = statistics.median(a), statistics.median(b)
    return {
        "ours": ours,
        "baseline": baseline,
        "ours_median_seconds": round(med_a, 3),
        "baseline_median_seconds": round(med_b, 3),
        "ours_per_s": round(work / med_a, 2),
        "baseline_per_s": round(work / med_b, 2),
        "ratio_of_medians": round(med_b / med_a, 3),
        "median_paired_ratio": round(statistics.median(y / x for x, y in zip(a, b, strict=True)), 3),
        "ours_seconds": [round(s, 3) for s in a],
        "baseline_seconds": [round(s, 3) for s in b],
    }
