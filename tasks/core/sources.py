"""Raw sources outside the store: a partition's source from its template, and the raw files it holds."""

from __future__ import annotations

import string
from datetime import date

from tasks.core import storage
from tasks.core.uris import redact


class CorpusInputError(ValueError):
    """A raw input that cannot be found or read as sentences; the message names the URI."""


def resolve_source(source: str, ingest_date: date) -> str:
    """The source of the partition ``ingest_date``: ``{ingest_date}`` in ``source`` is replaced by the date, with
    an optional strftime format (``raw/{ingest_date:%Y/%m/%d}/``); no other field is allowed."""
    try:
        fields = {field for _, field, _, _ in string.Formatter().parse(source) if field is not None}
        if fields - {"ingest_date"}:
            raise KeyError(f"holds {sorted(fields - {'ingest_date'})}, the only placeholder allowed is {{ingest_date}}")
        return source.format(ingest_date=ingest_date)
    except (ValueError, KeyError) as exc:
        raise CorpusInputError(f"{redact(source)}: not a valid source template ({redact(str(exc))})") from None


def source_uris(source: str) -> list[str]:
    """The raw files of ``source``: the object itself, else every visible object under it (a prefix)."""
    uri = storage.to_uri(source)
    if storage.exists(uri):
        return [uri]
    found = [u for u in storage.list_uris(uri) if not u.rsplit("/", 1)[-1].startswith((".", "_"))]
    if not found:
        raise CorpusInputError(f"{uri}: no such file, and no raw files under it")
    return found
