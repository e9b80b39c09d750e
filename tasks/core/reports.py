"""The store's report objects, those a browser opens: a validation's report, validated model card and metrics, and a
quality run's results and Data Docs, by store-relative key (:data:`REPORT_KEYS`); and their addresses in the
report app (:func:`report_path`: :mod:`tasks.serve.reports` serves them, the DAGs' buttons link to them)."""

from __future__ import annotations

import hashlib
import re

from tasks.core.catalog import Stage
from tasks.core.uris import to_uri

VALIDATION_REPORT = "report.html"  # a validation's HTML report, among its outputs
VALIDATED_CARD = "model_card.md"  # the validated model card, among its outputs
DATA_DOCS_INDEX = "data_docs/index.html"  # a quality run's Data Docs, by their index page below the run's folder
PREFIX = "/hpd/reports"  # where the report app is mounted in the Airflow API server

_NAME = r"[A-Za-z0-9_=-][A-Za-z0-9_.=-]*"
# By the stage whose manifest lists them: the manifest's key and the run id are named groups.
REPORT_KEYS = {
    Stage.VALIDATE: re.compile(
        rf"validation/(?P<key>{_NAME})/(?P<run_id>[0-9a-f]{{32}})/"
        rf"(?:{re.escape(VALIDATION_REPORT)}|{re.escape(VALIDATED_CARD)}|metrics\.json)"
    ),
    Stage.QUALITY: re.compile(
        rf"quality/(?P<key>ingest_date=\d{{4}}-\d{{2}}-\d{{2}})/(?P<run_id>[0-9a-f]{{32}})/"
        rf"(?:results\.json|data_docs/(?:{_NAME}/)*{_NAME})"
    ),
}


def store_id(store: str) -> str:
    """A store's name in report addresses: the first 16 hex digits of the sha256 of its normalised URI."""
    return hashlib.sha256(to_uri(store).encode()).hexdigest()[:16]


def report_path(uri: str) -> str | None:
    """The address (``PREFIX/<store id>/<key>``) of the report object at ``uri``, its store told by the key it ends
    with; None when ``uri`` is no report object."""
    for pattern in REPORT_KEYS.values():
        for start in (m.start() + 1 for m in re.finditer("/", uri)):
            if pattern.fullmatch(uri[start:]):
                return f"{PREFIX}/{store_id(uri[: start - 1])}/{uri[start:]}"
    return None
