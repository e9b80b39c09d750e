"""Defaults shared by the DAG files; imports nothing but the Task SDK, so DAG files parse fast."""

from datetime import timedelta

from airflow.sdk import Asset

DEFAULT_ARGS = {"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True}
# Updated when a retrained student passes the quality gate and becomes models/current.json.
PROMOTED_MODEL = Asset(name="hpd_promoted_model", uri="hpd://models/current")
