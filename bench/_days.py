"""A simulated day of the pipeline on a store, through the stage functions, as the DAGs run it (shared by the
steady-state benchmark's runs): staging, augmentation and the teacher (``hpd_ingest``), the day's index segment
(``hpd_index``), the day's plan and, when it says so, the retrain it plans (``hpd_retrain``: fit-pca, distill,
then promotion without the validate stage: its gate is the same on every path and is not what is measured) and the
new student's re-encode of the corpus. Each stage is timed; the day records its rows, retrain and freshness."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from bench import REPO
from tasks.core import catalog, config, manifest, promoted, sentences, storage
from tasks.core.catalog import ModelPointer, Stage
from tasks.ml import models, precision, sts, vector_index
from tasks.orchestration import day_plan
from tasks.orchestration.run_records import RetrainParams
from tasks.stages import augment, build_index, distill, encode_teacher, fit_pca, stage_corpus

FIRST = date(2026, 1, 1)
TEACHER = models.DEFAULT_TEACHER_SPEC  # the DAGs' default: all-mpnet-base-v2 with all-MiniLM-L6-v2
DTYPE = precision.resolve("auto", "cpu")
RETRAIN_STAGES = ("fit_pca", "distill", "reindex")  # what a day without a retrain does not run
PROBES = 5  # sentences of the day searched for (each must find itself)


class Day:
    """One simulated day on one store: its stage timings and what it did. ``ingest``: the hpd_ingest settings
    (``teacher_sample``, and ``augment`` values or None for no augmentation); ``training``: distill's settings."""

    def __init__(self, store: str, number: int, ingest: dict[str, Any], training: dict[str, Any]) -> None:
        self.store, self.number, self.settings, self.training = store, number, ingest, training
        self.day = FIRST + timedelta(days=number - 1)
        self.seconds: dict[str, float] = {}
        self.record: dict[str, Any] = {"day": number, "teacher_rows": 0, "student_rows": 0, "trained_rows": 0}

    def timed(self, stage: str, work: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        found = work()
        self.seconds[stage] = round(self.seconds.get(stage, 0) + time.perf_counter() - start, 2)
        return found

    def raw(self, lines: list[str]) -> Path:
        """The day's raw file (its arrivals, one sentence a line)."""
        raw = REPO / "var" / "bench" / "raw" / f"{len(lines)}-{self.day}.txt"
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text("\n".join(lines) + "\n")
        return raw

    def ingest(self, lines: list[str]) -> None:
        """Stage the day's sentences, augment the teacher's sample (when augmenting) and encode it."""
        base = {"store": self.store, "ingest_date": self.day}
        staged = {**base, "source": str(self.raw(lines)), "shard_rows": 50_000}
        self.timed("stage", lambda: stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, staged)))
        sample = {"teacher_sample": self.settings["teacher_sample"]}
        if self.settings.get("augment"):
            varied = {**base, **sample, **self.settings["augment"]}
            self.timed("augment", lambda: augment.run(config.parse(augment.AugmentParams, varied)))
        encoded = {**base, **sample, "teacher": TEACHER, "dtype": DTYPE}
        done = self.timed(
            "teacher", lambda: encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, encoded))
        )
        self.record["teacher_rows"] += done.stats["rows"]

    def plan(self, params: RetrainParams) -> day_plan.DayPlan:
        """The day's plan, as hpd_retrain's first task makes it."""
        planned = self.timed("plan", lambda: day_plan.plan(self.store, params, f"day{self.number:02d}"))
        self.record.update(retrained=planned.decision.retrain, reason=planned.decision.reason)
        return planned

    def retrain(self, planned: day_plan.DayPlan, max_rows: int = 40_000) -> str:
        """Fit the PCA (or keep the planned basis) and distil the planned model run, then promote it; its name."""
        name = planned.model_run or f"day{self.number:02d}"
        values = {"store": self.store, "teacher": TEACHER, "partitions": planned.partitions, "max_rows": max_rows}
        fitted = {**values, "name": name, "basis_from": planned.pca_basis}
        self.timed("fit_pca", lambda: fit_pca.run(config.parse(fit_pca.FitPCAParams, fitted)))
        trained = {"store": self.store, "name": name, "pca_name": name, "warm_start": planned.warm_start}
        result = self.timed(
            "distill", lambda: distill.run(config.parse(distill.DistillParams, {**trained, **self.training}))
        )
        epochs = result.stats["train_rows"] * self.training.get("epochs", 1)
        self.record["trained_rows"] += min(epochs, result.stats["steps"] * self.training["batch_size"])
        self.record.update(trained_partitions=len(planned.partitions), basis_kept=planned.pca_basis is not None)
        published = manifest.read(self.store, Stage.DISTILL, name)
        validation = catalog.manifest_uri(self.store, Stage.VALIDATE, name)
        pointer = ModelPointer(name, {}, validation, published.version_uri(self.store))
        catalog.move_pointer(self.store, pointer, promoted.model_etag(self.store))
        return name

    def index(self, stage: str = "index") -> None:
        values = {"store": self.store, "dtype": DTYPE}
        built = self.timed(stage, lambda: build_index.run(config.parse(build_index.BuildIndexParams, values)))
        self.record["student_rows"] += built.stats["rows_encoded"]
        self.record["index_rows"] = built.stats["rows"]
        self.record["segments"] = built.stats["segments"]

    def searchable(self, started: float) -> None:
        """Freshness: seconds since ``started``, once a sample of the day's sentences each find themselves."""
        self.record["freshness_s"] = round(time.perf_counter() - started, 1)
        self.record["probes_found"] = probes_found(self.store, self.day)

    def result(self) -> dict[str, Any]:
        compute = round(sum(self.seconds.values()), 2)
        retraining = sum(self.seconds.get(stage, 0) for stage in RETRAIN_STAGES)
        without = round(compute - retraining, 2)
        return {**self.record, "seconds": self.seconds, "compute_s": compute, "without_retrain_s": without}


