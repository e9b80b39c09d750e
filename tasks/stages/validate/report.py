"""The validation report: one self-contained HTML file (inline CSS, plots as inline PNG), offline."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.core.manifest import Input
from tasks.core.stage_records import StsTable
from tasks.stages.validate.records import Fidelity, ValidationReport
from tasks.stages.validate.report_parts import (
    below_baseline,
    drift_section,
    gate_section,
    header_table,
    metric,
    quality_section,
    score,
    table,
    versus_section,
)
from tasks.stages.validate.scoring import Plots

if TYPE_CHECKING:
    from tasks.stages.quality import QualityResults

STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #bbb;padding:.3rem .6rem;text-align:right}
th{background:#eef}td:first-child,th:first-child{text-align:left}.pass{color:#070;font-weight:bold}
.fail{color:#a00;font-weight:bold}figure{display:inline-block;margin:.5rem}code{font-size:.85em}
.warn{color:#8a4b00;background:#fff3d6;border-left:4px solid #e0a000;padding:.3rem .6rem;font-weight:bold}
td.below{background:#fff3d6}#run th{text-align:left}"""


def _png(draw, panels: int = 1) -> str:
    """An inline <img> of the matplotlib figure ``draw(axes)`` paints (an array of axes when ``panels`` > 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, panels, figsize=(5 + 2.5 * (panels - 1), 3.4), dpi=90)
    draw(axes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def render(  # noqa: PLR0913 - the report's parts
    title: str,
    report: ValidationReport,
    plots: Plots,
    lineage: list[Input],
    quality: dict[str, QualityResults | None],
    header: list[tuple[str, str]],
    report_key: str | None,
) -> str:
    """HTML for a validation run. ``quality``: the quality results of each partition the model learnt from (None:
    not checked); ``header``: the (label, value) rows naming the run; ``report_key``: where the page is published
    in the store (links to other objects of the store are relative to it, so they hold in a copy). Numbers are
    rounded; metrics.json keeps them unrounded."""
    measured = _fidelity_rows(Fidelity.model_validate(report.fidelity or {}))
    measured += [[f"retrieval {k}", metric(v)] for k, v in report.retrieval.model_dump().items()]
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        header_table(header),
        "<h2>Quality gate</h2>",
        gate_section(report.gate, report.sts),
        "<h2>STS (Spearman ×100 of cosine similarity)</h2>",
        _sts_table(report.sts),
        "<h2>Distillation fidelity and retrieval</h2>",
        table(["metric", "value"], measured),
        "<h2>Plots</h2>",
        "".join(
            f"<figure>{_png(draw, panels)}<figcaption>{html.escape(caption)}</figcaption></figure>"
            for caption, draw, panels in _figures(plots)
        ),
        "<h2>Against the promoted model</h2>",
        versus_section(report.versus_promoted),
        "<h2>Drift of the training data from the promoted model's</h2>",
        drift_section(report.drift),
        "<h2>Data quality of the training partitions (great-expectations)</h2>",
        quality_section(quality, report_key),
        "<h2>Lineage</h2>",
        table(["input", "sha256", "rows"], [[i.uri, i.sha256[:16], metric(i.rows)] for i in lineage]),
        "<p>Unrounded values: <code>metrics.json</code>, next to this report.</p>",
    ]
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>{"".join(sections)}</body></html>"""


def _fidelity_rows(fidelity: Fidelity) -> list[list[str]]:
    """The exported weights' fidelity to the targets, then each scored blend's, rounded like the rest."""
    rows = [[f"fidelity {k}", metric(v)] for k, v in fidelity.scores().items()]
    for blend in fidelity.blends:
        scores = ", ".join(f"{k} {metric(v)}" for k, v in blend.scores().items())
        rows.append([f"fidelity of the blend {blend.blend:g} (initial toward step {blend.step})", scores])
    return rows


def _sts_table(sts: StsTable) -> str:
    """Scores to 2 decimals; the student's cells below its same-size baseline are shaded and titled so."""
    table = sts.rows()
    sets = list(next(iter(table.values())))
    below = below_baseline(sts)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["model", *sets])
    rows = ""
    for name, row in table.items():
        cells = ""
        for s in sets:
            marked = name == "student" and s in below
            attributes = ' class="below" title="below its same-size baseline"' if marked else ""
            cells += f"<td{attributes}>{score(row[s])}{' ▼' if marked else ''}</td>"
        rows += f"<tr><td>{html.escape(name)}</td>{cells}</tr>"
    return f"<table><tr>{head}</tr>{rows}</table>"


def _figures(plots: Plots) -> list[tuple[str, Callable[[Any], None], int]]:
    """(caption, painter, panels) of each plot."""
    ratio = np.cumsum(plots.explained_variance_ratio)
    norms = {name: np.asarray(v, dtype=np.float64) for name, v in plots.norms.items()}

    def variance(ax: Any) -> None:
        ax.plot(np.arange(1, len(ratio) + 1), ratio)
        ax.set(xlabel="components", ylabel="ratio")

    def losses(ax: Any) -> None:
        ax.plot(*zip(*plots.curves.losses, strict=True), label="training (per step)")
        evals = plots.curves.evals
        ax.plot([step for step, _ in evals], [mse for _, mse in evals], "o-", label="validation")
        ax.set(xlabel="step", ylabel="MSE")
        ax.legend()

    def scatter(ax: Any) -> None:
        ax.scatter(plots.sts_gold, plots.sts_cosine, s=4, alpha=0.4)
        ax.set(xlabel="gold score", ylabel="cosine")

    def histogram(axes: Any) -> None:  # one panel per model, own bins and counts: neither hides the other
        for ax, (name, values) in zip(np.atleast_1d(axes), norms.items(), strict=True):
            low, high = values.min(), values.max()
            pad = max(0.01, 0.02 * (high - low))  # also for (near-)constant norms
            ax.hist(values, bins=np.linspace(low - pad, high + pad, 31), color=f"C{list(norms).index(name)}")
            ax.set(xlabel="L2 norm", title=f"{name}: mean {values.mean():.3f}, sd {values.std():.3f}")
            ax.title.set_fontsize(9)

    return [
        ("PCA explained variance (cumulative)", variance, 1),
        ("Training and validation loss", losses, 1),
        ("STS-B test: student cosine against gold", scatter, 1),
        ("Embedding norms (L2) of the corpus sample", histogram, len(norms)),
    ]
