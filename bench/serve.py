"""``hpd serve`` under load on localhost, with a promotion in the middle, at 100k and 1M vectors.

Model: the packaged student as ``make demo`` distils it (run ``demo-student``: all-MiniLM-L6-v2 +
Dense(128, tanh), the real model that encodes each query); run ``make demo`` first: this benchmark copies
its store (``var/store``) to a scratch folder and never changes the original. Each size is served twice, by
one service per query encoder (``hpd serve --query-encoder``): the student's ONNX graph (``auto``; the demo's
distillation exports an int8 one) and the same student in PyTorch fp32 (``torch``), same index, same queries.
Index: synthetic, seeded random unit vectors of the student's dimension in the index build-index's ``auto``
choice makes for that size (exact flat at 100k, HNSW32 at 1M), so the latency is that of the serving path
(HTTP, query encoding, search), not a measure of retrieval quality. Per size, the index is published twice
(the same vectors under two names); each service starts on the first.

The service runs as ``hpd serve`` in its own process on 127.0.0.1. Per size, after a warm-up: one client sends
SINGLE_REQUESTS GET /search (k=10, one corpus sentence) one after another (the warm latency of one query), and as
many through the standard library's ``http.client`` on one kept-alive connection (the same, with less of the
client's own cost); then CONCURRENCY client threads send requests back to back for DURATION_S seconds while,
halfway, ``indexes/current.json`` moves to the second index (and on, up to SWAP_WAIT_S more, until it answers). Clients
and service share the machine's cores; the service searches with one FAISS thread (its default). The served graph
also encodes the single-query run's queries in the benchmark's own process (no HTTP, no search): ``encode_only_ms``,
the floor under the service's latency on this machine.
Baseline: one search without a service (:func:`vector_index.search`: load the student and the largest index,
then answer), which is what each ``hpd search`` did before, interpreter start not counted.
"""

from __future__ import annotations

import gzip
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa

from bench import CORPUS, REPO, results
from tasks.core import catalog, parquet_shards, storage
from tasks.core.catalog import IndexPointer, Pointer, Stage
from tasks.ml import vector_index
from tasks.stages import build_index

SOURCE_STORE = REPO / "var" / "store"
SIZES = (100_000, 1_000_000)
SINGLE_REQUESTS = 300
CONCURRENCY = 4
DURATION_S = 20.0
SWAP_WAIT_S = 60.0  # how much longer the clients run, at most, for the new index to answer
POLL_S = 1.0
K = 10
QUERY_ENCODERS = ("auto", "torch")  # hpd serve --query-encoder: the student's ONNX graph, then PyTorch


def _queries(count: int = 500) -> list[str]:
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        return [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(count)]


def _publish_pair(store: str, dim: int, model_run: str, vectors: int) -> tuple[IndexPointer, IndexPointer]:
    """The index ``auto`` builds for ``vectors`` seeded random unit vectors, published under two names."""
    import faiss

    from tasks.stages.params import BuildIndexParams

    data = np.random.default_rng(vectors).standard_normal((vectors, dim), dtype=np.float32)
    faiss.normalize_L2(data)
    kind = build_index.choose_type("auto", vectors)
    factory = build_index.factory_string(kind, vectors, dim, BuildIndexParams(store=store))
    body = faiss.serialize_index(vector_index.build(data, factory, 16)).tobytes()
    return tuple(_publish(store, f"bench-serve-{vectors}-{n}", body, dim, model_run, vectors) for n in "ab")


