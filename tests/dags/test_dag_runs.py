"""The DAGs run end to end with tiny models, against file:// and the S3 endpoint: the whole chain (ingest,
retrain, index, quality report) as ``hpd demo`` runs it, ``airflow dags test`` of each DAG in one process."""

import gzip
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest

from tasks import demo
from tasks.core import catalog, contracts, manifest, sentences, storage
from tasks.core.catalog import Stage
from tests.support.paths import REPO as ROOT
from tests.support.tiny_models import build_sentence_model

pytestmark = [pytest.mark.models, pytest.mark.dags]

DAY = date(2026, 11, 3)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ingest")
    with gzip.open(ROOT / "data" / "corpus" / "sentences.tsv.gz", "rt") as f:
        lines = [next(f).rstrip("\n") for _ in range(61)]
    (root / "raw.tsv").write_text("\n".join(lines))
    return {
        "source": str(root / "raw.tsv"),
        "teacher": str(build_sentence_model(root / "teacher")),
        "student": str(build_sentence_model(root / "student", seed=5)),
    }


def test_demo_chain_runs_every_dag_reports_lineage_and_reruns_idempotently(inputs, store_root, tmp_path, monkeypatch):
    """`hpd demo`'s chain (`airflow dags test` of ingest, retrain, index, quality report) with tiny models (the
    teacher a composite of two, as the default teacher is), its OpenLineage events written to a file (the
    provider's file transport): a model is promoted and indexed, the outputs are where it says, the events link
    the chain, and on file:// the chain run again in the same process rewrites no manifest. On S3 each stage's
    rerun skips in tests/stages/test_copied_store.py, test_augment.py and test_quality.py: the chain's conf maps to
    the same params on either backend, so one rerun through Airflow checks that mapping."""
    from tasks.ml import vector_index

    events = tmp_path / "openlineage.jsonl"
    transport = {"type": "file", "log_file_path": str(events), "append": True}
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps(transport))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "hpd-test")
    on_file = store_root.startswith("file://")
    plan = (_ChainTwice if on_file else demo.DemoPlan)(
        store=store_root,
        airflow_home=tmp_path / "airflow",
        day=DAY,
        rows=60,
        k=8,
        teacher=f"{inputs['teacher']}+{inputs['student']}",  # a composite teacher, as the default one is
        student=inputs["student"],
        teacher_dtype="fp32",
        amp="off",
        extra_conf={
            "hpd_ingest": {"augment_methods": ["swap"]},
            "hpd_retrain": {"max_steps": 3, "batch_size": 16, "max_regression": 1000.0},
        },
    )
    chain = ["hpd_ingest", "hpd_retrain", "hpd_index", "hpd_quality_report"]
    rerun = _Rerun(store_root)
    walls = plan.run_chain(echo=rerun.echo)
    again = [f"{AGAIN}{dag_id}" for dag_id in chain] if on_file else []
    assert list(walls) == ["airflow db migrate", *chain, *again]
    assert [line for line in rerun.echoed if line.endswith(" ...")] == [
        "airflow db migrate ...",
        *(f"airflow dags test {dag_id} {DAY} ..." for dag_id in chain * (2 if on_file else 1)),
    ]
    _assert_the_partition_was_ingested(store_root, plan.teacher)
    where = demo.locations(store_root)
    assert where["model run"] == "demo-student"
    assert all(storage.exists(where[key]) for key in ("validation report", "index"))
    assert _validate_xcoms(plan.airflow_home)["validation_report"] == where["validation report"]  # its link's URL
    assert storage.exists(storage.join(where["model (sentence-transformers folder)"], "modules.json"))
    assert vector_index.search(store_root, "a sentence", 2)
    assert manifest.read(store_root, Stage.QUALITY, catalog.partition_key(DAY)).stats["passed"] is True
    drifted = manifest.read(store_root, Stage.DRIFT, catalog.partition_key(DAY)).stats  # its own training data
    assert drifted["model_run"] == "demo-student" and drifted["score"] == 0.0 and not drifted["flagged"]
    _assert_the_events_link_the_chain(_completed(events), store_root)
    _assert_the_datasets_carry_their_contracts(events, store_root)

    if on_file:
        assert len(rerun.before) >= 8 and _manifests(store_root) == rerun.before  # the second chain rewrote none


