"""``make airflow``'s environment: the scheduler's forkserver preloads the tasks' libraries (each name one that
imports: a forkserver skips a module it cannot import, silently), unless the user's environment says otherwise."""

import importlib.util
from pathlib import Path

import pytest

from tasks.orchestration import local_airflow

PRELOAD, START = "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD", "AIRFLOW__SCHEDULER__MP_START_METHOD"


def _env(monkeypatch: pytest.MonkeyPatch, **user: str) -> dict:
    for name in (PRELOAD, START):
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    return local_airflow.service_env(Path("/h"), "http://127.0.0.1:1", Path("/c"), Path("/s"), None, {})


def test_the_scheduler_forks_tasks_from_a_forkserver_with_their_libraries(monkeypatch):
    env = _env(monkeypatch)
    assert env[START] == "forkserver"
    preloaded = env[PRELOAD].split(",")
    assert {"torch", "sentence_transformers", "great_expectations", "faiss"} <= set(preloaded)
    assert [name for name in preloaded if importlib.util.find_spec(name) is None] == []
    assert not [name for name in preloaded if name.startswith(("tasks", "dags"))]  # the project's code stays fresh


def test_the_users_environment_overrides_the_start_method(monkeypatch):
    assert _env(monkeypatch, **{START: "fork"})[START] == "fork"
