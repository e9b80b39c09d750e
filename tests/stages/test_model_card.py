"""The exported model's card (Hugging Face / sentence-transformers metadata, readable body) and how the exported
folder loads in sentence-transformers."""

import json
import logging
import re
import warnings
from datetime import date

import numpy as np
import pytest
import yaml

from tasks.ml import models, student
from tasks.ml.encoder import SentenceEncoder
from tasks.stages.distill import card
from tests.support.projected_store import STS_DEV_SELECTION, corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 2)
RUN = "carded"
TEXTS = ["A man is playing a guitar.", "Stocks fell sharply on Monday.", "short", "x y z " * 20]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A tiny distillation under the recipe's defaults (STS dev selection among blends), its exported folder
    fetched from the store."""
    root = tmp_path_factory.mktemp("card")
    prepared = projected_store(root, corpus_lines(120), DAY, shard_rows=60)
    result = distill_tiny(prepared, RUN, max_steps=4, **STS_DEV_SELECTION)
    folder = student.fetch_exported(prepared["store"], RUN, root / "fetched")
    return {"root": root, "result": result, "folder": folder, "text": (folder / "README.md").read_text()}


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    header, _ = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header)


def test_the_card_holds_no_python_repr_and_no_local_path(published):
    text = published["text"]
    for repr_mark in ("{'", "['", "[(", "':", "OrderedDict", "np.float"):
        assert repr_mark not in text, repr_mark
    assert not re.search(r"\b(None|True|False|nan|inf)\b", text)
    for path in (str(published["root"]), "/tmp", "file://", "/home/", "/root"):
        assert path not in text, path


def test_the_front_matter_is_sentence_transformers_card_metadata(published):
    meta = _front_matter(published["text"])
    assert meta["library_name"] == "sentence-transformers"
    assert meta["pipeline_tag"] == "sentence-similarity"
    assert meta["base_model"] == "student"  # the tiny student's folder, by its name
    assert meta["license"] == card.UNKNOWN_LICENCE  # its folder has no card naming one
    assert {"sentence-transformers", "distillation"} <= set(meta["tags"])
    (index,) = meta["model-index"]
    assert index["name"] == RUN
    metrics = {
        (result["dataset"]["split"], metric["type"]): metric["value"]
        for result in index["results"]
        for metric in result["metrics"]
    }
    assert all(type(value) is float for value in metrics.values())
    exported = published["result"].stats["exported"]
    assert metrics["validation", "mse"] == pytest.approx(exported["val_mse"])
    assert metrics["validation", "cosine"] == pytest.approx(exported["val_cosine"])
    assert metrics["validation", "spearman_cosine"] == pytest.approx(exported["sts_dev"] / 100, abs=1e-5)
    assert 0 < metrics["train", "loss"] < 1


def test_the_body_gives_training_data_and_params_readably(published):
    text = published["text"]
    stats = published["result"].stats
    assert f"{stats['train_rows']:,} training rows" in text
    assert f"from the partitions {DAY.isoformat()}" in text
    assert "| `blend_initial` | 0.25, 0.5, 0.75 |" in text
    assert "| `partitions` | not set |" in text
    assert "| `length_grouped` | yes |" in text
    assert "| `store` |" not in text
    assert "- `sentences/ingest_date=2026-11-02/part-00000-" in text  # inputs by their key in the store
    assert f"| **exported** (the best by sts_dev) | {stats['best_step']} |" in text or "**exported** (blend" in text


def test_the_base_models_licence_and_language_come_from_its_own_card(tmp_path):
    folder = tmp_path / "licensed-student"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "README.md").write_text("---\nlicense: mit\nlanguage: en\n---\n# a model\n")
    assert card.base_card(str(folder)) == {"license": "mit", "language": "en"}
    assert card.base_card(str(tmp_path / "missing")) == {}
    assert card.model_name(str(folder)) == "licensed-student"
    assert card.model_name(models.DEFAULT_STUDENT) == f"sentence-transformers/{models.DEFAULT_STUDENT}"
    assert card.model_name("org/some-model") == "org/some-model"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_the_exported_student_loads_in_sentence_transformers_without_a_warning(published, caplog):
    from sentence_transformers import SentenceTransformer

    config = json.loads((published["folder"] / "sentence_bert_config.json").read_text())
    assert config["model_args"] == {"add_pooling_layer": False}
    transformers_log = logging.getLogger("transformers")  # it does not propagate to the root logger
    handler = _Records()
    transformers_log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            loaded = SentenceTransformer(str(published["folder"]), device="cpu")
    finally:
        transformers_log.removeHandler(handler)
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in handler.records] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert getattr(loaded[0].auto_model, "pooler", None) is None
    ours = SentenceEncoder.load(str(published["folder"])).encode(TEXTS)
    theirs = loaded.encode(TEXTS)
    assert theirs.shape == (len(TEXTS), 8)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)


def test_a_teacher_is_named_by_its_members_with_their_weights(tmp_path):
    local = tmp_path / "my-teacher"
    local.mkdir()
    spec = f"all-mpnet-base-v2+0.5*{local}"
    assert card.teacher_name(spec, quote="`") == "`sentence-transformers/all-mpnet-base-v2` + 0.5 × `my-teacher`"
    assert card.teacher_name("all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
