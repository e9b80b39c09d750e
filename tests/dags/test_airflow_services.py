"""Live Airflow services as a deployment runs them (docker/compose.yaml, infra/helm): api-server on 127.0.0.1,
scheduler, dag-processor and triggerer, the CeleryExecutor with Redis and PostgreSQL (Debian's packages, on
127.0.0.1) and two Celery workers of concurrency 1, ``hpd-cpu`` on the default queue and ``hpd-gpu`` on the default
and GPU queues, with a local SMTP sink; operated as the platform team does: a 3-day backfill of hpd_ingest over 3
daily inputs (one arriving late, waited for by the deferred sensor; the teacher encodings mapped, in the encoding
pool), the events that run the quality report on each partition and a retrain on the new data (distill on the GPU
queue), whose promotion rebuilds the index, on the store the events name (the services' own default store stays
empty); a red run on a failed gate (on a copy of the store in S3) with exactly one alert; reports opened in Chromium
from their tasks on both stores (the report plugin in the API server); a retrain that finds no new data; a run that
survives a killed scheduler. The tests run in order and build on each other: after a failure the rest are skipped,
naming it.

Where each task ran: Airflow records ``[core] hostname_callable()`` as a task instance's hostname and the task
process's PID as its pid. On one machine both workers share the FQDN, so each worker here names itself through
``tests/support/worker_hostname.py``, and, independently, :class:`ProcessTree` traces every pid to the worker
process it descended from. The executors are mixed as infra/helm mixes them (``CeleryExecutor,LocalExecutor``, the
CeleryExecutor the default), with ``HPD_DISTILL_EXECUTOR=CeleryExecutor`` routing distill by its task-level
``executor=`` (recorded on its task instance; here it names the default executor, so the live run shows the route
works, not that it differs from the default: tests/dags/test_task_routing.py parses the DAGs under a
KubernetesExecutor default). ``make airflow``'s LocalExecutor runs live in tests/dags/test_local_airflow.py.
"""

import gzip
import json
import time
import uuid
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, unquote

import httpx
import pytest

from tasks.core import catalog, manifest, partitions, promoted, storage
from tasks.core.catalog import Stage
from tasks.ml import segments
from tests.support import chromium, store_state
from tests.support.celery_services import CeleryAirflowServices, missing_servers
from tests.support.paths import REPO as ROOT
from tests.support.process_libraries import TORCH, descendants, mapped
from tests.support.servers import s3_settings
from tests.support.smtp_sink import SmtpSink, body_text
from tests.support.tiny_models import build_sentence_model

MISSING = missing_servers()
pytestmark = [
    pytest.mark.services,
    pytest.mark.celery,
    pytest.mark.models,
    pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} (make venv installs them)"),
]

DAYS = ("2026-11-01", "2026-11-02", "2026-11-03")
LATE_DAY = DAYS[-1]
# Each day's run maps two teacher encodings (the staged shard and the augmented one).
FAST = {"augment_methods": ["swap"], "augment_fraction": 1.0, "dtype": "fp32"}
CPU, GPU = "hpd-cpu", "hpd-gpu"
GPU_QUEUE, POOL = "gpu", "hpd_teacher_encode"


def _daily_inputs(raw) -> dict[str, list[str]]:
    """One TSV per day under ``raw/``, 20 different sentences each (the last written later, by the test)."""
    with gzip.open(ROOT / "data" / "corpus" / "sentences.tsv.gz", "rt") as f:
        header = next(f)
        lines = [next(f) for _ in range(len(DAYS) * 20)]
    raw.mkdir()
    inputs = {day: lines[i * 20 : (i + 1) * 20] for i, day in enumerate(DAYS)}
    for day in DAYS[:-1]:
        (raw / f"{day}.tsv").write_text(header + "".join(inputs[day]))
    inputs["header"] = [header]
    return inputs


