"""The documentation site as a reader sees it: the site is built once (``mkdocs build --strict``, offline, about a
second) and its HTML read. Every fenced block of every page renders as a block (a highlighted ``<pre>`` or a Mermaid
diagram), never as inline code run into a paragraph (what a fence inside a list item became without
``pymdownx.superfences``); the home page's flow is a Mermaid diagram drawn by the vendored script, not one fetched
from a CDN; the benchmark page shows the steady-state plot where the benchmark drew one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from bench import results
from tests.support.paths import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
PLOT = "steady_state.svg"


@dataclass
class Fenced:
    """A fenced block of a Markdown page: its info string (``bash``, ``mermaid``) and its lines, dedented."""

    info: str
    body: list[str] = field(default_factory=list)


def fenced_blocks(markdown: str) -> list[Fenced]:
    """The page's fenced blocks, a closing fence being the opening one's character, at least as long."""
    blocks: list[Fenced] = []
    opened: tuple[str, int] | None = None
    for line in markdown.splitlines():
        found = FENCE.match(line)
        if opened is None:
            if found and not (found["fence"][0] == "`" and "`" in found["info"]):
                opened = (found["fence"], len(found["indent"]))
                blocks.append(Fenced(found["info"].strip()))
        elif found and found["fence"][0] == opened[0][0] and len(found["fence"]) >= len(opened[0]):
            if not found["info"].strip():
                opened = None
                continue
            blocks[-1].body.append(line[opened[1] :])
        else:
            blocks[-1].body.append(line[opened[1] :])
    return blocks


@dataclass
class Block:
    """A ``<pre>`` of the built page's article: where it sits and the text it shows."""

    classes: list[str]
    in_highlight: bool
    text: str = ""


class _Article(HTMLParser):
    """The ``<pre>`` blocks, the ``<p>`` texts and the ``<img>`` sources of the page's ``<article>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, list[str]]] = []
        self.blocks: list[Block] = []
        self.paragraphs: list[str] = []
        self.images: list[str] = []
        self.scripts: list[str] = []

    def _inside(self, tag: str, css: str | None = None) -> bool:
        return any(t == tag and (css is None or css in classes) for t, classes in self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "script" and attributes.get("src"):
            self.scripts.append(str(attributes["src"]))
        if tag in {"img", "br", "input", "meta", "link", "hr", "source"}:
            if tag == "img" and self._inside("article"):
                self.images.append(str(attributes.get("src")))
            return
        classes = (attributes.get("class") or "").split()
        if tag == "pre" and self._inside("article"):
            self.blocks.append(Block(classes, self._inside("div", "highlight")))
        if tag == "p" and self._inside("article") and not self._inside("pre"):
            self.paragraphs.append("")
        self.stack.append((tag, classes))

    def handle_endtag(self, tag: str) -> None:
        if any(t == tag for t, _ in self.stack):
            while self.stack.pop()[0] != tag:
                pass

    def handle_data(self, data: str) -> None:
        if self._inside("pre") and self.blocks:
            self.blocks[-1].text += data
        elif self._inside("p") and self.paragraphs:
            self.paragraphs[-1] += data


def read_page(html: Path) -> _Article:
    article = _Article()
    article.feed(html.read_text())
    return article


def built_page(site: Path, page: Path) -> Path:
    """The HTML file ``mkdocs`` writes for ``page`` (directory URLs: ``a/b.md`` -> ``a/b/index.html``)."""
    relative = page.relative_to(DOCS).with_suffix("")
    return site / ("index.html" if relative.name == "index" else relative / "index.html")


def _words(text: str) -> str:
    return " ".join(text.split())


def _inline(block: Fenced) -> str:
    """What a fence shows when it renders as inline code: its info string, then its lines, run together."""
    return _words("\n".join([block.info, *block.body]))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    return folder


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_fenced_block_renders_as_a_block(site: Path, page: Path):
    fenced = fenced_blocks(page.read_text())
    article = read_page(built_page(site, page))
    inline = [p[:80] for p in article.paragraphs for b in fenced if b.body and _inline(b) in _words(p)]
    assert inline == [], f"{page.name}: fenced code rendered inline, within a paragraph"
    assert len(article.blocks) == len(fenced), f"{page.name}: {len(fenced)} fenced blocks, {len(article.blocks)} <pre>"
    for block, source in zip(article.blocks, fenced, strict=True):
        if source.info == "mermaid":
            assert "mermaid" in block.classes, f"{page.name}: a mermaid fence not in a mermaid container"
        else:
            assert block.in_highlight, f"{page.name}: a <pre> outside div.highlight: {block.text[:80]!r}"
        assert _words("\n".join(source.body)) == _words(block.text), f"{page.name}: a block shows other text"


def test_the_fence_reader_finds_fences_in_list_items_and_longer_fences():
    page = (
        "1. step:\n\n    ```bash\n    pip install x\n    ```\n\n"
        "````markdown\n```python\nx = 1\n```\n````\nsome `code`, ```inline``` too\n"
    )
    assert [(b.info, b.body) for b in fenced_blocks(page)] == [
        ("bash", ["pip install x"]),
        ("markdown", ["```python", "x = 1", "```"]),
    ]


def test_the_home_page_draws_the_flow_with_the_vendored_mermaid(site: Path):
    article = read_page(site / "index.html")
    diagrams = [block for block in article.blocks if "mermaid" in block.classes]
    assert len(diagrams) == 1, "the home page's flow is one mermaid diagram"
    flow = diagrams[0].text
    for name in ("hpd_ingest", "hpd_quality_report", "hpd_retrain", "plan", "hpd_index", "hpd_maintenance"):
        assert name in flow
    assert "object store" in flow and "hpd serve" in flow and "hpd search" in flow
    scripts = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!python/name:", ""))["extra_javascript"]
    vendored = [s["path"] if isinstance(s, dict) else s for s in scripts if "mermaid" in str(s)]
    assert len(vendored) == 1 and not re.match(r"\w+://", vendored[0]), "mermaid must be vendored, not a URL"
    assert vendored[0] in article.scripts
    script = site / vendored[0]
    assert script.stat().st_size > 1_000_000 and b'globalThis["mermaid"]' in script.read_bytes()[-2000:]
    assert (script.parent / "LICENSE").is_file()
    version = re.search(r"mermaid-(\d+\.\d+\.\d+)/", vendored[0])
    assert version and f"| mermaid | {version[1]} |" in (DOCS / "licences.md").read_text()


def test_the_benchmark_page_shows_the_steady_state_plot(site: Path):
    if not (results.RESULTS / PLOT).exists():
        pytest.skip(f"bench/results/{PLOT} not drawn")
    try:
        current = results.PAGE.read_text() == results.page()
    except KeyError:  # a result file the page's text names a figure of is being rewritten
        current = False
    if not current:
        pytest.skip("docs/benchmarks.md is stale (tests/test_bench_results.py fails): run `python -m bench.results`")
    article = read_page(built_page(site, results.PAGE))
    shown = [src for src in article.images if src.endswith(f"img/{PLOT}")]
    assert shown, f"the benchmark page shows no img/{PLOT}"
    assert (site / "img" / PLOT).read_bytes() == (results.RESULTS / PLOT).read_bytes()
