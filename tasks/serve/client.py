"""``hpd search`` through a running service: ``$HPD_SERVE_URL``, else ``http://127.0.0.1:8765``.

The answer is used only if the service serves the store asked for (it reports its store, redacted as
here); no service, a slow one, another store or any error means None, and the caller searches locally.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pydantic import BaseModel, ValidationError

from tasks.core import settings, uris
from tasks.ml.hits import Hit

TIMEOUT_S = 3.0

log = logging.getLogger(__name__)


class Answer(BaseModel):
    """What the service answered a search with: the index and model run that answered it, and the hits."""

    index: str
    model_run: str
    hits: list[Hit]


def service_url() -> str | None:
    """The service to try: ``$HPD_SERVE_URL`` (empty or ``off``: none), else the default."""
    url = settings.current().serve_url.strip()
    return None if url in ("", "off") else url.rstrip("/")


def _get(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except (OSError, ValueError) as exc:  # refused, timed out, HTTP error, not JSON
        log.debug("serve client: %s: %s", uris.redact(url), exc)
        return None


def search(store: str, query: str, k: int) -> Answer | None:
    """The service's answer for ``query`` on ``store``, or None when no suitable service answered."""
    base = service_url()
    if base is None or not base.startswith(("http://", "https://")):
        return None
    health = _get(f"{base}/health")
    if health is None or health.get("store") != uris.redact(store):
        return None
    answered = _get(f"{base}/search?{urllib.parse.urlencode({'q': query, 'k': k})}")
    if answered is None:
        return None
    try:
        answer = Answer.model_validate(answered)
    except ValidationError as exc:  # not a search answer (another service on that port)
        log.debug("serve client: %s: not a search answer: %s", base, exc)
        return None
    log.info("hpd search: answered by %s (index %s, model run %s)", base, answer.index, answer.model_run)
    return answer
