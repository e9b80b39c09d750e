"""Parts of the validation report: the run header, the quality gate's rules and warnings, number formats.

Every number the report shows goes through :func:`score` (STS scores, thresholds, margins: 2 decimals)
or :func:`metric` (everything else: 4 significant digits, never more than 4 decimals)."""

from __future__ import annotations

import html
import posixpath
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tasks.core import manifest, partitions
from tasks.core.stage_records import GATED, GateVerdict, StsTable
from tasks.stages.drift import TrainingDrift
from tasks.stages.params import DistillParams
from tasks.stages.validate.records import DriftNotMeasured, NotCompared, VersusPromoted

if TYPE_CHECKING:
    from tasks.stages.quality import CheckResult, QualityResults


def score(value: float) -> str:
    """An STS score (Spearman x100), threshold or margin: 2 decimals."""
    return f"{value:.2f}"


def metric(value: Any) -> str:
    """A measured value: integers as they are, floats to 4 significant digits (scientific below 0.01)."""
    if isinstance(value, bool) or not isinstance(value, float):
        return "–" if value is None else str(value)
    if value != 0 and abs(value) < 0.01:
        return f"{value:.3e}"
    return f"{value:.4f}" if abs(value) < 1 else f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def when(timestamp: str | None) -> str:
    """An ISO timestamp as ``YYYY-MM-DD HH:MM UTC`` (minutes are enough to tell runs apart)."""
    if not timestamp:
        return "–"
    return datetime.fromisoformat(timestamp).strftime("%Y-%m-%d %H:%M UTC")


def run_header(store: str, distilled: manifest.Manifest, validated_at: str) -> list[tuple[str, str]]:
    """(label, value) rows naming what was validated: the model run, when, by which code, from which inputs."""
    trained = DistillParams.model_validate(distilled.params)
    days = partitions.partitions_read(store, distilled)
    layers = trained.student_layers
    return [
        ("model run", distilled.key),
        ("validated", when(validated_at)),
        ("trained", when(distilled.document.get("ended_at"))),
        ("code version", manifest.code_version()),
        ("trained on partitions", ", ".join(str(d) for d in sorted(days)) or "–"),
        ("teacher", trained.teacher),
        ("student", trained.student + (f" (first {layers} layers)" if layers else "")),
        ("PCA", trained.pca_name),
    ]


def table(header: list[str], rows: list[list], attributes: str = "") -> str:
    """An HTML table of ``rows`` (cells escaped) under ``header``."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{attributes}><tr>{head}</tr>{body}</table>"


def header_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table id="run">{body}</table>'


def below_baseline(sts: StsTable) -> dict[str, float]:
    """Gated pair set -> points by which the student falls below its same-size baseline (where it does)."""
    student, baseline = sts.student, sts.baseline
    return {s: baseline[s] - student[s] for s in GATED if s in student and s in baseline and student[s] < baseline[s]}


def gate_section(gate: GateVerdict, sts: StsTable) -> str:
    """The verdict, a warning for each gated score below the same-size baseline, and the table of rules."""
    below = below_baseline(sts)
    if gate.passed:
        verdict = '<p class="pass">Quality gate: passed (every rule met)</p>'
    else:
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in gate.reasons)
        verdict = f'<p class="fail">Quality gate: failed</p><ul>{reasons}</ul>'
    warnings = "".join(
        f'<p class="warn">Warning: the student is below its same-size baseline by {score(points)} points on '
        f"{html.escape(name)} ({score(sts.student[name])} against {score(sts.baseline[name])}).</p>"
        for name, points in below.items()
    )
    return verdict + warnings + _rules_table(gate)


def drift_section(drift: TrainingDrift | DriftNotMeasured | None) -> str:
    """The drift score of the run's training data against the promoted model's, its components and both
    profiles' statistics; a warning when it is flagged."""
    if drift is None:
        return "<p>No promoted model to compare with.</p>"
    if isinstance(drift, DriftNotMeasured):
        return f'<p class="warn">Drift not measured: {html.escape(drift.error)}</p>'
    verdict = (
        f'<p class="warn">Drift flagged: score {metric(drift.score)} reaches the threshold '
        f"{metric(drift.threshold)}.</p>"
        if drift.flagged
        else f"<p>Drift score {metric(drift.score)}, below the threshold {metric(drift.threshold)}.</p>"
    )
    compared = (
        f"<p>Partitions {html.escape(', '.join(drift.partitions))} against those of "
        f"{html.escape(drift.reference_run)}: {html.escape(', '.join(drift.reference_partitions))}.</p>"
    )
    components = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{metric(value)}</td><td>{metric(drift.weights[name])}</td></tr>"
        for name, value in drift.components.items()
    )
    statistics = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{metric(value)}</td><td>{metric(drift.reference[name])}</td></tr>"
        for name, value in drift.partition.items()
    )
    return (
        verdict
        + compared
        + f'<table id="drift"><tr><th>component</th><th>value</th><th>weight</th></tr>{components}</table>'
        + "<table><tr><th>statistic</th><th>this run's data</th><th>promoted model's data</th></tr>"
        + f"{statistics}</table>"
    )


