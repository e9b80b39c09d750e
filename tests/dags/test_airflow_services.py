"""Live Airflow services (api-server on 127.0.0.1, scheduler, dag-processor; LocalExecutor, SQLite):
a 2-day backfill of hpd_ingest and a REST-triggered hpd_retrain, and a run that survives a killed scheduler."""

import gzip
import json
import time

import pytest

from tasks.core import manifest, storage
from tasks.core.catalog import Stage
from tests.support.airflow_services import AirflowServices
from tests.support.paths import REPO as ROOT
from tests.support.tiny_models import build_sentence_model


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow-services")
    with gzip.open(ROOT / "data" / "corpus" / "sentences.tsv.gz", "rt") as f:
        (home / "raw.tsv").write_text("".join(next(f) for _ in range(41)))
    model = str(build_sentence_model(home / "tiny"))
    store = storage.to_uri(str(home / "store"))
    running = AirflowServices(
        home,
        {
            "HPD_STORE": store,
            "HPD_DEFAULT_SOURCE": str(home / "raw.tsv"),
            "HPD_DEFAULT_TEACHER": model,
            "HPD_DEFAULT_STUDENT": model,
            "HPD_DEFAULT_K": "8",
        },
    )
    running.start()
    running.store = store
    try:
        for dag_id in ("hpd_ingest", "hpd_retrain"):
            running.wait_for_dag(dag_id)
            running.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        yield running
    finally:
        running.stop()


def _checksums_agree(store):
    for stage in (Stage.STAGE_CORPUS, Stage.AUGMENT, Stage.ENCODE_TEACHER):
        for key in manifest.list_keys(store, stage):
            for output in manifest.read(store, stage, key).outputs:
                assert manifest.sha256_hex(storage.read_bytes(output.uri)) == output.sha256, output.uri


def test_two_day_backfill_through_the_rest_api(services):
    conf = {"augment_methods": ["swap"], "dtype": "fp32"}
    services.request(
        "POST",
        "/api/v2/backfills",
        {
            "dag_id": "hpd_ingest",
            "from_date": "2026-11-01T00:00:00Z",
            "to_date": "2026-11-02T00:00:00Z",
            "max_active_runs": 2,
            "reprocess_behavior": "none",
            "run_backwards": False,
            "dag_run_conf": conf,
        },
    )
    days = ("2026-11-01", "2026-11-02")
    for day in days:
        assert services.wait_for_run("hpd_ingest", f"backfill__{day}T00:00:00+00:00", timeout=300) == "success"
    written = [
        manifest.read(services.store, Stage.STAGE_CORPUS, f"ingest_date={d}").stats["rows_written"] for d in days
    ]
    assert sum(written) == 40  # both days read the same file: each sentence is stored once
    _checksums_agree(services.store)


def test_retrain_triggered_through_the_rest_api(services):
    run = services.request(
        "POST",
        "/api/v2/dags/hpd_retrain/dagRuns",
        {
            "logical_date": None,
            "conf": {
                "partitions": ["2026-11-01", "2026-11-02"],
                "max_steps": 3,
                "batch_size": 16,
                "amp": "off",
                "max_regression": 1000.0,
            },
        },
    )
    assert services.wait_for_run("hpd_retrain", run["dag_run_id"], timeout=400) == "success"
    promoted = json.loads(storage.read_bytes(f"{services.store}/models/current.json"))
    assert manifest.read(services.store, Stage.DISTILL, promoted["model_run"]) is not None


def test_a_run_completes_after_the_scheduler_is_killed(services):
    run = services.request(
        "POST",
        "/api/v2/dags/hpd_ingest/dagRuns",
        {"logical_date": "2026-11-05T00:00:00Z", "conf": {"augment_methods": ["swap"], "dtype": "fp32"}},
    )
    path = f"/api/v2/dags/hpd_ingest/dagRuns/{run['dag_run_id']}/taskInstances"
    deadline = time.monotonic() + 120
    while not any(t["state"] == "running" for t in services.request("GET", path)["task_instances"]):
        assert time.monotonic() < deadline, "no task started"
        time.sleep(0.5)
    services.kill("scheduler")
    services.start_one("scheduler", ["scheduler", "--skip-serve-logs"])
    assert services.wait_for_run("hpd_ingest", run["dag_run_id"], timeout=400) == "success"
    assert manifest.read(services.store, Stage.STAGE_CORPUS, "ingest_date=2026-11-05").stats["rows_written"] == 0
    _checksums_agree(services.store)
