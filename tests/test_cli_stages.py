"""The CLI drives every stage; the chain stage -> augment -> encode -> PCA on a tiny model."""

import json

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
        ["fit-pca", "--teacher", str(model), "--k", "8", "--partitions", "2026-11-30", "--no-write-targets"],
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
