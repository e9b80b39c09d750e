"""A bounded retrain: warm-started from the promoted student against trained from the base model, same data, budget.

The packaged models through the stages, with the stages' recipe (targets from the two-teacher composite
all-mpnet-base-v2+all-MiniLM-L6-v2, student all-MiniLM-L6-v2, MSE plus the in-batch neighbourhood KL on the
teacher's own similarities, weights
chosen on the STS dev sets among the checkpoints and blends with the initial weights), on a store under
``var/bench/bounded_retrain``: ``DAY_ROWS`` distinct corpus sentences a day for ``len(OLD)`` older days and one
new day, staged and encoded by the teacher.
The promoted model learned the older days (PCA-128 over them, then ``PROMOTED_STEPS`` steps from the base model).
The retrain learns what the policy selects (:func:`tasks.orchestration.day_plan.training_partitions` with
``max_train_rows`` = ``BUDGET``: the new day and a replay sample of the older ones) for ``RETRAIN_STEPS`` steps
of the same batch and seed, as ``hpd_retrain`` would: warm-started from the promoted student on targets in the
PCA basis it learned (``basis_from``), so that it keeps that student's head too (its step 0 is the promoted
student), and, to compare, from the base model on a PCA fitted on the selection.
Scored on STS-B and SICK-R test (Spearman x100 of cosine similarity) beside the same-size baseline (MiniLM-L6
without distillation, its 384-d embeddings reduced to 128-d by a PCA fitted on the training sentences).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from datetime import date, timedelta
from typing import Any

import numpy as np

from bench import CORPUS, REPO, results
from tasks.core import catalog, config, manifest, sentences, storage
from tasks.core.catalog import ModelPointer, Stage
from tasks.ml import models, precision, sts
from tasks.orchestration import day_plan
from tasks.stages import distill, encode_teacher, fit_pca, stage_corpus

ROOT = REPO / "var" / "bench" / "bounded_retrain"
STORE = storage.to_uri(str(ROOT / "store"))
DAY_ROWS = int(os.environ.get("HPD_BENCH_DAY_ROWS", 1000))
OLD = [date(2026, 1, 1) + timedelta(days=n) for n in range(3)]
NEW = date(2026, 1, 4)
BUDGET = 2 * DAY_ROWS  # max_train_rows: the new day and about one older day
PROMOTED_STEPS, RETRAIN_STEPS = 120, 60
THREADS = len(os.sched_getaffinity(0))
DTYPE = precision.resolve("auto", "cpu")
TEACHER = models.DEFAULT_TEACHER_SPEC
TRAINING: dict[str, Any] = {
    "teacher": TEACHER,
    "batch_size": 64,
    "amp": "bf16" if DTYPE == "bf16" else "off",
    "threads": THREADS,
    "eval_every": 20,
    "seed": 0,
    "relation_weight": 1.0,  # the stage's defaults, recorded
    "relation_on": "teacher",
}
SETS = {"STS-B test": sts.stsb_test, "SICK-R test": sts.sick_r_test}


def stage_days() -> None:
    """Stage and teacher-encode each day's distinct sentences (skipped when done)."""
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        lines = [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(DAY_ROWS * (len(OLD) + 1))]
    for number, day in enumerate([*OLD, NEW]):
        raw = ROOT / "raw" / f"{day}.txt"
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text("\n".join(lines[number * DAY_ROWS : (number + 1) * DAY_ROWS]) + "\n")
        values = {"store": STORE, "source": str(raw), "ingest_date": day}
        stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
        values = {"store": STORE, "ingest_date": day, "teacher": TEACHER, "dtype": DTYPE}
        encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, values))


def trained(name: str, pca_name: str, steps: int, **settings: Any) -> dict[str, Any]:
    """A distill run (skipped when published with the same params): its train seconds and exported scores."""
    values = {"store": STORE, "name": name, "pca_name": pca_name, "max_steps": steps, **TRAINING, **settings}
    result = distill.run(config.parse(distill.DistillParams, values), progress=True)
    published = result.manifest
    assert published is not None
    return {
        "steps": published.stats["steps"],
        "train_rows": published.stats["train_rows"],
        "train_seconds": round(published.document["timings_s"]["train"], 1),
        "head": published.stats["init"]["init"],
        "sts_dev_by_step": _sts_dev_by_step(published),
        "best_step": published.stats["best_step"],
        "exported_blend": published.stats["exported"].get("blend"),
        "exported_val_cosine": published.stats["exported"]["val_cosine"],
        "scores": _scores(_student_encoder(name)),
    }


