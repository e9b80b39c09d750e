"""``hpd serve`` on a tiny store (tiny student, k=8, 300 sentences): single and batched queries, bounds,
health, a refused pointer, ``hpd search`` through the running service, and a promotion while clients
hammer it (no failed request; the new index answers after the next poll)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from tasks import cli
from tasks.core import catalog, config, storage
from tasks.core.catalog import IndexPointer, Pointer
from tasks.serve import app as serve_app
from tasks.serve.holder import IndexHolder, describe
from tasks.stages import build_index
from tests.support.projected_store import distill_tiny, projected_store
from tests.support.servers import serving

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)
TEXTS = [
    f"sentence {i} about {topic} and {i % 13}"
    for i, topic in enumerate(["cats", "markets", "rain", "music", "football", "trains"] * 50)
]
POLL_S = 0.2


def _build(store: str, name: str, promote: bool = True):
    values = {"store": store, "model_run": "tiny", "index_type": "flat", "name": name, "promote": promote}
    return build_index.run(config.parse(build_index.BuildIndexParams, values))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A store with 300 staged sentences, a tiny student (run 'tiny', with its fp32 ONNX graph) and a promoted
    flat index 'a'."""
    prepared = projected_store(tmp_path_factory.mktemp("serve"), TEXTS, DAY, shard_rows=120)
    distill_tiny(prepared, "tiny", max_steps=2, onnx="fp32")
    _build(prepared["store"], "a")
    return prepared["store"]


@pytest.fixture(scope="module")
def service(store) -> Iterator[str]:
    """The service over ``store`` in uvicorn on a free 127.0.0.1 port, polling every 0.2 s; its base URL."""
    with _running(IndexHolder(store, POLL_S)) as url:
        yield url


def _running(holder: IndexHolder) -> contextlib.AbstractContextManager[str]:
    """The service over ``holder`` in uvicorn on a free 127.0.0.1 port, in a thread of this process."""
    return serving(serve_app.create_app(holder))


def test_health_names_the_served_index(service, store):
    health = httpx.get(f"{service}/health").json()
    pointer, etag = catalog.read_pointer(store, Pointer.INDEX)
    assert health["status"] == "ok" and health["model_run"] == "tiny" and health["etag"] == etag
    assert health["index"] == catalog.store_key(store, pointer.index) and health["index"].startswith("indexes/a/")
    assert health["vectors"] == 300 and health["dim"] == 8 and health["last_error"] is None
    assert health["store"] == store and health["loaded_at"] <= time.time()
    assert health["query_encoder"] == "onnx-fp32"


def test_query_encoder_torch_serves_the_pytorch_student(store):
    holder = IndexHolder(store, POLL_S, query_encoder="torch")
    assert holder.refresh() and holder.health()["query_encoder"] == "torch"
    hits = holder.current.search([TEXTS[7]], 1)[0]
    assert hits[0].text == TEXTS[7]


def test_a_search_runs_with_the_holders_openmp_threads_in_the_requests_thread(store):
    import faiss

    fresh = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())  # what a new thread starts with
    wanted = 2 if fresh == 1 else 1
    holder = IndexHolder(store, POLL_S, search_threads=wanted)
    holder.refresh()
    seen: list[int] = []

    def request() -> None:
        seen.append(faiss.omp_get_max_threads())
        holder.search(holder.current, [TEXTS[7]], 1)
        seen.append(faiss.omp_get_max_threads())

    thread = threading.Thread(target=request)
    thread.start()
    thread.join()
    assert seen == [fresh, wanted]


def test_single_and_batched_queries(service):
    single = httpx.get(f"{service}/search", params={"q": TEXTS[7], "k": 3}).json()
    assert [h["rank"] for h in single["hits"]] == [1, 2, 3] and single["hits"][0]["text"] == TEXTS[7]
    assert single["hits"][0]["score"] == pytest.approx(1.0, abs=1e-4) and single["index"].startswith("indexes/a/")
    batch = httpx.post(f"{service}/search", json={"queries": [TEXTS[7], TEXTS[42], "rain"], "k": 4}).json()
    assert [len(hits) for hits in batch["results"]] == [4, 4, 4]
    assert batch["results"][0][0]["text"] == TEXTS[7] and batch["results"][1][0]["text"] == TEXTS[42]
    everything = httpx.get(f"{service}/search", params={"q": "cats", "k": 1000}).json()
    assert len(everything["hits"]) == 300  # k beyond the corpus: every sentence, once


