"""
### hpd_maintenance — garbage-collect the store

Daily: delete the store's objects that no manifest, pointer or live distill checkpoint references any
longer (shards replaced by a rerun, the shards of a concurrent run that lost, temp files of killed
writers), once they are older than the retention period, which is what readers of a replaced manifest
have to finish. Each run records what it deleted in `manifests/gc/<UTC time>.json`; `dry_run` only
lists what would go.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import DEFAULT_ARGS, STORE_PARAM
from tasks.stages.params import GCParams

GC = "Garbage collection"


@dag(
    dag_id="hpd_maintenance",
    dag_display_name="Maintenance: store garbage collection",
    description="Delete the store's objects nothing references any longer, past the retention period",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "maintenance"],
    doc_md=__doc__,
    params={
        "store": STORE_PARAM,
        "retention_hours": stage_param(GCParams, "retention_hours", title="Retention (hours)", section=GC),
        "dry_run": stage_param(GCParams, "dry_run", title="Dry run: only list", section=GC),
    },
)
def hpd_maintenance():
    @task
    def collect_garbage(**context) -> dict:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = context["params"]
        values = runtime.pick(p, "retention_hours", "dry_run")
        stats = runtime.run_stage(Stage.GC, runtime.stage_params(Stage.GC, values, p)).stats
        return {name: value for name, value in stats.items() if name != "deleted_keys"}  # the list: in the manifest

    collect_garbage()


hpd_maintenance()
