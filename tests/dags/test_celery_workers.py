"""The DAG chain on distributed workers: the CeleryExecutor with Redis and PostgreSQL (Debian's packages, on
127.0.0.1) and two Celery workers of concurrency 1, ``hpd-cpu`` on the default queue and ``hpd-gpu`` on the
default and GPU queues. Two hpd_ingest runs (their teacher encodings mapped, in the encoding pool) and an
hpd_retrain run over both partitions are triggered through the REST API; the task instances the API reports
(hostname, pid, queue, pool, executor, state, start and end) say where and how each task ran.

Where: Airflow records ``[core] hostname_callable()`` as a task instance's hostname and the task process's PID
as its pid. On one machine both workers share the FQDN, so each worker here names itself through
``tests/support/worker_hostname.py``, and, independently, :class:`ProcessTree` traces every pid to the worker
process it descended from.

The deployment mixes executors as infra/helm does (``CeleryExecutor,LocalExecutor`` here, the CeleryExecutor the
default), with ``HPD_DISTILL_EXECUTOR=CeleryExecutor`` routing distill by its task-level ``executor=`` (recorded
on its task instance; here it names the default executor, so the live run shows the route works, not that it
differs from the default: tests/dags/test_task_routing.py parses the DAGs under a KubernetesExecutor default).
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass, field
from datetime import datetime

import pytest

from tasks.core import manifest, storage
from tasks.core.catalog import Stage
from tests.support.celery_services import CeleryAirflowServices, missing_servers
from tests.support.paths import CORPUS
from tests.support.process_libraries import TORCH, descendants, mapped

MISSING = missing_servers()
pytestmark = [
    pytest.mark.celery,
    pytest.mark.services,
    pytest.mark.models,
    pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} (make venv installs them)"),
]

CPU, GPU = "hpd-cpu", "hpd-gpu"
GPU_QUEUE, POOL = "gpu", "hpd_teacher_encode"
DAYS = ("2026-11-01", "2026-11-02")
ROWS_PER_DAY = 30


@dataclass
class Chain:
    services: CeleryAirflowServices
    store: str
    runs: dict[str, str] = field(default_factory=dict)  # name -> dag_run_id
    tis: dict[str, list[dict]] = field(default_factory=dict)  # name -> task instances
    seconds: dict[str, float] = field(default_factory=dict)

    def workers_of(self, ti: dict) -> set[str]:
        return self.services.tree.owners(ti["pid"]) if ti["pid"] else set()


def _sources(home):
    with gzip.open(CORPUS, "rt") as f:
        header, lines = next(f), [next(f) for _ in range(ROWS_PER_DAY * len(DAYS))]
    paths = []
    for i, day in enumerate(DAYS):
        path = home / f"raw-{day}.tsv"
        path.write_text(header + "".join(lines[i * ROWS_PER_DAY : (i + 1) * ROWS_PER_DAY]))
        paths.append(str(path))
    return paths


def _run(chain: Chain, name: str, dag_id: str, body: dict, timeout: float) -> None:
    services, start = chain.services, time.monotonic()
    run_id = services.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"]
    chain.runs[name] = run_id
    state = services.wait_for_run(dag_id, run_id, timeout=timeout)
    chain.tis[name] = services.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    chain.seconds[name] = round(time.monotonic() - start, 1)
    assert state == "success", f"{name}: {state}; " + json.dumps(
        [(t["task_id"], t["map_index"], t["state"]) for t in chain.tis[name]]
    )


def _run_the_chain(chain: Chain, sources: list[str]) -> None:
    services = chain.services
    for dag_id in ("hpd_ingest", "hpd_retrain"):
        services.wait_for_dag(dag_id)
        services.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    ingest = {"augment_methods": ["swap"], "augment_fraction": 1.0, "dtype": "fp32"}
    # Day 1 with the pool's 2 slots, day 2 with 1: each run maps 2 encodings (the staged and the augmented shard).
    _run(
        chain,
        "ingest-1",
        "hpd_ingest",
        {"logical_date": f"{DAYS[0]}T00:00:00Z", "conf": {**ingest, "source": sources[0]}},
        300,
    )
    services.request(
        "PATCH", f"/api/v2/pools/{POOL}?update_mask=slots", {"pool": POOL, "slots": 1, "include_deferred": False}
    )
    _run(
        chain,
        "ingest-2",
        "hpd_ingest",
        {"logical_date": f"{DAYS[1]}T00:00:00Z", "conf": {**ingest, "source": sources[1]}},
        300,
    )
    retrain = {"partitions": list(DAYS), "max_steps": 3, "batch_size": 16, "amp": "off", "max_regression": 1000.0}
    _run(chain, "retrain", "hpd_retrain", {"logical_date": None, "conf": retrain}, 400)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    from tests.support.tiny_models import build_sentence_model

    home = tmp_path_factory.mktemp("airflow-celery")
    sources = _sources(home)
    model = str(build_sentence_model(home / "tiny"))
    store = storage.to_uri(str(home / "store"))
    services = CeleryAirflowServices(
        home,
        {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor,LocalExecutor",
            "HPD_DISTILL_EXECUTOR": "CeleryExecutor",
            "HPD_GPU_QUEUE": GPU_QUEUE,
            "HPD_ENCODE_POOL": POOL,
            "HPD_ENCODE_POOL_SLOTS": "2",
            "HPD_STORE": store,
            "HPD_DEFAULT_TEACHER": model,
            "HPD_DEFAULT_STUDENT": model,
            "HPD_DEFAULT_K": "8",
        },
        workers={CPU: "default", GPU: f"default,{GPU_QUEUE}"},
    )
    result, start = Chain(services, store), time.monotonic()
    try:
        services.start()
        result.seconds["start"] = round(time.monotonic() - start, 1)
        _run_the_chain(result, sources)
        result.seconds["total"] = round(time.monotonic() - start, 1)
        yield result
    finally:
        services.stop()


def _tasks(chain: Chain, run: str, task_id: str) -> list[dict]:
    return sorted((t for t in chain.tis[run] if t["task_id"] == task_id), key=lambda t: t["map_index"])


def _where(chain: Chain, ti: dict) -> str:
    """The worker that ran ``ti``: its recorded hostname, which must agree with the process tree."""
    assert chain.workers_of(ti) == {ti["hostname"]}, (ti["task_id"], ti["hostname"], ti["pid"], chain.workers_of(ti))
    return ti["hostname"]


def test_the_chain_ran_on_the_celery_workers(chain):
    ran = [t for run in chain.tis.values() for t in run if t["state"] == "success"]
    assert {t["task_id"] for t in ran} >= {
        "stage",
        "augment",
        "plan_encoding",
        "encode",
        "fit_pca",
        "distill",
        "validate",
    }
    assert {_where(chain, t) for t in ran} == {CPU, GPU}  # never the scheduler (LocalExecutor) or elsewhere
    print(f"\nCelery chain timings (s): {chain.seconds}")
    for run, tis in chain.tis.items():
        for t in sorted(tis, key=lambda t: t["start_date"] or "~"):
            where = f"{t['hostname']} pid {t['pid']} (process tree: {sorted(chain.workers_of(t))})"
            print(
                f"  {run} {t['task_id']}[{t['map_index']}] {t['state']} {t['duration'] or 0:.1f}s queue={t['queue']}"
                f" pool={t['pool']} executor={t['executor']} on {where}"
            )


def test_mapped_encodings_ran_on_the_workers_in_the_pool(chain):
    encodes = _tasks(chain, "ingest-1", "encode") + _tasks(chain, "ingest-2", "encode")
    assert len(encodes) == 4 and all(t["state"] == "success" for t in encodes)
    assert all(t["queue"] == "default" and t["pool"] == POOL and t["pool_slots"] == 1 for t in encodes)
    assert {_where(chain, t) for t in encodes} <= {CPU, GPU}
    print(
        "\nencode task instances: "
        + json.dumps([(t["map_index"], t["hostname"], t["pid"], t["queue"]) for t in encodes])
    )


def _at(ti: dict, key: str) -> datetime:
    return datetime.fromisoformat(ti[key])


def _overlap(a: dict, b: dict) -> bool:
    return _at(a, "start_date") < _at(b, "end_date") and _at(b, "start_date") < _at(a, "end_date")


def test_the_pool_bounds_concurrent_encodings(chain):
    """With the pool's 2 slots, day 1's two encodings were queued at once, neither waiting for the other (which
    worker takes each, and how soon, is Celery's); with 1 slot, day 2's second was queued only once the first had
    ended, though a worker was free, so they never ran at once."""
    first, second = _tasks(chain, "ingest-1", "encode"), _tasks(chain, "ingest-2", "encode")
    assert all(_at(a, "queued_when") < _at(b, "end_date") for a, b in (first, first[::-1]))
    earlier, later = sorted(second, key=lambda t: _at(t, "queued_when"))
    assert _at(later, "queued_when") >= _at(earlier, "end_date") and not _overlap(*second)


def test_distill_ran_on_the_gpu_queue_worker(chain):
    (distill,) = _tasks(chain, "retrain", "distill")
    assert distill["state"] == "success"
    assert distill["queue"] == GPU_QUEUE and distill["executor"] == "CeleryExecutor"
    assert _where(chain, distill) == GPU
    model_run = json.loads(storage.read_bytes(f"{chain.store}/models/current.json"))["model_run"]
    assert manifest.read(chain.store, Stage.DISTILL, model_run) is not None
    print(f"\ndistill: hostname={distill['hostname']} pid={distill['pid']} queue={distill['queue']}")


def test_each_worker_forks_its_tasks_with_their_libraries_loaded(chain):
    """The project's Celery configuration (the deployments'): a worker imports the tasks' libraries before it forks
    its pool, so its processes hold torch while no task runs."""
    for name in (CPU, GPU):
        root = chain.services.processes[f"worker-{name}"].pid
        assert [pid for pid in (root, *descendants(root)) if mapped(pid, TORCH)], name
