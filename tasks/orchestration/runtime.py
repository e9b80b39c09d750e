"""What the Airflow DAG tasks call at run time: the run's partition and store, stage runs, shard planning."""

from __future__ import annotations

import importlib
from datetime import date
from typing import Any

from tasks.core import catalog, config
from tasks.core.catalog import Stage
from tasks.core.config import StageParams
from tasks.core.manifest import StageResult


def partition_date(context: dict) -> date:
    """The run's partition: the day its data interval starts (never the wall clock)."""
    start = context.get("data_interval_start") or context["logical_date"]
    return start.date()


def pick(params: dict, *names: str) -> dict[str, Any]:
    """The run's params ``names``: DAG params that feed the stage field of the same name."""
    return {name: params[name] for name in names}


def with_store(values: dict, params: dict) -> dict:
    """Stage values plus the store from the run's params (default: ``$HPD_STORE`` / ``./var/store``)."""
    return {**values, "store": params.get("store") or config.default_store()}


def stage_params(stage: Stage, values: dict[str, Any], params: dict) -> StageParams:
    """``values`` and the run's store, validated into the stage's parameter model."""
    from tasks.stages.params import PARAMS

    return config.parse(PARAMS[stage], with_store(values, params))


def run_stage(stage: Stage, parsed: StageParams) -> StageResult:
    """Run ``stage`` (the module ``tasks.stages.<stage>``) with validated parameters."""
    return importlib.import_module(f"tasks.stages.{stage}").run(parsed)


def shard_groups(params: dict, day: str) -> list[list[int]]:
    """The partition's sentences shards split round-robin into ``params['shard_groups']`` non-empty groups."""
    from tasks.core import sentences

    store = config.parse(StageParams, with_store({}, params)).store
    count = len(sentences.shards(store, date.fromisoformat(day)))
    groups = min(params["shard_groups"], count)
    return [list(range(g, count, groups)) for g in range(groups)]


def run_name(context: dict) -> str:
    """A store-safe name for the Airflow run (the default name of a distill run)."""
    return catalog.airflow_run_name(context["run_id"])