@pytest.fixture(scope="module")
def sink():
    running = SmtpSink().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def s3_store(s3_endpoint, tmp_path_factory):
    """A store root in a bucket of the suite's S3 endpoint, with the AWS_* settings this process and the services
    share for the module."""
    settings = s3_settings(s3_endpoint, tmp_path_factory)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        storage.reset_s3_clients()
        bucket = f"hpd-services-{uuid.uuid4().hex[:12]}"
        storage.s3_client().create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/store", settings
    storage.reset_s3_clients()


@pytest.fixture(scope="module")
def services(tmp_path_factory, sink, s3_store):
    home = tmp_path_factory.mktemp("airflow-services")
    inputs = _daily_inputs(home / "raw")
    model = str(build_sentence_model(home / "tiny"))
    running = CeleryAirflowServices(
        home,
        {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor,LocalExecutor",
            "HPD_DISTILL_EXECUTOR": "CeleryExecutor",
            "HPD_GPU_QUEUE": GPU_QUEUE,
            "HPD_ENCODE_POOL": POOL,
            "HPD_ENCODE_POOL_SLOTS": "2",
            "HPD_STORE": storage.to_uri(str(home / "default-store")),  # must stay empty: runs name their store
            "HPD_REPORT_STORES": f"{storage.to_uri(str(home / 'store'))},{s3_store[0]}",  # those runs name
            **s3_store[1],
            "HPD_DEFAULT_SOURCE": str(home / "raw" / "{ingest_date}.tsv"),
            "HPD_DEFAULT_TEACHER": model,
            "HPD_DEFAULT_STUDENT": model,
            "HPD_DEFAULT_K": "8",
            # Tiny random models: the gate judges the plumbing, not them (a warm-started retrain's dev score may fall).
            "HPD_DEFAULT_MAX_REGRESSION": "1000",
            "HPD_DEFAULT_MAX_DEV_REGRESSION": "1000",
            "HPD_ALERT_EMAIL": "ml-oncall@example.com",
            "HPD_ALERT_FROM": "hpd-airflow@example.com",
            "AIRFLOW_CONN_SMTP_DEFAULT": sink.connection_uri(),
        },
        workers={CPU: "default", GPU: f"default,{GPU_QUEUE}"},
    )
    running.home, running.inputs = home, inputs
    running.store, running.s3_store = storage.to_uri(str(home / "store")), s3_store[0]
    running.default_store = home / "default-store"
    try:
        running.start()
        for dag_id in ("hpd_ingest", "hpd_quality_report", "hpd_index", "hpd_retrain"):
            running.wait_for_dag(dag_id)
            running.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        yield running
    finally:
        running.stop()


def _runs(services, dag_id: str) -> list[dict]:
    return sorted(services.request("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"], key=lambda r: r["run_after"])


def _queued_events(services, dag_id: str) -> int:
    """Asset events the scheduler holds for ``dag_id`` and has not yet made a run of."""
    return services.request("GET", f"/api/v2/dags/{dag_id}/assets/queuedEvents")["total_entries"]


def _wait_for_runs(services, dag_id: str, count: int, timeout: float, settle_s: float = 10) -> list[dict]:
    """The DAG's runs once at least ``count`` exist, all of them finished, no asset event is queued for another
    and no new one came for ``settle_s``."""
    deadline, seen, since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        runs = _runs(services, dag_id)
        if len(runs) != seen:
            seen, since = len(runs), time.monotonic()
        finished = all(r["state"] in ("success", "failed") for r in runs)
        settled = time.monotonic() - since >= settle_s and not _queued_events(services, dag_id)
        if len(runs) >= count and finished and settled:
            return runs
        services.check_alive()
        time.sleep(2)
    raise services.failure(f"{dag_id}: {[(r['dag_run_id'], r['state']) for r in _runs(services, dag_id)]}")


