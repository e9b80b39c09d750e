"""The HTTP search service (FastAPI): ``GET /health``, ``GET /search?q=...&k=5`` and ``POST /search``
with ``{"queries": [...], "k": 5}``. Every answer names the index that gave it (model run, index key, the
pointer's etag). ``k`` is 1..:data:`MAX_K`, a batch holds at most :data:`MAX_BATCH` queries of at most
:data:`MAX_QUERY_CHARS` characters, each text in valid UTF-8 (:mod:`tasks.serve.queries`); anything else is a 422
naming the field and the problem. 503 while no index is loaded.

One query through the student's ONNX graph is answered on the event loop itself: its work is bounded (one
query, truncated at the student's token limit, then one search; 7 ms p50 of encoding on 2 cores) and waits on
no lock, while handing it to a worker thread and back costs about 0.45 ms a request there. Batches, and
queries encoded by the PyTorch student (which take the encoder's lock), run in the thread pool, so the loop
never waits on a lock.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from tasks.ml.hits import Hit
from tasks.ml.vector_index import LoadedIndex
from tasks.serve.holder import IndexHolder, describe
from tasks.serve.queries import QueryError, checked

MAX_K = 1000  # as `hpd search -k` (tasks.cli.MAX_HITS)
MAX_BATCH = 256
MAX_QUERY_CHARS = 10_000
DEFAULT_PORT = 8765


def _text(value: object) -> object:
    """A query string checked (:func:`checked`) before pydantic's own validation, which refuses a lone surrogate
    as "not a valid string", less clearly."""
    return checked(value) if isinstance(value, str) else value


QueryText = Annotated[str, BeforeValidator(_text), Field(min_length=1, max_length=MAX_QUERY_CHARS)]


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queries: list[QueryText] = Field(min_length=1, max_length=MAX_BATCH)
    k: int = Field(default=5, ge=1, le=MAX_K)


def _served(holder: IndexHolder) -> LoadedIndex:
    served = holder.current  # read once: a swap during this request does not change what answers it
    if served is None:
        raise HTTPException(503, f"no index loaded yet: {holder.last_error or 'nothing promoted'}")
    return served


def _utf8_query(request: Request) -> None:
    """Refuse a ``q`` whose percent-encoded bytes are not UTF-8: the query-string parser would have made them
    U+FFFD, a query nobody typed."""
    raw = request.scope.get("query_string", b"").decode("latin-1")
    queries = [value for name, value in parse_qsl(raw, keep_blank_values=True, errors="surrogateescape") if name == "q"]
    for query in queries:
        try:
            checked(query)
        except QueryError as exc:
            raise RequestValidationError([{"type": "value_error", "loc": ("query", "q"), "msg": str(exc)}]) from None


async def _unprocessable(_: Request, exc: Exception) -> Response:
    """FastAPI's 422, but as ASCII JSON: a rejected input that is no valid text (a lone surrogate) is escaped
    rather than failing the answer's encoding."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    body = json.dumps({"detail": jsonable_encoder(errors)}, ensure_ascii=True)
    return Response(body, status_code=422, media_type="application/json")


def _as_json(hits: list[Hit]) -> list[dict[str, Any]]:
    return [hit.to_dict() for hit in hits]


def create_app(holder: IndexHolder, poll: bool = True) -> FastAPI:
    """The service over ``holder``: it loads the promoted index at start-up and, with ``poll``, checks the
    pointer every ``holder.poll_s`` seconds for the app's lifetime."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        holder.refresh()
        if poll:
            holder.start()
        try:
            yield
        finally:
            holder.stop()

    app = FastAPI(title="hpd search", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, _unprocessable)

    @app.get("/health")
    def health() -> JSONResponse:
        record = holder.health()
        return JSONResponse(record, status_code=200 if record["status"] == "ok" else 503)

    # The answers are JSONResponses made here (plain JSON types only): FastAPI passes a returned Response through,
    # without validating it against a response model and re-encoding it (0.6 ms a query on 2 cores).
    @app.get("/search", dependencies=[Depends(_utf8_query)])
    async def search_one(
        q: Annotated[QueryText, Query()], k: Annotated[int, Query(ge=1, le=MAX_K)] = 5
    ) -> JSONResponse:
        served = _served(holder)
        if served.encodes_one_lock_free:  # on the event loop: bounded work that waits on no lock (see the module)
            hits = holder.search(served, [q], k)[0]
        else:
            hits = (await run_in_threadpool(holder.search, served, [q], k))[0]
        return JSONResponse({**describe(served), "k": k, "hits": _as_json(hits)})

    @app.post("/search")
    def search_batch(request: BatchRequest) -> JSONResponse:
        served = _served(holder)
        results = holder.search(served, request.queries, request.k)
        return JSONResponse({**describe(served), "k": request.k, "results": [_as_json(hits) for hits in results]})

    return app


def serve(
    store: str,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    poll_s: float = 5.0,
    query_encoder: str = "auto",
    search_threads: int = 1,
    access_log: bool = False,
) -> None:
    """Run the service until interrupted (uvicorn, one process). Uvicorn's access log, a line per request with
    its query string (the users' query texts), only with ``access_log`` (it also costs about 0.2 ms a request on
    2 cores); swaps, refused pointers and errors are logged either way."""
    import uvicorn

    holder = IndexHolder(store, poll_s, query_encoder, search_threads)
    config = uvicorn.Config(create_app(holder), host=host, port=port, log_level="info", access_log=access_log)
    uvicorn.Server(config).run()
