"""Validate: measure a distilled student, decide whether it may ship, and promote it if so.

Metrics (all in the manifest and ``validation/<run>/<fingerprint12>/metrics.json``):
- STS (Spearman x100 of cosine) on STS-B test, SICK-R test and any pair file given by URI
  (CSV/TSV with ``sentence1``, ``sentence2``, ``score``), for the teacher (full dimension), the
  teacher reduced by the fitted PCA, the student, and the paper's same-size baseline: the
  student's base model reduced to k by a PCA of its own embeddings of corpus sentences;
- distillation fidelity: held-out MSE and mean cosine to the targets (from the distill run);
- retrieval: recall@10 of the student's neighbours against the teacher's exact neighbours over a
  corpus sample, and MRR of retrieving the paired sentence for STS-B test pairs scored >= 4.

Quality gate: the student's STS-B and SICK-R scores must meet the configured minima and must not
fall more than ``max_regression`` points below the currently promoted model's (the first run
compares with the baseline). The decision and its reasons are recorded; a passing model moves
``models/current.json`` by compare-and-swap.
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from tasks import datasets, encode_teacher, manifest, metrics, sentences, storage, sts
from tasks.config import StageParams

STAGE = "validate"
GATED = ("STS-B test", "SICK-R test")


class ValidationError(ValueError):
    """The validation cannot run; the message names the input."""


class ValidateParams(StageParams):
    model_run: str = Field(description="the distill run to validate")
    pair_files: list[str] = Field([], description="extra STS pair files (CSV/TSV: sentence1, sentence2, score)")
    retrieval_sample: int = Field(2000, gt=10, description="corpus sentences for the recall@10 check")
    min_stsb: float | None = Field(None, description="minimum STS-B test score to promote")
    min_sickr: float | None = Field(None, description="minimum SICK-R test score to promote")
    max_regression: float = Field(1.0, ge=0, description="points a score may fall below the reference")
    teacher_dtype: Literal["fp32", "bf16"] = "bf16"
    promote: bool = Field(True, description="move models/current.json when the gate passes")


def current_model_uri(store: str) -> str:
    from tasks.student import PROMOTED

    return storage.join(store, PROMOTED)


def read_pairs(uri: str) -> sts.PairSet:
    """A user pair file: CSV or TSV with a header holding sentence1, sentence2 and score."""
    uri = storage.to_uri(uri)
    text = storage.read_bytes(uri).decode("utf-8-sig", errors="strict")
    dialect = "excel-tab" if uri.endswith((".tsv", ".tsv.gz")) or "\t" in text.split("\n", 1)[0] else "excel"
    rows = list(csv.DictReader(io.StringIO(text), dialect=dialect))
    missing = {"sentence1", "sentence2", "score"} - set(rows[0] if rows else {})
    if not rows or missing:
        raise ValidationError(f"{uri}: needs columns sentence1, sentence2, score (missing {sorted(missing)})")
    try:
        scores = np.array([float(r["score"]) for r in rows])
    except (TypeError, ValueError):
        bad = next(i for i, r in enumerate(rows, start=2) if not _is_number(r["score"]))
        raise ValidationError(f"{uri}: line {bad}: score {rows[bad - 2]['score']!r} is not a number") from None
    return sts.PairSet(uri.rsplit("/", 1)[-1], [r["sentence1"] for r in rows], [r["sentence2"] for r in rows],
                       scores)


def _is_number(value: str | None) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
        return True
    except (TypeError, ValueError):
        return False


def run(params: ValidateParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Measure the student of ``params.model_run``, apply the gate, promote on success."""
    from tasks import student
    from tasks.encoder import SentenceEncoder
    from tasks.projection import MomentAccumulator, load_projection

    distilled = manifest.read(params.store, "distill", params.model_run)
    if distilled is None:
        raise ValidationError(f"{params.store}: no published distill run {params.model_run!r}")
    pair_sets = [sts.stsb_test(), sts.sick_r_test(), *(read_pairs(uri) for uri in params.pair_files)]
    trained = distilled["params"]
    stage_run = manifest.StageRun(
        stage=STAGE, key=params.model_run, store=params.store, params=params.model_dump(mode="json"),
        inputs=[{"uri": manifest.manifest_uri(params.store, "distill", params.model_run),
                 "sha256": distilled["fingerprint"], "rows": None}],
    )
    current_before = student.promoted(params.store)
    if not force and (done := stage_run.completed()) is not None:
        return manifest.StageResult(stage_run.uri, skipped=True, manifest=done)

    corpus_ids, corpus_texts, teacher_vectors = _corpus_sample(params.store, trained["teacher"],
                                                               params.retrieval_sample)
    with tempfile.TemporaryDirectory() as scratch, stage_run.phase("encode_and_score"):
        model = SentenceEncoder.load(str(student.fetch_exported(params.store, params.model_run, Path(scratch))))
        teacher = SentenceEncoder.load(trained["teacher"])
        projection = load_projection(params.store, trained["teacher"], trained["pca_name"])
        base = student.build(trained["student"], model.dim, layers=trained["student_layers"])
        base.dense = None
        moments = MomentAccumulator(base.dim)
        moments.add(base.encode(corpus_texts))
        base_pca = moments.fit(model.dim, "centered")

        encoded_by_teacher: dict[tuple[str, ...], np.ndarray] = {}

        def teacher_encode(texts: list[str]) -> np.ndarray:  # once per pair set, for both teacher rows
            key = tuple(texts)
            if key not in encoded_by_teacher:
                encoded_by_teacher[key] = teacher.encode(texts, dtype=params.teacher_dtype)
            return encoded_by_teacher[key]

        encoders = {"teacher": teacher_encode,
                    "teacher + PCA": lambda t: projection.apply(teacher_encode(t)),
                    "student": model.encode,
                    "baseline (base model + PCA)": lambda t: base_pca.apply(base.encode(t))}
        table = {name: {p.name: round(sts.score(encode, p), 2) for p in pair_sets} for name, encode in encoders.items()}
        student_corpus = model.encode(corpus_texts)
        truth = metrics.nearest(teacher_vectors, teacher_vectors, 10, exclude_self=True)
        found = metrics.nearest(student_corpus, student_corpus, 10, exclude_self=True)
        stsb = pair_sets[0]
        close = stsb.scores >= 4.0
        candidates = sorted(set(np.array(stsb.second)[close]))
        answers = np.array([candidates.index(s) for s in np.array(stsb.second)[close]])
        retrieval = {"recall_at_10_vs_teacher": round(metrics.recall_at_k(found, truth), 4),
                     "corpus_sample": len(corpus_ids), "stsb_pairs_ge4": int(close.sum()),
                     "mrr_stsb_ge4": round(metrics.mean_reciprocal_rank(
                         model.encode(list(np.array(stsb.first)[close])), model.encode(candidates), answers), 4)}
        plots = {"explained_variance_ratio": projection.explained_variance_ratio,
                 "sts_scatter": (sts.cosine(model.encode(stsb.first), model.encode(stsb.second)), stsb.scores),
                 "norms": {"teacher": np.linalg.norm(teacher_vectors, axis=1),
                           "student": np.linalg.norm(student_corpus, axis=1)},
                 **_training_curves(distilled)}
    reference_name, reference = ("promoted model " + current_before[0]["model_run"], current_before[0]["scores"]) \
        if current_before[0] else ("baseline", table["baseline (base model + PCA)"])
    decision = gate(table["student"], reference, reference_name, params)
    report = {"sts": table, "fidelity": distilled["stats"].get("exported"), "retrieval": retrieval,
              "gate": decision}
    from tasks.report import render

    lineage = [*stage_run.inputs, *distilled["inputs"]]
    page = render(f"Validation of {params.model_run}", report, plots, lineage, _quality_results(params.store))
    prefix = storage.join(params.store, "validation", params.model_run, stage_run.fingerprint[:12])
    for name, body in (("metrics.json", json.dumps(report, indent=2).encode()), ("report.html", page.encode())):
        storage.write_bytes(storage.join(prefix, name), body)
        stage_run.add_output(storage.join(prefix, name), manifest.sha256_hex(body), len(body), None)
    stage_run.stats = report
    published = stage_run.publish()
    if decision["passed"] and params.promote:
        promote_model(params.store, params.model_run, table["student"], stage_run.uri, current_before[1])
    return manifest.StageResult(stage_run.uri, skipped=False, manifest=published)


