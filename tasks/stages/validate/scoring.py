"""What a validation measures, for the teacher (full dimension), the teacher reduced by the fitted
PCA, the student, and the paper's same-size baseline (the student's base model reduced to k by a
PCA of its own embeddings of corpus sentences):

- STS: Spearman x100 of cosine on each pair set;
- retrieval: recall@10 of the student's neighbours against the teacher's exact neighbours over a
  corpus sample, and MRR of retrieving the paired sentence for STS-B test pairs scored >= 4;
- the report's plots: PCA explained variance, training curves, STS-B scatter, embedding norms.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tasks.core import catalog, manifest, sentences, storage
from tasks.core.catalog import Stage
from tasks.core.progress import Progress
from tasks.core.promoted import PromotedModel
from tasks.core.stage_records import BASELINE, Record, Retrieval, StsTable
from tasks.ml import metrics, sts
from tasks.stages import encode_teacher
from tasks.stages.params import DistillParams, ValidateParams
from tasks.stages.validate.errors import ValidateError
from tasks.stages.validate.records import DevVersusPromoted, NeighbourOverlap

if TYPE_CHECKING:
    from tasks.stages.quality import QualityResults

Encode = Callable[[list[str]], np.ndarray]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CorpusSample:
    ids: list[str]
    texts: list[str]
    teacher_vectors: np.ndarray


class _Loss(Record):
    """A line of a distill run's ``losses.jsonl``: the training loss at one step."""

    step: int
    loss: float


class _Evaluation(Record):
    """An evaluation in a distill run's ``metrics.json``: the validation MSE at one step (its other scores unused)."""

    step: int
    val_mse: float


class _DistillMetrics(Record):
    evals: list[_Evaluation]


@dataclass(frozen=True)
class TrainingCurves:
    """(step, training loss) of each step and (step, validation MSE) of each evaluation of a distill run."""

    losses: list[tuple[int, float]]
    evals: list[tuple[int, float]]


@dataclass(frozen=True)
class Plots:
    """What the report plots: the PCA's explained variance ratio, the training curves, the student's STS-B test
    cosines against the gold scores, and the L2 norms of the corpus sample's embeddings by model."""

    explained_variance_ratio: np.ndarray
    curves: TrainingCurves
    sts_cosine: np.ndarray
    sts_gold: np.ndarray
    norms: dict[str, np.ndarray]


@dataclass(frozen=True)
class Measurements:
    sts: StsTable
    retrieval: Retrieval
    plots: Plots
    neighbours_vs_promoted: NeighbourOverlap | None = None
    dev_vs_promoted: DevVersusPromoted | None = None


def measure(
    params: ValidateParams,
    distilled: manifest.Manifest,
    pair_sets: list[sts.PairSet],
    promoted: PromotedModel | None,
    progress: bool = False,
) -> Measurements:
    """Score the exported student of ``distilled`` and its references on ``pair_sets`` and a corpus sample; with
    ``promoted`` (another run's promotion), also how far both students agree on the sample's neighbours and both
    students' mean STS dev score. The
    scores done are logged as progress (a bar with ``progress``)."""
    from tasks.ml import student
    from tasks.ml.encoder import SentenceEncoder

    trained = DistillParams.model_validate(distilled.params)
    corpus = corpus_sample(params.store, trained.teacher, params.retrieval_sample)
    with tempfile.TemporaryDirectory() as scratch:
        model = SentenceEncoder.load(str(student.fetch_published(distilled, Path(scratch))))
        encode = sts.remembering(model.encode)  # its STS-B sentences are scored, plotted and ranked: encoded once
        encoders, explained = _encoders(params, trained, model.dim, encode, corpus.texts)
        table = _sts_table(encoders, pair_sets, f"validate {distilled.key} STS", progress)
        student_corpus = encode(corpus.texts)
        stsb = pair_sets[0]
        plots = Plots(
            explained_variance_ratio=explained,
            curves=training_curves(distilled),
            sts_cosine=sts.cosine(encode(stsb.first), encode(stsb.second)),
            sts_gold=stsb.scores,
            norms={
                "teacher": np.linalg.norm(corpus.teacher_vectors, axis=1),
                "student": np.linalg.norm(student_corpus, axis=1),
            },
        )
        found = neighbours(student_corpus)
        overlap, dev = (
            _versus_promoted(promoted, encode, found, corpus.texts, Path(scratch)) if promoted else (None, None)
        )
        return Measurements(table, _retrieval(encode, found, corpus, stsb), plots, overlap, dev)


def neighbours(vectors: np.ndarray) -> np.ndarray:
    """Each row's 10 nearest other rows by cosine: what the neighbour overlaps (overlap@10) compare."""
    return metrics.nearest(vectors, vectors, 10, exclude_self=True)


def _sts_table(encoders: dict[str, Encode], pair_sets: list[sts.PairSet], what: str, bar: bool) -> StsTable:
    """Each encoder's score on each pair set, the pair sets scored logged as ``what``'s progress (or a bar)."""
    scores: dict[str, dict[str, float]] = {}
    total = len(encoders) * len(pair_sets)
    with Progress(what, total, unit="pair sets", bar=bar, logger=log) as reporter:
        for name, encode in encoders.items():
            for pairs in pair_sets:
                scores.setdefault(name, {})[pairs.name] = round(sts.score(encode, pairs), 2)
                reporter.update(encoder=name, pairs=pairs.name)
    return StsTable.model_validate(scores)


