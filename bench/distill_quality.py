"""The CPU recipe: HPD students that beat their same-size baselines, the levers that got them there.

Teacher all-mpnet-base-v2 -> PCA-128 (uncentered) -> students all-MiniLM-L6-v2 and its first 3 layers, run by
the pipeline's own stages on a persistent store under ``var/bench/distill_quality`` (a rerun skips what is
finished, scores included). Two partitions: ``HPD_BENCH_SENTENCES`` corpus sentences plus 25% WordNet variants,
and the in-domain text (the distinct sentences of the STS-B and SICK training splits, without their scores:
:func:`tasks.ml.sts.training_sentences`). Augmentation varies, and the teacher encodes, every row
(``teacher_sample`` 0: the pipeline's default bounds the sample a day adds; here the whole set is the data).
The teacher encodings (the teacher alone, and the two-teacher composite of :mod:`tasks.ml.teachers`: the
teacher and the base student, whose member encodings it reuses) are stage runs of their own, reported apart.

Levers: short runs of the 6-layer student (``LEVER_STEPS`` steps of 64 sentences), each changing one setting
of the reference; the dev sets (STS-B dev, SICK-R dev) choose, the test sets report. The recipe: the two
students trained with the winning settings on the budget of ``RECIPE``; their folders are kept in
``var/bench/students/<name>/`` (sentence-transformers format). Each student faces its same-size baseline: the
same architecture without distillation, its 384-d embeddings reduced to 128-d by a PCA fitted on 8,000
training sentences. Scores: Spearman x100 of cosine similarity.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable
from datetime import date
from typing import Any

import numpy as np

from bench import REPO, results
from tasks.core import config, manifest, sentences, storage
from tasks.core.catalog import Stage
from tasks.ml import metrics, models, precision, sts
from tasks.stages import augment, distill, encode_teacher, fit_pca, stage_corpus
from tasks.stages.distill.stage import RUNTIME
from tasks.stages.validate import scoring

STORE = storage.to_uri(str(REPO / "var" / "bench" / "distill_quality"))
SCORES = REPO / "var" / "bench" / "distill_quality_scores.json"
STUDENTS = REPO / "var" / "bench" / "students"
IN_DOMAIN_TEXT = REPO / "var" / "bench" / "in_domain.txt"
DAY, IN_DOMAIN_DAY = date(2026, 1, 1), date(2026, 1, 2)  # the corpus partition, the in-domain text's
CORPUS_ONLY, EVERY_PARTITION = [DAY.isoformat()], [DAY.isoformat(), IN_DOMAIN_DAY.isoformat()]
EVERY_ROW = {"teacher_sample": 0}  # the teacher encodes, and augmentation varies, every staged row
SENTENCES = int(os.environ.get("HPD_BENCH_SENTENCES", 48_000))
THREADS = len(os.sched_getaffinity(0))
LEVER_STEPS = 150
REFERENCE = {
    "batch_size": 64,
    "lr": 1e-4,
    "warmup_ratio": 0.05,
    "epochs": 20,
    "eval_every": 50,
    "length_grouped": False,
    "select_on": "val_mse",
    "blend_initial": [],
    "relation_weight": 0.0,
    "relation_on": "targets",
    "partitions": CORPUS_ONLY,
}
PREDATING = {"length_grouped": False, "relation_on": "targets"}  # how runs from before a parameter behaved
TWO_TEACHERS = models.DEFAULT_TEACHER_SPEC  # the stages' default: teacher + base student
HALF_STUDENT = f"{models.DEFAULT_TEACHER}+0.5*{models.DEFAULT_STUDENT}"  # the base student's block at weight 0.5
TEACHERS = (models.DEFAULT_TEACHER, TWO_TEACHERS, HALF_STUDENT)
DTYPE = precision.resolve("auto", "cpu")  # bf16 on CPUs with AVX-512 BF16 or AMX (where it was measured), else fp32
AMP = "bf16" if DTYPE == "bf16" else "off"
LEVERS: dict[str, dict[str, Any]] = {
    "reference: lr 1e-4, MSE, weights of the lowest validation MSE": {},
    "data: + the STS-B and SICK training splits' sentences (unlabelled)": {"partitions": EVERY_PARTITION},
    "lr 3e-5": {"lr": 3e-5},
    "loss: MSE + cosine term (weight 1)": {"cosine_weight": 1.0},
    "loss: MSE + similarity-structure term (weight 1)": {"structure_weight": 1.0},
    "loss: MSE + in-batch neighbourhood KL (weight 1, temperature 0.05)": {"relation_weight": 1.0},
    "weights of the best STS dev score": {"select_on": "sts_dev"},
    "embeddings and 3 lower layers frozen": {"freeze_layers": 3},
    "max_seq_length 32": {"max_seq_length": 32},
    "length-grouped batches": {"length_grouped": True},
    "targets from two teachers (teacher and base student, concatenated, PCA-128)": {"teacher": TWO_TEACHERS},
    "weights of the best STS dev score, blends of the initial and final weights among the candidates": {
        "select_on": "sts_dev",
        "blend_initial": [0.25, 0.5, 0.75],
    },
    "targets from two teachers, with the in-batch neighbourhood KL (weight 1, temperature 0.05)": {
        "teacher": TWO_TEACHERS,
        "relation_weight": 1.0,
    },
    "data: the STS-B and SICK training splits' sentences alone (no corpus partition)": {
        "partitions": [IN_DOMAIN_DAY.isoformat()]
    },
    "targets from two teachers, with the in-batch neighbourhood KL at weight 10": {
        "teacher": TWO_TEACHERS,
        "relation_weight": 10.0,
    },
    "targets from two teachers, the base student's at weight 0.5, with the in-batch neighbourhood KL": {
        "teacher": HALF_STUDENT,
        "relation_weight": 1.0,
    },
    "targets from two teachers, with the in-batch neighbourhood KL on the teacher's own (1,152-d) similarities": {
        "teacher": TWO_TEACHERS,
        "relation_weight": 1.0,
        "relation_on": "teacher",
    },
}
RECIPE: dict[str, dict[str, Any]] = {
    "MiniLM-L6": {"max_steps": 7500},
    "MiniLM-L3": {"student_layers": 3, "max_steps": 10000},
}
WINNING: dict[str, Any] = {
    "teacher": TWO_TEACHERS,
    "partitions": EVERY_PARTITION,
    "relation_weight": 1.0,
    "relation_on": "teacher",
    "length_grouped": True,
    "select_on": "sts_dev",
    "blend_initial": [0.25, 0.5, 0.75],
    "eval_every": 200,
}
OVERLAP, OVERLAP_SAMPLE = "neighbour overlap@10", 2000  # the validation report's measure, on its sample size
SETS: dict[str, Callable[[], sts.PairSet]] = {
    "STS-B dev": sts.stsb_dev,
    "SICK-R dev": sts.sick_r_dev,
    "STS-B test": sts.stsb_test,
    "SICK-R test": sts.sick_r_test,
}


def prepare() -> dict:
    """Stage, augment, encode with the teacher and fit the PCA (each skipped when done); wall seconds of each."""
    corpus = {"source": str(REPO / "data" / "corpus" / "sentences.tsv.gz"), "column": "sentence", "limit": SENTENCES}
    steps = [
        ("stage", stage_corpus.run, stage_corpus.StageCorpusParams, DAY, corpus),
        ("augment", augment.run, augment.AugmentParams, DAY, {"methods": ["wordnet"], "fraction": 0.25, **EVERY_ROW}),
        ("stage in-domain", stage_corpus.run, stage_corpus.StageCorpusParams, IN_DOMAIN_DAY, _in_domain_source()),
    ]
    for teacher in TEACHERS:
        values = {"dtype": DTYPE, "teacher": teacher, **EVERY_ROW}
        for day in (DAY, IN_DOMAIN_DAY):
            steps.append(
                (f"encode_teacher {teacher} {day}", encode_teacher.run, encode_teacher.EncodeTeacherParams, day, values)
            )
    timings = {}
    for name, run, model, day, values in steps:
        timings[name] = _timed_stage(run, config.parse(model, {"store": STORE, "ingest_date": day, **values}))
    for teacher in TEACHERS:
        values = {"store": STORE, "teacher": teacher, "k": 128, "max_rows": 40_000}
        timings[f"fit_pca {teacher}"] = _timed_stage(fit_pca.run, config.parse(fit_pca.FitPCAParams, values))
    return timings


def _in_domain_source() -> dict[str, str]:
    """The in-domain partition's source: the training splits' sentences, one per line."""
    IN_DOMAIN_TEXT.parent.mkdir(parents=True, exist_ok=True)
    IN_DOMAIN_TEXT.write_text("\n".join(sts.training_sentences()) + "\n", encoding="utf-8")
    return {"source": str(IN_DOMAIN_TEXT)}


def _timed_stage(run: Callable[..., manifest.StageResult], params: Any) -> dict:
    """The stage's wall seconds in this call, and those its published manifest recorded (when it was skipped)."""
    start = time.perf_counter()
    result = run(params, progress=True)
    recorded = result.manifest.document.get("timings_s", {}) if result.manifest else {}
    return {"seconds": round(time.perf_counter() - start, 1), "skipped": result.skipped, "recorded_s": recorded}


