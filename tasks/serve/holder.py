"""The index a service answers from, and the poller that swaps it when ``indexes/current.json`` moves.

A request reads :attr:`IndexHolder.current` once and answers from that :class:`LoadedIndex` to the end, so
a swap (one reference assignment) never changes an index under a request in flight; the old one is freed
when its last request ends. A new index is loaded completely, off the request path, before it is swapped
in (the segments and student it shares with the served one are not read again); one that fails to load
(missing objects, outside the store, wrong dimension) leaves the served one in place and is retried only when
the pointer moves again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from tasks.core import catalog, storage, uris
from tasks.core.catalog import Pointer
from tasks.ml import vector_index
from tasks.ml.hits import Hit
from tasks.ml.vector_index import LoadedIndex

log = logging.getLogger(__name__)


class IndexHolder:
    """The served index (or None before one is promoted), the pointer etag last tried, and the poller;
    ``query_encoder`` as :func:`vector_index.load_current` takes it; the OpenMP threads a FAISS search may use."""

    def __init__(self, store: str, poll_s: float, query_encoder: str = "auto", search_threads: int = 1) -> None:
        self.store, self.poll_s, self.query_encoder = store, poll_s, query_encoder
        self.search_threads = search_threads
        self.current: LoadedIndex | None = None
        self.tried_etag: str | None = None
        self.last_error: str | None = None
        self.last_check: float | None = None
        self.swaps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def search(self, served: LoadedIndex, queries: list[str], k: int) -> list[list[Hit]]:
        """``served.search`` with ``search_threads`` OpenMP threads. The setting is the calling thread's own (an
        OpenMP thread count is per thread), so it is made in each request's thread; one thread by default:
        requests already run side by side, and a team per single query contends with the query encoder's
        threads (100k flat, one query: 5.2 ms with 1 thread, 16 ms with 2, on 2 cores)."""
        import faiss

        faiss.omp_set_num_threads(self.search_threads)
        return served.search(queries, k)

    def pointer_etag(self) -> str | None:
        """The etag of ``indexes/current.json`` (None while nothing is promoted), without reading it."""
        try:
            return storage.head(catalog.pointer_uri(self.store, Pointer.INDEX)).etag
        except storage.ObjectNotFound:
            return None

    def refresh(self) -> bool:
        """Load and swap in the promoted index if its pointer moved since the last try; whether it swapped."""
        etag = self.pointer_etag()
        self.last_check = time.time()
        if etag is None or etag == self.tried_etag:
            return False
        self.tried_etag = etag
        try:
            loaded = vector_index.load_current(self.store, self.query_encoder, self.current)
        except (ValueError, uris.StorageError) as exc:
            self.last_error = str(exc)
            log.error("serve: %s; still serving %s", exc, self.current.index_key if self.current else "nothing")
            return False
        self.tried_etag = loaded.etag  # the version actually read (the pointer may have moved again since)
        self.current, self.last_error = loaded, None
        self.swaps += 1
        log.info(
            "serve: now serving %s (model run %s, queries encoded by %s)",
            loaded.index_key,
            loaded.pointer.model_run,
            loaded.query_encoder,
        )
        return True

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.refresh()
            except Exception:  # a storage hiccup must not end the poller: log it and try at the next tick
                log.exception("serve: checking %s failed", catalog.pointer_uri(self.store, Pointer.INDEX))

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="hpd-serve-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def health(self) -> dict[str, Any]:
        served = self.current
        record: dict[str, Any] = {
            "status": "ok" if served else "no_index",
            "store": uris.redact(self.store),
            "poll_s": self.poll_s,
            "last_check": self.last_check,
            "last_error": self.last_error,
            "swaps": self.swaps,
        }
        if served is not None:
            record.update(describe(served), vectors=int(served.index.ntotal), dim=int(served.index.d))
        return record


def describe(served: LoadedIndex) -> dict[str, Any]:
    """What identifies the index that answered: model run, index key, its build run, pointer etag, load time,
    and what encodes the queries."""
    return {
        "model_run": served.pointer.model_run,
        "query_encoder": served.query_encoder,
        "index": served.index_key,
        "index_run_id": served.pointer.run_id,
        "etag": served.etag,
        "loaded_at": served.loaded_at,
    }
