"""Bad input as a user types it, through the ``hpd`` entry point: exit 2 for bad parameters and 1 for bad
input, a message naming the input or parameter, no Python traceback, no credentials echoed, and nothing
written to the store."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

HPD = Path(sys.executable).parent / "hpd"
DAY = ["--ingest-date", "2026-11-30"]
SECRET = "topsecret"
# (case, arguments ({tmp} is a scratch folder, {store} a store root under it), exit code, text the message holds)
CASES = [
    (
        "store-scheme",
        ["stage-corpus", "--store", "ftp://host/x", "--source", "{tmp}/raw.txt", *DAY],
        2,
        "ftp://host/x: unsupported scheme 'ftp'",
    ),
    (
        "store-relative-file-uri",
        ["stage-corpus", "--store", "file://relative/x", "--source", "{tmp}/raw.txt", *DAY],
        2,
        "file://relative/x: file URIs need an absolute path",
    ),
    (
        "store-credentials",
        ["stage-corpus", "--store", f"s3://AKIAEXAMPLE:{SECRET}@bucket/p", "--source", "{tmp}/raw.txt", *DAY],
        2,
        "credentials do not belong in a URI",
    ),
    ("search-store-scheme", ["search", "a query", "--store", "ftp://host/x"], 2, "--store: ftp://host/x"),
    ("search-k-zero", ["search", "a query", "-k", "0", "--store", "{store}"], 2, "0 is not within 1-1000"),
    (
        "search-k-huge",
        ["search", "a query", "-k", "10000000", "--store", "{store}"],
        2,
        "10000000 is not within 1-1000",
    ),
    ("search-no-index", ["search", "a query", "--store", "{store}"], 1, "no index promoted yet"),
    (
        "impossible-date",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--ingest-date", "2026-13-45"],
        2,
        "ingest_date",
    ),
    (
        "unknown-format",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--format", "xml", *DAY],
        2,
        "invalid choice: 'xml'",
    ),
    (
        "negative-shard-rows",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--shard-rows", "-1", *DAY],
        2,
        "shard_rows",
    ),
    (
        "missing-source",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/missing.txt", *DAY],
        1,
        "missing.txt: no such file",
    ),
    (
        "empty-source",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/empty.txt", *DAY],
        1,
        "empty.txt: the input is empty",
    ),
    (
        "binary-source",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/binary.txt", *DAY],
        1,
        "binary.txt: not valid UTF-8",
    ),
    ("nothing-staged", ["encode-teacher", "--store", "{store}", *DAY], 1, "no sentences staged for ingest_date"),
    ("no-pca-run", ["distill", "--store", "{store}", "--pca-name", "k8-missing"], 1, "no PCA run 'k8-missing'"),
    (
        "no-distill-run",
        ["validate", "--store", "{store}", "--model-run", "missing"],
        1,
        "no published distill run 'missing'",
    ),
    ("zero-k", ["fit-pca", "--store", "{store}", "--k", "0"], 2, "k: Input should be greater than 0"),
    (
        "gzip-bomb",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/bomb.txt.gz", "--max-input-bytes", "100000", *DAY],
        1,
        "bomb.txt.gz: decompresses to more than max_input_bytes=100000 bytes",
    ),
    (
        "source-too-large",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--max-input-bytes", "5", *DAY],
        1,
        "raw.txt: 12 bytes, more than max_input_bytes=5",
    ),
    (
        "line-too-long",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/long.txt", "--max-line-chars", "50", *DAY],
        1,
        "long.txt: line 2 holds 60 characters, more than max_line_chars=50",
    ),
    (
        "truncated-gzip",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/cut.txt.gz", *DAY],
        1,
        "cut.txt.gz: corrupt gzip data (truncated)",
    ),
    (
        "jsonl-not-json",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/bad.jsonl", *DAY],
        1,
        "bad.jsonl: line 2 is not JSON",
    ),
    (
        "jsonl-without-field",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/other.jsonl", *DAY],
        1,
        "other.jsonl: line 1 has no field 'text'",
    ),
    (
        "csv-without-column",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/table.csv", *DAY],
        1,
        "table.csv: no column 'text'",
    ),
    (
        "parquet-that-is-not",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/fake.parquet", *DAY],
        1,
        "fake.parquet: not a Parquet file",
    ),
    (
        "unknown-suffix",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/notes.xyz", *DAY],
        1,
        "notes.xyz: cannot tell the format from the name",
    ),
    (
        "zero-limit",
        ["stage-corpus", "--store", "{store}", "--source", "{tmp}/raw.txt", "--limit", "0", *DAY],
        2,
        "limit: Input should be greater than 0",
    ),
    ("augment-nothing-staged", ["augment", "--store", "{store}", *DAY], 1, "no sentences staged for"),
    (
        "back-translation-without-models",
        ["augment", "--store", "{store}", "--methods", "back_translation", *DAY],
        2,
        "back_translation needs translate_forward and translate_backward",
    ),
    ("quality-nothing-staged", ["quality", "--store", "{store}", *DAY], 1, "nothing staged for ingest_date=2026-11-30"),
    ("fit-pca-nothing-encoded", ["fit-pca", "--store", "{store}"], 1, "no teacher embeddings of 'all-mpnet-base-v2'"),
    ("build-index-nothing-promoted", ["build-index", "--store", "{store}"], 1, "no promoted model"),
    (
        "grad-accum-not-dividing",
        ["distill", "--store", "{store}", "--batch-size", "10", "--grad-accum", "3"],
        2,
        "batch_size 10 is not divisible by grad_accum 3",
    ),
    ("fp16-on-cpu", ["distill", "--store", "{store}", "--amp", "fp16", "--device", "cpu"], 2, "fp16 AMP needs CUDA"),
    ("bad-augment-method", ["augment", "--store", "{store}", "--methods", "shout", *DAY], 2, "invalid choice: 'shout'"),
]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "raw.txt").write_text("A sentence.\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"ok line\n\xff\xfe\xfa not text\n")
    (tmp_path / "bomb.txt.gz").write_bytes(gzip.compress(b"a" * 10_000_000))  # 10 MB from about 10 kB
    (tmp_path / "long.txt").write_text("short\n" + "x" * 60 + "\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    (tmp_path / "other.jsonl").write_text('{"sentence": "wrong field"}\n')
    (tmp_path / "table.csv").write_text("id,sentence\n1,hello\n")
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (tmp_path / "notes.xyz").write_text("a line\n")
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"a sentence\n" * 1000)[:-30])
    return tmp_path


@pytest.mark.parametrize(("arguments", "code", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_cleanly(scratch, arguments, code, expected):
    store = scratch / "store"
    argv = [a.format(tmp=scratch, store=store) for a in arguments]
    env = {k: v for k, v in os.environ.items() if k != "HPD_STORE"}
    done = subprocess.run([str(HPD), *argv], cwd=scratch, env=env, capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == code, said
    assert expected in done.stderr, done.stderr
    assert "Traceback" not in said
    assert SECRET not in said
    assert not store.exists() or not any(p.is_file() for p in store.rglob("*"))
