"""The generated reference pages match the code, and the settings model owns every ``HPD_*`` variable the code
reads: no module of ``tasks/`` or ``dags/`` reads one from ``os.environ`` itself."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import reference
from tasks.core import settings
from tests.support.paths import REPO

SETTINGS_MODULE = REPO / "tasks" / "core" / "settings.py"


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_each_page_is_what_the_code_generates(page):
    on_disk = (reference.DOCS / page).read_text()
    assert on_disk == reference.PAGES[page](), f"docs/reference/{page} is stale: run `{reference.REGENERATE}`"


def test_the_check_names_a_stale_page(tmp_path):
    for name, page in reference.PAGES.items():
        (tmp_path / name).write_text(page())
    assert reference.stale(tmp_path) == []
    (tmp_path / "cli.md").write_text(reference.cli_page().replace("--shard-rows", "--shard-size"))
    assert reference.stale(tmp_path) == ["cli.md"]
    done = subprocess.run([sys.executable, "-m", "tasks.reference", "--check"], cwd=REPO, capture_output=True)
    assert done.returncode == 0, done.stderr  # the pages in docs/ are current


def test_the_pages_list_every_command_option_and_variable():
    cli_page, configuration = reference.cli_page(), reference.configuration_page()
    from tasks import cli, completion

    for path, parser in completion.commands(cli.build_parser()).items():
        assert f"hpd {path.replace('/', ' ')}".strip() in cli_page
        for action in parser._actions:
            assert all(f"`{flag}`" in cli_page for flag in action.option_strings)
    assert "| `--amp` | one of `auto`, `off`, `bf16`, `fp16` | `auto` |" in cli_page
    for name in settings.Settings.model_fields:
        assert f"| `{settings.env_name(name)}` |" in configuration
    assert "| `HPD_S3_MAX_ATTEMPTS` | `int` | `8` |" in configuration
    assert "| `HPD_SMTP_CONN_ID` | `smtp_default` |" in configuration


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to a string constant (``EVERY_S_ENV = "HPD_LOG_EVERY_S"``)."""
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _names_hpd(node: ast.expr | None, strings: dict[str, str]) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith(settings.PREFIX)
    if isinstance(node, ast.JoinedStr):
        return bool(node.values) and _names_hpd(node.values[0], strings)
    if isinstance(node, ast.Name):
        return strings.get(node.id, "").startswith(settings.PREFIX)
    return False


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def environment_reads(source: str) -> list[int]:
    """Lines of ``source`` that read an ``HPD_*`` variable from the environment: ``os.environ.get("HPD_X")``,
    ``os.environ["HPD_X"]``, ``os.getenv(f"HPD_{name}")``, through a module constant too."""
    tree = ast.parse(source)
    strings = _module_strings(tree)
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute | ast.Name):
            func = node.func
            getenv = isinstance(func, ast.Name) and func.id == "getenv" or getattr(func, "attr", "") == "getenv"
            get = isinstance(func, ast.Attribute) and func.attr in ("get", "pop") and _is_environ(func.value)
            key = node.args[0] if getenv or get else None
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            key = node.slice
        if _names_hpd(key, strings):
            found.append(node.lineno)
    return found


def test_no_hpd_variable_is_read_beside_the_settings_model():
    reads = [
        f"{path.relative_to(REPO)}:{line}"
        for root in ("tasks", "dags")
        for path in sorted((REPO / root).rglob("*.py"))
        if path != SETTINGS_MODULE
        for line in environment_reads(path.read_text())
    ]
    assert reads == []


def test_the_environment_read_scan_sees_each_way_in():
    sample = """
import os
from os import environ, getenv
NAME = "HPD_STORE"
a = os.environ.get("HPD_STORE")
b = os.environ["HPD_GPU_QUEUE"]
c = os.getenv(f"HPD_DEFAULT_{x.upper()}")
d = environ.get(NAME, "x")
e = getenv("HPD_K")
os.environ["HPD_STORE"] = "written, not read"
f = os.environ.get("WORLD_SIZE")
g = {"HPD_STORE": store, **os.environ}
"""
    assert environment_reads(sample) == [5, 6, 7, 8, 9]


def test_every_hpd_name_in_the_code_is_a_setting():
    """A variable named in tasks/ or dags/ (in code, a docstring or a comment) is one the settings model owns."""
    known = {settings.env_name(name) for name in settings.Settings.model_fields}
    named = {
        f"{path.relative_to(REPO)}: {name}"
        for root in ("tasks", "dags")
        for path in sorted((REPO / root).rglob("*.py"))
        for name in re.findall(r"\bHPD_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
        if name not in known and name != "HPD_DEFAULT"  # HPD_DEFAULT_* names the group
    }
    assert named == set()


def test_every_setting_is_documented_and_sectioned():
    for name, field in settings.Settings.model_fields.items():
        assert field.description, name
        assert isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("section"), name
    assert Path(reference.DOCS).name == "reference"
