"""``make airflow`` as a user runs it: ``python -m tasks.orchestration.local_airflow`` (what the target runs, on a
free port, SQLite in its home) prints a URL and a login that work; ``hpd_ingest`` triggered through the REST API
with params runs green and honours them; a backfill over two dates created through the REST API runs both; the
DAG's grid page renders in headless Chromium with those runs; Ctrl-C stops every service it started."""

import gzip
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from tasks.core import manifest, storage
from tasks.core.catalog import Stage
from tasks.orchestration.local_airflow import AirflowFailed, LocalAirflow
from tests.support import chromium
from tests.support.airflow_services import POLL_S
from tests.support.paths import REPO as ROOT
from tests.support.servers import free_port
from tests.support.tiny_models import build_sentence_model

pytestmark = [
    pytest.mark.services,
    pytest.mark.models,
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="no Chromium (make test-tools installs it)"),
]

TRIGGERED, BACKFILLED = "2026-11-10", ("2026-11-11", "2026-11-12")
FAST = {"augment_methods": ["swap"], "dtype": "fp32", "shard_groups": 1}
UP = "Ctrl-C stops it."
LOGIN = r"Airflow is up: (http://127\.0\.0\.1:\d+)\n  login: (\S+) / (\S+)\n"


class Running:
    """The ``make airflow`` process, what it printed, and a REST client logged in with the printed login."""

    def __init__(self, home: Path, store: str, process: subprocess.Popen, output: Path) -> None:
        self.home, self.store, self.process, self.output = home, store, process, output
        self.client: LocalAirflow | None = None
        self.run_ids: list[str] = []

    def printed(self) -> str:
        return self.output.read_text()

    def log_in(self) -> LocalAirflow:
        """A REST client for the printed URL, logged in with the printed user and password."""
        url, user, password = re.search(LOGIN, self.printed()).groups()
        client = LocalAirflow(self.home / "airflow", int(url.rsplit(":", 1)[1]))  # the client only: not started
        body = {"username": user, "password": password}
        client.token = client.request("POST", "/auth/token", body, auth=False)["access_token"]
        return client

    def wait_up(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while UP not in self.printed():
            if self.process.poll() is not None or time.monotonic() > deadline:
                logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in self.home.glob("airflow/*.log"))
                raise AssertionError(f"make airflow did not come up:\n{self.printed()}{logs}")
            time.sleep(0.5)

    def service_pids(self) -> list[int]:
        """The processes ``make airflow`` started (its children)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        return [int(pid) for pid in children.split()]

    def wait_for_run(self, run_id: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.client.request("GET", f"/api/v2/dags/hpd_ingest/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            self.client.check_alive()
            time.sleep(POLL_S)
        raise AssertionError(f"hpd_ingest {run_id} did not finish in {timeout} s")


def _sources(raw: Path) -> dict[str, Path]:
    """One TSV of 20 different sentences per day (the triggered run gets its own path through its params)."""
    with gzip.open(ROOT / "data" / "corpus" / "sentences.tsv.gz", "rt") as f:
        header = next(f)
        lines = [next(f) for _ in range(60)]
    raw.mkdir()
    paths = {}
    for i, day in enumerate((TRIGGERED, *BACKFILLED)):
        paths[day] = raw / (f"triggered-{day}.tsv" if day == TRIGGERED else f"{day}.tsv")
        paths[day].write_text(header + "".join(lines[i * 20 : (i + 1) * 20]))
    return paths


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    home = tmp_path_factory.mktemp("make-airflow")
    model, sources = str(build_sentence_model(home / "tiny")), _sources(home / "raw")
    store, port = storage.to_uri(str(home / "store")), free_port()
    env = {
        **os.environ,
        "HPD_STORE": store,
        "HPD_DEFAULT_SOURCE": str(home / "raw" / "{ingest_date}.tsv"),
        "HPD_DEFAULT_TEACHER": model,
        "HPD_DEFAULT_STUDENT": model,
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",  # only the runs the test makes
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",  # the DAG files do not change under a test
    }
    env.pop("HPD_AIRFLOW_PASSWORD", None)
    command = [sys.executable, "-m", "tasks.orchestration.local_airflow", "--home", str(home / "airflow")]
    output = home / "make-airflow.out"
    with open(output, "w") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port)], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    running = Running(home, store, process, output)
    running.sources = sources
    try:
        running.wait_up()
        running.client = running.log_in()
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)


def test_it_prints_the_url_and_a_login_that_works(airflow):
    client = airflow.client  # logged in with what it printed
    assert f"store: {airflow.store}\n" in airflow.printed()
    with pytest.raises(AirflowFailed, match="401"):
        client.request("GET", "/api/v2/dags/hpd_ingest", auth=False)
    dags = {d["dag_id"] for d in client.request("GET", "/api/v2/dags")["dags"]}
    assert {"hpd_ingest", "hpd_retrain", "hpd_index", "hpd_quality_report", "hpd_maintenance"} <= dags
    (pool,) = [p for p in client.request("GET", "/api/v2/pools")["pools"] if p["name"] == "hpd_teacher_encode"]
    assert pool["slots"] == 4  # created by make airflow: without it no encoding task would be scheduled


def test_a_run_triggered_with_params_and_a_two_date_backfill_through_the_rest_api(airflow):
    """Both made at once (the runs share the executor's two slots), then waited for."""
    client = airflow.client
    client.request("PATCH", "/api/v2/dags/hpd_ingest", {"is_paused": False})
    conf = {"source": str(airflow.sources[TRIGGERED]), "limit": 12, **FAST}
    body = {"logical_date": f"{TRIGGERED}T00:00:00Z", "conf": conf}
    run = client.request("POST", "/api/v2/dags/hpd_ingest/dagRuns", body)
    assert run["conf"] == conf and run["logical_date"].startswith(TRIGGERED)
    backfill = {
        "dag_id": "hpd_ingest",
        "from_date": f"{BACKFILLED[0]}T00:00:00Z",
        "to_date": f"{BACKFILLED[-1]}T00:00:00Z",
        "max_active_runs": 2,
        "reprocess_behavior": "none",
        "run_backwards": False,
        "dag_run_conf": FAST,  # the source: HPD_DEFAULT_SOURCE, one file per day
    }
    assert client.request("POST", "/api/v2/backfills", backfill)["dag_id"] == "hpd_ingest"
    airflow.run_ids = [run["dag_run_id"], *(f"backfill__{day}T00:00:00+00:00" for day in BACKFILLED)]
    assert [airflow.wait_for_run(run_id) for run_id in airflow.run_ids] == ["success"] * 3

    staged = manifest.read(airflow.store, Stage.STAGE_CORPUS, f"ingest_date={TRIGGERED}")
    assert staged.stats["rows_written"] == 12 and staged.inputs[0].uri.endswith("/triggered-2026-11-10.tsv")
    for day in BACKFILLED:
        staged = manifest.read(airflow.store, Stage.STAGE_CORPUS, f"ingest_date={day}")
        assert staged.stats["rows_written"] == 20 and staged.inputs[0].uri.endswith(f"/raw/{day}.tsv")
    encoded = manifest.list_keys(airflow.store, Stage.ENCODE_TEACHER)
    for day in (TRIGGERED, *BACKFILLED):
        assert any(f"={day}/" in key for key in encoded), f"{day} was not encoded with the teacher: {encoded}"


def test_the_grid_page_renders_the_runs_in_chromium(airflow, tmp_path):
    client = airflow.client
    shot = tmp_path / "grid.png"
    rendered = "document.body.innerText.includes('announce')"  # the grid's last task, listed after its own fetches
    visit = chromium.Visit(offline=False, cookies={"_token": client.token}, screenshot=shot, until=rendered)
    page = chromium.load(f"{client.url}/dags/hpd_ingest", tmp_path / "profile", timeout=120, visit=visit)
    assert not page.failed, page.failed
    assert {"wait_for_source", "stage", "augment", "encode", "announce"} <= set(re.findall(r"[a-z_]+", page.text))
    links = [unquote(link) for link in page.links]
    runs = {link.rsplit("/runs/", 1)[1].split("/")[0] for link in links if "/dags/hpd_ingest/runs/" in link}
    assert set(airflow.run_ids) <= runs, runs
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_ctrl_c_stops_every_service_it_started(airflow):
    services = airflow.service_pids()
    assert len(services) == 4
    airflow.process.send_signal(signal.SIGINT)
    assert airflow.process.wait(timeout=60) == 0
    assert airflow.printed().rstrip().endswith("stopped.")
    assert [pid for pid in services if Path(f"/proc/{pid}").exists()] == []
