"""docs/own-data.md runs as written: its ``sh`` blocks, in order, on the shipped sample days, with the DAG settings the
page reads (HPD_DEFAULT_TEACHER, HPD_DEFAULT_STUDENT, HPD_DEFAULT_K) pointing at tiny models; the chain runs through
the CLI in the stages' order and ends with a search whose first hit is the last day's sentence it asked for. The
page's fallbacks for those settings are their defaults."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tasks.core import settings
from tests.support.paths import REPO
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

PAGE = REPO / "docs" / "own-data.md"
CHAIN = ["stage-corpus", "augment", "encode-teacher", "fit-pca", "distill", "validate", "build-index", "search"]
HIT = re.compile(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+(.*)$")


def shell_blocks(markdown: str) -> list[str]:
    """The bodies of the page's fenced ``sh`` blocks, in order."""
    return re.findall(r"^```sh\n(.*?)^```$", markdown, re.M | re.S)


def hpd_commands(script: str) -> list[list[str]]:
    """Each ``.venv/bin/hpd`` command line of ``script`` (continuation lines joined), split as the shell would."""
    lines = script.replace("\\\n", " ").splitlines()
    return [shlex.split(line.strip()) for line in lines if line.strip().startswith(".venv/bin/hpd ")]


def test_the_page_runs_the_chain_on_the_sample_days(tmp_path: Path, warm_hpd: Path):
    script = "\n".join(shell_blocks(PAGE.read_text()))
    commands = hpd_commands(script)
    assert [command[1] for command in commands] == CHAIN
    query = commands[-1][2]
    defaults = dict(re.findall(r"^\w+=\$\{(HPD_DEFAULT_\w+):-([^}]*)\}$", script, re.M))
    fields = settings.Settings.model_fields
    assert defaults == {
        settings.env_name(name): str(fields[name].default)
        for name in ("default_teacher", "default_student", "default_k")
    }
    days = sorted((REPO / "data" / "samples").iterdir())
    assert query in days[-1].joinpath("sentences.txt").read_text().splitlines()

    validate = "hpd validate --model-run own-student"
    assert script.count(validate) == 1
    script = script.replace(validate, f"{validate} --max-regression 100")

    model = build_sentence_model(tmp_path / "tiny")
    checkout = tmp_path / "checkout"  # the page runs from a checkout's root: the sample days, `hpd`, a fresh var/
    shutil.copytree(REPO / "data" / "samples", checkout / "data" / "samples")
    env = {key: value for key, value in os.environ.items() if not key.startswith("HPD_")}
    env.update(HPD_DEFAULT_TEACHER=str(model), HPD_DEFAULT_STUDENT=str(model), HPD_DEFAULT_K="8", HPD_SERVE_URL="off")
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "hpd").symlink_to(warm_hpd)  # each `hpd` a process forked with its libraries loaded
    bash = ["bash", "-euo", "pipefail", "-c", script]
    ran = subprocess.run(bash, cwd=checkout, env=env, capture_output=True, text=True, timeout=540)
    assert ran.returncode == 0, ran.stderr[-3000:]

    hits = [found.groups() for found in map(HIT.match, ran.stdout.splitlines()) if found]
    assert [rank for rank, _, _ in hits] == ["1", "2", "3"] and hits[0][2] == query
    staged = sorted(path.name for path in (checkout / "var" / "own-store" / "sentences").iterdir())
    assert staged == [f"ingest_date={day.name}" for day in days]
