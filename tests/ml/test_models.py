"""Unpacking a packaged split-zip model: every zip member is checked before anything is extracted."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path

import pytest

from tasks.ml import models
from tasks.ml.models import ModelError, SplitZipModel

GOOD = {"m/": b"", "m/config.json": b"{}", "m/1_Pooling/config.json": b"{}", "m/desktop.ini": b"x"}


def _split_zip(tmp_path: Path, members: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> SplitZipModel:
    """A two-part zip of ``members`` standing in for the installed part packages; the model cache is
    ``tmp_path/cache``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, body in members.items():
            archive.writestr(zipfile.ZipInfo(name), body)  # ZipInfo keeps the name as given ('/abs', '../x')
    data = buffer.getvalue()
    parts = {"fake-part-001": tmp_path / "parts" / "m.zip.001", "fake-part-002": tmp_path / "parts" / "m.zip.002"}
    parts["fake-part-001"].parent.mkdir()
    parts["fake-part-001"].write_bytes(data[: len(data) // 2])
    parts["fake-part-002"].write_bytes(data[len(data) // 2 :])
    monkeypatch.setattr(models, "_part_path", lambda name, dist: parts[dist])
    monkeypatch.setenv("HPD_MODEL_CACHE", str(tmp_path / "cache"))
    return SplitZipModel(parts=tuple(parts), sha256=hashlib.sha256(data).hexdigest(), folder="m")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _files_under(tmp_path: Path, folder: str) -> list[str]:
    return [f"{folder}/{name}" for name in _files(tmp_path / folder)]


def test_a_good_zip_unpacks_once_into_the_cache(tmp_path, monkeypatch):
    packaged = _split_zip(tmp_path, GOOD, monkeypatch)
    model_dir = models._unpacked("fake-model", packaged)
    assert model_dir == tmp_path / "cache" / f"fake-model-{packaged.sha256[:12]}" / "m"
    assert _files(model_dir.parent) == [".complete", "m/1_Pooling/config.json", "m/config.json"]  # no desktop.ini


@pytest.mark.parametrize(
    "member",
    ["../evil.txt", "m/../../evil.txt", "<tmp>/evil.txt", "..\\evil.txt", "C:/evil.txt", "m/../..", "./"],
)
def test_a_member_leaving_the_folder_is_refused_before_anything_is_extracted(tmp_path, monkeypatch, member):
    member = member.replace("<tmp>", str(tmp_path))  # an absolute member: this test's own folder
    packaged = _split_zip(tmp_path, {**GOOD, member: b"pwned"}, monkeypatch)
    with pytest.raises(ModelError, match=re.escape(f"zip member {member!r}")) as err:
        models._unpacked("fake-model", packaged)
    assert "model 'fake-model' (packages fake-part-001 ... fake-part-002)" in str(err.value)
    cache = tmp_path / "cache"
    assert [f for f in _files(cache) if not f.endswith(".lock")] == []  # nothing extracted, no .complete
    assert _files(tmp_path) == sorted([*_files_under(tmp_path, "parts"), *_files_under(tmp_path, "cache")])


def test_safe_members_lists_what_to_extract(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in ["m/", "m/a..b.json", "m/desktop.ini", "m/x/./y.json"]:
            archive.writestr(name, b"")
    with zipfile.ZipFile(buffer) as archive:
        assert models.safe_members(archive, tmp_path, "pkg") == ["m/", "m/a..b.json", "m/x/./y.json"]


def test_each_part_of_the_packaged_teacher_is_found_in_its_installed_distribution():
    packaged = models.PACKAGED["all-mpnet-base-v2"]
    parts = [models._part_path("all-mpnet-base-v2", distribution) for distribution in packaged.parts]
    assert [part.name for part in parts] == [f"all-mpnet-base-v2.zip.{i:03d}" for i in range(1, 6)]
    assert all(part.is_file() for part in parts)


def test_a_part_package_that_is_not_installed_is_named():
    with pytest.raises(models.ModelError, match="package no-such-part is not installed; install the packaged"):
        models._part_path("all-mpnet-base-v2", "no-such-part")
