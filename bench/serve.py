"""``hpd serve`` under load on localhost, with a promotion in the middle.

Model: the packaged student as ``make demo`` distils it (run ``demo-student``: all-MiniLM-L6-v2 +
Dense(128, tanh), the real model that encodes each query); run ``make demo`` first: this benchmark copies
its store (``var/store``) to a scratch folder and never changes the original. Index: synthetic, 100,000
seeded random unit vectors of the student's dimension in an exact flat index (the corpus of the demo holds
only 2,000 sentences), so the latency is that of the serving path (HTTP, query encoding, exact search over
100k vectors), not a measure of retrieval quality. Two such indexes are published; the service starts on
the first, and half-way through the run ``indexes/current.json`` moves to the second.

The service runs as ``hpd serve`` in its own process on 127.0.0.1; CONCURRENCY client threads in this
process send GET /search (k=10, corpus sentences as queries) back to back for DURATION_S seconds. Both
share the machine's cores. Baseline: one search without a service (:func:`build_index.search`: load the
student and the index, then answer), which is what each ``hpd search`` did before, interpreter start not
counted.
"""

from __future__ import annotations

import gzip
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench import CORPUS, REPO, results
from tasks.core import catalog, storage
from tasks.core.catalog import IndexPointer, Pointer
from tasks.stages import build_index

SOURCE_STORE = REPO / "var" / "store"
VECTORS = 100_000
CONCURRENCY = 4
DURATION_S = 20.0
POLL_S = 1.0
K = 10


def _queries(count: int = 500) -> list[str]:
    with gzip.open(CORPUS, "rt") as f:
        next(f)
        return [next(f).rstrip("\n").split("\t", 1)[1] for _ in range(count)]


def _publish(store: str, name: str, dim: int, model_run: str, seed: int) -> IndexPointer:
    """A flat index over VECTORS seeded random unit vectors and its id map, published under ``indexes/name/``."""
    import faiss

    vectors = np.random.default_rng(seed).standard_normal((VECTORS, dim), dtype=np.float32)
    faiss.normalize_L2(vectors)
    index = build_index.build(vectors, "Flat", 1)
    prefix = storage.join(store, f"indexes/{name}")
    index_uri, ids_uri = storage.join(prefix, "index.faiss"), storage.join(prefix, "ids.parquet")
    storage.write_bytes(index_uri, faiss.serialize_index(index).tobytes())
    ids = [f"{name}-{i}" for i in range(VECTORS)]
    storage.write_parquet(ids_uri, pa.table({"sentence_id": ids, "text": [f"synthetic vector {i}" for i in ids]}))
    return IndexPointer(index_uri, ids_uri, "manifests/build_index/none.json", model_run, dim, name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(store: str, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "tasks.cli", "serve", "--store", store, "--port", str(port)]
    server = subprocess.Popen([*command, "--poll-s", str(POLL_S)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.terminate()
    raise SystemExit("hpd serve did not become healthy within 120 s")


def _client(url: str, queries: list[str], until: float, log: list, seed: int) -> None:
    import httpx

    rng = np.random.default_rng(seed)
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < until:
            query = queries[int(rng.integers(len(queries)))]
            start = time.monotonic()
            try:
                response = client.get("/search", params={"q": query, "k": K})
                served = response.json()["index"] if response.status_code == 200 else f"HTTP {response.status_code}"
            except Exception as exc:  # every kind of failure is an error of the run
                served = repr(exc)
            log.append((start, time.monotonic() - start, served))


def _load(url: str, store: str, second: IndexPointer, queries: list[str]) -> tuple[list, float]:
    """Run the clients; move the pointer to ``second`` half-way. Every request's (start, seconds, index)."""
    log: list = []
    until = time.monotonic() + DURATION_S
    threads = [threading.Thread(target=_client, args=(url, queries, until, log, i)) for i in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    time.sleep(DURATION_S / 2)
    _, etag = catalog.read_pointer(store, Pointer.INDEX)
    promoted_at = time.monotonic()
    catalog.move_pointer(store, second, etag)
    for thread in threads:
        thread.join()
    return log, promoted_at


def _summary(log: list, promoted_at: float, first: str, second: str) -> dict:
    ok = np.array([seconds for _, seconds, served in log if served in (first, second)]) * 1000
    errors = [served for _, _, served in log if served not in (first, second)]
    swapped = [start for start, _, served in log if served == second]
    return {
        "requests": len(log),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "requests_per_s": round(len(log) / DURATION_S, 1),
        "latency_ms": {q: round(float(np.percentile(ok, p)), 2) for q, p in (("p50", 50), ("p95", 95), ("p99", 99))}
        | {"max": round(float(ok.max()), 2)},
        "answered_by_first_index": sum(served == first for _, _, served in log),
        "answered_by_second_index": len(swapped),
        "seconds_from_promotion_to_first_answer_of_new_index": round(min(swapped) - promoted_at, 2)
        if swapped
        else None,
    }


def _baseline(store: str, queries: list[str], runs: int = 3) -> float:
    """Milliseconds of one search without a service (load student and index, answer), the median of ``runs``."""
    times = []
    for query in queries[:runs]:
        start = time.perf_counter()
        build_index.search(store, query, K)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000


def main() -> dict:
    model, _ = catalog.read_pointer(storage.to_uri(str(SOURCE_STORE)), Pointer.MODEL)
    if model is None:
        raise SystemExit(f"run `make demo` first: this benchmark serves the student it promotes in {SOURCE_STORE}")
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copytree(SOURCE_STORE, Path(scratch) / "store")
        store = storage.to_uri(str(Path(scratch) / "store"))
        dim = catalog.read_pointer(store, Pointer.INDEX)[0].dim
        first, second = (
            _publish(store, f"bench-serve-{n}", dim, model.model_run, seed) for n, seed in (("a", 1), ("b", 2))
        )
        catalog.move_pointer(store, first, catalog.read_pointer(store, Pointer.INDEX)[1])
        queries = _queries()
        baseline_ms = _baseline(store, queries)
        port = _free_port()
        server = _start(store, port)
        try:
            log, promoted_at = _load(f"http://127.0.0.1:{port}", store, second, queries)
        finally:
            server.terminate()
            server.wait(30)
        keys = [catalog.store_key(store, p.index) for p in (first, second)]
        return _write(_summary(log, promoted_at, *keys), baseline_ms, model.model_run, dim)


def _write(summary: dict, baseline_ms: float, model_run: str, dim: int) -> dict:
    return results.write(
        "serve",
        unit="ms per query",
        ours=summary["latency_ms"]["p99"],
        baseline=round(baseline_ms, 1),
        baseline_name=f"one search without a service (load + answer); ours: p99 at {CONCURRENCY} clients",
        higher_is_better=False,
        details={
            "model": f"{model_run} (make demo's student: all-MiniLM-L6-v2 + Dense({dim}, tanh)), fp32 on CPU",
            "index": f"synthetic: {VECTORS:,} seeded random unit vectors, exact flat inner-product index, dim {dim}",
            "endpoint": f"GET /search, k={K}, one corpus sentence per request",
            "concurrency": CONCURRENCY,
            "duration_s": DURATION_S,
            "poll_s": POLL_S,
            "promotion": "indexes/current.json moved to a second index of the same kind at half time",
            "server": "hpd serve (uvicorn, one process) on 127.0.0.1; clients in another process, same cores",
            **summary,
        },
    )


if __name__ == "__main__":
    print(main())
