"""
### hpd_ingest — daily corpus partition: wait for its data, stage, augment, encode, announce

For the data interval's day `D`: wait (deferred, on the triggerer) until `source`, resolved for `D`
(`{ingest_date}` in it becomes the date), holds raw files, failing after `arrival_timeout_h`; stage them
into `sentences/ingest_date=D`; then, for the teacher's bounded sample of the partition (`teacher_sample`
rows, chosen from its content: what the PCA, retrains, drift and the quality checks read; the student indexes
every row in `hpd_index`), augment it (WordNet synonyms by default) and encode it with the teacher (one mapped
task per group of shards, in the teacher-encoding pool), then announce the
partition: a partitioned `hpd_corpus_partition` event (key `D`; schedules `hpd_quality_report` on it)
and an `hpd_corpus_updated` event (schedules `hpd_retrain`), both with the store, date, row counts and
staging manifest. Every step is idempotent per partition, so
`airflow backfill create --dag-id hpd_ingest --from-date ... --to-date ...` is safe. The logic lives in
`tasks/`; this file only wires it. Params come from the stages' own parameter models; where this DAG's
default differs, the param's description says why.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from tasks.orchestration.arrival import WaitForSource
from tasks.orchestration.assets import CORPUS_PARTITION, CORPUS_UPDATED
from tasks.orchestration.dag_params import DIALECT, stage_param
from tasks.orchestration.defaults import (
    DATA,
    DEFAULT_ARGS,
    DEFAULT_SOURCE,
    DEFAULT_TEACHER,
    DEPLOYMENT,
    ENCODE_POOL,
    STORE_PARAM,
)
from tasks.stages.params import AugmentParams, EncodeTeacherParams, StageCorpusParams

AUGMENT, ENCODE = "Augmentation", "Teacher encoding"


@dag(
    dag_id="hpd_ingest",
    dag_display_name="Ingest: a day's corpus partition",
    description="Wait for a day's raw data, stage, augment and encode it with the teacher, announce the partition",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    default_args=DEFAULT_ARGS,
    tags=["hpd", "ingest"],
    doc_md=__doc__,
    params={
        "source": stage_param(
            StageCorpusParams, "source", DEFAULT_SOURCE, DEPLOYMENT, title="Raw data source", section=DATA
        ),
        "arrival_timeout_h": Param(
            24.0,
            type="number",
            exclusiveMinimum=0,
            description="fail when no raw data arrives within this",
            title="Wait for the data (hours)",
            section=DATA,
            **DIALECT,
        ),
        "column": stage_param(
            StageCorpusParams,
            "column",
            "sentence",
            "the vendored corpus's text column",
            title="Text column",
            section=DATA,
        ),
        "limit": stage_param(StageCorpusParams, "limit", title="Most rows staged", section=DATA),
        "store": STORE_PARAM,
        "augment_methods": stage_param(AugmentParams, "methods", title="Augmentation methods", section=AUGMENT),
        "augment_fraction": stage_param(
            AugmentParams,
            "fraction",
            0.25,
            "a daily run augments a quarter of the new sentences",
            title="Share of sentences augmented",
            section=AUGMENT,
        ),
        "translate_forward": stage_param(
            AugmentParams, "translate_forward", title="Back-translation: forward model", section=AUGMENT
        ),
        "translate_backward": stage_param(
            AugmentParams, "translate_backward", title="Back-translation: backward model", section=AUGMENT
        ),
        "teacher": stage_param(
            EncodeTeacherParams, "teacher", DEFAULT_TEACHER, DEPLOYMENT, title="Teacher model(s)", section=ENCODE
        ),
        "teacher_sample": stage_param(
            EncodeTeacherParams, "teacher_sample", title="Teacher sample (rows per partition)", section=ENCODE
        ),
        "dtype": stage_param(EncodeTeacherParams, "dtype", title="Embedding dtype", section=ENCODE),
        "shard_groups": Param(
            2,
            type="integer",
            minimum=1,
            description="mapped encode tasks",
            title="Encode tasks",
            section=ENCODE,
            **DIALECT,
        ),
    },
)
def hpd_ingest():
    @task
    def stage(**context) -> str:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        runtime.run_stage(Stage.STAGE_CORPUS, runtime.staging_params(context))
        return runtime.partition_date(context).isoformat()

    @task
    def augment(day: str, **context) -> str:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = runtime.run_params(context)
        values = {"ingest_date": day, "methods": p["augment_methods"], "fraction": p["augment_fraction"]}
        values.update(runtime.pick(p, "translate_forward", "translate_backward", "teacher_sample"))
        runtime.run_stage(Stage.AUGMENT, runtime.stage_params(Stage.AUGMENT, values, p))
        return day

    @task
    def plan_encoding(day: str, **context) -> list[list[int]]:
        from tasks.orchestration import runtime

        return runtime.shard_groups(runtime.run_params(context), day)

    @task(max_active_tis_per_dagrun=4, pool=ENCODE_POOL)
    def encode(shards: list[int], day: str, **context) -> dict:
        from tasks.core.catalog import Stage
        from tasks.orchestration import runtime

        p = runtime.run_params(context)
        values = {**runtime.pick(p, "teacher", "dtype", "teacher_sample"), "ingest_date": day, "shards": shards}
        return runtime.run_stage(Stage.ENCODE_TEACHER, runtime.stage_params(Stage.ENCODE_TEACHER, values, p)).stats

    @task(outlets=[CORPUS_PARTITION, CORPUS_UPDATED])
    def announce(day: str, encoded: list[dict], **context) -> dict:
        from tasks.orchestration import runtime

        return runtime.announce_partition(context, day)

    staged = stage()
    WaitForSource(task_id="wait_for_source", poll_s=30) >> staged
    day = augment(staged)
    announce(day, encode.partial(day=day).expand(shards=plan_encoding(day)))


hpd_ingest()