def train(name: str, overrides: dict[str, Any]) -> dict:
    """A distill run of the reference with ``overrides`` (a published run of that name whose recorded params
    agree is reused: it may predate a newer stage parameter); its stats and seconds, as published."""
    values = {
        "teacher": models.DEFAULT_TEACHER,
        "amp": AMP,
        "threads": THREADS,
        "checkpoint_every": 400,
        **REFERENCE,
        **overrides,
    }
    published = manifest.read(STORE, Stage.DISTILL, name)
    recorded = {**PREDATING, **published.params} if published else {}
    if published is None or any(recorded.get(k) != v for k, v in values.items() if k not in RUNTIME):
        published = distill.run(
            config.parse(distill.DistillParams, {"store": STORE, "name": name, **values}), progress=True
        ).manifest
    stats, seconds = published.stats, published.document["timings_s"]["train"]
    metrics = next(o for o in published.outputs if o.uri.endswith("/metrics.json"))
    return {
        "params": values,
        "steps": stats["steps"],
        "best_step": stats["best_step"],
        "exported": stats["exported"],
        "evals": json.loads(storage.read_bytes(metrics.uri, sha256=metrics.sha256))["evals"],
        "train_seconds": round(seconds, 1),
        "sentences_per_s": round(stats["steps"] * values["batch_size"] / seconds),
        "val_cosine": {"initial": stats["initial"]["val_cosine"], "exported": stats["exported"]["val_cosine"]},
        "key": published.key,
        "fingerprint": published.fingerprint,
    }


