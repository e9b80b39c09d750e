"""
### hpd_quality_report — great-expectations checks of a partition's data

Daily (for the data interval's partition) and on demand: run the expectation suites on the
partition's sentences and the teacher's embeddings, and on a PCA run's targets when named. A
failure fails the task with every failing expectation and sample rows in the log.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from tasks.dag_defaults import DEFAULT_ARGS, DEFAULT_TEACHER


@dag(
    dag_id="hpd_quality_report",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "quality"],
    doc_md=__doc__,
    params={
        "store": Param(None, type=["null", "string"], description="store root URI (default: $HPD_STORE)"),
        "teacher": Param(DEFAULT_TEACHER, type=["null", "string"]),
        "pca_name": Param(None, type=["null", "string"]),
    },
)
def hpd_quality_report():
    @task
    def check_partition(**context) -> dict:
        from tasks import config, orchestration, quality

        p = context["params"]
        values = {"ingest_date": orchestration.partition_date(context), "teacher": p["teacher"],
                  "pca_name": p["pca_name"]}
        return quality.run(config.parse(quality.QualityParams, orchestration.with_store(values, p))).manifest["stats"]

    check_partition()


hpd_quality_report()
