"""Shared fixtures: an S3 endpoint (in-process moto server on 127.0.0.1), fresh buckets, store roots; each test
item keeps its phase reports (``item.rep_setup`` / ``rep_call``) for fixtures that act on an outcome. The suite's
order and its split over pytest-xdist workers (docs/contributing.md)."""

from __future__ import annotations

import gc
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.core import storage
from tasks.core.process_exit import end_without_final_collection
from tests.support import warm_cli
from tests.support.servers import s3_settings

_ISOLATED_ENV = (
    "HPD_AWS_CONN_ID",
    "HPD_S3_MAX_ATTEMPTS",
    "HPD_S3_MULTIPART_THRESHOLD",
    "HPD_S3_PART_SIZE",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_SESSION_TOKEN",
)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker and the processes it starts run OpenMP (torch, FAISS) on one thread: two
    workers share the two cores, and threads spinning for a core the other worker holds waste it. A test process
    ends, as ``hpd`` does, without collecting the garbage of the whole session (tasks/core/process_exit.py). The
    workers and every process the tests start (Airflow's tasks import the project afresh, ``hpd`` commands, the
    demo's Airflow) share the checkout's bytecode cache, whatever ``PYTHONDONTWRITEBYTECODE`` says: else each
    compiles the modules it imports (the tests' collection alone: 3.5 CPU-s a worker)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    end_without_final_collection()


# The longest modules, in the order pytest-xdist hands them out first (``--dist loadfile``): the live Airflow
# services, then the DAG chain on file:// and on S3 (a unit each), then `make airflow`'s services (SQLite, the
# LocalExecutor), the chaos test, the retrain decisions through Airflow and distillation's on the third. The rest
# fill in around them.
# Modules whose tests are units of work of their own, so that two workers share them: the chain on file:// and on S3.
SPLIT_BY_TEST = ("tests/dags/test_dag_runs.py",)
LONGEST_FIRST = (
    "tests/dags/test_airflow_services.py",
    "tests/dags/test_dag_runs.py",
    "tests/dags/test_local_airflow.py",
    "tests/test_chaos.py",
    "tests/dags/test_retrain_decisions.py",
    "tests/dags/test_task_failures.py",
    "tests/stages/test_distill.py",
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The libraries the tests load (torch, transformers, great-expectations, FAISS, botocore's data files: not
    Airflow, which reads its configuration at import) are imported now, and with what collection imported they are
    frozen out of the garbage collector's full collections: those live as long as the process, and the tests run
    many full collections (transformers' Trainer at each training, the benchmarks before each timed run)."""
    import tests.support.forked_warmup  # noqa: F401 - imported for what it loads

    gc.freeze()


def _module_path(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``LONGEST_FIRST`` first; tests that use the S3 endpoint are marked ``s3`` (``make check`` leaves them out)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module_path(item.nodeid), len(rank)))
    for item in items:
        if "s3_endpoint" in item.fixturenames:
            item.add_marker(pytest.mark.s3)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``-n N`` (``--dist load``) or ``--dist loadfile``: whole modules (tests that build on each other never
    split), in collection order, and each test of a ``SPLIT_BY_TEST`` module in one of its own."""
    if config.getvalue("dist") not in ("load", "loadfile"):
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False

    class SplitSomeModules(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = _module_path(nodeid)
            return nodeid if path in SPLIT_BY_TEST else path

    return SplitSomeModules(config, log)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _serialise_moto_writes() -> None:
    """Make moto's conditional PutObject atomic, as it is on S3.

    moto checks If-None-Match / If-Match and then stores the object without a lock, so two racing
    requests on its threaded server can both pass the check.  Real S3 (and MinIO) decide atomically.
    """
    from moto.s3.responses import S3Response

    original = S3Response.put_object
    lock = threading.Lock()

    def put_object(self: S3Response) -> object:
        with lock:
            return original(self)

    S3Response.put_object = put_object  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of an S3 endpoint: ``HPD_TEST_S3_ENDPOINT`` if set, else a moto server started here."""
    external = os.environ.get("HPD_TEST_S3_ENDPOINT")
    if external:
        yield external.rstrip("/")
        return
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            """No access-log line per request (errors are still logged)."""

    _serialise_moto_writes()
    # moto's S3 app itself, as moto's ThreadedMotoServer serves it, without the dispatcher that finds the service
    # of each request again (it lists moto's package folder per request): every request here is one to S3.
    server = make_server("127.0.0.1", 0, create_backend_app("s3"), threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="session")
def warm_hpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An ``hpd`` executable whose commands are processes forked from a zygote that loaded their libraries
    (tests/support/warm_cli.py): what the console script does, without seconds of imports per command."""
    with warm_cli.warm_hpd(tmp_path_factory.mktemp("warm-hpd")) as client:
        yield client


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> Iterator[str]:
    """Point boto3's default chain at ``s3_endpoint`` for one test; yields the endpoint URL."""
    for name in _ISOLATED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_settings(s3_endpoint, tmp_path_factory).items():
        monkeypatch.setenv(name, value)
    storage.reset_s3_clients()
    yield s3_endpoint
    storage.reset_s3_clients()


@pytest.fixture
def s3_bucket(s3_env: str) -> Iterator[str]:
    """A fresh, empty bucket; emptied and removed afterwards."""
    client = storage.s3_client()
    name = f"hpd-test-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    yield name
    for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
        client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=name, Key=obj["Key"])
    client.delete_bucket(Bucket=name)


@pytest.fixture(params=[pytest.param("file", id="file"), pytest.param("s3", id="s3", marks=pytest.mark.s3)])
def store_root(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty root URI on each backend: ``file://<tmp>`` and ``s3://<fresh bucket>/root``."""
    if request.param == "file":
        return storage.to_uri(str(tmp_path / "store"))
    return f"s3://{request.getfixturevalue('s3_bucket')}/root"