def scored(key: str, encode_factory: Callable[[], Callable[[list[str]], np.ndarray]]) -> dict[str, float]:
    """The four STS scores of an encoder, cached in ``SCORES`` under ``key`` (a model's identity)."""
    cache = json.loads(SCORES.read_text()) if SCORES.exists() else {}
    if key not in cache:
        encode = encode_factory()
        cache[key] = {name: round(sts.score(encode, load()), 2) for name, load in SETS.items()}
        SCORES.write_text(json.dumps(cache, indent=2))
    return cache[key]


def measured(key: str, encode_factory: Callable[[], Callable[[list[str]], np.ndarray]]) -> dict[str, float]:
    """The four STS scores of an encoder (:func:`scored`) and its neighbour overlap@10 with the teacher, cached in
    ``SCORES`` under ``key``: a rerun computes only what the cache lacks."""
    encode_factory = functools.cache(encode_factory)
    scores = scored(key, encode_factory)
    cache = json.loads(SCORES.read_text())
    if OVERLAP not in cache[key]:
        cache[key][OVERLAP] = neighbour_overlap(encode_factory())
        SCORES.write_text(json.dumps(cache, indent=2))
    return {**scores, OVERLAP: cache[key][OVERLAP]}


def neighbour_overlap(encode: Callable[[list[str]], np.ndarray]) -> float:
    """The validation report's neighbour overlap@10 with the teacher: over the first ``OVERLAP_SAMPLE`` staged
    corpus sentences, the mean share of each one's 10 nearest by ``encode`` that the teacher (all-mpnet-base-v2)
    also ranks among its 10 nearest."""
    sample = scoring.corpus_sample(STORE, models.DEFAULT_TEACHER, OVERLAP_SAMPLE)
    found = scoring.neighbours(encode(sample.texts))
    return round(metrics.recall_at_k(found, scoring.neighbours(sample.teacher_vectors)), 4)


def _student(run: dict) -> Callable[[], Callable[[list[str]], np.ndarray]]:
    def factory() -> Callable[[list[str]], np.ndarray]:
        from tasks.ml import student

        folder = STUDENTS / ".scoring" / run["key"]
        shutil.rmtree(folder, ignore_errors=True)
        return _folder_encoder(student.fetch_exported(STORE, run["key"], folder))

    return factory


def baselines(layers: int | None, train_texts: list[str]) -> dict[str, dict[str, float]]:
    """The untrained architecture at 384-d, reduced to 128-d by PCA, and with the ridge head the runs start from."""
    from sklearn.decomposition import PCA

    from tasks.ml import student

    name = f"MiniLM-L{layers or 6}"

    def base() -> Any:
        encoder = student.build(models.DEFAULT_STUDENT, 128, layers=layers)
        encoder.dense = None
        return encoder

    def pca_factory() -> Callable[[list[str]], np.ndarray]:
        encoder = base()
        pca = PCA(n_components=128).fit(encoder.encode(train_texts, batch_size=64))
        return lambda texts: pca.transform(encoder.encode(texts, batch_size=64))

    return {
        f"baseline {name} (384-d)": measured(f"base-{name}", lambda: base().encode),
        f"baseline {name} + PCA-128 (same size)": measured(f"base-pca-{name}", pca_factory),
    }