def gate(scores: dict, reference: dict, reference_name: str, params: ValidateParams) -> dict:
    """The promotion decision: minima and no regression beyond the margin, with every reason."""
    reasons = []
    for name, minimum in zip(GATED, (params.min_stsb, params.min_sickr), strict=True):
        if minimum is not None and scores[name] < minimum:
            reasons.append(f"{name} {scores[name]:.2f} is below the minimum {minimum:.2f}")
        if scores[name] < reference[name] - params.max_regression:
            reasons.append(f"{name} {scores[name]:.2f} regresses more than {params.max_regression:.2f} below "
                           f"the {reference_name}'s {reference[name]:.2f}")
    return {"passed": not reasons, "reasons": reasons or ["all checks passed"], "reference": reference_name,
            "reference_scores": {n: reference[n] for n in GATED}}


def promote_model(store: str, model_run: str, scores: dict, manifest_uri: str, etag: str | None) -> None:
    pointer = {"model_run": model_run, "scores": scores, "validation": manifest_uri}
    try:
        storage.compare_and_swap(current_model_uri(store), json.dumps(pointer, indent=2).encode(), etag)
    except storage.PreconditionFailed:
        raise ValidationError(f"{current_model_uri(store)}: another promotion happened since this validation "
                              f"started; {model_run} was not promoted") from None


