"""Day after day: what a day costs and how fresh search stays, at a real volume and over a month.

- At a real volume (:mod:`bench._volume`, the headline): ``HPD_BENCH_VOLUME_DAYS`` (14) days of
  ``HPD_BENCH_VOLUME_ROWS`` (10,000) new distinct sentences, the previous path (the teacher encodes every staged
  row) against today's (the teacher encodes a bounded sample of each partition, the student indexes every row), on
  the same arrivals, retrain policy and training settings: compute per day and stage, teacher and student rows,
  retrains and why, freshness in one process and, on a few days, end to end as the DAGs' tasks run it (a process
  each); the last promoted student's STS under each; at each warm-started promotion, how much of a full re-encode
  the old student's index finds with the new student's queries.
- Over a month (as issue 32 measured it): ``DAYS`` (30) daily partitions of ``DAY_ROWS`` (100) sentences under the
  retrain policy (and with ``retrain_fraction`` ``OTHER_FRACTION``) against a retrain and a full index rebuild per
  partition (the pipeline before its retrain policy), each on a store of its own; a retrain learns the partitions
  the day's plan selects within ``MAX_TRAIN_ROWS`` (ten days' rows), warm-started from the promoted student. The
  cost of a day without a retrain on day 2 and on the last day is also measured ``REPEATS`` times each on copies of
  the policy's store as it was those mornings, with the same new sentences (:func:`quiet_day_repeats`).

A retrained student is promoted without the validate stage (its gate is the same on every path and is not what
this measures). Writes ``bench/results/steady_state.json`` and the plot ``bench/results/steady_state.svg`` (the
volume run's days).
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import CORPUS, REPO, _volume, results
from bench._days import DTYPE, TEACHER, Day
from tasks.core import partitions, promoted, storage
from tasks.orchestration import day_plan
from tasks.orchestration.run_records import RetrainParams

ROOT = REPO / "var" / "bench" / "steady_state"
DAYS = int(os.environ.get("HPD_BENCH_DAYS", 30))
DAY_ROWS = int(os.environ.get("HPD_BENCH_DAY_ROWS", 100))
MAX_TRAIN_ROWS = 10 * DAY_ROWS
DEFAULTS = RetrainParams(teacher=TEACHER)  # hpd_retrain's policy as it ships
POLICY = day_plan.Policy(DEFAULTS.retrain_fraction, DEFAULTS.max_model_age_days)
OTHER_FRACTION = 0.5  # the policy is also run with this retrain_fraction, for the trade-off beside the default
THREADS = len(os.sched_getaffinity(0))
INGEST: dict[str, Any] = {"teacher_sample": 0}  # a hundred rows a day: the teacher's sample is every row
TRAINING: dict[str, Any] = {
    "teacher": TEACHER,
    "epochs": 1,
    "batch_size": 32,
    "amp": "bf16" if DTYPE == "bf16" else "off",
    "threads": THREADS,
    "select_on": "val_mse",
    "blend_initial": [],
}
QUIET_DAYS = (2, DAYS)  # the days whose work without a retrain is run again, REPEATS times each
REPEATS = 5


def _day(store: str, number: int) -> Day:
    return Day(store, number, INGEST, TRAINING)


def _plan(partitions_learned: list, warm_start: str | None) -> day_plan.DayPlan:
    """A plan that retrains on ``partitions_learned`` from ``warm_start`` (fitting a PCA), as forced."""
    decision = day_plan.forced("a retrain per partition")
    return day_plan.DayPlan(decision=decision, partitions=partitions_learned, warm_start=warm_start)


def per_partition_day(day: Day, lines: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    day.ingest(lines)
    day.record.update(retrained=True, reason="new partition")
    day.retrain(_plan(sorted(partitions.encoded_partitions(day.store, TEACHER)), None))
    day.index()
    day.searchable(started)
    return day.result()


def quiet_day(day: Day, lines: list[str]) -> dict[str, Any]:
    """A policy day's work without its retrain: staging, the teacher, the day's index segment, the decision."""
    day.ingest(lines)
    day.index()
    day.timed("plan", lambda: day_plan.decide(day.store, TEACHER, POLICY))
    return day.result()


def policy_day(day: Day, lines: list[str], policy: day_plan.Policy = POLICY) -> dict[str, Any]:
    started = time.perf_counter()
    day.ingest(lines)
    if promoted.model(day.store) is not None:  # hpd_index takes the partition with the promoted student
        day.index()
        day.searchable(started)
    values = {"retrain_fraction": policy.retrain_fraction, "max_train_rows": MAX_TRAIN_ROWS}
    planned = day.plan(DEFAULTS.model_copy(update=values))
    if planned.decision.retrain:
        day.retrain(planned)
        day.index("reindex")  # the new student encodes the corpus once
        if "freshness_s" not in day.record:
            day.searchable(started)
    return day.result()


POLICIES: dict[str, Callable[[Day, list[str]], dict[str, Any]]] = {
    "per_partition": per_partition_day,
    "policy": policy_day,
    f"policy_retrain_fraction_{OTHER_FRACTION}": functools.partial(
        policy_day, policy=day_plan.Policy(OTHER_FRACTION, POLICY.max_model_age_days)
    ),
}


def arrivals() -> list[list[str]]:
    """``DAYS`` lists of ``DAY_ROWS`` distinct corpus sentences, in corpus order."""
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        lines = [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(DAYS * DAY_ROWS)]
    return [lines[n * DAY_ROWS : (n + 1) * DAY_ROWS] for n in range(DAYS)]


def simulated(name: str, daily: list[list[str]]) -> list[dict[str, Any]]:
    """Every day of ``daily`` under policy ``name``, on a store of its own; the policy's store is copied aside on
    the mornings of :data:`QUIET_DAYS` for :func:`quiet_day_repeats`."""
    shutil.rmtree(ROOT / name, ignore_errors=True)
    folder = ROOT / name / "store"
    days = []
    for number, lines in enumerate(daily, start=1):
        if name == "policy" and number in QUIET_DAYS:
            shutil.copytree(folder, ROOT / "mornings" / str(number), dirs_exist_ok=True)
        days.append(POLICIES[name](_day(storage.to_uri(str(folder)), number), lines))
        print(f"{name} day {number}: {days[-1]['compute_s']} s", flush=True)
    return days


def quiet_day_repeats(lines: list[str]) -> dict[str, Any]:
    """The policy's :func:`quiet_day` with ``lines`` (the last day's arrivals, new on each of those mornings) on
    each of :data:`QUIET_DAYS`, ``REPEATS`` times, each on a fresh copy of the store as it was that morning, the
    days interleaved: the same work on a store 2 and 30 days old, only the store differing (medians)."""
    seconds: dict[int, list[float]] = {number: [] for number in QUIET_DAYS}
    replay = ROOT / "replay"
    for _ in range(REPEATS):
        for number in QUIET_DAYS:
            shutil.rmtree(replay, ignore_errors=True)
            shutil.copytree(ROOT / "mornings" / str(number), replay)
            done = quiet_day(_day(storage.to_uri(str(replay)), number), lines)
            seconds[number].append(done["compute_s"])
    first, last = (statistics.median(seconds[number]) for number in QUIET_DAYS)
    return {
        "repeats": REPEATS,
        **{f"day_{number}_s": runs for number, runs in seconds.items()},
        **{f"day_{number}_median_s": statistics.median(runs) for number, runs in seconds.items()},
        "ratio_of_medians": round(last / first, 3),
    }


def thirty_days() -> dict[str, Any]:
    """The policy (and with ``retrain_fraction`` :data:`OTHER_FRACTION`) against a retrain per partition over
    :data:`DAYS` days of :data:`DAY_ROWS` sentences, and the quiet-day repeats; the runs per day."""
    shutil.rmtree(ROOT / "mornings", ignore_errors=True)
    daily = arrivals()
    runs = {name: simulated(name, daily) for name in POLICIES}
    repeated = quiet_day_repeats(daily[-1])
    totals = {name: round(sum(d["compute_s"] for d in days), 1) for name, days in runs.items()}
    return {
        "days": DAYS,
        "day_rows": DAY_ROWS,
        "max_train_rows": MAX_TRAIN_ROWS,
        "policy": {**POLICY.__dict__, "warm_start": DEFAULTS.warm_start},
        "training": TRAINING,
        "totals_s": totals,
        "ratios_to_per_partition": {name: round(totals["per_partition"] / t, 3) for name, t in totals.items()},
        "retrains": {name: sum(d["retrained"] for d in days) for name, days in runs.items()},
        "daily_cost_without_retrain": {**_quiet_days(runs["policy"]), "repeated": repeated},
        "freshness_s": {name: _spread([d["freshness_s"] for d in days]) for name, days in runs.items()},
        "validate": "skipped in both policies: a retrained student is promoted directly",
        "per_day": runs,
    }


def at_volume() -> dict[str, Any]:
    """Both paths of :mod:`bench._volume` on the same arrivals, their summary and their runs per day."""
    daily, how = _volume.arrivals()
    runs, e2e = {}, []
    for path in _volume.PATHS:
        runs[path], replayed = _volume.simulated(path, daily)
        e2e += replayed
    return {
        "days": len(daily),
        "day_rows": _volume.VOLUME_ROWS,
        "arrivals": how,
        "augment": _volume.AUGMENT,
        "teacher_sample": _volume.PATHS,
        "retrain": _volume.RETRAIN.model_dump(mode="json", exclude={"teacher", "store"}),
        "training": _volume.TRAINING,
        **_volume.summary(runs, e2e),
        "end_to_end": e2e,
        "validate": "skipped on both paths: a retrained student is promoted directly, its STS measured here",
        "per_day": runs,
    }


def main() -> dict:
    import torch

    torch.set_num_threads(THREADS)
    volume = at_volume()
    small = _kept_thirty_days() if os.environ.get("HPD_BENCH_THIRTY_DAYS") == "keep" else thirty_days()
    _plot(volume["per_day"], f"{_volume.VOLUME_ROWS:,} new sentences a day")
    quiet = volume["quiet_day_median_compute_s"]
    return results.write(
        "steady_state",
        unit=f"median compute seconds of a day without a retrain, {_volume.VOLUME_ROWS:,} new sentences a day",
        ours=quiet["sampled"],
        baseline=quiet["previous"],
        baseline_name="the previous path: the teacher encodes every staged row (same arrivals, models, policy and "
        "training settings)",
        higher_is_better=False,
        details={"teacher_dtype": DTYPE, "threads": THREADS, "volume": volume, "thirty_days": small},
    )


def _kept_thirty_days() -> dict[str, Any]:
    """The month's figures of the last result file, kept as they were measured (``HPD_BENCH_THIRTY_DAYS=keep``:
    a rerun of the volume part alone; each comparison's sides were measured in one run)."""
    import json

    kept = json.loads((results.RESULTS / "steady_state.json").read_text())["details"]["thirty_days"]
    return {**kept, "kept_from": kept.get("kept_from", "an earlier run of this benchmark, on the same machine")}


