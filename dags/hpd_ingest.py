"""
### hpd_ingest — daily corpus partition: stage, augment, encode with the teacher

For the data interval's day `D`: stage the raw sentence files into `sentences/ingest_date=D`, augment
them (WordNet synonyms by default) and encode every sentences shard with the teacher, one mapped
task per group of shards. Every step is idempotent per partition (a rerun or backfill skips what its
manifests say is done), so `airflow backfill create --dag-id hpd_ingest --from-date ... --to-date ...`
is safe. The logic lives in `tasks/`; this file only wires it.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from tasks.dag_defaults import DEFAULT_ARGS, DEFAULT_SOURCE, DEFAULT_TEACHER


@dag(
    dag_id="hpd_ingest",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "ingest"],
    doc_md=__doc__,
    params={
        "source": Param(DEFAULT_SOURCE, type="string", description="raw file or prefix URI"),
        "column": Param("sentence", type="string", description="text field or column"),
        "limit": Param(None, type=["null", "integer"], minimum=1, description="stage at most this many records"),
        "store": Param(None, type=["null", "string"], description="store root URI (default: $HPD_STORE)"),
        "augment_methods": Param(["wordnet"], type="array", items={"enum": ["wordnet", "delete", "swap"]}),
        "augment_fraction": Param(0.25, type="number", exclusiveMinimum=0, maximum=1),
        "teacher": Param(DEFAULT_TEACHER, type="string", description="teacher model spec"),
        "dtype": Param("bf16", enum=["fp32", "bf16", "fp16"]),
        "shard_groups": Param(2, type="integer", minimum=1, description="mapped encode tasks"),
    },
)
def hpd_ingest():
    @task
    def stage(**context) -> str:
        from tasks import config, orchestration, stage_corpus

        params, day = context["params"], orchestration.partition_date(context)
        values = {"source": params["source"], "column": params["column"], "limit": params["limit"],
                  "ingest_date": day}
        stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, orchestration.with_store(values, params)))
        return day.isoformat()

    @task
    def augment(day: str, **context) -> str:
        from tasks import augment as augment_stage
        from tasks import config, orchestration

        params = context["params"]
        values = {"ingest_date": day, "methods": params["augment_methods"], "fraction": params["augment_fraction"]}
        augment_stage.run(config.parse(augment_stage.AugmentParams, orchestration.with_store(values, params)))
        return day

    @task
    def plan_encoding(day: str, **context) -> list[list[int]]:
        from tasks import orchestration

        return orchestration.shard_groups(context["params"], day)

    @task(max_active_tis_per_dagrun=4)
    def encode(shards: list[int], day: str, **context) -> dict:
        from tasks import config, encode_teacher, orchestration

        params = context["params"]
        values = {"ingest_date": day, "teacher": params["teacher"], "dtype": params["dtype"], "shards": shards}
        result = encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams,
                                                 orchestration.with_store(values, params)))
        return result.manifest["stats"]

    day = augment(stage())
    encode.partial(day=day).expand(shards=plan_encoding(day))


hpd_ingest()
