"""The CLI drives every stage; the chain stage -> augment -> encode -> PCA -> distill -> index on a tiny model,
and ``hpd search`` over it prints only its answer at the default log level."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import cli
from tasks.ml.projection import load_projection
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models


def test_the_chain_runs_from_the_cli(tmp_path, capsys):
    source = tmp_path / "raw.txt"
    source.write_text("\n".join(f"sentence number {i} about topic {i % 7}" for i in range(60)))
    model = build_sentence_model(tmp_path / "tiny")
    common = ["--store", str(tmp_path / "store"), "--quiet"]
    day = ["--ingest-date", "2026-11-30"]
    steps = [
        ["stage-corpus", "--source", str(source), "--shard-rows", "25", *day],
        ["augment", "--methods", "swap", "delete", "--fraction", "0.5", *day],
        ["encode-teacher", "--teacher", str(model), "--dtype", "bf16", *day],
        ["fit-pca", "--teacher", str(model), "--k", "8", "--partitions", "2026-11-30"],
        ["distill", "--teacher", str(model), "--student", str(model), "--pca-name", "k8-uncentered", "--name", "tiny"]
        + ["--max-steps", "2", "--batch-size", "16", "--threads", "1", "--onnx", "none"],
        ["build-index", "--model-run", "tiny", "--index-type", "flat", "--name", "tiny"],
    ]
    summaries = []
    for step in steps:
        assert cli.main([*step, *common]) == 0, step
        summaries.append(json.loads(capsys.readouterr().out))
    assert summaries[1]["stats"]["rows_written"] > 0
    encoded = summaries[2]["stats"]
    assert encoded["rows"] == 60 + summaries[1]["stats"]["rows_written"] and encoded["shards"] >= 4
    assert summaries[3]["stats"]["rows_fitted"] == encoded["rows"]
    projection = load_projection(f"file://{tmp_path}/store", str(model), "k8-uncentered")
    assert projection.components.shape == (8, 32)
    assert summaries[5]["skipped"] is False
    _search_prints_only_its_answer(tmp_path / "store")


def _search_prints_only_its_answer(store: Path) -> None:
    """At the default level, ``hpd search`` writes its hits and nothing else (no FAISS loader lines, no
    transformers notices); ``--log-level INFO`` shows what was hidden."""
    hpd = [str(Path(sys.executable).parent / "hpd"), "search", "sentence number 3 about topic 3", "-k", "3"]
    env = {**os.environ, "HPD_SERVE_URL": "off", "HPD_STORE": str(store)}
    env.pop("TRANSFORMERS_VERBOSITY", None)
    quiet = subprocess.run(hpd, capture_output=True, text=True, env=env, check=True, timeout=120)
    assert quiet.stderr == ""
    lines = quiet.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2", "3"] and "sentence number" in quiet.stdout
    told = subprocess.run([*hpd, "--log-level", "INFO"], capture_output=True, text=True, env=env, timeout=120)
    assert told.returncode == 0 and "faiss.loader" in told.stderr and told.stdout == quiet.stdout
