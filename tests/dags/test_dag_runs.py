"""The DAGs run end to end with tiny models, against file:// and the S3 endpoint: ``dag.test()`` of
hpd_ingest, and the whole chain (ingest, retrain, index, quality report) as ``hpd demo`` runs it, through
``airflow dags test``."""

import gzip
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from tasks.core import catalog, manifest, sentences, storage
from tasks.core.catalog import Stage
from tests.support.paths import REPO as ROOT
from tests.support.paths import SUPPORT
from tests.support.tiny_models import build_sentence_model

HELPER = SUPPORT / "run_dag.py"
DAY = date(2026, 11, 3)


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
    }
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return env


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


def _dag_test(airflow_env, dag_id, conf, logical_date=f"{DAY}T00:00:00+00:00"):
    env = {**airflow_env, **{k: v for k, v in os.environ.items() if k.startswith(("AWS_", "HPD_"))}}
    done = subprocess.run(
        [sys.executable, str(HELPER), dag_id, logical_date, json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _ingest(airflow_env, inputs, store):
    _dag_test(
        airflow_env,
        "hpd_ingest",
        {
            "source": inputs["source"],
            "store": store,
            "teacher": inputs["teacher"],
            "dtype": "fp32",
            "augment_methods": ["swap"],
            "augment_fraction": 0.5,
            "shard_groups": 2,
        },
    )


def test_ingest_runs_end_to_end(airflow_env, inputs, store_root):
    _ingest(airflow_env, inputs, store_root)
    staged = manifest.read(store_root, Stage.STAGE_CORPUS, catalog.partition_key(DAY))
    assert staged.stats["rows_written"] == 60  # the partition comes from the data interval
    shards = sentences.shards(store_root, DAY)
    assert [uri.rsplit("/", 3)[-3] for uri in shards] == ["sentences", "sentences_aug"]
    encoded = manifest.list_keys(store_root, Stage.ENCODE_TEACHER)
    assert len(encoded) == len(shards)
    assert storage.exists(catalog.manifest_uri(store_root, Stage.AUGMENT, catalog.partition_key(DAY)))


def test_demo_chain_runs_every_dag_and_reruns_idempotently(inputs, store_root, tmp_path):
    """`hpd demo`'s chain (`airflow dags test` of ingest, retrain, index, quality report) with tiny models:
    a model is promoted and indexed, the outputs are where it says, and a rerun rewrites no manifest."""
    from tasks import demo
    from tasks.stages import build_index

    plan = demo.DemoPlan(
        store=store_root,
        airflow_home=tmp_path / "airflow",
        day=DAY,
        rows=60,
        k=8,
        teacher=inputs["teacher"],
        student=inputs["student"],
        teacher_dtype="fp32",
        amp="off",
        extra_conf={
            "hpd_ingest": {"augment_methods": ["swap"]},
            "hpd_retrain": {"max_steps": 3, "batch_size": 16, "max_regression": 1000.0},
        },
    )
    walls = demo.run_chain(plan, echo=lambda *a, **k: None)
    assert list(walls) == ["airflow db migrate", "hpd_ingest", "hpd_retrain", "hpd_index", "hpd_quality_report"]
    where = demo.locations(store_root)
    assert where["model run"] == "demo-student"
    assert all(storage.exists(where[key]) for key in ("validation report", "index"))
    assert storage.exists(storage.join(where["model (sentence-transformers folder)"], "modules.json"))
    assert build_index.search(store_root, "a sentence", 2)
    assert manifest.read(store_root, Stage.QUALITY, catalog.partition_key(DAY)).stats["passed"] is True

    def manifests() -> dict[str, bytes]:
        keys = [(stage, key) for stage in Stage for key in manifest.list_keys(store_root, stage)]
        return {f"{s}/{k}": storage.read_bytes(catalog.manifest_uri(store_root, s, k)) for s, k in keys}

    before = manifests()
    assert len(before) >= 8
    demo.run_chain(plan, echo=lambda *a, **k: None)
    assert manifests() == before