def _validate_xcoms(airflow_home) -> dict[str, object]:
    """The XComs of ``hpd_retrain``'s validate task in its last run, by key (from the demo's metadata database)."""
    import sqlite3

    with sqlite3.connect(airflow_home / "airflow.db") as db:
        rows = db.execute(
            "SELECT key, value FROM xcom WHERE dag_id = 'hpd_retrain' AND task_id = 'validate' "
            "AND run_id = (SELECT run_id FROM dag_run WHERE dag_id = 'hpd_retrain' ORDER BY id DESC LIMIT 1)"
        ).fetchall()
    return {key: json.loads(value) for key, value in rows}


AGAIN = "again: "


@dataclass(frozen=True)
class _ChainTwice(demo.DemoPlan):
    """The demo's chain, then the same chain again, in its one Airflow process (``run_chain`` as the demo runs it)."""

    def commands(self) -> dict[str, list[str]]:
        once = super().commands()
        return {**once, **{f"{AGAIN}{label}": argv for label, argv in once.items() if label != "airflow db migrate"}}


class _Rerun:
    """An echo of the chain's output that keeps its lines and, as the second chain starts (its first step line),
    each manifest's bytes and file identity (inode, modification time): what a rerun must leave as it is. A rerun's
    first write could only follow its ingest's first tasks, seconds after that line."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.echoed: list[str] = []
        self.before: dict[str, tuple[bytes, int, int]] = {}

    def echo(self, line: str, **_: object) -> None:
        if line.startswith("airflow dags test hpd_ingest ") and any(
            seen.startswith("airflow dags test hpd_quality_report ") for seen in self.echoed
        ):
            self.before = _manifests(self.store)
        self.echoed.append(line)


def _manifests(store: str) -> dict[str, tuple[bytes, int, int]]:
    """Each manifest of ``store`` (a folder): its bytes, inode and modification time (ns), by stage and key."""
    found = {}
    for stage in Stage:
        for key in manifest.list_keys(store, stage):
            path = Path(catalog.manifest_uri(store, stage, key).removeprefix("file://"))
            stat = path.stat()
            found[f"{stage}/{key}"] = (path.read_bytes(), stat.st_ino, stat.st_mtime_ns)
    return found


def _assert_the_partition_was_ingested(store_root: str, teacher: str) -> None:
    """hpd_ingest staged the partition of its data interval, augmented it, and encoded each of its shards."""
    from tasks.stages import encode_teacher

    staged = manifest.read(store_root, Stage.STAGE_CORPUS, catalog.partition_key(DAY))
    assert staged.stats["rows_written"] == 60
    shards = sentences.shards(store_root, DAY)
    assert [uri.rsplit("/", 3)[-3] for uri in shards] == ["sentences", "sentences_aug"]
    encoded = encode_teacher.encoded(store_root, teacher, DAY)
    assert [shard.uri for shard, _ in encoded] == shards and all(published for _, published in encoded)
    assert storage.exists(catalog.manifest_uri(store_root, Stage.AUGMENT, catalog.partition_key(DAY)))


def _completed(events) -> dict[str, tuple[set[str], set[str]]]:
    """Each task's input and output dataset names (namespace/name: the object URIs) in its COMPLETE events (of
    every instance of a mapped task together)."""
    lineage: dict[str, tuple[set[str], set[str]]] = {}
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event["eventType"] == "COMPLETE" and "." in event["job"]["name"]:
            inputs, outputs = lineage.setdefault(event["job"]["name"], (set(), set()))
            inputs.update(f"{d['namespace']}/{d['name']}" for d in event.get("inputs", []))
            outputs.update(f"{d['namespace']}/{d['name']}" for d in event.get("outputs", []))
    return lineage


def _assert_the_events_link_the_chain(lineage: dict[str, tuple[set[str], set[str]]], store_root: str) -> None:
    """Each stage task's event names exactly what its manifest lists (read, written) and the manifest itself, so
    one task's outputs are the next one's inputs down the chain (corpus -> teacher embeddings -> targets ->
    student -> index); the manifests record the Airflow task instance that wrote them."""
    day = catalog.partition_key(DAY)
    chain = [
        ("hpd_ingest.stage", Stage.STAGE_CORPUS, day),
        ("hpd_retrain.fit_pca", Stage.FIT_PCA, None),
        ("hpd_retrain.distill", Stage.DISTILL, "demo-student"),
        ("hpd_index.build_and_promote", Stage.BUILD_INDEX, None),
    ]
    for job, stage, key in chain:
        key = key or manifest.list_keys(store_root, stage)[0]
        published = manifest.read(store_root, stage, key)
        written = [o.uri for o in published.outputs] + [catalog.manifest_uri(store_root, stage, key)]
        written += [published.version_uri(store_root)] if stage in catalog.VERSIONED else []
        names = ({_dataset(i.uri) for i in published.inputs}, {_dataset(uri) for uri in written})
        assert lineage[job] == names, job
        assert published.document["orchestration"]["task_id"] == job.split(".", 1)[1]
        assert published.document["orchestration"]["dag_id"] == job.split(".", 1)[0]
    sentences_read, encoded = lineage["hpd_ingest.encode"]
    staged = manifest.read(store_root, Stage.STAGE_CORPUS, day).outputs
    assert {_dataset(o.uri) for o in staged} <= sentences_read  # staged shards -> teacher encoding
    assert encoded and encoded <= lineage["hpd_retrain.fit_pca"][0]  # teacher embeddings -> PCA
    assert lineage["hpd_retrain.fit_pca"][1] & lineage["hpd_retrain.distill"][0]  # targets -> student
    assert lineage["hpd_retrain.distill"][1] & lineage["hpd_index.build_and_promote"][0]  # student -> index


def _assert_the_datasets_carry_their_contracts(events, store_root: str) -> None:
    """Every published dataset shard is named in a COMPLETE event, and wherever it is (read or written) its schema
    facet lists its contract's columns (an embedding as a fixed-size list of its value types); other objects
    (manifests, models, indexes) have none. The catalog tells each shard's contract from its URI."""
    schemas: dict[str, list[list[tuple[str, str]]]] = {}
    for line in events.read_text().splitlines():
        event = json.loads(line)
        for dataset in event.get("inputs", []) + event.get("outputs", []) if event["eventType"] == "COMPLETE" else []:
            fields = dataset.get("facets", {}).get("schema", {}).get("fields") or []
            schemas.setdefault(f"{dataset['namespace']}/{dataset['name']}", []).append(
                [(f["name"], f["type"]) for f in fields]
            )
    shards = {}
    for stage in Stage:
        for key in manifest.list_keys(store_root, stage):
            for output in manifest.read(store_root, stage, key).outputs:
                assert catalog.dataset_at(store_root, output.uri) == output.contract, output.uri
                if output.contract:
                    shards[_dataset(output.uri)] = output.contract
    teacher = [("sentence_id", "string"), ("embedding", "fixed_size_list<float32|float16>")]
    assert {"sentences", "teacher_embeddings", "projected_targets", "index_ids"} <= set(shards.values())
    for name, contract in shards.items():
        columns = [f.name for f in contracts.load(contract).fields]
        assert schemas[name] and all([c for c, _ in seen] == columns for seen in schemas[name]), name
        assert contract != "teacher_embeddings" or all(seen == teacher for seen in schemas[name])
    assert all(seen == [] for name in set(schemas) - set(shards) for seen in schemas[name])


def _dataset(uri: str) -> str:
    """An object URI as OpenLineage names it (namespace/name): ``file`` + path, or ``s3://bucket`` + key."""
    scheme, rest = uri.split("://", 1)
    if scheme == "file":
        return f"file/{rest}"
    bucket, key = rest.split("/", 1)
    return f"s3://{bucket}/{key}"