@pytest.fixture(autouse=True)
def _after_a_failure_skip_the_rest(request):
    """The tests build on each other: once one has failed, the later ones would only wait out their timeouts."""
    failed = getattr(request.module, "_first_failure", None)
    if failed:
        pytest.skip(f"builds on {failed}, which failed")
    yield
    report = getattr(request.node, "rep_call", None)
    if report is None or report.failed:
        request.module._first_failure = request.node.name


def _trigger(services, dag_id: str, conf: dict) -> str:
    body = {"logical_date": None, "conf": {"store": services.store, **conf}}
    return services.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"]


def _promoted(store: str) -> catalog.ModelPointer | None:
    return catalog.read_pointer(store, catalog.Pointer.MODEL)[0]


def _learned(store: str) -> set[str]:
    """The days the promoted student has learned from."""
    model = promoted.model(store)
    return set() if model is None else {day.isoformat() for day in model.learned.partitions}


def _checksums_agree(store):
    for stage in (Stage.STAGE_CORPUS, Stage.AUGMENT, Stage.ENCODE_TEACHER):
        for key in manifest.list_keys(store, stage):
            for output in manifest.read(store, stage, key).outputs:
                assert manifest.sha256_hex(storage.read_bytes(output.uri)) == output.sha256, output.uri


def test_three_day_backfill_over_three_daily_inputs(services):
    services.request(
        "POST",
        "/api/v2/backfills",
        {
            "dag_id": "hpd_ingest",
            "from_date": f"{DAYS[0]}T00:00:00Z",
            "to_date": f"{DAYS[-1]}T00:00:00Z",
            "max_active_runs": 3,
            "reprocess_behavior": "none",
            "run_backwards": False,
            "dag_run_conf": {"store": services.store, **FAST},
        },
    )
    late_run = _backfill_run(LATE_DAY)
    services.wait_for_task_state("hpd_ingest", late_run, "wait_for_source", "deferred", timeout=300)
    for day in DAYS[:-1]:
        assert services.wait_for_run("hpd_ingest", _backfill_run(day), timeout=400) == "success"
    # The late day's encodings take the encoding pool's one slot in turn (days 1 and 2 ran with 2).
    body = {"pool": POOL, "slots": 1, "include_deferred": False}
    services.request("PATCH", f"/api/v2/pools/{POOL}?update_mask=slots", body)
    late = services.home / "raw" / f"{LATE_DAY}.tsv"  # lands while its sensor waits in the triggerer
    late.write_text("".join(services.inputs["header"] + services.inputs[LATE_DAY]))
    assert services.wait_for_run("hpd_ingest", late_run, timeout=400) == "success"
    assert services.task_states("hpd_ingest", late_run)["wait_for_source"] == "success"
    texts = {}
    for day in DAYS:
        staged = manifest.read(services.store, Stage.STAGE_CORPUS, f"ingest_date={day}")
        assert staged.stats["rows_written"] == 20 and staged.inputs[0].uri.endswith(f"/raw/{day}.tsv")
        texts[day] = {r["text"] for o in staged.outputs for r in storage.read_parquet(o.uri).to_pylist()}
    assert len(set().union(*texts.values())) == 60  # three partitions, three different contents
    _checksums_agree(services.store)


def _backfill_run(day: str) -> str:
    return f"backfill__{day}T00:00:00+00:00"


def _tasks(services, dag_id: str, run_id: str, task_id: str | None = None) -> list[dict]:
    """The run's task instances (``task_id``'s only, when given), by map index."""
    found = services.task_instances(dag_id, run_id)
    return sorted((t for t in found if task_id in (None, t["task_id"])), key=lambda t: t["map_index"])


def _at(ti: dict, key: str) -> float:
    return datetime.fromisoformat(ti[key]).timestamp()


def _where(services, ti: dict) -> str:
    """The worker that ran ``ti``: its recorded hostname, which must agree with the process tree."""
    traced = services.tree.owner(ti["pid"], _at(ti, "end_date"))
    assert traced == ti["hostname"], (ti["task_id"], ti["hostname"], ti["pid"], traced)
    return ti["hostname"]


