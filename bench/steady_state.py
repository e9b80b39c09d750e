"""Day after day: the pipeline's daily cost and freshness under today's policy and under a retrain per partition.

``DAYS`` daily partitions of ``DAY_ROWS`` new distinct corpus sentences go through the stage functions with the
packaged models (teacher all-mpnet-base-v2, student all-MiniLM-L6-v2), each policy on a store of its own under
``var/bench/steady_state``, making the decisions its DAGs make:

- ``per_partition`` (the pipeline before its retrain policy): every new partition retrains (PCA over every
  partition, the student from the base model on all of them), then the index is built again with the new student
  over the whole corpus; a day's sentences are searchable once all of that is done.
- ``policy`` (today's ``hpd_retrain`` and ``hpd_index``): the index takes the day's partition with the promoted
  student (one new segment); then :func:`tasks.orchestration.day_plan.decide` decides, and a retrain learns
  the partitions :func:`~tasks.orchestration.day_plan.training_partitions` selects within ``MAX_TRAIN_ROWS``,
  warm-started from the promoted student as ``hpd_retrain``'s default says, and its student re-encodes the corpus
  once. The policy's thresholds are ``hpd_retrain``'s defaults; ``MAX_TRAIN_ROWS`` is ten days' rows.

Both train with the same settings (``TRAINING``: one epoch over their training rows), and a retrained student is
promoted without the validate stage (its STS gate is the same for both and is not what this measures). Recorded
per day and stage: compute seconds, rows encoded by the teacher and by the student (indexing) and rows trained,
whether it retrained and why, and freshness: seconds from the start of the day's staging until its sentences
are searchable (checked: each of a sample of them finds itself in the promoted index). The cost of a day without
a retrain on day 2 and on the last day is also measured ``REPEATS`` times each on copies of the policy's store as
it was those mornings, with the same new sentences (:func:`quiet_day_repeats`): one day's timing alone moves with
the machine and with its sentences' lengths. The policy also runs with ``retrain_fraction`` ``OTHER_FRACTION``
for the trade-off between retrains and cost. Writes
``bench/results/steady_state.json`` and the plot ``bench/results/steady_state.svg``.
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
import statistics
import time
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

from bench import CORPUS, REPO, results
from tasks.core import catalog, config, manifest, partitions, sentences, storage
from tasks.core.catalog import ModelPointer, Stage
from tasks.ml import models, precision, vector_index
from tasks.orchestration import day_plan
from tasks.orchestration.run_records import RetrainParams
from tasks.stages import build_index, distill, encode_teacher, fit_pca, stage_corpus

ROOT = REPO / "var" / "bench" / "steady_state"
DAYS = int(os.environ.get("HPD_BENCH_DAYS", 30))
DAY_ROWS = int(os.environ.get("HPD_BENCH_DAY_ROWS", 100))
MAX_TRAIN_ROWS = 10 * DAY_ROWS
DEFAULTS = RetrainParams.model_fields  # hpd_retrain's policy as it ships
POLICY = day_plan.Policy(DEFAULTS["retrain_fraction"].default, DEFAULTS["max_model_age_days"].default)
OTHER_FRACTION = 0.5  # the policy is also run with this retrain_fraction, for the trade-off beside the default
WARM_START: bool = DEFAULTS["warm_start"].default
FIRST = date(2026, 1, 1)
THREADS = len(os.sched_getaffinity(0))
DTYPE = precision.resolve("auto", "cpu")
TEACHER = models.DEFAULT_TEACHER
TRAINING: dict[str, Any] = {
    "teacher": TEACHER,
    "epochs": 1,
    "batch_size": 32,
    "amp": "bf16" if DTYPE == "bf16" else "off",
    "threads": THREADS,
    "select_on": "val_mse",
    "blend_initial": [],
}
RETRAIN_STAGES = ("fit_pca", "distill", "reindex")  # what a day without a retrain does not run
PROBES = 5  # sentences of the day searched for (each must find itself)
QUIET_DAYS = (2, DAYS)  # the days whose work without a retrain is run again, REPEATS times each
REPEATS = 5


class Day:
    """One simulated day on one policy's store: its stage timings and what it did."""

    def __init__(self, store: str, number: int) -> None:
        self.store, self.number = store, number
        self.day = FIRST + timedelta(days=number - 1)
        self.seconds: dict[str, float] = {}
        self.record: dict[str, Any] = {"day": number, "teacher_rows": 0, "student_rows": 0, "trained_rows": 0}

    def timed(self, stage: str, work: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        found = work()
        self.seconds[stage] = round(self.seconds.get(stage, 0) + time.perf_counter() - start, 2)
        return found

    def ingest(self, lines: list[str]) -> None:
        raw = ROOT / "raw" / f"{self.day}.txt"
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text("\n".join(lines) + "\n")
        values = {"store": self.store, "source": str(raw), "ingest_date": self.day}
        self.timed("stage", lambda: stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values)))
        values = {"store": self.store, "ingest_date": self.day, "teacher": TEACHER, "dtype": DTYPE}
        encoded = self.timed(
            "teacher", lambda: encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, values))
        )
        self.record["teacher_rows"] += sum(o.rows or 0 for o in encoded.outputs)

    def retrain(self, partitions: list[date], warm_start: str | None) -> None:
        name = f"day{self.number:02d}"
        values = {"store": self.store, "teacher": TEACHER, "partitions": partitions, "max_rows": 40_000, "name": name}
        self.timed("fit_pca", lambda: fit_pca.run(config.parse(fit_pca.FitPCAParams, values)))
        values = {"store": self.store, "name": name, "pca_name": name, "warm_start": warm_start, **TRAINING}
        trained = self.timed("distill", lambda: distill.run(config.parse(distill.DistillParams, values)))
        self.record["trained_rows"] += trained.stats["train_rows"] * TRAINING["epochs"]
        self.record["trained_partitions"] = len(partitions)
        published = manifest.read(self.store, Stage.DISTILL, name)
        _, etag = catalog.read_pointer(self.store, catalog.Pointer.MODEL)
        validation = catalog.manifest_uri(self.store, Stage.VALIDATE, name)
        catalog.move_pointer(self.store, ModelPointer(name, {}, validation, published.version_uri(self.store)), etag)

    def index(self, stage: str = "index") -> None:
        values = {"store": self.store, "dtype": DTYPE}
        built = self.timed(stage, lambda: build_index.run(config.parse(build_index.BuildIndexParams, values)))
        self.record["student_rows"] += built.stats["rows_encoded"]
        self.record["index_rows"] = built.stats["rows"]
        self.record["segments"] = built.stats["segments"]

    def searchable(self, started: float) -> None:
        """Freshness: seconds since ``started``, once a sample of the day's sentences each find themselves."""
        self.record["freshness_s"] = round(time.perf_counter() - started, 1)
        loaded = vector_index.load_current(self.store)
        shard = sentences.shards(self.store, self.day, (Stage.STAGE_CORPUS,))[0]
        table = storage.read_parquet(shard, columns=["sentence_id", "text"]).slice(0, PROBES)
        hits = loaded.search(table.column("text").to_pylist(), 10)
        ids = table.column("sentence_id").to_pylist()
        found = [sid in {h.sentence_id for h in row} for sid, row in zip(ids, hits, strict=True)]
        self.record["probes_found"] = f"{sum(found)}/{len(found)}"
        if not all(found):
            raise AssertionError(f"day {self.day}: staged sentences not searchable after the day's runs")

    def result(self) -> dict[str, Any]:
        compute = round(sum(self.seconds.values()), 2)
        retraining = sum(self.seconds.get(stage, 0) for stage in RETRAIN_STAGES)
        return {**self.record, "seconds": self.seconds, "compute_s": compute, "without_retrain_s": compute - retraining}


