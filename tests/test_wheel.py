"""The built wheel, installed for real (not editable) into a fresh virtualenv, works outside the checkout:
its package data (STS sets, model-card template, schemas) ships in it and ``hpd validate`` finds it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from datetime import date
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.projected_store import corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 2)
PACKAGE_DATA = (
    "tasks/ml/sts_sets/stsbenchmark/sts-test.csv",
    "tasks/ml/sts_sets/sick/SICK_test_annotated.txt",
    "tasks/stages/distill/model_card.md",
    "schemas/manifest.schema.json",
    "schemas/expectations/sentences.json",
    "tasks/stages/data_docs_assets/README.md",
    "tasks/stages/data_docs_assets/jquery-3.7.1/jquery.min.js",
    "tasks/stages/data_docs_assets/fontawesome-free-6.6.0/webfonts/fa-solid-900.woff2",
)
# Build outputs and local state that must not go into the copied tree (nor be written into the checkout).
_NOT_SOURCE = shutil.ignore_patterns(".*", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", "var")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from the checkout. The build runs on a copy of the tree: an in-tree setuptools build
    would leave build/ and *.egg-info in the shared checkout, and a stale build/lib leaks into later wheels."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(root / "dist"),
            str(source),
        ]
    )
    [built] = (root / "dist").glob("hpd_pipeline-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> dict[str, Path]:
    """A new virtualenv with the wheel installed (non-editable), seeing the main venv's third-party packages
    through a plain path line in a .pth file: that adds the folder to sys.path without processing the .pth
    files inside it, so the checkout's editable finder (``__editable__.hpd_pipeline-*.pth``) stays off."""
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # Installed before the .pth exists, so pip sees an empty environment: it can neither find the editable
    # hpd-pipeline of the main venv "already satisfied" nor uninstall it.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "-q",
            str(wheel),
        ],
        cwd=root,
    )
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout.strip()
    )
    (site / "main_venv_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return {"root": root, "venv": venv, "python": python, "site": site, "hpd": venv / "bin" / "hpd"}


def _outside_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    # validate has no threads option; torch's default (one thread a core) crawls on a busy 2-core runner
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_wheel_ships_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [name for name in PACKAGE_DATA if name not in names]
    assert "tests/__init__.py" not in names and not any(n.startswith("dags/") for n in names)


def test_fresh_env_imports_the_installed_wheel_not_the_checkout(fresh_env):
    probe = (
        "import json, sys, tasks, schemas, torch; from tasks.ml import sts; "
        "print(json.dumps({'tasks': tasks.__file__, 'schemas': schemas.__file__, 'torch': torch.__file__, "
        "'sts': str(sts.sts_file('stsbenchmark', 'sts-test.csv')), "
        "'finders': [type(f).__name__ for f in sys.meta_path]}))"
    )
    where = json.loads(_run([str(fresh_env["python"]), "-c", probe], cwd=fresh_env["root"], env=_outside_env()).stdout)
    site = fresh_env["site"].resolve()
    for name in ("tasks", "schemas", "sts"):
        assert Path(where[name]).resolve().is_relative_to(site), (name, where[name])
    assert Path(where["torch"]).resolve().is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve())
    assert not any("Editable" in finder for finder in where["finders"])


@pytest.fixture(scope="module")
def distilled_store(tmp_path_factory) -> str:
    """A tiny store (tiny teacher and student) with one short distill run, 'wheel'."""
    prepared = projected_store(tmp_path_factory.mktemp("store"), corpus_lines(200), DAY, shard_rows=100)
    distill_tiny(prepared, "wheel", max_steps=5, lr=1e-3)
    return prepared["store"]


def test_installed_hpd_validates_outside_the_checkout(fresh_env, distilled_store):
    done = _run(
        [
            str(fresh_env["hpd"]),
            "validate",
            "--store",
            distilled_store,
            "--model-run",
            "wheel",
            "--retrieval-sample",
            "100",
            "--max-regression",
            "100",
            "--quiet",
        ],
        cwd=fresh_env["root"],
        env=_outside_env(),
        timeout=300,
    )
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["skipped"] is False and summary["outputs"] == 3  # report.html, metrics.json, model_card.md
    student = summary["stats"]["sts"]["student"]
    assert set(student) == {"STS-B test", "SICK-R test"}
    assert all(-100 <= score <= 100 for score in student.values())