def probes_found(store: str, day: date) -> str:
    """``found/searched`` of the first :data:`PROBES` sentences staged on ``day`` (each must find itself in the
    promoted index); an AssertionError when one does not."""
    loaded = vector_index.load_current(store)
    shard = sentences.shards(store, day, (Stage.STAGE_CORPUS,))[0]
    table = storage.read_parquet(shard, columns=["sentence_id", "text"]).slice(0, PROBES)
    hits = loaded.search(table.column("text").to_pylist(), 10)
    ids = table.column("sentence_id").to_pylist()
    found = [sid in {h.sentence_id for h in row} for sid, row in zip(ids, hits, strict=True)]
    if not all(found):
        raise AssertionError(f"{day}: staged sentences not searchable after the day's runs")
    return f"{sum(found)}/{len(found)}"


def student_scores(store: str, model_run: str) -> dict[str, float]:
    """The STS-B and SICK-R test scores (Spearman x100) of a published student."""
    from tasks.ml import student
    from tasks.ml.encoder import SentenceEncoder

    with tempfile.TemporaryDirectory() as scratch:
        model = SentenceEncoder.load(str(student.fetch_exported(store, model_run, Path(scratch))))
        return {pairs.name: round(sts.score(model.encode, pairs), 2) for pairs in (sts.stsb_test(), sts.sick_r_test())}


def index_vectors(store: str) -> tuple[list[str], np.ndarray]:
    """The promoted index's sentence ids and the student embeddings it was built from, row for row."""
    from tasks.ml import segments

    pointer = promoted.index(store)
    assert pointer is not None, f"{store}: no index promoted"
    _, listed = segments.read_table(store, pointer.pointer.index)
    ids, blocks = [], []
    for segment in segments.ordered(listed):
        for output in segment.embeddings:
            table = storage.read_parquet(output.uri, sha256=output.sha256)
            ids += table.column("sentence_id").to_pylist()
            blocks.append(np.asarray(table.column("embedding").to_pylist(), dtype=np.float32))
    return ids, np.concatenate(blocks)
