"""The validation report: one self-contained HTML file (inline CSS, plots as inline PNG), offline."""

from __future__ import annotations

import base64
import html
import io
import json

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
    gate = report["gate"]
    verdict = f'<p class="{"pass" if gate["passed"] else "fail"}">Quality gate: ' \
              f'{"passed" if gate["passed"] else "failed"}</p><ul>' + \
              "".join(f"<li>{html.escape(r)}</li>" for r in gate["reasons"]) + "</ul>"
    ratio = np.cumsum(plots["explained_variance_ratio"])
    all_norms = np.concatenate([np.asarray(v, dtype=np.float64) for v in plots["norms"].values()])
    edges = np.linspace(all_norms.min() - 0.01, all_norms.max() + 0.01, 41)  # also for (near-)constant norms
    figures = [
        ("PCA explained variance (cumulative)", lambda ax: (ax.plot(np.arange(1, len(ratio) + 1), ratio),
                                                            ax.set_xlabel("components"), ax.set_ylabel("ratio"))),
        ("Training and validation loss", lambda ax: (
            ax.plot(*zip(*plots["losses"], strict=True), label="training (per step)"),
            ax.plot([e["step"] for e in plots["evals"]], [e["val_mse"] for e in plots["evals"]], "o-",
                    label="validation"), ax.set_xlabel("step"), ax.set_ylabel("MSE"), ax.legend())),
        ("STS-B test: student cosine against gold", lambda ax: (
            ax.scatter(plots["sts_scatter"][1], plots["sts_scatter"][0], s=4, alpha=.4),
            ax.set_xlabel("gold score"), ax.set_ylabel("cosine"))),
        ("Embedding norms", lambda ax: ([ax.hist(v, bins=edges, alpha=.5, label=k) for k, v in plots["norms"].items()],
                                        ax.set_xlabel("L2 norm"), ax.legend())),
    ]
    figures_html = "".join(f"<figure>{_png(draw)}<figcaption>{html.escape(caption)}</figcaption></figure>"
                           for caption, draw in figures)
    fidelity = report.get("fidelity") or {}
    sections = [
        f"<h1>{html.escape(title)}</h1>", verdict,
        "<h2>STS (Spearman ×100 of cosine similarity)</h2>",
        _table(["model", *sets], [[name, *(row[s] for s in sets)] for name, row in sts.items()]),
        "<h2>Distillation fidelity and retrieval</h2>",
        _table(["metric", "value"], [[f"fidelity {k}", v] for k, v in fidelity.items()]
               + [[f"retrieval {k}", v] for k, v in report["retrieval"].items()]),
        "<h2>Plots</h2>", figures_html,
        "<h2>Data quality (great-expectations)</h2>",
        _table(["shard", "suite", "rows", "expectations passed"],
               [[q["uri"], q["suite"], q["rows"], f'{sum(e["success"] for e in q["expectations"])}/'
                 f'{len(q["expectations"])}'] for q in quality]) if quality else "<p>No data-quality results.</p>",
        "<h2>Lineage</h2>",
        _table(["input", "sha256", "rows"], [[i.uri, i.sha256[:16], i.rows] for i in lineage]),
        f"<details><summary>Raw metrics</summary><pre>{html.escape(json.dumps(report, indent=2))}</pre></details>",
    ]
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>{"".join(sections)}</body></html>"""
