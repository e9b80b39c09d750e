"""What the Airflow DAG files share: the partition of a run and its store, and shard planning."""

from __future__ import annotations

from datetime import date

from tasks import config, sentences


def partition_date(context: dict) -> date:
    """The run's partition: the day its data interval starts (never the wall clock)."""
    start = context.get("data_interval_start") or context["logical_date"]
    return start.date()


def with_store(values: dict, params: dict) -> dict:
    """Stage values plus the store from the run's params (default: ``$HPD_STORE`` / ``./var/store``)."""
    return {**values, "store": params.get("store") or config.default_store()}


def shard_groups(params: dict, day: str) -> list[list[int]]:
    """The partition's sentences shards split round-robin into ``params['shard_groups']`` non-empty groups."""
    store = config.parse(config.StageParams, with_store({}, params)).store
    count = len(sentences.shards(store, date.fromisoformat(day)))
    groups = min(params["shard_groups"], count)
    return [list(range(g, count, groups)) for g in range(groups)]


def run_name(context: dict) -> str:
    """A store-safe name for the Airflow run (the default name of a distill run)."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in context["run_id"])
