"""The Airflow plugin serving the store's reports in the API server, at ``/hpd/reports`` behind Airflow's login
(:mod:`tasks.serve.reports`): a validation's report, card and metrics for whoever may read ``hpd_retrain``'s task
instances, a quality run's Data Docs for ``hpd_quality_report``'s. It serves ``HPD_STORE`` and the stores
``HPD_REPORT_STORES`` names. The package registers it (entry point ``airflow.plugins``); the tasks' extra links
(:mod:`tasks.orchestration.defaults`) open what it serves.

Every Airflow process loads its plugins (the scheduler, the DAG processor, the triggerer, each task), but only the
API server reads ``fastapi_apps``: the app is built then, so that the others never import FastAPI and the API
server's security stack (a second or two of CPU each)."""

from __future__ import annotations

import functools
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from tasks.core import config, settings
from tasks.core.reports import PREFIX
from tasks.core.uris import store_root, to_uri

# Whose task instances a reader must be allowed to see, by report kind (the first path segment of its key).
READERS = {"validation": "hpd_retrain", "quality": "hpd_quality_report"}


def served_stores() -> list[str]:
    """``HPD_STORE``, then the stores of ``HPD_REPORT_STORES``."""
    return [config.default_store(), *(store_root(to_uri(store)) for store in settings.current().report_stores)]


def readers_of(kind: str) -> list[Any]:
    """The dependency that lets through a user allowed to read the task instances of the DAG writing ``kind``."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return [requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE, param_dag_id=READERS[kind])]


@functools.cache
def fastapi_apps() -> list[dict[str, Any]]:
    """The plugin's FastAPI apps, as Airflow's API server mounts them (built once per process)."""
    from tasks.serve.reports import reports_app

    return [{"app": reports_app(served_stores, readers_of), "url_prefix": PREFIX, "name": "hpd reports"}]


class _BuiltWhenRead:
    """A class attribute whose value :func:`fastapi_apps` builds when first read."""

    def __get__(self, instance: object, owner: type) -> list[dict[str, Any]]:
        return fastapi_apps()


class HpdReportsPlugin(AirflowPlugin):
    name = "hpd_reports"
    fastapi_apps = _BuiltWhenRead()