def _publish(store: str, name: str, body: bytes, dim: int, model_run: str, vectors: int) -> IndexPointer:
    """An index and its id map, published under ``indexes/name/`` with a build-index manifest listing both (what
    the service verifies them against)."""
    from tasks.core import manifest

    run = manifest.StageRun(stage=Stage.BUILD_INDEX, key=name, store=store, params={"synthetic": vectors}, inputs=[])
    prefix = storage.join(store, f"indexes/{name}")
    index_uri, ids_uri = storage.join(prefix, "index.faiss"), storage.join(prefix, "ids.parquet")
    run.write_output(index_uri, body, rows=vectors)
    ids = [f"{name}-{i}" for i in range(vectors)]
    run.write_output(
        ids_uri, parquet_shards.parquet_bytes(pa.table({"sentence_id": ids, "text": ids}), dictionary=[]), rows=vectors
    )
    run.publish()
    return IndexPointer(index_uri, ids_uri, catalog.manifest_uri(store, Stage.BUILD_INDEX, name), model_run, dim, name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(store: str, port: int, query_encoder: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "tasks.cli", "serve", "--store", store, "--port", str(port)]
    options = ["--poll-s", str(POLL_S), "--query-encoder", query_encoder]
    server = subprocess.Popen([*command, *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.terminate()
    raise SystemExit("hpd serve did not become healthy within 120 s")


def _client(url: str, queries: list[str], stop: threading.Event, log: list, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            query = queries[int(rng.integers(len(queries)))]
            start = time.monotonic()
            try:
                response = client.get("/search", params={"q": query, "k": K})
                served = response.json()["index"] if response.status_code == 200 else f"HTTP {response.status_code}"
            except Exception as exc:  # every kind of failure is an error of the run
                served = repr(exc)
            log.append((start, time.monotonic() - start, served))


def _single(url: str, queries: list[str]) -> dict[str, float]:
    """Warm latency of one query at a time through httpx: p50/p99 over SINGLE_REQUESTS sequential requests (after
    20 unmeasured)."""
    with httpx.Client(base_url=url, timeout=30) as client:
        return _sequential(queries, lambda query: client.get("/search", params={"q": query, "k": K}).raise_for_status())


def _single_lean(port: int, queries: list[str]) -> dict[str, float]:
    """As :func:`_single` through the standard library's ``http.client`` on one kept-alive connection: the
    service's latency with less of the client's own (httpx costs about 1 ms a request here)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def ask(query: str) -> None:
        connection.request("GET", "/search?" + urllib.parse.urlencode({"q": query, "k": K}))
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"GET /search: HTTP {response.status}")

    try:
        return _sequential(queries, ask)
    finally:
        connection.close()


def _sequential(queries: list[str], ask: Callable[[str], object]) -> dict[str, float]:
    took = []
    for n, query in enumerate((queries * 2)[: SINGLE_REQUESTS + 20]):
        start = time.perf_counter()
        ask(query)
        if n >= 20:
            took.append((time.perf_counter() - start) * 1000)
    return {q: round(float(np.percentile(took, p)), 2) for q, p in (("p50", 50), ("p99", 99))}


def _load(url: str, store: str, second: IndexPointer, queries: list[str]) -> tuple[list, float, float]:
    """Run the clients; move the pointer to ``second`` half-way through DURATION_S, and keep them running
    past it until the new index has answered (at most SWAP_WAIT_S more). Every request's (start, seconds,
    index served), the promotion's time and the seconds the clients ran."""
    log: list = []
    stop = threading.Event()
    threads = [threading.Thread(target=_client, args=(url, queries, stop, log, i)) for i in range(CONCURRENCY)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(DURATION_S / 2)
    _, etag = catalog.read_pointer(store, Pointer.INDEX)
    promoted_at = time.monotonic()
    catalog.move_pointer(store, second, etag)
    key = catalog.store_key(store, second.index)
    deadline = started + DURATION_S + SWAP_WAIT_S
    while time.monotonic() < started + DURATION_S or (
        time.monotonic() < deadline and not any(served == key for _, _, served in log[-CONCURRENCY * 4 :])
    ):
        time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join()
    return log, promoted_at, time.monotonic() - started


def _summary(log: list, promoted_at: float, ran_s: float, first: str, second: str) -> dict:
    ok = np.array([seconds for _, seconds, served in log if served in (first, second)]) * 1000
    errors = [served for _, _, served in log if served not in (first, second)]
    swapped = [start for start, _, served in log if served == second]
    return {
        "requests": len(log),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "seconds": round(ran_s, 1),
        "requests_per_s": round(len(log) / ran_s, 1),
        "latency_ms": {q: round(float(np.percentile(ok, p)), 2) for q, p in (("p50", 50), ("p95", 95), ("p99", 99))}
        | {"max": round(float(ok.max()), 2)},
        "answered_by_first_index": sum(served == first for _, _, served in log),
        "answered_by_second_index": len(swapped),
        "seconds_from_promotion_to_first_answer_of_new_index": round(min(swapped) - promoted_at, 2)
        if swapped
        else None,
    }


def _encode_floor(store: str, model_run: str, queries: list[str]) -> dict[str, float]:
    """The served graph's own time for one query, in this process, over the single-query run's queries: what
    no HTTP stack can go below (the service runs the same graph with the same ONNX Runtime settings)."""
    from tasks.ml import student

    with tempfile.TemporaryDirectory() as scratch:
        encoder = vector_index.query_encoder(student.fetch_exported(store, model_run, Path(scratch)))
    took = []
    for n, query in enumerate((queries * 2)[: SINGLE_REQUESTS + 20]):
        start = time.perf_counter()
        encoder.encode([query])
        if n >= 20:
            took.append((time.perf_counter() - start) * 1000)
    return {q: round(float(np.percentile(took, p)), 2) for q, p in (("p50", 50), ("p99", 99))}


def _baseline(store: str, queries: list[str], runs: int = 3) -> float:
    """Milliseconds of one search without a service (load student and index, answer), the median of ``runs``."""
    times = []
    for query in queries[:runs]:
        start = time.perf_counter()
        vector_index.search(store, query, K)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000


def _serve_size(store: str, dim: int, model_run: str, vectors: int, queries: list[str]) -> dict:
    """Per query encoder: single-query latency, then the concurrent load with a promotion, over the ``auto``
    index of ``vectors``."""
    first, second = _publish_pair(store, dim, model_run, vectors)
    keys = [catalog.store_key(store, p.index) for p in (first, second)]
    found: dict = {"vectors": vectors, "index": build_index.choose_type("auto", vectors)}
    for encoder in QUERY_ENCODERS:
        catalog.move_pointer(store, first, catalog.read_pointer(store, Pointer.INDEX)[1])
        port = _free_port()
        server = _start(store, port, encoder)
        try:
            served = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["query_encoder"]
            single = _single(f"http://127.0.0.1:{port}", queries)
            lean = _single_lean(port, queries)
            log, promoted_at, ran_s = _load(f"http://127.0.0.1:{port}", store, second, queries)
        finally:
            server.terminate()
            server.wait(30)
        found[served] = {
            "single_client_ms": single,
            "single_lean_client_ms": lean,
            **_summary(log, promoted_at, ran_s, *keys),
        }
    return found


def main() -> dict:
    model, _ = catalog.read_pointer(storage.to_uri(str(SOURCE_STORE)), Pointer.MODEL)
    if model is None:
        raise SystemExit(f"run `make demo` first: this benchmark serves the student it promotes in {SOURCE_STORE}")
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copytree(SOURCE_STORE, Path(scratch) / "store")
        store = storage.to_uri(str(Path(scratch) / "store"))
        dim = catalog.read_pointer(store, Pointer.INDEX)[0].dim
        queries = _queries()
        sizes = [_serve_size(store, dim, model.model_run, vectors, queries) for vectors in SIZES]
        baseline_ms = _baseline(store, queries)
        floor = _encode_floor(store, model.model_run, queries)
        return _write(sizes, baseline_ms, floor, model.model_run, dim)


def _write(sizes: list[dict], baseline_ms: float, floor: dict[str, float], model_run: str, dim: int) -> dict:
    largest = sizes[-1]
    graph = next((name for name in largest if name.startswith("onnx-")), None)
    if graph is None:
        raise SystemExit(f"{model_run} exported no ONNX graph: rerun `make demo` (hpd_retrain exports one)")
    p50 = {name: largest[name]["single_client_ms"]["p50"] for name in (graph, "torch")}
    return results.write(
        "serve",
        unit="ms per query",
        ours=p50[graph],
        baseline=round(baseline_ms, 1),
        baseline_name=(
            f"one search without a service (load + answer); ours: warm p50 of one query; both at {largest['vectors']:,}"
            " vectors"
        ),
        higher_is_better=False,
        details={
            "model": f"{model_run} (make demo's student: all-MiniLM-L6-v2 + Dense({dim}, tanh)) on CPU",
            "query_encoders": {
                graph: "the student's ONNX graph run by ONNX Runtime (hpd_retrain asks distill for int8 and keeps "
                "fp32 when int8 loses more than 0.3 STS dev points)",
                "torch": "the same student in PyTorch, fp32 (hpd serve --query-encoder torch)",
            },
            "single_query_p50_torch_over_onnx": round(p50["torch"] / p50[graph], 2),
            "single_query_p50_lean_client_ms": largest[graph]["single_lean_client_ms"]["p50"],
            "lean_client": "the standard library's http.client on one kept-alive connection (single_lean_client_ms); "
            "the headline and single_client_ms use httpx",
            "encode_only_ms": floor,
            "encode_only": f"{graph} encoding the same queries one at a time in the benchmark's process, no HTTP, "
            "no search",
            "index": f"synthetic seeded random unit vectors, dim {dim}, build-index's auto choice per size",
            "endpoint": f"GET /search, k={K}, one corpus sentence per request",
            "single_requests": SINGLE_REQUESTS,
            "concurrency": CONCURRENCY,
            "duration_s": DURATION_S,
            "swap_wait_s": SWAP_WAIT_S,
            "poll_s": POLL_S,
            "promotion": "indexes/current.json moved to the second copy of the index at half time",
            "server": "hpd serve (uvicorn, one process) on 127.0.0.1, one per query encoder; clients in another "
            "process, same cores",
            "load_average_at_end": list(os.getloadavg()),
            "sizes": sizes,
        },
    )


if __name__ == "__main__":
    print(main())
