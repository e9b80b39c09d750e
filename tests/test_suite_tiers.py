"""The quick tier (``make check``: ``-m "not (models or services or s3 or slow or celery or dags)"``) holds no
test that builds a model or starts a live service: a test module that imports a model builder carries the
``models`` mark, and a test that uses a live-service harness the ``services`` mark (its module's or its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

MODEL_SUPPORT = {"tiny_models", "projected_store", "slow_distill", "slow_encode"}
SERVICE_SUPPORT = {"airflow_services", "celery_services", "chromium", "postgres", "smtp_sink"}
TEST_FILES = sorted((REPO / "tests").rglob("test_*.py"))


def _support_imports(tree: ast.Module) -> dict[str, str]:
    """``tests.support`` modules the file imports: the name bound in the file -> the support module."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tests.support":
            bound.update({alias.asname or alias.name: alias.name for alias in node.names})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.support."):
            module = node.module.rsplit(".", 1)[1]
            bound.update({alias.asname or alias.name: module for alias in node.names})
    return bound


def _marks(node: ast.AST) -> set[str]:
    """The ``pytest.mark.NAME`` names within ``node`` (a decorator list or a ``pytestmark`` value)."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"
    }


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            return _marks(node.value)
    return set()


def _uses(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(sub, ast.Name) and sub.id in names for sub in ast.walk(node))


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_model_and_service_tests_are_marked_out_of_the_quick_tier(path: Path):
    tree = ast.parse(path.read_text())
    imported, module_marks = _support_imports(tree), _module_marks(tree)
    if set(imported.values()) & MODEL_SUPPORT:
        assert "models" in module_marks, f"{path.name} builds models: pytestmark = pytest.mark.models"
    service_names = {name for name, module in imported.items() if module in SERVICE_SUPPORT}
    if not service_names or "services" in module_marks:
        return
    unmarked = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _uses(node, service_names)
        and "services" not in {mark for decorator in node.decorator_list for mark in _marks(decorator)}
    ]
    assert unmarked == [], f"{path.name}: these use a live service without @pytest.mark.services"