def _versus_promoted(
    promoted: PromotedModel, encode: Encode, found: np.ndarray, texts: list[str], scratch: Path
) -> tuple[NeighbourOverlap, DevVersusPromoted]:
    """This run's student (its ``encode``) against the promoted run's: the mean share of each sample sentence's 10
    nearest sample sentences (``found``, by this run's student) that the promoted one also ranks among its 10
    nearest (1: the same neighbours), and both students' mean STS dev score."""
    from tasks.ml import student
    from tasks.ml.encoder import SentenceEncoder

    theirs = SentenceEncoder.load(str(student.fetch_published(promoted.distilled, scratch / "promoted")))
    vectors = theirs.encode(texts)
    overlap = metrics.recall_at_k(found, neighbours(vectors))
    dev = DevVersusPromoted(
        run=promoted.model_run,
        student=round(sts.dev_score(encode), 2),
        promoted=round(sts.dev_score(theirs.encode), 2),
    )
    return NeighbourOverlap(run=promoted.model_run, overlap_at_10=round(overlap, 4), queries=len(texts)), dev


def _encoders(
    params: ValidateParams, trained: DistillParams, dim: int, encode: Encode, corpus_texts: list[str]
) -> tuple[dict[str, Encode], np.ndarray]:
    """The four encoders scored (the student's: ``encode``, its embeddings ``dim``-d), and the fitted PCA's
    explained variance ratio."""
    from tasks.ml import student, teachers
    from tasks.ml.projection import MomentAccumulator, load_projection

    teacher = teachers.load(trained.teacher)
    projection = load_projection(params.store, trained.teacher, trained.pca_name)
    base = student.build(trained.student, dim, layers=trained.student_layers)
    base.dense = None
    moments = MomentAccumulator(base.dim)
    moments.add(base.encode(corpus_texts))
    base_pca = moments.fit(dim, "centered")
    teacher_encode = sts.remembering(lambda texts: teacher.encode(texts, dtype=params.teacher_dtype))  # both rows

    return {
        "teacher": teacher_encode,
        "teacher + PCA": lambda t: projection.apply(teacher_encode(t)),
        "student": encode,
        BASELINE: lambda t: base_pca.apply(base.encode(t)),
    }, projection.explained_variance_ratio


def _retrieval(encode: Encode, found: np.ndarray, corpus: CorpusSample, stsb: sts.PairSet) -> Retrieval:
    """Recall@10 of the student's neighbours ``found`` against the teacher's, and MRR of STS-B pairs >= 4."""
    truth = neighbours(corpus.teacher_vectors)
    close = stsb.scores >= 4.0
    candidates = sorted(set(np.array(stsb.second)[close]))
    answers = np.array([candidates.index(s) for s in np.array(stsb.second)[close]])
    return Retrieval(
        recall_at_10_vs_teacher=round(metrics.recall_at_k(found, truth), 4),
        corpus_sample=len(corpus.ids),
        stsb_pairs_ge4=int(close.sum()),
        mrr_stsb_ge4=round(
            metrics.mean_reciprocal_rank(encode(list(np.array(stsb.first)[close])), encode(candidates), answers), 4
        ),
    )


def training_curves(distilled: manifest.Manifest) -> TrainingCurves:
    """Per-step training losses and the validation evaluations of a distill run, from its outputs."""
    losses_output, metrics_output = distilled.output_named("losses.jsonl"), distilled.output_named("metrics.json")
    lines = _read_output(losses_output).decode().splitlines()
    losses = [_Loss.parse(json.loads(line), losses_output.uri) for line in lines]
    evals = _DistillMetrics.parse(json.loads(_read_output(metrics_output)), metrics_output.uri).evals
    return TrainingCurves(
        [(item.step, item.loss) for item in losses] or [(0, np.nan)], [(e.step, e.val_mse) for e in evals]
    )


def _read_output(output: manifest.Output) -> bytes:
    """A published object, verified against the sha256 its manifest records."""
    return storage.read_bytes(output.uri, sha256=output.sha256)


def corpus_sample(store: str, teacher: str, size: int) -> CorpusSample:
    """The first ``size`` staged sentences the teacher encoded (its sample of each partition), with their
    embeddings; both shards read verified against the sha256 their manifests record."""
    ids, texts, vectors = [], [], []
    for day in sentences.staged_days(store):
        for shard, encoded in encode_teacher.encoded(store, teacher, day, (Stage.STAGE_CORPUS,)):
            for embedded in encoded.outputs if encoded else ():
                rows = encode_teacher.read_encoded(shard, embedded)
                ids.extend(rows.ids)
                texts.extend(rows.texts)
                vectors.append(rows.vectors)
            if len(ids) >= size:
                return CorpusSample(ids[:size], texts[:size], np.concatenate(vectors)[:size])
    if len(ids) < 11:
        raise ValidateError(f"{store}: fewer than 11 encoded corpus sentences for the retrieval check")
    return CorpusSample(ids, texts, np.concatenate(vectors))


def quality_results(store: str, days: set[date]) -> dict[str, QualityResults | None]:
    """Per partition key of ``days`` (those the model learnt from), the results its published quality run
    recorded (its checks, and where its Data Docs are), None where no quality run is published."""
    from tasks.stages.quality import QualityResults  # pandas and pyarrow: only when a report is written

    results: dict[str, QualityResults | None] = {}
    for day in sorted(days):
        key = catalog.partition_key(day)
        published = manifest.read(store, Stage.QUALITY, key)
        if published is None:
            results[key] = None
            continue
        output = published.output_named(catalog.QUALITY_RESULTS)
        results[key] = QualityResults.parse(json.loads(_read_output(output)), output.uri)
    return results