def per_partition_day(day: Day, lines: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    day.ingest(lines)
    day.record.update(retrained=True, reason="new partition")
    day.retrain(sorted(partitions.encoded_partitions(day.store, TEACHER)), None)
    day.index()
    day.searchable(started)
    return day.result()


def quiet_day(day: Day, lines: list[str]) -> dict[str, Any]:
    """A policy day's work without its retrain: staging, the teacher, the day's index segment, the decision."""
    day.ingest(lines)
    day.index()
    day.timed("decide", lambda: day_plan.decide(day.store, TEACHER, POLICY))
    return day.result()


def policy_day(day: Day, lines: list[str], policy: day_plan.Policy = POLICY) -> dict[str, Any]:
    started = time.perf_counter()
    day.ingest(lines)
    promoted, _ = catalog.read_pointer(day.store, catalog.Pointer.MODEL)
    if promoted is not None:  # hpd_index takes the partition with the promoted student
        day.index()
        day.searchable(started)
    decision = day.timed("decide", lambda: day_plan.decide(day.store, TEACHER, policy))
    day.record.update(retrained=decision.retrain, reason=decision.reason, decision=decision.explanation)
    if decision.retrain:
        chosen = day.timed("decide", lambda: day_plan.training_partitions(day.store, TEACHER, MAX_TRAIN_ROWS))
        day.retrain(chosen, promoted.model_run if promoted is not None and WARM_START else None)
        day.index("reindex")  # the new student encodes the corpus once
        if promoted is None:
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
        days.append(POLICIES[name](Day(storage.to_uri(str(folder)), number), lines))
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
            done = quiet_day(Day(storage.to_uri(str(replay)), number), lines)
            seconds[number].append(done["compute_s"])
    first, last = (statistics.median(seconds[number]) for number in QUIET_DAYS)
    return {
        "repeats": REPEATS,
        **{f"day_{number}_s": runs for number, runs in seconds.items()},
        **{f"day_{number}_median_s": statistics.median(runs) for number, runs in seconds.items()},
        "ratio_of_medians": round(last / first, 3),
    }


def main() -> dict:
    import torch

    torch.set_num_threads(THREADS)
    shutil.rmtree(ROOT / "mornings", ignore_errors=True)
    daily = arrivals()
    runs = {name: simulated(name, daily) for name in POLICIES}
    repeated = quiet_day_repeats(daily[-1])
    totals = {name: round(sum(d["compute_s"] for d in days), 1) for name, days in runs.items()}
    _plot(runs)
    return results.write(
        "steady_state",
        unit=f"compute seconds over {DAYS} days",
        ours=totals["policy"],
        baseline=totals["per_partition"],
        baseline_name="a retrain and a full index rebuild per partition (same arrivals, models and training settings)",
        higher_is_better=False,
        details={
            "days": DAYS,
            "day_rows": DAY_ROWS,
            "max_train_rows": MAX_TRAIN_ROWS,
            "policy": {**POLICY.__dict__, "warm_start": WARM_START},
            "training": TRAINING,
            "teacher_dtype": DTYPE,
            "totals_s": totals,
            "ratios_to_per_partition": {name: round(totals["per_partition"] / t, 3) for name, t in totals.items()},
            "retrains": {name: sum(d["retrained"] for d in days) for name, days in runs.items()},
            "daily_cost_without_retrain": {**_quiet_days(runs["policy"]), "repeated": repeated},
            "freshness_s": {name: _spread([d["freshness_s"] for d in days]) for name, days in runs.items()},
            "validate": "skipped in both policies: a retrained student is promoted directly",
            "per_day": runs,
        },
    )


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


def _plot(runs: dict[str, list[dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for name, days in runs.items():
        axes.plot([d["day"] for d in days], [d["compute_s"] for d in days], marker="o", markersize=3, label=name)
    axes.set_xlabel("day")
    axes.set_ylabel("compute seconds")
    axes.set_title(f"Daily cost, {DAY_ROWS} new sentences a day ({results.machine()['cores']} cores)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(results.RESULTS / "steady_state.svg", metadata={"Date": None})
    plt.close(figure)


if __name__ == "__main__":
    print(main())
