"""The shared result format of every benchmark, and README's table generated from it."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path

from bench import REPO

RESULTS = Path(__file__).parent / "results"
README = REPO / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def machine() -> dict:
    model = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
    return {"cores": len(os.sched_getaffinity(0)), "cpu_model": model, "python": platform.python_version()}


def write(
    name: str, *, unit: str, ours: float, baseline_name: str, baseline: float, higher_is_better: bool, details: dict
) -> dict:
    """Write ``bench/results/<name>.json``; ``ratio`` is ours/baseline (or baseline/ours when lower wins),
    so a ratio above 1 always means we are ahead."""
    ratio = ours / baseline if higher_is_better else baseline / ours
    result = {
        "benchmark": name,
        "unit": unit,
        "ours": ours,
        "baseline": {"name": baseline_name, "value": baseline},
        "ratio": round(ratio, 3),
        "higher_is_better": higher_is_better,
        "machine": machine(),
        "details": details,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def table() -> str:
    """README's performance table, one row per result file."""
    rows = ["| benchmark | ours | baseline | ratio (>1: ours ahead) | machine |", "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        rows.append(
            f"| `{r['benchmark']}` | {_number(r['ours'])} {r['unit']} | {r['baseline']['name']}: "
            f"{_number(r['baseline']['value'])} {r['unit']} | {r['ratio']:.2f}× | "
            f"{r['machine']['cores']} cores, {r['machine']['cpu_model']} |"
        )
    return "\n".join(rows)


def update_readme() -> None:
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{README}: no {START} ... {END} block to fill")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
