"""
### hpd_index — rebuild and promote the search index for the promoted student

Scheduled on the `hpd_promoted_model` Asset (updated by `hpd_retrain` when a student passes the
gate) and runnable by hand: encode the corpus with the promoted student, build the FAISS index,
publish it and move `indexes/current.json` by compare-and-swap. The logic lives in `tasks/`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import DEFAULT_ARGS, PROMOTED_MODEL, STORE_PARAM
from tasks.stages.params import BuildIndexParams


@dag(
    dag_id="hpd_index",
    schedule=[PROMOTED_MODEL],
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "index"],
    doc_md=__doc__,
    params={
        "store": STORE_PARAM,
        "index_type": stage_param(BuildIndexParams, "index_type"),
        "sq8": stage_param(BuildIndexParams, "sq8"),
    },
)
def hpd_index():
    @task
    def build_and_promote(**context) -> dict:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = context["params"]
        values = runtime.pick(p, "index_type", "sq8")  # named after the promoted model run
        return runtime.run_stage(Stage.BUILD_INDEX, runtime.stage_params(Stage.BUILD_INDEX, values, p)).stats

    build_and_promote()


hpd_index()