def test_one_query_through_the_graph_is_answered_while_the_encoders_lock_is_held(store):
    holder = IndexHolder(store, 60)
    with _running(holder) as url:
        served = holder.current
        assert served.encodes_one_lock_free
        with served.lock:  # as a batch in flight holds it
            response = httpx.get(f"{url}/search", params={"q": TEXTS[7], "k": 1}, timeout=10)
    assert response.status_code == 200 and response.json()["hits"][0]["text"] == TEXTS[7]


def test_a_query_waiting_for_the_encoders_lock_does_not_hold_up_the_service(store):
    holder = IndexHolder(store, 60, query_encoder="torch")
    with _running(holder) as url, ThreadPoolExecutor(1) as pool:
        served = holder.current
        assert not served.encodes_one_lock_free
        with served.lock:
            waiting = pool.submit(httpx.get, f"{url}/search", params={"q": TEXTS[7], "k": 1}, timeout=30)
            time.sleep(0.3)
            assert not waiting.done()
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        assert waiting.result().json()["hits"][0]["text"] == TEXTS[7]


def test_answers_are_the_holders_results_as_json(store):
    holder = IndexHolder(store, 60)
    with TestClient(serve_app.create_app(holder, poll=False)) as client:
        single = client.get("/search", params={"q": TEXTS[7], "k": 3})
        batch = client.post("/search", json={"queries": [TEXTS[7], "rain"], "k": 2})
        served = holder.current
        assert single.headers["content-type"] == "application/json"
        hits = [hit.to_dict() for hit in served.search([TEXTS[7]], 3)[0]]
        results = [[hit.to_dict() for hit in found] for found in served.search([TEXTS[7], "rain"], 2)]
        assert single.json() == {**describe(served), "k": 3, "hits": hits}
        assert batch.json() == {**describe(served), "k": 2, "results": results}


@pytest.mark.parametrize(
    ("method", "request_args", "field"),
    [
        ("GET", {"params": {"q": "cats", "k": 0}}, "k"),
        ("GET", {"params": {"q": "cats", "k": 1001}}, "k"),
        ("GET", {"params": {"q": "cats", "k": "many"}}, "k"),
        ("GET", {"params": {"q": ""}}, "q"),
        ("GET", {"params": {}}, "q"),
        ("GET", {"params": {"q": "x" * (serve_app.MAX_QUERY_CHARS + 1)}}, "q"),
        ("POST", {"json": {"queries": [], "k": 5}}, "queries"),
        ("POST", {"json": {"queries": ["a"] * (serve_app.MAX_BATCH + 1)}}, "queries"),
        ("POST", {"json": {"queries": ["a", ""]}}, "queries"),
        ("POST", {"json": {"queries": ["a"], "k": 1001}}, "k"),
        ("POST", {"json": {"queries": "cats"}}, "queries"),
        ("POST", {"json": {"queries": ["a"], "top": 3}}, "top"),
    ],
)
def test_bad_requests_are_422_naming_the_field(service, method, request_args, field):
    response = httpx.request(method, f"{service}/search", **request_args)
    assert response.status_code == 422
    assert field in [str(part) for error in response.json()["detail"] for part in error["loc"]]


_JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("method", "path", "request_args", "problem"),
    [
        ("GET", "/search?q=%20%20", {}, "the query is empty"),
        ("GET", "/search?q=%09%00%1B", {}, "the query is empty"),
        ("GET", "/search?q=caf%E9%FF", {}, "the query is not valid UTF-8"),  # bytes that do not decode
        ("GET", "/search?k=2&q=a%ED%B3%BFb", {}, "the query is not valid UTF-8"),  # an encoded surrogate
        ("POST", "/search", {"json": {"queries": ["cats", " \n "]}}, "the query is empty"),
        ("POST", "/search", {"content": b'{"queries": ["cats", "a\\udcff"]}', "headers": _JSON}, "not valid UTF-8"),
    ],
)
def test_a_query_without_text_or_not_utf8_is_422_saying_so(service, method, path, request_args, problem):
    response = httpx.request(method, f"{service}{path}", **request_args)
    assert response.status_code == 422
    assert any(problem in error["msg"] for error in response.json()["detail"])