def _rules_table(gate: GateVerdict) -> str:
    if not gate.rules:
        return "<p>No rule details recorded.</p>"
    reference = html.escape(gate.reference)
    head = "".join(f"<th>{h}</th>" for h in ("score", "rule", "threshold", "value", "margin", "result"))
    body = ""
    for rule in gate.rules:
        what = "minimum" if rule.rule == "minimum" else f"no regression below the {reference}"
        outcome = "pass" if rule.passed else "fail"
        cells = [score(rule.threshold), score(rule.value), f"{rule.margin:+.2f}"]
        body += (
            f"<tr><td>{html.escape(rule.score)}</td><td>{what}</td>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + f'<td class="{outcome}">{outcome}</td></tr>'
        )
    return f'<table id="gate-rules"><tr>{head}</tr>{body}</table>'


def quality_section(quality: dict[str, QualityResults | None], report_key: str | None) -> str:
    """Per partition the model learnt from, its quality run's checks and a link to its Data Docs (relative to
    the report, ``report_key``, so it holds in a copied store); a partition no quality run checked is marked."""
    if not quality:
        return "<p>The run records no training partitions.</p>"
    parts = []
    for partition, results in quality.items():
        if results is None:
            day = partition.split("=", 1)[-1]
            parts.append(
                f'<p class="warn">{html.escape(partition)}: no data-quality run is published '
                f"(<code>hpd quality --ingest-date {html.escape(day)}</code>).</p>"
            )
            continue
        link = ""
        if results.data_docs and report_key:
            href = posixpath.relpath(results.data_docs, posixpath.dirname(report_key))
            link = f' <a class="data-docs" href="{html.escape(href)}">Data Docs</a>'
        rows = [_check_row(c) for c in results.checks]
        parts.append(f"<h3>{html.escape(partition)}{link}</h3>" + table(["shard", "suite", "rows", "passed"], rows))
    return "".join(parts)


def _check_row(check: CheckResult) -> list[str]:
    """A suite's results on a shard: the shard, the suite, its rows and how many expectations passed."""
    passed = sum(e.success for e in check.expectations)
    return [check.uri, check.suite, metric(check.rows), f"{passed}/{len(check.expectations)}"]


def versus_section(versus: VersusPromoted | NotCompared | None) -> str:
    """The run against the promoted one: STS deltas, neighbour agreement, and every row of ``hpd runs compare``
    that differs (this run, the promoted one)."""
    if versus is None:
        return "<p>No other model is promoted: nothing to compare with.</p>"
    if isinstance(versus, NotCompared):
        return f'<p class="warn">Not compared with {html.escape(versus.run)}: {html.escape(versus.error)}</p>'
    run = html.escape(versus.run)
    deltas = ", ".join(f"{html.escape(s)} {d:+.2f}" for s, d in versus.sts_delta.items())
    lines = [f"<p>Compared with the promoted run <b>{run}</b>. Student STS, this run minus promoted: {deltas}.</p>"]
    if neighbours := versus.neighbours:
        lines.append(
            f"<p>Neighbour overlap@10: {metric(neighbours.overlap_at_10)} (share of each of "
            f"{neighbours.queries} corpus sentences' 10 nearest that both students return).</p>"
        )
    rows = [[row.name, _cell(row.a), _cell(row.b)] for row in versus.differences]
    lines.append(table(["differs", "this run", run], rows, ' id="versus"'))
    return "".join(lines)


def _cell(value: Any) -> str:
    """A compared value: rounded like every number here, lists comma-separated."""
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return metric(value)
