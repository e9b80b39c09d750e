"""The docs' benchmark page is generated from ``bench/results/*.json``: the committed page is what the files
generate, every figure it names is read from them, and README points to it instead of holding figures."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import results
from tests.support.paths import REPO

RESULT_FILES = sorted(results.RESULTS.glob("*.json"))


def _section(page: str, name: str) -> str:
    start = page.index(f"{{#{name}}}")
    end = page.find("\n## ", start)
    return page[start : end if end >= 0 else None]


def test_the_committed_page_is_what_the_result_files_generate():
    assert results.PAGE.read_text() == results.page(), "docs/benchmarks.md is stale: run `python -m bench.results`"


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_each_benchmark_has_its_figures_machine_comparison_and_rerun_command_on_the_page(path: Path):
    result = json.loads(path.read_text())
    name = result["benchmark"]
    assert name in results.ABOUT, f"bench/results.py: ABOUT has no entry for {name}"
    about = results.ABOUT[name]
    assert about.like_for_like.startswith(("yes", "no")), f"{name}: say whether it is like-for-like"
    section = _section(results.PAGE.read_text(), name)
    machine = result["machine"]
    for text in (
        f"ours {results._number(result['ours'])} {result['unit']}",
        f"{results._number(result['baseline']['value'])} {result['unit']}",
        f"ratio {result['ratio']:.2f}×",
        f"{machine['cores']} cores, {machine['cpu_model']}, Python {machine['python']}",
        f"`python -m bench {name}`",
        "**Like-for-like:** yes" if about.like_for_like.startswith("yes") else "**Not like-for-like:**",
    ):
        assert text in section, f"{name}: {text!r} is not in its section of docs/benchmarks.md"


def test_a_changed_figure_changes_the_page(tmp_path: Path):
    shutil.copytree(results.RESULTS, tmp_path, dirs_exist_ok=True)
    index = json.loads((tmp_path / "index.json").read_text())
    index["details"]["bytes_ratio"] = 7.25
    index["details"]["by_index"]["student"]["queries_per_s_batch1"] = 1234.5
    index["ours"] = 4321.0
    (tmp_path / "index.json").write_text(json.dumps(index))
    section = _section(results.page(tmp_path), "index")
    assert "7.25× smaller" in section
    assert "| student | 128 | 8,192,045 | 1,234 | 5,300 |" in section
    assert "ours 4,321 queries/s" in section
    assert results.page(tmp_path) != results.page()


def test_a_note_naming_a_figure_its_file_lacks_is_refused(tmp_path: Path):
    shutil.copytree(results.RESULTS, tmp_path, dirs_exist_ok=True)
    index = json.loads((tmp_path / "index.json").read_text())
    del index["details"]["bytes_ratio"]
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(KeyError, match="index: no figure at 'details/bytes_ratio'"):
        results.page(tmp_path)


def test_a_benchmark_without_a_description_is_listed_as_not_stated(tmp_path: Path):
    result = {
        "benchmark": "new_bench",
        "unit": "s",
        "ours": 2.0,
        "baseline": {"name": "the old way", "value": 3.0},
        "ratio": 1.5,
        "machine": {"cores": 4, "cpu_model": "some CPU", "python": "3.11.9"},
        "details": {},
    }
    (tmp_path / "new_bench.json").write_text(json.dumps(result))
    page = results.page(tmp_path)
    assert "| [new_bench](#new_bench) | 2 s | 3 s | 1.50× | **no** | 4 cores, some CPU |" in page
    assert "**Not like-for-like:** " in _section(page, "new_bench")


def test_readme_links_the_page_and_holds_no_figures_table_commit_or_cpu_name():
    readme = (REPO / "README.md").read_text()
    assert "docs/benchmarks.md" in readme
    assert "<!-- bench:" not in readme and len(readme.splitlines()) <= 200
    assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", readme), "a commit hash"
    assert not re.search(r"EPYC|Xeon|Zen|Ryzen|Core i\d|the issue", readme)
