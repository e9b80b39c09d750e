"""The validation report: one self-contained HTML file (inline CSS, plots as inline PNG), offline."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.core.manifest import Input

STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #bbb;padding:.3rem .6rem;text-align:right}
th{background:#eef}td:first-child,th:first-child{text-align:left}.pass{color:#070;font-weight:bold}
.fail{color:#a00;font-weight:bold}figure{display:inline-block;margin:.5rem}code{font-size:.85em}"""


def _png(draw) -> str:
    """An inline <img> of the matplotlib figure ``draw(axes)`` paints."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.4), dpi=90)
    draw(axes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(title: str, report: dict, plots: dict, lineage: list[Input], quality: list[dict]) -> str:
    """HTML for a validation run. ``plots`` holds ``explained_variance_ratio``, ``losses`` [(step, loss)],
    ``evals`` [{step, val_mse}], ``sts_scatter`` (predicted, gold) and ``norms`` {name: array}."""
    sts = report["sts"]
    sets = list(next(iter(sts.values())))
    fidelity = report.get("fidelity") or {}
    measured = [[f"fidelity {k}", v] for k, v in fidelity.items()]
    measured += [[f"retrieval {k}", v] for k, v in report["retrieval"].items()]
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        _verdict(report["gate"]),
        "<h2>STS (Spearman ×100 of cosine similarity)</h2>",
        _table(["model", *sets], [[name, *(row[s] for s in sets)] for name, row in sts.items()]),
        "<h2>Distillation fidelity and retrieval</h2>",
        _table(["metric", "value"], measured),
        "<h2>Plots</h2>",
        "".join(
            f"<figure>{_png(draw)}<figcaption>{html.escape(caption)}</figcaption></figure>"
            for caption, draw in _figures(plots)
        ),
        "<h2>Data quality (great-expectations)</h2>",
        _quality_table(quality),
        "<h2>Lineage</h2>",
        _table(["input", "sha256", "rows"], [[i.uri, i.sha256[:16], i.rows] for i in lineage]),
        f"<details><summary>Raw metrics</summary><pre>{html.escape(json.dumps(report, indent=2))}</pre></details>",
    ]
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>{"".join(sections)}</body></html>"""


def _verdict(gate: dict) -> str:
    outcome = "pass" if gate["passed"] else "fail"
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in gate["reasons"])
    return f'<p class="{outcome}">Quality gate: {"passed" if gate["passed"] else "failed"}</p><ul>{reasons}</ul>'


def _quality_table(quality: list[dict]) -> str:
    if not quality:
        return "<p>No data-quality results.</p>"
    rows = [
        [q["uri"], q["suite"], q["rows"], f"{sum(e['success'] for e in q['expectations'])}/{len(q['expectations'])}"]
        for q in quality
    ]
    return _table(["shard", "suite", "rows", "expectations passed"], rows)


def _figures(plots: dict) -> list[tuple[str, Callable[[Any], None]]]:
    """(caption, painter) of each plot."""
    ratio = np.cumsum(plots["explained_variance_ratio"])
    norms = plots["norms"]
    all_norms = np.concatenate([np.asarray(v, dtype=np.float64) for v in norms.values()])
    edges = np.linspace(all_norms.min() - 0.01, all_norms.max() + 0.01, 41)  # also for (near-)constant norms

    def variance(ax: Any) -> None:
        ax.plot(np.arange(1, len(ratio) + 1), ratio)
        ax.set(xlabel="components", ylabel="ratio")

    def losses(ax: Any) -> None:
        ax.plot(*zip(*plots["losses"], strict=True), label="training (per step)")
        evals = plots["evals"]
        ax.plot([e["step"] for e in evals], [e["val_mse"] for e in evals], "o-", label="validation")
        ax.set(xlabel="step", ylabel="MSE")
        ax.legend()

    def scatter(ax: Any) -> None:
        ax.scatter(plots["sts_scatter"][1], plots["sts_scatter"][0], s=4, alpha=0.4)
        ax.set(xlabel="gold score", ylabel="cosine")

    def histogram(ax: Any) -> None:
        for name, values in norms.items():
            ax.hist(values, bins=edges, alpha=0.5, label=name)
        ax.set(xlabel="L2 norm")
        ax.legend()

    return [
        ("PCA explained variance (cumulative)", variance),
        ("Training and validation loss", losses),
        ("STS-B test: student cosine against gold", scatter),
        ("Embedding norms", histogram),
    ]