def _most_at_once(tis: list[dict]) -> int:
    """The most of ``tis`` queued or running at once (each from its ``queued_when`` to its ``end_date``)."""
    return max(sum(_at(u, "queued_when") <= _at(t, "queued_when") < _at(u, "end_date") for u in tis) for t in tis)


def test_the_encodings_ran_mapped_on_the_workers_within_the_pool(services):
    """Each day's two teacher encodings ran on the Celery workers, in the encoding pool. With its 2 slots (days 1
    and 2, their runs at the same time), two were queued at once and never three; with 1 slot (the late day), its
    second was queued only once its first had ended."""
    encodes = {day: _tasks(services, "hpd_ingest", _backfill_run(day), "encode") for day in DAYS}
    every = [t for day in DAYS for t in encodes[day]]
    assert [len(encodes[day]) for day in DAYS] == [2, 2, 2] and {t["state"] for t in every} == {"success"}
    assert all(t["queue"] == "default" and t["pool"] == POOL and t["pool_slots"] == 1 for t in every)
    assert {_where(services, t) for t in every} <= {CPU, GPU}
    assert _most_at_once(encodes[DAYS[0]] + encodes[DAYS[1]]) == 2
    earlier, later = sorted(encodes[LATE_DAY], key=lambda t: _at(t, "queued_when"))
    assert _at(later, "queued_when") >= _at(earlier, "end_date")


def test_each_worker_forks_its_tasks_with_their_libraries_loaded(services):
    """The project's Celery configuration (the deployments'): a worker imports the tasks' libraries before it forks
    its pool, so its processes hold torch while no task runs."""
    for name in (CPU, GPU):
        root = services.processes[f"worker-{name}"].pid
        assert [pid for pid in (root, *descendants(root)) if mapped(pid, TORCH)], name


def test_each_partition_event_runs_the_quality_report_on_exactly_that_partition(services):
    runs = _wait_for_runs(services, "hpd_quality_report", len(DAYS), timeout=300)
    assert sorted(r["partition_key"] for r in runs) == list(DAYS)
    assert {r["run_type"] for r in runs} == {"asset_triggered"} and {r["state"] for r in runs} == {"success"}
    for day in DAYS:
        assert manifest.read(services.store, Stage.QUALITY, f"ingest_date={day}") is not None
    assert not any(services.default_store.rglob("*.json"))


def test_new_data_retrains_and_the_promotion_rebuilds_the_index_on_the_events_store(services):
    """Each ingest event queues a retrain (one at a time; events arriving meanwhile make one more run), whose
    policy decides whether the new partitions are worth training on: every run ends green, the first trains (a later
    one may too, when the partitions that came meanwhile are worth it).
    The index takes every partition with the promoted student, retrained on or not."""
    retrains = _wait_for_runs(services, "hpd_retrain", 1, timeout=600)
    assert {r["run_type"] for r in retrains} == {"asset_triggered"}
    assert {r["state"] for r in retrains} == {"success"}, retrains
    model = _promoted(services.store)
    assert model is not None
    trained = {d.isoformat() for d in partitions.trained_partitions(services.store, model.model_run)}
    assert trained and trained <= set(DAYS)

    index_runs = _wait_for_runs(services, "hpd_index", 1, timeout=300)
    assert {(r["run_type"], r["state"]) for r in index_runs} == {("asset_triggered", "success")}
    index = catalog.read_pointer(services.store, catalog.Pointer.INDEX)[0]
    assert index is not None and index.model_run == model.model_run
    _, listed = segments.read_table(services.store, index.index)
    assert {day for segment in listed for day in segment.partitions} == set(DAYS)
    assert not any(services.default_store.rglob("*.json"))
    trained_runs = [r["dag_run_id"] for r in retrains]
    trained = next(r for r in trained_runs if services.task_states("hpd_retrain", r)["validate"] == "success")
    services.reports = {"file": {"store": services.store, "hpd_retrain": trained}}


