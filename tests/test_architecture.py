"""The shape of the code: short functions and classes, and imports that flow one way between the wings
of ``tasks`` (core <- ml <- stages <- orchestration; the CLI and the demo on top)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

MAX_FUNCTION_LINES, MAX_CLASS_LINES = 60, 150
CHECKED = ("tasks", "dags", "bench")
# What each wing may import from ``tasks`` (at module level or inside functions).
ALLOWED = {
    "tasks.core": ("tasks.core",),
    "tasks.ml": ("tasks.core", "tasks.ml"),
    "tasks.stages": ("tasks.core", "tasks.ml", "tasks.stages"),
    "tasks.orchestration": ("tasks.core", "tasks.stages.params", "tasks.orchestration"),
}


def _sources(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py"))


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def test_no_long_functions_or_classes():
    too_long = []
    for path in _sources(*CHECKED):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} > {limit} lines)")
    assert too_long == []


def _imported(path: Path) -> set[str]:
    """Every ``tasks`` module ``path`` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("tasks.")}


@pytest.mark.parametrize("wing", sorted(ALLOWED))
def test_imports_flow_one_way(wing):
    allowed = ALLOWED[wing]
    wrong = [
        f"{_module(path)} imports {name}"
        for path in _sources(wing.replace(".", "/"))
        for name in sorted(_imported(path))
        if not name.startswith(allowed)
    ]
    assert wrong == []


def test_the_architecture_test_sees_a_wrong_import(tmp_path):
    """The import scan finds imports inside functions too (the kind that would sneak a stage into the core)."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from tasks.stages import distill\n    import tasks.ml.encoder\n")
    assert _imported(sample) == {"tasks.stages.distill", "tasks.ml.encoder"}
