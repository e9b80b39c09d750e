"""
### hpd_index — rebuild and promote the search index for the promoted student

Scheduled on the `hpd_promoted_model` Asset (updated by `hpd_retrain` when a student passes the
gate) and runnable by hand: encode the corpus with the promoted student, build the FAISS index,
publish it and move `indexes/current.json` by compare-and-swap. The logic lives in `tasks/`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from tasks.dag_defaults import DEFAULT_ARGS, PROMOTED_MODEL


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
        "store": Param(None, type=["null", "string"], description="store root URI (default: $HPD_STORE)"),
        "index_type": Param("auto", enum=["auto", "flat", "ivf_flat", "hnsw", "ivf_pq"]),
        "sq8": Param(False, type="boolean"),
    },
)
def hpd_index():
    @task
    def build_and_promote(**context) -> dict:
        from tasks import build_index, config, orchestration

        p = context["params"]
        values = {"index_type": p["index_type"], "sq8": p["sq8"]}  # named after the promoted model run
        result = build_index.run(config.parse(build_index.BuildIndexParams, orchestration.with_store(values, p)))
        return result.manifest["stats"]

    build_and_promote()


hpd_index()
