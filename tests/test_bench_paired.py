"""bench/_paired.py: interleaved rounds, the order reversed every other round, warm-up rounds untimed, and no
garbage collection inside a timed run (timeit's convention), the collector restored after."""

from __future__ import annotations

import gc

from bench import _paired


def test_rounds_alternate_their_order_and_each_timed_run_is_collector_free():
    calls: list[tuple[str, bool]] = []

    def timer(name: str, took: float):
        def run() -> float:
            calls.append((name, gc.isenabled()))
            return took

        return run

    assert gc.isenabled()
    seconds = _paired.interleaved({"a": timer("a", 1.0), "b": timer("b", 2.0)}, rounds=2, warmup_rounds=1)
    assert seconds == {"a": [1.0, 1.0], "b": [2.0, 2.0]}  # the warm-up round is not recorded
    assert [name for name, _ in calls] == ["b", "a", "a", "b", "b", "a"]  # warm-up, round 1, round 2
    assert not any(enabled for _, enabled in calls)
    assert gc.isenabled()


def test_a_collector_switched_off_by_the_caller_stays_off():
    gc.disable()
    try:
        _paired.interleaved({"a": lambda: 0.5}, rounds=1)
        assert not gc.isenabled()
    finally:
        gc.enable()