def _quiet_days(days: list[dict[str, Any]]) -> dict[str, Any]:
    """The policy's daily cost without a retrain (staging, teacher, the day's index segment, the decision): on day 2
    and on the last day, their ratio; the same over a week at each end (medians of days 2-8 and of the last 7,
    steadier than one day's timing); and the cost of the last day that did not retrain."""
    second, last = days[1], days[-1]
    quiet = [d for d in days if not d["retrained"]]
    first_week, last_week = (statistics.median(d["without_retrain_s"] for d in week) for week in (days[1:8], days[-7:]))
    return {
        "day_2_s": round(second["without_retrain_s"], 2),
        f"day_{last['day']}_s": round(last["without_retrain_s"], 2),
        "ratio_last_to_day_2": round(last["without_retrain_s"] / second["without_retrain_s"], 3),
        "median_days_2_to_8_s": round(first_week, 2),
        "median_last_7_days_s": round(last_week, 2),
        "ratio_last_week_to_first": round(last_week / first_week, 3),
        "last_day_without_a_retrain": {"day": quiet[-1]["day"], "compute_s": quiet[-1]["compute_s"]} if quiet else None,
    }


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"min": ordered[0], "median": ordered[len(ordered) // 2], "max": ordered[-1]}


def _plot(runs: dict[str, list[dict[str, Any]]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for name, days in runs.items():
        axes.plot([d["day"] for d in days], [d["compute_s"] for d in days], marker="o", markersize=3, label=name)
    axes.set_xlabel("day")
    axes.set_ylabel("compute seconds")
    axes.set_title(f"Daily cost, {title} ({results.machine()['cores']} cores)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(results.RESULTS / "steady_state.svg", metadata={"Date": None})
    plt.close(figure)


if __name__ == "__main__":
    print(main())