def teacher_rows() -> dict[str, dict[str, float]]:
    from tasks.ml import teachers
    from tasks.ml.projection import load_projection

    def projected(teacher: str) -> Callable[[], Callable[[list[str]], np.ndarray]]:
        def factory() -> Callable[[list[str]], np.ndarray]:
            encoder, projection = teachers.load(teacher), load_projection(STORE, teacher, "k128-uncentered")
            return lambda texts: projection.apply(encoder.encode(texts, dtype=DTYPE))

        return factory

    full = measured("teacher", lambda: lambda t: teachers.load(models.DEFAULT_TEACHER).encode(t, dtype=DTYPE))
    return {
        "teacher all-mpnet-base-v2 (768-d)": full,
        "teacher + PCA-128 (the single-teacher targets)": measured("teacher-pca", projected(models.DEFAULT_TEACHER)),
        "two teachers + PCA-128 (the recipe's targets)": measured("two-teachers-pca", projected(TWO_TEACHERS)),
        "two teachers, the base student's at weight 0.5, + PCA-128": measured(
            "half-student-pca", projected(HALF_STUDENT)
        ),
    }


def main() -> dict:
    import torch

    from tasks.ml import student

    torch.set_num_threads(THREADS)
    prepared = prepare()
    train_texts = [
        text
        for uri in sentences.shards(STORE, DAY, (Stage.STAGE_CORPUS,))
        for text in storage.read_parquet(uri, columns=["text"]).column("text").to_pylist()
    ][:8000]
    levers = {
        lever: trained(f"lever-{number}", {"max_steps": LEVER_STEPS, **overrides})
        for number, (lever, overrides) in enumerate(LEVERS.items())
    }
    recipe = {name: trained(f"recipe-{name}", {**WINNING, **budget}) for name, budget in RECIPE.items()}
    table = {**teacher_rows(), **baselines(None, train_texts), **baselines(3, train_texts)}
    for name, run in recipe.items():
        shutil.rmtree(STUDENTS / name, ignore_errors=True)
        student.fetch_exported(STORE, run["key"], STUDENTS / name)
        table[f"student {name} (128-d, HPD recipe)"] = run["scores"]
    return _write(table, levers, recipe, prepared)


def trained(name: str, overrides: dict[str, Any]) -> dict:
    """A distill run (:func:`train`) with the STS scores of the student it exported."""
    run = train(name, overrides)
    return {**run, "scores": measured(f"{run['key']}@{run['fingerprint']}", _student(run))}


def _folder_encoder(folder) -> Callable[[list[str]], np.ndarray]:
    from tasks.ml.encoder import SentenceEncoder

    encoder = SentenceEncoder.load(str(folder))
    return lambda texts: encoder.encode(texts, batch_size=64)


def _write(table: dict, levers: dict, recipe: dict, prepared: dict) -> dict:
    def gap(name: str, on: str) -> float:
        same_size = table[f"baseline {name} + PCA-128 (same size)"][on]
        return round(table[f"student {name} (128-d, HPD recipe)"][on] - same_size, 2)

    l6 = table["student MiniLM-L6 (128-d, HPD recipe)"]["STS-B test"]
    details = {
        "sentences": SENTENCES,
        "threads": THREADS,
        "dtype": {"teacher": DTYPE, "amp": AMP},
        "lever_steps": LEVER_STEPS,
        "reference": REFERENCE,
        "winning": WINNING,
        "table": table,
        "levers": levers,
        "recipe": recipe,
        "recipe_train_minutes": round(sum(r["train_seconds"] for r in recipe.values()) / 60, 1),
        "prepare": prepared,
        "gaps_vs_same_size": {
            name: {on: gap(name, on) for on in ("STS-B test", "SICK-R test")} for name in ("MiniLM-L6", "MiniLM-L3")
        },
    }
    return results.write(
        "distill_quality",
        unit="STS-B test Spearman x100",
        ours=l6,
        baseline=table["baseline MiniLM-L6 + PCA-128 (same size)"]["STS-B test"],
        baseline_name="MiniLM-L6 without distillation + PCA-128",
        higher_is_better=True,
        details=details,
    )


if __name__ == "__main__":
    print(main())
