"""
### hpd_index — keep the search index current: new partitions, new students

Scheduled on the `hpd_promoted_model` Asset (updated by `hpd_retrain` when a student passes the
gate; the event names the store and the model run, which this run then uses) or the `hpd_corpus_updated`
Asset (a partition `hpd_ingest` staged), and runnable by hand (default: the store's promoted model).
It publishes a new index version and moves `indexes/current.json` by compare-and-swap: with the same
student, the version keeps the segments of the one before and encodes only the partitions none covers
(a day's new partition is searchable after this run, with no retrain); a new student encodes the whole
corpus once. Segments merge by tiers as they accumulate. While no model is promoted the run is skipped.
The logic lives in `tasks/`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from tasks.orchestration.assets import CORPUS_UPDATED, PROMOTED_MODEL
from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import DEFAULT_ARGS, STORE_PARAM
from tasks.stages.params import BuildIndexParams

INDEX = "Index"


@dag(
    dag_id="hpd_index",
    dag_display_name="Index: keep search current",
    description="Publish a new search index version (new partitions, or a new student) and promote it",
    schedule=(PROMOTED_MODEL | CORPUS_UPDATED),
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "index"],
    doc_md=__doc__,
    params={
        "store": STORE_PARAM,
        "model_run": stage_param(
            BuildIndexParams,
            "model_run",
            None,
            "empty: the triggering event's, else the promoted",
            title="Model run",
            section=INDEX,
        ),
        "index_type": stage_param(BuildIndexParams, "index_type", title="Index type", section=INDEX),
        "sq8": stage_param(BuildIndexParams, "sq8", title="8-bit scalar quantisation", section=INDEX),
    },
)
def hpd_index():
    @task
    def build_and_promote(**context) -> dict:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = runtime.run_params(context)
        values = {**runtime.pick(p, "index_type", "sq8"), "model_run": runtime.model_to_index(context)}
        return runtime.run_stage(Stage.BUILD_INDEX, runtime.stage_params(Stage.BUILD_INDEX, values, p)).stats

    build_and_promote()


hpd_index()
