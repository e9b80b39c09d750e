"""The Airflow plugin serving the store's reports in the API server, at ``/hpd/reports`` behind Airflow's login
(:mod:`tasks.serve.reports`): a validation's report, card and metrics for whoever may read ``hpd_retrain``'s task
instances, a quality run's Data Docs for ``hpd_quality_report``'s. It serves ``HPD_STORE`` and the stores
``HPD_REPORT_STORES`` names. The package registers it (entry point ``airflow.plugins``); the tasks' extra links
(:mod:`tasks.orchestration.defaults`) open what it serves."""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from tasks.core import config, settings
from tasks.core.reports import PREFIX
from tasks.core.uris import store_root, to_uri
from tasks.serve.reports import reports_app

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


class HpdReportsPlugin(AirflowPlugin):
    name = "hpd_reports"
    fastapi_apps = [{"app": reports_app(served_stores, readers_of), "url_prefix": PREFIX, "name": "hpd reports"}]