def _sts_dev_by_step(published: manifest.Manifest) -> dict[int, float]:
    """The mean STS dev score of each evaluation of a distill run (step 0: the weights it started from)."""
    metrics = next(o for o in published.outputs if o.uri.endswith("/metrics.json"))
    evals = json.loads(storage.read_bytes(metrics.uri, sha256=metrics.sha256))["evals"]
    return {e["step"]: e["sts_dev"] for e in evals if "sts_dev" in e}


def _fit(name: str, days: list[date], basis_from: str | None = None) -> None:
    """The PCA run ``name`` over ``days``: fitted, or in the basis distill run ``basis_from`` learned."""
    values = {"store": STORE, "teacher": TEACHER, "k": 128, "partitions": days, "name": name, "basis_from": basis_from}
    fit_pca.run(config.parse(fit_pca.FitPCAParams, values))


def _promote(name: str) -> None:
    """Point models/current.json at distill run ``name`` (the bench skips validate: no gate is measured here)."""
    published = manifest.read(STORE, Stage.DISTILL, name)
    assert published is not None
    _, etag = catalog.read_pointer(STORE, catalog.Pointer.MODEL)
    validation = catalog.manifest_uri(STORE, Stage.VALIDATE, name)
    catalog.move_pointer(STORE, ModelPointer(name, {}, validation, published.version_uri(STORE)), etag)


def _student_encoder(name: str):
    from tasks.ml import student
    from tasks.ml.encoder import SentenceEncoder

    folder = student.fetch_exported(STORE, name, ROOT / "students" / name)
    encoder = SentenceEncoder.load(str(folder))
    return lambda texts: encoder.encode(texts, batch_size=64)


def _scores(encode) -> dict[str, float]:
    return {name: round(sts.score(encode, load()), 2) for name, load in SETS.items()}


def _same_size_baseline(days: list[date]) -> dict[str, float]:
    from sklearn.decomposition import PCA

    from tasks.ml import student

    texts = [
        text
        for day in days
        for uri in sentences.shards(STORE, day, (Stage.STAGE_CORPUS,))
        for text in storage.read_parquet(uri, columns=["text"]).column("text").to_pylist()
    ]
    encoder = student.build(models.DEFAULT_STUDENT, 128)
    encoder.dense = None
    pca = PCA(n_components=128).fit(encoder.encode(texts, batch_size=64))
    return _scores(lambda batch: pca.transform(encoder.encode(batch, batch_size=64)))


def main() -> dict:
    import torch

    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    stage_days()
    _fit("k128-old", OLD)
    promoted = trained("promoted", "k128-old", PROMOTED_STEPS)
    _promote("promoted")
    selected = day_plan.training_partitions(STORE, TEACHER, BUDGET)
    _fit("k128-kept", selected, basis_from="promoted")
    _fit("k128-bounded", selected)
    warm = trained("warm", "k128-kept", RETRAIN_STEPS, warm_start="promoted")
    base = trained("base", "k128-bounded", RETRAIN_STEPS)
    table = {
        "promoted (older days, from the base model)": promoted["scores"],
        "retrain warm-started from the promoted student": warm["scores"],
        "retrain from the base model": base["scores"],
        "baseline MiniLM-L6 + PCA-128 (same size)": _same_size_baseline(selected),
    }
    better = "warm_start" if _mean(warm["scores"]) >= _mean(base["scores"]) else "base"
    return results.write(
        "bounded_retrain",
        unit="STS-B test Spearman x100",
        ours=warm["scores"]["STS-B test"],
        baseline=base["scores"]["STS-B test"],
        baseline_name="the same bounded retrain from the base model (same data, steps, batch, seed; like-for-like)",
        higher_is_better=True,
        details={
            "day_rows": DAY_ROWS,
            "older_days": [str(d) for d in OLD],
            "new_day": str(NEW),
            "max_train_rows": BUDGET,
            "selected_partitions": [str(d) for d in selected],
            "steps": {"promoted": PROMOTED_STEPS, "retrain": RETRAIN_STEPS},
            "training": TRAINING,
            "teacher_dtype": DTYPE,
            "table": table,
            "runs": {"promoted": promoted, "warm": warm, "base": base},
            "better": better,
            "mean_test_points": {"warm": _mean(warm["scores"]), "base": _mean(base["scores"])},
            "warm_minus_promoted": {on: round(warm["scores"][on] - promoted["scores"][on], 2) for on in SETS},
            "wall_seconds": round(time.perf_counter() - start, 1),
        },
    )


def _mean(scores: dict[str, float]) -> float:
    return round(float(np.mean(list(scores.values()))), 2)


if __name__ == "__main__":
    print(main())
