"""A real HPD run on CPU: teacher all-mpnet-base-v2 -> PCA-128 -> two students, scored on STS.

The pipeline's own stages, on a sample of the vendored corpus (plus WordNet augmentation), in a
persistent store under ``var/bench/distill_quality`` (a rerun skips finished stages). Students:
all-MiniLM-L6-v2 and the same model cut to its first 3 layers, each with the default ridge-initialised
head; the 3-layer one also from a random head (HPD's init) for the same budget. Each student is
compared with its same-size baseline: the same architecture without distillation, its 384-d
embeddings reduced to 128-d by a PCA fitted on the training sentences. STS-B test and SICK-R test,
Spearman x100 of cosine similarity. Budget: under 60 minutes on 2 cores, teacher encoding included.
"""

from __future__ import annotations

import os
import time
from datetime import date

from bench import REPO, results
from tasks.core import config, manifest, sentences, storage
from tasks.core.catalog import Stage
from tasks.ml import models, sts
from tasks.ml.projection import load_projection
from tasks.stages import augment, distill, encode_teacher, fit_pca, stage_corpus

ROOT = REPO
STORE = storage.to_uri(str(ROOT / "var" / "bench" / "distill_quality"))
DAY = date(2026, 1, 1)
SENTENCES = int(os.environ.get("HPD_BENCH_SENTENCES", 16_000))
EPOCHS = int(os.environ.get("HPD_BENCH_EPOCHS", 2))
THREADS = len(os.sched_getaffinity(0))
STUDENTS = {
    "MiniLM-L6": {"student_layers": None, "init": "ridge"},
    "MiniLM-L3": {"student_layers": 3, "init": "ridge"},
    "MiniLM-L3 (random head)": {"student_layers": 3, "init": "random"},
}


def prepare() -> dict:
    timings = {}
    steps = [
        (
            "stage",
            stage_corpus.run,
            stage_corpus.StageCorpusParams,
            {"source": str(ROOT / "data" / "corpus" / "sentences.tsv.gz"), "column": "sentence", "limit": SENTENCES},
        ),
        ("augment", augment.run, augment.AugmentParams, {"methods": ["wordnet"], "fraction": 0.25}),
        (
            "encode_teacher",
            encode_teacher.run,
            encode_teacher.EncodeTeacherParams,
            {"dtype": "bf16", "threads": THREADS},
        ),
    ]
    for name, run, model, values in steps:
        start = time.perf_counter()
        run(config.parse(model, {"store": STORE, "ingest_date": DAY, **values}), progress=True)
        timings[name] = round(time.perf_counter() - start, 1)
    start = time.perf_counter()
    fit_pca.run(config.parse(fit_pca.FitPCAParams, {"store": STORE, "k": 128, "max_rows": 40_000}), progress=True)
    timings["fit_pca"] = round(time.perf_counter() - start, 1)
    return timings


def _train(name: str, overrides: dict) -> tuple[manifest.StageResult, float]:
    values = {
        "store": STORE,
        "batch_size": 64,
        "lr": 1e-4,
        "epochs": EPOCHS,
        "warmup_ratio": 0.05,
        "amp": "bf16",
        "threads": THREADS,
        "eval_every": 100,
        "checkpoint_every": 100,
        "name": name.replace(" ", "").replace("(", "-").replace(")", ""),
        **overrides,
    }
    start = time.perf_counter()
    result = distill.run(config.parse(distill.DistillParams, values), progress=True)
    return result, time.perf_counter() - start


def _pca_baseline(encoder, train_texts: list[str]):
    """The same-size baseline: the untrained encoder, reduced to 128-d by PCA fitted on training sentences."""
    from sklearn.decomposition import PCA

    pca = PCA(n_components=128).fit(encoder.encode(train_texts, batch_size=64))
    return lambda texts: pca.transform(encoder.encode(texts, batch_size=64))


def _scores(encode) -> dict:
    return {pairs.name: round(sts.score(encode, pairs), 2) for pairs in (sts.stsb_test(), sts.sick_r_test())}


def main() -> dict:
    import torch

    from tasks.ml import student
    from tasks.ml.encoder import SentenceEncoder

    torch.set_num_threads(THREADS)
    started = time.perf_counter()
    timings = prepare()
    train_texts = [
        t
        for uri in sentences.shards(STORE, DAY, (Stage.STAGE_CORPUS,))
        for t in storage.read_parquet(uri, columns=["text"]).column("text").to_pylist()
    ][:8000]
    table: dict[str, dict] = {}
    teacher = SentenceEncoder.load(models.DEFAULT_TEACHER)
    projection = load_projection(STORE, models.DEFAULT_TEACHER, "k128-uncentered")
    table["teacher all-mpnet-base-v2 (768-d)"] = _scores(lambda t: teacher.encode(t, dtype="bf16"))
    table["teacher + PCA-128 (the targets)"] = _scores(lambda t: projection.apply(teacher.encode(t, dtype="bf16")))
    runs = {}
    for name, overrides in STUDENTS.items():
        published, seconds = _train(name, overrides)
        runs[name] = {"seconds": round(seconds, 1), "stats": published.stats}
        model_dir = ROOT / "var" / "bench" / "students" / name.replace(" ", "_")
        distilled = SentenceEncoder.load(str(student.fetch_exported(STORE, published.manifest.key, model_dir)))
        table[f"student {name} (128-d)"] = _scores(lambda t, m=distilled: m.encode(t, batch_size=64))
        if "random" not in name:
            base = student.build(models.DEFAULT_STUDENT, 128, layers=overrides["student_layers"])
            base.dense = None
            table[f"baseline {name.split()[0]} (384-d)"] = _scores(lambda t, m=base: m.encode(t, batch_size=64))
            table[f"baseline {name.split()[0]} + PCA-128"] = _scores(_pca_baseline(base, train_texts))
    l3, l3_base = table["student MiniLM-L3 (128-d)"]["STS-B test"], table["baseline MiniLM-L3 + PCA-128"]["STS-B test"]
    details = {
        "sentences": SENTENCES,
        "epochs": EPOCHS,
        "threads": THREADS,
        "table": table,
        "runs": runs,
        "prepare_seconds": timings,
        "total_minutes": round((time.perf_counter() - started) / 60, 1),
        "gap_L3_vs_baseline_stsb": round(l3 - l3_base, 2),
        "gap_L6_vs_baseline_stsb": round(
            table["student MiniLM-L6 (128-d)"]["STS-B test"] - table["baseline MiniLM-L6 + PCA-128"]["STS-B test"], 2
        ),
    }
    return results.write(
        "distill_quality",
        unit="STS-B Spearman x100",
        ours=l3,
        baseline=l3_base,
        baseline_name="MiniLM-L3 without distillation + PCA-128",
        higher_is_better=True,
        details=details,
    )


if __name__ == "__main__":
    print(main())
