import json
import logging
import math
import re
from datetime import date
from importlib import resources

import numpy as np
import pyarrow as pa
import pytest

from tasks.core import catalog, config, manifest, sentences, storage
from tasks.stages import data_docs, quality, stage_corpus
from tests.support import chromium
from tests.support.synthetic import correlated_embeddings, publish_teacher_shards

DAY = date(2026, 11, 1)


def _sentences(ids, texts):
    return pa.table({"sentence_id": ids, "text": texts})


def _embeddings(vectors, ids=None, dim=None):
    vectors = np.asarray(vectors, dtype=np.float32)
    ids = ids or [f"{i:032d}" for i in range(len(vectors))]
    return pa.table(
        {
            "sentence_id": ids,
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim or vectors.shape[1]),
        }
    )


def test_clean_sentences_pass():
    good = _sentences([sentences.sentence_id(t) for t in ("a b", "c d")], ["a b", "c d"])
    result = quality.check("sentences", good, "mem://good", max_chars=100)
    assert result.rows == 2 and all(e.success for e in result.expectations)


@pytest.mark.parametrize(
    ("table", "expectation", "bad_row"),
    [
        (_sentences(["a" * 32, "a" * 32], ["x", "y"]), "expect_column_values_to_be_unique", "'text': 'x'"),
        (_sentences(["a" * 32, "b" * 32], ["x", None]), "expect_column_values_to_not_be_null", "'sentence_id': 'bbbb"),
        (_sentences(["a" * 32, "b" * 32], ["x", "y" * 50]), "expect_column_values_to_be_between", "'text_length': 50"),
    ],
)
def test_injected_bad_sentences_are_caught(table, expectation, bad_row):
    with pytest.raises(quality.QualityError) as err:
        quality.check("sentences", table, "file:///bad.parquet", max_chars=20)
    message = str(err.value)
    assert message.startswith("file:///bad.parquet: 1 of 5 expectations of suite 'sentences' failed")
    assert expectation in message and bad_row in message


