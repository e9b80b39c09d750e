"""The validated model card: the distill run's card (its model folder's ``README.md``, read verified) with what the
validation measured. Its ``model-index`` gains the test scores and the neighbour overlap with the teacher; its
body, a section with the STS table, the retrieval checks, the gate's verdict and the data the student learned from,
in place of the note that the validation is still to come."""

from __future__ import annotations

import re

from tasks.core import learned, manifest, storage
from tasks.core.stage_records import GATED
from tasks.stages.validate.records import ValidationReport

CARD_FILE = "README.md"  # the card's name in the model folder (sentence-transformers' and the Hub's)
# The distill card's note that the test scores are still to come, which the validation section replaces.
_PENDING = re.compile(r"^The test scores \(STS-B test, SICK-R test, retrieval\).*?in the store\.\n", re.M | re.S)
_DATASETS = {"STS-B test": ("sentence-transformers/stsb", "STS Benchmark"), "SICK-R test": ("sick", "SICK-R")}


def render(store: str, distilled: manifest.Manifest, report: ValidationReport, run_id: str) -> str | None:
    """The card of ``distilled``'s student as validation run ``run_id`` found it (None: its model has no card)."""
    from huggingface_hub import ModelCard

    published = next((o for o in distilled.outputs if o.uri.endswith(f"/{CARD_FILE}")), None)
    if published is None:
        return None
    card = ModelCard(storage.read_bytes(published.uri, sha256=published.sha256).decode())
    card.data.eval_results = [*(card.data.eval_results or []), *_results(report)]
    section = _section(store, distilled, report, run_id)
    body, replaced = _PENDING.subn(section, card.text)
    body = body if replaced else f"{body.rstrip()}\n\n{section}"
    return f"---\n{card.data.to_yaml()}\n---\n{body}"


def _results(report: ValidationReport) -> list:
    """The test scores (Spearman of cosine, 0-1, as sentence-transformers reports it) and the neighbour overlap
    with the teacher, as ``model-index`` results."""
    from huggingface_hub import EvalResult

    results = [
        EvalResult(
            task_type="sentence-similarity",
            task_name="Semantic Textual Similarity",
            dataset_type=_DATASETS[name][0],
            dataset_name=_DATASETS[name][1],
            dataset_split="test",
            metric_type="spearman_cosine",
            metric_value=round(report.sts.student[name] / 100, 5),
        )
        for name in GATED
    ]
    overlap = report.retrieval.recall_at_10_vs_teacher
    results.append(
        EvalResult(
            task_type="sentence-similarity",
            task_name="Neighbour overlap with the teacher",
            dataset_type="hpd-corpus-sample",
            dataset_name=f"{report.retrieval.corpus_sample} corpus sentences",
            metric_type="recall_at_10",
            metric_name="the teacher's 10 nearest neighbours the student also finds",
            metric_value=round(overlap, 5),
        )
    )
    return results


def _section(store: str, distilled: manifest.Manifest, report: ValidationReport, run_id: str) -> str:
    """The card's validation section, in words and a table."""
    gate = report.gate
    verdict = "passed" if gate.passed else "failed: " + "; ".join(gate.reasons)
    rows = report.sts.rows()
    sets = list(next(iter(rows.values())))
    table = [f"| encoder | {' | '.join(sets)} |", "|---|" + "---:|" * len(sets)]
    table += [f"| {encoder} | {' | '.join(f'{scores[s]:.2f}' for s in sets)} |" for encoder, scores in rows.items()]
    retrieval = report.retrieval
    seen = learned.of(store, distilled)
    days = ", ".join(day.isoformat() for day in seen.partitions) or "none recorded"
    return "\n".join(
        [
            f"Validated by run `{run_id}`: the quality gate {verdict} (held to the {gate.reference}).",
            "",
            "STS, Spearman x 100 of cosine similarity (the test sets measure, the dev sets select):",
            "",
            *table,
            "",
            f"Retrieval over {retrieval.corpus_sample:,} corpus sentences: the student finds"
            f" {retrieval.recall_at_10_vs_teacher:.1%} of the teacher's 10 nearest neighbours (overlap@10); the"
            f" paired sentence of the {retrieval.stsb_pairs_ge4:,} STS-B test pairs scored 4 or more comes back at"
            f" a mean reciprocal rank of {retrieval.mrr_stsb_ge4:.3f}.",
            "",
            f"Training data: {seen.rows:,} staged sentences of the store's partitions {days} (with their"
            " augmented variants), encoded by the teacher and projected by the PCA run above.",
            "",
        ]
    )
