"""Day after day at a real volume, for the steady-state benchmark: ``VOLUME_DAYS`` days of ``VOLUME_ROWS`` new distinct
sentences, through the DAGs' stages with the packaged models, on two paths with the same arrivals, retrain policy
(``hpd_retrain``'s defaults: the day's plan, warm starts that keep their PCA basis) and training settings:

- ``previous``: the teacher encodes every staged row and augmentation varies every sentence (``teacher_sample`` 0);
- ``sampled``: today's default: the teacher encodes and augmentation varies a bounded sample of each partition.

Recorded per day and stage: compute seconds, teacher rows, student rows, whether it retrained and why, freshness
(staging to searchable, in one process with the stages run one after the other). On :data:`E2E_DAYS`, the sampled
path's day is also replayed as the DAGs run it, each task a process of its own that loads its models
(``hpd stage-corpus``, ``augment``, ``encode-teacher``, ``build-index``, on a copy of that morning's store): the
end-to-end freshness. At each warm-started promotion, the old student's index searched with the new student's
queries is compared with the new student's full re-encode (recall@10, exact search; :func:`reuse_recall`), with both
students' STS: the verdict on keeping old segments after a promotion. The last promoted student's STS-B and SICK-R
test are recorded under each path.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import statistics
import subprocess
import time
from typing import Any

import numpy as np

from bench import CORPUS, REPO
from bench._days import DTYPE, TEACHER, Day, index_vectors, probes_found, student_scores
from tasks.core import promoted, sentences, storage
from tasks.orchestration.run_records import RetrainParams
from tasks.stages.params import TEACHER_SAMPLE

ROOT = REPO / "var" / "bench" / "steady_state_volume"
VOLUME_DAYS = int(os.environ.get("HPD_BENCH_VOLUME_DAYS", 14))
VOLUME_ROWS = int(os.environ.get("HPD_BENCH_VOLUME_ROWS", 10_000))
E2E_DAYS = tuple(sorted({day for day in (3, 6, 10, VOLUME_DAYS) if day <= VOLUME_DAYS}))
AUGMENT = {"methods": ["wordnet"], "fraction": 0.25}  # hpd_ingest's
PATHS = {"previous": 0, "sampled": TEACHER_SAMPLE}  # each path's teacher_sample
RETRAIN = RetrainParams(teacher=TEACHER, k=128, mode="uncentered")  # hpd_retrain's defaults otherwise
TRAIN_STEPS = int(os.environ.get("HPD_BENCH_VOLUME_STEPS", 200))
# The same training budget a retrain on either path: TRAIN_STEPS steps (as many epochs over the selected teacher rows
# as that takes), the weights chosen on STS-B/SICK-R dev and blended with the start's as hpd_retrain's defaults do.
TRAINING: dict[str, Any] = {
    "teacher": TEACHER,
    "epochs": 1000,
    "max_steps": TRAIN_STEPS,
    "batch_size": 32,
    "amp": "bf16" if DTYPE == "bf16" else "off",
}
HPD = REPO / ".venv" / "bin" / "hpd"
QUERIES = 1000  # corpus sentences the new student encodes as queries in reuse_recall
REUSE_THRESHOLD = 0.97  # keep old segments after a promotion only where reuse recalls this much of a re-encode


def arrivals(days: int = VOLUME_DAYS, rows: int = VOLUME_ROWS) -> tuple[list[list[str]], str]:
    """``days`` lists of ``rows`` distinct sentences: the vendored corpus in order, then (once it is used up)
    WordNet-synonym variants of its sentences, each distinct from every earlier arrival; and how they were made."""
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        corpus = [line.rstrip("\n").split("\t", 1)[1] for line in f]
    lines = corpus[: days * rows]
    seen = {sentences.sentence_id(sentences.normalise_text(line)) for line in lines}
    variants = _variants(corpus, days * rows - len(lines), seen)
    how = f"the first {len(lines)} vendored corpus sentences"
    if variants:
        how += f", then {len(variants)} WordNet-synonym variants of corpus sentences (distinct from every other)"
    lines += variants
    return [lines[n * rows : (n + 1) * rows] for n in range(days)], how


def _variants(corpus: list[str], needed: int, seen: set[str]) -> list[str]:
    """``needed`` synonym variants of corpus sentences (half their content words replaced), none in ``seen``."""
    from tasks.ml import wordnet
    from tasks.stages.augment import synonym_substitute

    synonyms, found, generation = wordnet.synonyms_of(wordnet.load()), list[str](), 0

    while len(found) < needed:
        rng = random.Random(generation)
        for text in corpus:
            variant = sentences.normalise_text(synonym_substitute(text, rng, 0.5, synonyms))
            sid = sentences.sentence_id(variant)
            if variant and sid not in seen:
                seen.add(sid)
                found.append(variant)
                if len(found) == needed:
                    break
        generation += 1
    return found


def reuse_recall(before: tuple[list[str], np.ndarray], after: tuple[list[str], np.ndarray]) -> dict[str, Any]:
    """How much of a full re-encode the old student's vectors find: :data:`QUERIES` corpus sentences encoded by the
    new student (``after``), searched among the old student's vectors (``before``) and among the new one's, exact
    inner product over L2-normalised vectors, each query's own row left out; recall@10 of the first against the
    second."""
    import faiss

    position = {sid: row for row, sid in enumerate(before[0])}
    common = [(position[sid], row) for row, sid in enumerate(after[0]) if sid in position]
    old = np.ascontiguousarray(before[1][[b for b, _ in common]], dtype=np.float32)
    new = np.ascontiguousarray(after[1][[a for _, a in common]], dtype=np.float32)
    faiss.normalize_L2(old)
    faiss.normalize_L2(new)
    rows = np.random.default_rng(0).choice(len(common), min(QUERIES, len(common)), replace=False)
    queries = np.ascontiguousarray(new[rows])
    found = {}
    for name, vectors in (("reused", old), ("re_encoded", new)):
        _, neighbours = faiss.knn(queries, vectors, 11, faiss.METRIC_INNER_PRODUCT)
        found[name] = [[int(n) for n in row if n != own][:10] for row, own in zip(neighbours, rows, strict=True)]
    overlap = [len(set(a) & set(b)) / 10 for a, b in zip(found["reused"], found["re_encoded"], strict=True)]
    return {"queries": len(rows), "corpus": len(common), "recall_at_10_vs_re_encode": round(float(np.mean(overlap)), 4)}


def volume_day(day: Day, lines: list[str]) -> dict[str, Any]:
    """One day of a path: ingest, the day's segment, the plan and what it plans (a warm-started promotion
    measured by :func:`reuse_recall` before the new student re-encodes the corpus)."""
    started = time.perf_counter()
    day.ingest(lines)
    if promoted.model(day.store) is not None:  # hpd_index takes the partition with the promoted student
        day.index()
        day.searchable(started)
    planned = day.plan(RETRAIN)
    if planned.decision.retrain:
        before = index_vectors(day.store) if planned.warm_start else None
        name = day.retrain(planned)
        day.index("reindex")
        day.record["promoted"] = {"model_run": name, "scores": student_scores(day.store, name)}
        if before is not None:
            day.record["promoted"]["reuse"] = {
                **reuse_recall(before, index_vectors(day.store)),
                "from": planned.warm_start,
            }
        if "freshness_s" not in day.record:
            day.searchable(started)
    return day.result()


def end_to_end(store: str, day: Day, lines: list[str]) -> dict[str, Any]:
    """The sampled path's day replayed as the DAGs' tasks run it, each a process (``hpd`` commands), on ``store``
    (a copy of that morning's): each task's wall seconds and the freshness, staging to searchable."""
    raw, date = day.raw(lines), day.day.isoformat()
    sample = str(PATHS["sampled"])
    tasks = {
        "stage-corpus": ["--source", str(raw), "--shard-rows", "50000"],
        "augment": [
            "--methods",
            *AUGMENT["methods"],
            "--fraction",
            str(AUGMENT["fraction"]),
            "--teacher-sample",
            sample,
        ],
        "encode-teacher": ["--teacher", TEACHER, "--dtype", DTYPE, "--teacher-sample", sample],
        "build-index": ["--dtype", DTYPE],
    }
    env = {**os.environ, "HPD_STORE": store, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    walls, started = {}, time.perf_counter()
    for task, args in tasks.items():
        command = [str(HPD), task, *args, "--quiet"]
        command += [] if task == "build-index" else ["--ingest-date", date]
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
        walls[task] = round(time.perf_counter() - start, 2)
    freshness = round(time.perf_counter() - started, 1)
    return {"day": day.number, "tasks_s": walls, "freshness_s": freshness, "probes_found": probes_found(store, day.day)}


def simulated(path: str, daily: list[list[str]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every day of ``daily`` on ``path``'s own store; on the sampled path, :data:`E2E_DAYS` replayed end to end."""
    folder = ROOT / path / "store"
    shutil.rmtree(ROOT / path, ignore_errors=True)
    ingest = {"teacher_sample": PATHS[path], "augment": AUGMENT}
    days, e2e = [], []
    for number, lines in enumerate(daily, start=1):
        day = Day(storage.to_uri(str(folder)), number, ingest, TRAINING)
        if path == "sampled" and number in E2E_DAYS:
            e2e.append(end_to_end(storage.to_uri(str(_morning_copy(folder))), day, lines))
        days.append(volume_day(day, lines))
        print(f"volume {path} day {number}: {days[-1]['compute_s']} s", flush=True)
    return days, e2e


def _morning_copy(folder) -> Any:
    """A copy of the store ``folder`` as it is now (an empty folder before the first day)."""
    replay = ROOT / "replay"
    shutil.rmtree(replay, ignore_errors=True)
    if folder.exists():
        shutil.copytree(folder, replay)
    else:
        replay.mkdir(parents=True)
    return replay


def summary(runs: dict[str, list[dict[str, Any]]], e2e: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the benchmark reports: quiet-day compute per path and their ratio, teacher rows a day against
    the sample size, end-to-end freshness, the last promoted students' scores, and the reuse verdict."""
    quiet = {path: statistics.median(d["compute_s"] for d in days if not d["retrained"]) for path, days in runs.items()}
    reuse = [d["promoted"]["reuse"] for d in runs["sampled"] if "reuse" in d.get("promoted", {})]
    lowest = min((r["recall_at_10_vs_re_encode"] for r in reuse), default=None)
    freshness = sorted(run["freshness_s"] for run in e2e)
    last = {path: next(d["promoted"] for d in reversed(days) if "promoted" in d) for path, days in runs.items()}
    return {
        "quiet_day_median_compute_s": quiet,
        "quiet_day_ratio_previous_to_sampled": round(quiet["previous"] / quiet["sampled"], 2),
        "teacher_rows_per_day_max": {path: max(d["teacher_rows"] for d in days) for path, days in runs.items()},
        "teacher_sample": PATHS["sampled"],
        "end_to_end_freshness_s": {"days": [r["day"] for r in e2e], "p95": _p95(freshness), "max": max(freshness)},
        "last_promoted": last,
        "sts_delta_sampled_minus_previous": {
            name: round(last["sampled"]["scores"][name] - last["previous"]["scores"][name], 2)
            for name in last["previous"]["scores"]
        },
        "reuse_after_promotion": {
            "measured": reuse,
            "lowest_recall_at_10_vs_re_encode": lowest,
            "threshold": REUSE_THRESHOLD,
            "verdict": "keep old segments, re-encode in the background"
            if lowest is not None and lowest >= REUSE_THRESHOLD
            else "re-encode the corpus at promotion",
        },
    }


def _p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank) of ``values``, sorted."""
    return values[max(0, -(-len(values) * 95 // 100) - 1)]
