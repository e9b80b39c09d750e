"""The Celery workers' configuration (``[celery] celery_config_options``): Airflow's default, and the libraries the
stage tasks import (:data:`~tasks.orchestration.task_libraries.TASK_LIBRARIES`) imported by each worker before it
forks its pool, so a task on a worker starts with them loaded."""

from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

from tasks.orchestration.task_libraries import TASK_LIBRARIES

CELERY_CONFIG: dict[str, Any] = {**DEFAULT_CELERY_CONFIG, "imports": TASK_LIBRARIES}
# The setting that names this configuration, for the workers' (and the scheduler's) environment.
CELERY_CONFIG_ENV = {"AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": f"{__name__}.CELERY_CONFIG"}