def test_distill_ran_on_the_gpu_queue_worker(services):
    """The retrain that trained routed distill to the GPU queue, through its task-level executor."""
    (distill,) = _tasks(services, "hpd_retrain", services.reports["file"]["hpd_retrain"], "distill")
    assert distill["state"] == "success"
    assert distill["queue"] == GPU_QUEUE and distill["executor"] == "CeleryExecutor"
    assert _where(services, distill) == GPU


def test_a_failed_gate_is_a_red_run_with_one_alert_and_no_promotion(services, sink):
    """On a copy of the store in S3 (a copied store stays valid)."""
    assert sink.messages == []  # nothing failed so far
    store_state.copy_into(Path(services.store.removeprefix("file://")), services.s3_store)
    before = _promoted(services.s3_store)
    conf = {"partitions": list(DAYS), "max_steps": 2, "batch_size": 16, "amp": "off", "min_stsb": 99.0}
    conf["warm_start"] = False  # a warm start may export its start unchanged, which is not validated: no gate
    run_id = _trigger(services, "hpd_retrain", {**conf, "store": services.s3_store})
    assert services.wait_for_run("hpd_retrain", run_id, timeout=600) == "failed"
    states = services.task_states("hpd_retrain", run_id)
    assert states["validate"] == "failed" and states["announce_promotion"] == "upstream_failed"
    assert _promoted(services.s3_store) == before

    deadline = time.monotonic() + 30
    while not sink.messages and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)  # a second message would have arrived by now
    (alert,) = sink.messages
    assert alert["To"] == "ml-oncall@example.com" and alert["From"] == "hpd-airflow@example.com"
    assert "hpd_retrain.validate failed" in alert["Subject"] and run_id in alert["Subject"]
    body = body_text(alert)
    assert "failed on try 1." in body  # a failed gate is not retried
    assert "quality gate failed" in body and "STS-B test" in body and "below the minimum 99.00" in body
    assert "Nothing was promoted" in body and "/validation/" in body and "report.html" in body
    services.reports["s3"] = {"store": services.s3_store, "hpd_retrain": run_id}


# The task whose buttons open each report object, by the name the object's address ends with.
BUTTONS = {
    "report.html": ("hpd_retrain", "validate"),
    "model_card.md": ("hpd_retrain", "validate"),
    "index.html": ("hpd_quality_report", "check_partition"),
}


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_reports_open_from_their_tasks_in_the_grid(services, backend, tmp_path):
    """The tasks opened in the grid (file://: the green retrain; S3: the red one) and a quality report run then on
    that store: the validate task's Validation report button leads to the report the API server serves (the report
    plugin, from the run's store, one of HPD_REPORT_STORES) with its title and plots, its Model card button to the
    card, and the quality check's Data Docs button to the Data Docs (the partition's latest). Without the login
    they are refused."""
    runs, links = services.reports[backend], {}
    body = {"logical_date": None, "partition_key": DAYS[0], "conf": {"store": runs["store"]}}
    runs["hpd_quality_report"] = services.request("POST", "/api/v2/dags/hpd_quality_report/dagRuns", body)["dag_run_id"]
    assert services.wait_for_run("hpd_quality_report", runs["hpd_quality_report"], timeout=300) == "success"
    visit = chromium.Visit(offline=False, cookies={"_token": services.token})
    buttons = replace(visit, until="document.querySelector('a[href*=\"/hpd/reports/\"]')")  # fetched after the page
    with chromium.Browser(tmp_path / "profile") as browser:
        for dag_id, task in sorted(set(BUTTONS.values())):
            details = f"{services.url}/dags/{dag_id}/runs/{runs[dag_id]}/tasks/{task}/details"  # its extra links
            page = browser.load(details, timeout=120, visit=buttons)
            links |= {unquote(link).rsplit("/", 1)[1]: link for link in page.links if "/hpd/reports/" in link}
        assert set(links) == set(BUTTONS), links
        report = browser.load(links["report.html"], timeout=60, visit=visit)
        card = browser.load(links["model_card.md"], timeout=60, visit=visit)
        docs = browser.load(links["index.html"], timeout=60, visit=visit)
    assert not report.failed and report.title.startswith("Validation of ") and report.images >= 1
    assert card.title.startswith("Model card: ") and "STS-B test" in card.text
    assert not docs.failed and docs.title == "Data Docs created by Great Expectations" and "sentences" in docs.text
    assert {httpx.get(link).status_code for link in links.values()} <= {401, 403}