def _unit(rows, dim, seed=0):
    x = np.random.default_rng(seed).normal(size=(rows, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("vectors", "dim", "expectation"),
    [
        (np.vstack([_unit(3, 4), [[math.nan, 0, 0, 1]]]), 4, "'finite'"),
        (_unit(4, 4), 3, "'dim'"),
        (np.vstack([_unit(3, 4), [[3.0, 0, 0, 0]]]), 4, "'norm'"),
    ],
)
def test_injected_bad_embeddings_are_caught(vectors, dim, expectation):
    settings = {"dim": dim, "min_norm": 0.5, "max_norm": 1.5}
    with pytest.raises(quality.QualityError, match=expectation):
        quality.check("embeddings", _embeddings(vectors, dim=4), "file:///e.parquet", **settings)


def test_duplicate_embedding_ids_and_collapsed_targets():
    with pytest.raises(quality.QualityError, match="expect_column_values_to_be_unique"):
        quality.check(
            "embeddings", _embeddings(_unit(2, 4), ids=["x", "x"]), "file:///e", dim=4, min_norm=0.5, max_norm=1.5
        )
    targets = np.column_stack([np.random.default_rng(0).normal(size=50), np.full(50, 0.25)])
    table = pa.table(
        {
            "sentence_id": [str(i) for i in range(50)],
            "target": pa.FixedSizeListArray.from_arrays(pa.array(targets.ravel().astype(np.float32)), 2),
        }
    )
    with pytest.raises(quality.QualityError, match="'dimension': 1"):
        quality.check("targets", table, "file:///t", min_variance=1e-8)


def _staged_partition(store: str, tmp_path) -> quality.QualityParams:
    """Two sentences staged for DAY in ``store``; the params of their quality run (no teacher)."""
    source = tmp_path / "raw.txt"
    source.write_text("first sentence\nsecond sentence\n")
    stage_corpus.run(
        config.parse(stage_corpus.StageCorpusParams, {"store": store, "source": str(source), "ingest_date": DAY})
    )
    return config.parse(quality.QualityParams, {"store": store, "ingest_date": DAY, "teacher": None})


def test_the_stage_checks_a_partition(store_root, tmp_path, caplog):
    params = _staged_partition(store_root, tmp_path)
    caplog.set_level(logging.INFO, logger="tasks")
    result = quality.run(params)
    assert result.stats == {"checks": 1, "rows": 2, "passed": True}
    [shard] = sentences.shards(store_root, DAY)
    suite = len(quality.suite_spec("sentences").expectations)
    assert f"quality: suite sentences on {shard} (2 rows): {suite} of {suite} expectations passed" in caplog.messages
    assert quality.run(params).skipped


def test_the_stage_publishes_data_docs_listed_in_its_manifest(store_root, tmp_path):
    result = quality.run(_staged_partition(store_root, tmp_path))
    docs = catalog.quality_data_docs_prefix(store_root, DAY, result.manifest.run_id)
    index = quality.data_docs_index(store_root, DAY)
    assert index == f"{docs}/index.html"
    results = json.loads(storage.read_bytes(result.manifest.output_named("results.json").uri))
    assert catalog.resolve(store_root, results["data_docs"]) == index
    listed = {o.uri: o.sha256 for o in result.outputs if o.uri.startswith(docs + "/")}
    assert sorted(listed) == storage.list_uris(docs)  # every file published there, and only those, is listed
    assert all(manifest.sha256_hex(storage.read_bytes(uri)) == sha for uri, sha in listed.items())
    pages = [uri for uri in listed if uri.endswith(".html")]
    assert (
        len([p for p in pages if "/validations/" in p]) == 1 and len([p for p in pages if "/expectations/" in p]) == 1
    )
    for page in pages:
        html = storage.read_bytes(page).decode()
        assert not _REMOTE_LOAD.findall(html), page  # no script, stylesheet, icon or image from the web
        for ref in data_docs.loaded(html):
            assert _resolve(page, ref) in listed, (page, ref)  # each loaded file is published and listed
    assert quality.run(_staged_partition(store_root, tmp_path)).skipped
    assert quality.data_docs_index(store_root, date(2026, 11, 2)) is None


_REMOTE_LOAD = re.compile(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="(?:https?:)?//', re.I)


def _resolve(page: str, ref: str) -> str:
    """The URI that the relative ``ref`` of the page at ``page`` names."""
    parts = page.split("/")[:-1]
    for piece in ref.split("/"):
        if piece == "..":
            parts.pop()
        elif piece != ".":
            parts.append(piece)
    return "/".join(parts)


@pytest.mark.services
def test_data_docs_open_offline_in_headless_chromium(store_root, tmp_path):
    """The Data Docs copied out of the store (as anyone would) load in Chromium with the network off: every
    script, stylesheet, font and image found, no script error."""
    quality.run(_staged_partition(store_root, tmp_path))
    published = manifest.read(store_root, "quality", catalog.partition_key(DAY))
    docs = quality.data_docs_index(store_root, DAY).removesuffix("index.html")
    copy = tmp_path / "copy"
    for output in published.outputs:
        if output.uri.startswith(docs):
            path = copy / output.uri.removeprefix(docs)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(storage.read_bytes(output.uri, sha256=output.sha256))
    pages = [copy / "index.html", *copy.glob("validations/**/*.html"), *copy.glob("expectations/*.html")]
    assert len(pages) == 3
    loaded = set()
    for page in pages:
        load = chromium.load(page.as_uri(), tmp_path / "profile")
        assert load.failed == [] and load.errors == [], page
        assert any(url.endswith("/jquery.min.js") for url in load.requested.values()), page
        loaded |= set(load.requested.values())
    assert all(url.startswith((copy.as_uri() + "/", "data:")) for url in loaded)
    assert any(url.endswith("/fa-solid-900.woff2") for url in loaded)  # the pass/fail icons


def test_data_docs_pages_load_only_vendored_files(caplog):
    """Every URL a GX template loads from the web has a vendored copy (or is dropped on purpose), and each
    vendored copy is in the package; an unknown one is left as it is, with a warning."""
    templates = resources.files("great_expectations") / "render" / "view" / "templates"
    remote = set()
    for template in templates.iterdir():
        if template.name.endswith(".j2") and not template.name.startswith("markdown"):
            remote |= set(
                re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="(https?://[^"{]+)"', template.read_text())
            )
    assert remote and remote <= set(data_docs.CDN)
    assets = resources.files("tasks.stages") / "data_docs_assets"
    assert all(assets.joinpath(path).is_file() for path in data_docs.CDN.values() if path)
    page = (
        '<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>'
        '<script src="https://code.jquery.com/jquery-3.7.1.min.js" integrity="sha384-x" crossorigin="anonymous">'
        '</script><link rel="shortcut icon" href="../../static/images/favicon.ico"/>'
        '<img src="https://example.org/x.png">'
    )
    with caplog.at_level(logging.WARNING, logger="tasks"):
        offline = data_docs.offline_page(page, "../")
    assert offline == (
        '<script src="../static/vendor/jquery-3.7.1/jquery.min.js"></script>'
        '<link rel="shortcut icon" href="../static/images/favicon.ico"/><img src="https://example.org/x.png">'
    )
    assert caplog.messages == ["data docs: https://example.org/x.png is not vendored; the page loads it from the web"]


def test_the_stage_fails_on_bad_teacher_embeddings_and_publishes_nothing(store_root):
    vectors = correlated_embeddings(20, 6, seed=3)  # norms far from 1: not a normalised teacher
    publish_teacher_shards(store_root, "synthetic", DAY, vectors, shard_rows=10)
    params = config.parse(quality.QualityParams, {"store": store_root, "ingest_date": DAY, "teacher": "synthetic"})
    with pytest.raises(quality.QualityError, match="expect_column_values_to_be_between"):
        quality.run(params)
    assert storage.list_uris(f"{store_root}/quality") == []