def test_a_text_query_with_a_replacement_character_is_searched(service):
    """U+FFFD typed and sent as UTF-8 is text: only bytes that do not decode are refused."""
    assert httpx.get(f"{service}/search", params={"q": "caf\ufffd", "k": 1}).status_code == 200


def test_no_index_yet_is_503(tmp_path):
    empty = storage.to_uri(str(tmp_path / "empty"))
    with TestClient(serve_app.create_app(IndexHolder(empty, 60), poll=False)) as client:
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "no_index"
        assert client.get("/search", params={"q": "cats"}).status_code == 503


def test_a_pointer_outside_the_store_is_refused_and_the_old_index_kept(store, tmp_path):
    holder = IndexHolder(store, 60)
    assert holder.refresh() and holder.current is not None
    served, original = holder.current, storage.read_bytes(catalog.pointer_uri(store, Pointer.INDEX))
    pointer, etag = catalog.read_pointer(store, Pointer.INDEX)
    outside = storage.to_uri(str(tmp_path / "elsewhere" / "index.faiss"))
    catalog.move_pointer(store, IndexPointer(outside, pointer.ids, pointer.manifest, "tiny", 8, "hand-made"), etag)
    try:
        assert not holder.refresh()
        assert holder.current is served and "outside the store" in holder.last_error
        assert not holder.refresh()  # the same refused pointer is not retried
    finally:
        storage.write_bytes(catalog.pointer_uri(store, Pointer.INDEX), original)
    assert holder.refresh() and holder.current.index_key == served.index_key and holder.last_error is None


def test_hpd_search_asks_the_running_service(service, store, tmp_path, monkeypatch, capsys, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    monkeypatch.setenv("HPD_SERVE_URL", service)
    assert cli.main(["search", TEXTS[7], "-k", "2", "--store", store]) == 0
    assert TEXTS[7] in capsys.readouterr().out
    assert any(f"answered by {service}" in r.getMessage() for r in caplog.records)
    caplog.clear()  # a service over another store is not asked: this store has no index
    assert cli.main(["search", "cats", "--store", storage.to_uri(str(tmp_path / "other"))]) == 1
    assert "no index promoted yet" in capsys.readouterr().err and not caplog.records
    monkeypatch.setenv("HPD_SERVE_URL", "http://127.0.0.1:9")  # nothing listens: searched here
    assert cli.main(["search", TEXTS[7], "-k", "1", "--store", store]) == 0


def _hammer(service: str, stop: threading.Event, seen: Counter, failures: list) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        while not stop.is_set():
            try:  # single queries (answered on the event loop) and batches (in the thread pool) in turn
                if sum(seen.values()) % 2:
                    response = client.get("/search", params={"q": TEXTS[3], "k": 5})
                else:
                    response = client.post("/search", json={"queries": [TEXTS[3], "music"], "k": 5})
                response.raise_for_status()
                seen[response.json()["index"].split("/")[1]] += 1
            except Exception as exc:  # every kind of failure counts
                failures.append(repr(exc))


def test_a_promotion_swaps_the_index_without_failing_a_request(service, store):
    stop, seen, failures = threading.Event(), Counter(), []
    clients = [threading.Thread(target=_hammer, args=(service, stop, seen, failures)) for _ in range(3)]
    for thread in clients:
        thread.start()
    try:
        time.sleep(0.5)
        _build(store, "b")  # promote=True: indexes/current.json moves to index b
        deadline = time.monotonic() + 30
        while not httpx.get(f"{service}/health").json()["index"].startswith("indexes/b/"):
            assert time.monotonic() < deadline, "the service did not swap to the promoted index"
            time.sleep(POLL_S)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in clients:
            thread.join()
    assert failures == [] and seen["a"] > 0 and seen["b"] > 0
    _, etag = catalog.read_pointer(store, Pointer.INDEX)
    assert httpx.get(f"{service}/health").json()["etag"] == etag


@pytest.mark.parametrize(("flag", "logged"), [([], False), (["--access-log"], True)])
def test_hpd_serve_logs_requests_only_when_asked(store, monkeypatch, flag, logged):
    """The CLI's uvicorn server logs each request (with the query text) only with --access-log."""
    started: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda server: started.append(server.config))
    assert cli.main(["serve", "--store", store, "--port", "8765", *flag]) == 0
    (config,) = started
    assert config.access_log is logged and (config.host, config.port) == ("127.0.0.1", 8765)