def _training_curves(distilled: dict) -> dict:
    """Per-step training losses and the validation evaluations of a distill run, from its outputs."""
    uris = {o["uri"].rsplit("/", 1)[-1]: o["uri"] for o in distilled["outputs"]}
    losses = [json.loads(line) for line in storage.read_bytes(uris["losses.jsonl"]).decode().splitlines()]
    evals = json.loads(storage.read_bytes(uris["metrics.json"]))["evals"]
    return {"losses": [(item["step"], item["loss"]) for item in losses] or [(0, np.nan)], "evals": evals}


def _quality_results(store: str) -> list[dict]:
    """The data-quality checks published for every staged partition (those that ran)."""
    results = []
    for key in manifest.list_keys(store, "quality"):
        published = manifest.read(store, "quality", key)
        for output in published["outputs"]:
            results.extend(json.loads(storage.read_bytes(output["uri"]))["checks"])
    return results


def _corpus_sample(store: str, teacher: str, size: int) -> tuple[list[str], list[str], np.ndarray]:
    """The first ``size`` staged sentences that have teacher embeddings, with those embeddings."""
    ids, texts, vectors = [], [], []
    for day in sentences.staged_days(store):
        for shard_uri, encoded in encode_teacher.encoded(store, teacher, day, ("stage_corpus",)):
            if encoded is None:
                continue
            staged = storage.read_parquet(shard_uri, columns=["sentence_id", "text"])
            embedded = storage.read_parquet(encoded["outputs"][0]["uri"])
            ids.extend(staged.column("sentence_id").to_pylist())
            texts.extend(staged.column("text").to_pylist())
            vectors.append(datasets.vectors(embedded, "embedding"))
            if len(ids) >= size:
                return ids[:size], texts[:size], np.concatenate(vectors)[:size]
    if len(ids) < 11:
        raise ValidationError(f"{store}: fewer than 11 encoded corpus sentences for the retrieval check")
    return ids, texts, np.concatenate(vectors)
