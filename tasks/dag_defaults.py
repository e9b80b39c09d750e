"""Defaults shared by the DAG files; imports nothing but the Task SDK, so DAG files parse fast."""

import os
from datetime import timedelta

from airflow.sdk import Asset

DEFAULT_ARGS = {"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True}
# Updated when a retrained student passes the quality gate and becomes models/current.json.
PROMOTED_MODEL = Asset(name="hpd_promoted_model", uri="hpd://models/current")

# Deployment-level defaults of the DAGs' params (a run's conf still overrides them).
DEFAULT_SOURCE = os.environ.get("HPD_DEFAULT_SOURCE", "data/corpus/sentences.tsv.gz")
DEFAULT_TEACHER = os.environ.get("HPD_DEFAULT_TEACHER", "all-mpnet-base-v2")
DEFAULT_STUDENT = os.environ.get("HPD_DEFAULT_STUDENT", "all-MiniLM-L6-v2")
DEFAULT_K = int(os.environ.get("HPD_DEFAULT_K", "128"))