def test_a_retrain_without_new_data_distils_nothing(services):
    """Once the promoted student has learned every partition, a retrain plans and distils nothing. Should the
    asset-triggered retrains have left a partition unlearned (judged not worth it, until drift was flagged on it after
    they decided, or a warm-started one exported its start unchanged), a retrain forced over every day from the base
    model teaches it first."""
    if not set(DAYS) <= _learned(services.store):
        conf = {"partitions": list(DAYS), "max_steps": 2, "batch_size": 16, "amp": "off", "warm_start": False}
        assert services.wait_for_run("hpd_retrain", _trigger(services, "hpd_retrain", conf), timeout=600) == "success"
        assert set(DAYS) <= _learned(services.store)
    distilled_before = manifest.list_keys(services.store, Stage.DISTILL)
    run_id = _trigger(services, "hpd_retrain", {})
    assert services.wait_for_run("hpd_retrain", run_id, timeout=300) == "success"
    states = services.task_states("hpd_retrain", run_id)
    assert states["plan"] == "success"
    assert {states[t] for t in ("fit_pca", "distill", "validate", "announce_promotion")} == {"skipped"}
    assert manifest.list_keys(services.store, Stage.DISTILL) == distilled_before


def test_a_run_completes_after_the_scheduler_is_killed(services):
    day = "2026-11-05"
    (services.home / "raw" / f"{day}.tsv").write_text(
        "".join(services.inputs["header"] + services.inputs[DAYS[0]])  # a repeat of day 1: nothing new
    )
    run = services.request(
        "POST",
        "/api/v2/dags/hpd_ingest/dagRuns",
        {"logical_date": f"{day}T00:00:00Z", "conf": {"store": services.store, **FAST}},
    )
    deadline = time.monotonic() + 120
    while not any(t["state"] == "running" for t in services.task_instances("hpd_ingest", run["dag_run_id"])):
        if time.monotonic() > deadline:
            raise services.failure("no task started in 120 s", "hpd_ingest", run["dag_run_id"])
        time.sleep(0.5)
    services.kill("scheduler")
    services.start_one("scheduler", services.service_args()["scheduler"])
    assert services.wait_for_run("hpd_ingest", run["dag_run_id"], timeout=400) == "success"
    assert manifest.read(services.store, Stage.STAGE_CORPUS, f"ingest_date={day}").stats["rows_written"] == 0
    _checksums_agree(services.store)
    assert json.loads(storage.read_bytes(f"{services.store}/models/current.json"))["model_run"]


def test_every_task_ran_on_the_celery_workers(services):
    """Every task instance of the module's runs that ran (the late day's sensor too, before and after it deferred
    to the triggerer) ran on one of the two workers: never in the scheduler (the LocalExecutor) or elsewhere."""
    every, cursor = [], ""
    while cursor is not None:  # every DAG's runs' task instances (``~``), a page at a time (keyset pagination)
        page = services.request("GET", f"/api/v2/dags/~/dagRuns/~/taskInstances?limit=100&cursor={quote(cursor)}")
        every, cursor = every + page["task_instances"], page["next_cursor"]
    ran = [t for t in every if t["state"] in ("success", "failed")]
    tasks = {"stage", "augment", "plan_encoding", "encode", "fit_pca", "distill", "validate", "build_and_promote"}
    assert {t["task_id"] for t in ran} >= tasks
    assert {_where(services, t) for t in ran} == {CPU, GPU}
