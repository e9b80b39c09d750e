"""Every DAG file imports cleanly and fast, and every DAG carries docs, tags and retries."""

import time
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

DAGS = Path(__file__).parents[2] / "dags"
FILES = sorted(DAGS.glob("*.py"))


@pytest.fixture(scope="module")
def dagbag():
    return DagBag(str(DAGS))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"hpd_ingest"} <= set(dagbag.dag_ids)


def test_every_dag_has_docs_tags_and_retries(dagbag):
    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md and len(dag.doc_md) > 100, dag_id
        assert "hpd" in dag.tags, dag_id
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id}"


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_each_file_parses_in_under_a_second(path):
    DagBag(str(path))  # warm: airflow itself is imported once
    start = time.perf_counter()
    bag = DagBag(str(path))
    assert time.perf_counter() - start < 1.0
    assert bag.import_errors == {}


def test_heavy_libraries_are_imported_inside_tasks():
    for path in FILES:
        head = [line for line in path.read_text().splitlines() if line.startswith(("import ", "from "))]
        assert not [line for line in head if any(lib in line for lib in ("torch", "transformers", "tasks"))], path
