"""The processes tasks fork from load the tasks' libraries first: ``make airflow``'s scheduler through its
forkserver (unless the user's environment says otherwise), the Celery workers through the project's Celery
configuration. Each name is one that imports (a forkserver skips a module it cannot import, silently), none of the
project's own. (The live tests check the libraries are loaded in those processes.)"""

import importlib.util
from pathlib import Path

import pytest

from tasks.orchestration import local_airflow
from tasks.orchestration.task_libraries import TASK_LIBRARIES

PRELOAD, START = "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD", "AIRFLOW__SCHEDULER__MP_START_METHOD"


def _env(monkeypatch: pytest.MonkeyPatch, **user: str) -> dict:
    for name in (PRELOAD, START):
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    return local_airflow.service_env(Path("/h"), "http://127.0.0.1:1", Path("/c"), Path("/s"), None, {})


def test_every_library_imports_and_none_is_the_projects():
    assert {"torch", "sentence_transformers", "great_expectations", "faiss"} <= set(TASK_LIBRARIES)
    assert [name for name in TASK_LIBRARIES if importlib.util.find_spec(name) is None] == []
    assert not [name for name in TASK_LIBRARIES if name.startswith(("tasks", "dags"))]  # they stay fresh per task


def test_the_scheduler_forks_tasks_from_a_forkserver_with_the_libraries(monkeypatch):
    env = _env(monkeypatch)
    assert env[START] == "forkserver" and env[PRELOAD].split(",") == list(TASK_LIBRARIES)
    assert _env(monkeypatch, **{START: "fork"})[START] == "fork"  # the user's environment overrides it


def test_the_celery_configuration_is_airflows_with_the_libraries_imported():
    from airflow.providers.celery.executors import celery_executor_utils
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    from tasks.orchestration.celery_config import CELERY_CONFIG, CELERY_CONFIG_ENV

    assert {k: v for k, v in CELERY_CONFIG.items() if k != "imports"} == DEFAULT_CELERY_CONFIG
    assert CELERY_CONFIG["imports"] == TASK_LIBRARIES
    with pytest.MonkeyPatch.context() as patch:
        for name, value in CELERY_CONFIG_ENV.items():
            patch.setenv(name, value)
        celery_executor_utils.get_celery_configuration.cache_clear()
        try:
            assert celery_executor_utils.get_celery_configuration() is CELERY_CONFIG  # what Airflow's workers load
        finally:
            celery_executor_utils.get_celery_configuration.cache_clear()
