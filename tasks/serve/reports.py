"""The store's reports over HTTP: a validation's report, validated model card and metrics, and a quality run's
Data Docs, read verified from the stores a deployment serves (``HPD_STORE`` and ``HPD_REPORT_STORES``).

An address is ``<store id>/<store-relative key>`` (:func:`tasks.core.reports.report_path`): a store is named by a
digest of its URI, so the task that wrote a report links to it without the server's list, and the server answers
for the stores it serves only. The key keeps the store's layout, so a report's relative links (the validation
report's to the Data Docs) resolve here too. What is served is confined to report objects
(:data:`tasks.core.reports.REPORT_KEYS`) a manifest lists (a validation's kept manifest version, a partition's
current quality manifest), their bytes matching the sha256 it records. A model card is rendered as a page. A
validation's pages run no script (:data:`PAGE_POLICY`); Data Docs run theirs but connect nowhere
(:data:`DATA_DOCS_POLICY`).

:func:`reports_app` builds the FastAPI app; who may read is the caller's (``guard``): the Airflow plugin
(:mod:`tasks.serve.report_plugin`) asks Airflow's auth manager.
"""

from __future__ import annotations

import html
import mimetypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from tasks.core import catalog, manifest, storage
from tasks.core.catalog import Stage
from tasks.core.reports import REPORT_KEYS, store_id

# What a page may do. A validation's pages (the report, the rendered card) run no script and load nothing but their
# inline styles and images; Data Docs run the scripts they carry, loaded from here, and connect, post or frame nowhere.
PAGE_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; base-uri 'none'"
DATA_DOCS_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'none'; form-action 'none'; frame-ancestors 'self'; base-uri 'none'"
)


class ReportNotFound(LookupError):
    """Not a report object a manifest of a served store lists; the message says why."""


@dataclass(frozen=True)
class Served:
    body: bytes
    media_type: str


def read_report(store: str, key: str) -> Served:
    """The report object ``key`` of ``store``, verified against the manifest that lists it."""
    found = next(((stage, match) for stage, pattern in REPORT_KEYS.items() if (match := pattern.fullmatch(key))), None)
    if found is None:
        raise ReportNotFound(f"{key}: not a report object (a validation's report, card or metrics, or Data Docs)")
    stage, match = found
    listing = _listing(store, stage, *match.group("key", "run_id"))
    uri = catalog.resolve(store, key)
    output = next((o for o in listing.outputs if o.uri == uri), None) if listing else None
    if output is None:
        raise ReportNotFound(f"{key}: no manifest of this store lists it (never published, or replaced since)")
    body = storage.read_bytes(uri, sha256=output.sha256)
    if key.endswith(".md"):
        return Served(_card_page(body.decode("utf-8"), key), "text/html; charset=utf-8")
    media_type = mimetypes.guess_type(key)[0] or "application/octet-stream"
    return Served(body, f"{media_type}; charset=utf-8" if media_type.startswith("text/") else media_type)


def _listing(store: str, stage: Stage, key: str, run_id: str) -> manifest.Manifest | None:
    """The manifest of run ``run_id`` of ``stage`` under ``key``: a validation's kept version, or the current quality
    manifest of the partition when it is that run's."""
    if stage is Stage.VALIDATE:
        uri = catalog.manifest_version_uri(store, stage, key, run_id)
        return manifest.read_at(store, uri) if storage.exists(uri) else None
    current = manifest.read(store, stage, key)
    return current if current is not None and current.run_id == run_id else None


def _card_page(markdown_text: str, key: str) -> bytes:
    """The model card (Markdown with a YAML header) as an HTML page: the header as a block, then the card."""
    import markdown

    _, header, body = markdown_text.split("---\n", 2) if markdown_text.startswith("---\n") else ("", "", markdown_text)
    title = f"Model card: {key.split('/')[1]}"
    rendered = markdown.markdown(body, extensions=["tables", "fenced_code"])
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head><body>'
        f"<h1>{html.escape(title)}</h1><pre>{html.escape(header)}</pre>{rendered}</body></html>"
    ).encode()


def reports_app(stores: Callable[[], Sequence[str]], guard: Callable[[str], Sequence[Any]]) -> FastAPI:
    """The app serving ``GET /{store id}/{key}``: ``stores()`` lists the served stores; ``guard(kind)`` gives the
    dependencies that authorise reading a report of that kind (``validation`` or ``quality``)."""
    app = FastAPI(title="hpd reports", openapi_url=None, docs_url=None, redoc_url=None)

    async def serve(which: str, key: str) -> Response:
        served = {store_id(store): store for store in stores()}
        if which not in served:
            raise HTTPException(404, f"store {which} is not served here (HPD_STORE, HPD_REPORT_STORES)")
        try:
            found = await run_in_threadpool(read_report, served[which], key)
        except ReportNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        except storage.IntegrityError as exc:
            raise HTTPException(502, f"{key}: does not verify against its manifest ({exc.message})") from None
        except (storage.StorageError, manifest.ManifestError) as exc:
            raise HTTPException(503, f"{key}: {exc}") from None
        policy = DATA_DOCS_POLICY if key.startswith("quality/") else PAGE_POLICY
        headers = {"Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff"}
        return Response(found.body, media_type=found.media_type, headers=headers)

    for kind in ("validation", "quality"):
        app.add_api_route(
            f"/{{which}}/{kind}/{{rest:path}}",
            _route(serve, kind),
            methods=["GET"],
            dependencies=[Depends(d) for d in guard(kind)],
        )
    return app


def _route(serve: Callable[[str, str], Any], kind: str) -> Callable[[str, str], Any]:
    async def route(which: str, rest: str) -> Response:
        return await serve(which, f"{kind}/{rest}")

    route.__name__ = f"{kind}_report"
    return route
