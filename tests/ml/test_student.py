"""Downloading an exported student: the files come from URIs listed in a distill manifest, so each must
lie in the run's model folder (in the store) and land inside the download folder; nothing is written
elsewhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.core import catalog, manifest, storage
from tasks.core.catalog import Stage
from tasks.ml import student
from tasks.ml.student import StudentError

pytestmark = pytest.mark.models

FP = "0123456789ab"
MODEL_FILES = ["modules.json", "config.json", "1_Pooling/config.json"]


def _publish(store: str, run: str, files: list[str], folder: str | None = None) -> str:
    """A distill manifest listing ``files`` under ``folder`` (default: the run's model folder), each
    written where its URI points; the URIs are spelled by hand (``join`` refuses '..')."""
    folder = folder or f"{store}/students/{run}/{FP}/model"
    run_record = manifest.StageRun(Stage.DISTILL, run, store, {}, [])
    for name in files:
        uri, body = f"{folder}/{name}", f"body of {name}".encode()
        storage.write_bytes(uri, body)
        run_record.add_output(uri, body)
    metrics = f"{store}/students/{run}/{FP}/metrics.json"
    run_record.write_output(metrics, b"{}")  # an output beside the model folder: not downloaded
    run_record.publish()
    return folder


def _files_outside(tmp_path: Path, *kept: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.is_file() and not any(k in p.parents for k in kept)]


def test_fetch_exported_downloads_the_model_folder(store_root, tmp_path):
    _publish(store_root, "good", MODEL_FILES)
    into = tmp_path / "download" / "into"
    assert student.fetch_exported(store_root, "good", into) == into
    got = sorted(str(p.relative_to(into)) for p in into.rglob("*") if p.is_file())
    assert got == sorted(MODEL_FILES)
    assert (into / "1_Pooling" / "config.json").read_bytes() == b"body of 1_Pooling/config.json"


def test_fetch_exported_refuses_a_file_that_is_not_what_was_published(store_root, tmp_path):
    folder = _publish(store_root, "tampered", MODEL_FILES)
    storage.write_bytes(f"{folder}/config.json", b"replaced after publishing")
    with pytest.raises(storage.IntegrityError, match=re.escape(f"{folder}/config.json")):
        student.fetch_exported(store_root, "tampered", tmp_path / "into")
    assert not (tmp_path / "into" / "config.json").exists()


def test_fetch_exported_refuses_an_output_escaping_the_model_folder(store_root, tmp_path):
    """A stage cannot publish such an output (the writer refuses it); a manifest planted with one is refused
    when it is read, naming the bad entry, before anything is downloaded."""
    folder = _publish(store_root, "evil", MODEL_FILES)
    with pytest.raises(manifest.ManifestError, match="not below the store"):
        _publish(store_root, "evil-direct", ["../../../../evil.txt"])
    uri = catalog.manifest_uri(store_root, Stage.DISTILL, "evil")
    document = json.loads(storage.read_bytes(uri))
    escaping = catalog.store_key(store_root, folder) + "/../../evil.txt"
    document["outputs"].append({**document["outputs"][0], "key": escaping})
    storage.write_bytes(uri, json.dumps(document).encode())
    into = tmp_path / "download" / "into"
    with pytest.raises(manifest.ManifestError, match=re.escape(uri)):
        student.fetch_exported(store_root, "evil", into)
    store = tmp_path / "store"
    assert _files_outside(tmp_path, store) == []  # not even the model's own files: checked before any download


@pytest.mark.parametrize(
    "folder",
    ["s3://bucket/root/students/r/0123/model", "file:///data/store/students/r/0123/model"],
)
@pytest.mark.parametrize("name", ["../../evil.txt", "../model-x/evil.txt", "a/../../evil.txt", "./x/../../../y"])
def test_local_files_refuses_dot_segments_out_of_the_folder(tmp_path, folder, name):
    outputs = [f"{folder}/modules.json", f"{folder}/{name}"]
    with pytest.raises(StudentError, match=re.escape(f"{folder}/{name}")):
        student.local_files(outputs, folder, tmp_path / "into")


def test_local_files_refuses_an_s3_key_that_would_land_outside_the_download_folder(tmp_path):
    folder = "s3://bucket/root/students/r/0123/model"
    with pytest.raises(StudentError, match=re.escape(f"{folder}//etc/passwd") + ".*outside the download folder"):
        student.local_files([f"{folder}//etc/passwd"], folder, tmp_path / "into")


def test_local_files_maps_each_file_below_the_download_folder(tmp_path):
    folder = "file:///data/store/students/r/0123/model"
    outputs = [f"{folder}/modules.json", f"{folder}/a/../b.json", f"{folder}-x/other.json"]  # the last: not listed
    into = tmp_path / "into"
    assert student.local_files(outputs, folder, into) == [
        (f"{folder}/modules.json", into.resolve() / "modules.json"),
        (f"{folder}/b.json", into.resolve() / "b.json"),  # normalised, still inside
    ]


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_the_sentence_transformer_view_is_the_student(tmp_path, activation):
    """The view encodes exactly as the student does and trains its very parameters: a cut student's layers,
    its frozen flags and its head, not copies."""
    from tests.support.tiny_models import build_sentence_model

    folder = str(build_sentence_model(tmp_path / "student", layers=3, normalize=False))
    encoder = student.build(folder, 8, activation, layers=2, dropout=0.0)
    student.freeze(encoder, 1, folder)
    view = student.as_sentence_transformer(encoder)
    texts = ["A man is playing a guitar.", "short", "x y z " * 20]
    np.testing.assert_array_equal(view.encode(texts, convert_to_numpy=True), encoder.encode(texts))
    assert [id(p) for p in view.parameters()] == [id(p) for p in encoder.parameters()]
    assert len(view[0].model.encoder.layer) == 2
    frozen = [name for name, p in view.named_parameters() if not p.requires_grad]
    assert frozen and all(".embeddings." in n or ".layer.0." in n for n in frozen)
    with torch.no_grad():
        encoder.dense.linear.bias.add_(1.0)  # a change to the student shows through the view
    np.testing.assert_array_equal(view.encode(texts, convert_to_numpy=True), encoder.encode(texts))


def test_a_kept_head_is_the_folder_s_own_and_must_be_the_head_asked_for(tmp_path):
    """A warm start's head is kept as saved; a folder without one, or one of another size or activation, is refused
    naming the folder."""
    from tests.support.tiny_models import build_sentence_model

    bare = str(build_sentence_model(tmp_path / "bare", layers=1, normalize=False))
    saved = student.build(bare, 8, "tanh")
    with torch.no_grad():
        saved.dense.linear.weight.fill_(0.5)
    saved.save(tmp_path / "trained")
    trained = str(tmp_path / "trained")
    kept = student.build(trained, 8, "tanh")
    student.keep_head(kept, trained)
    assert torch.equal(kept.dense.linear.weight, saved.dense.linear.weight)
    with pytest.raises(StudentError, match=f"student '{re.escape(bare)}' has no Dense head to keep"):
        student.keep_head(student.build(bare, 8, "tanh"), bare)
    for k, activation in ((4, "tanh"), (8, "identity")):
        with pytest.raises(StudentError, match="its Dense head is not the .* head asked for"):
            student.keep_head(student.build(trained, k, activation), trained)
