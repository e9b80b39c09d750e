"""
### hpd_quality_report — great-expectations checks of a partition's data

Daily (for the data interval's partition) and on demand: run the expectation suites on the
partition's sentences and the teacher's embeddings, and on a PCA run's targets when named. A
failure fails the task with every failing expectation and sample rows in the log.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from tasks.orchestration.dag_params import stage_param
from tasks.orchestration.defaults import DEFAULT_ARGS, DEFAULT_TEACHER, DEPLOYMENT, STORE_PARAM
from tasks.stages.params import QualityParams


@dag(
    dag_id="hpd_quality_report",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "quality"],
    doc_md=__doc__,
    params={
        "store": STORE_PARAM,
        "teacher": stage_param(QualityParams, "teacher", DEFAULT_TEACHER, DEPLOYMENT),
        "pca_name": stage_param(QualityParams, "pca_name"),
    },
)
def hpd_quality_report():
    @task
    def check_partition(**context) -> dict:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = context["params"]
        values = {**runtime.pick(p, "teacher", "pca_name"), "ingest_date": runtime.partition_date(context)}
        return runtime.run_stage(Stage.QUALITY, runtime.stage_params(Stage.QUALITY, values, p)).stats

    check_partition()


hpd_quality_report()
