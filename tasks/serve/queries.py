"""What a search query must be, for ``hpd search`` and the service alike: text (something besides whitespace and
control characters, which a sentence never holds), and valid UTF-8 (bytes that do not decode reach Python as
surrogate escapes from a command line, and as lone surrogates from JSON). Light to import: no model, no store."""

from __future__ import annotations

import unicodedata


class QueryError(ValueError):
    """A query that cannot be searched; the message says why, in one line."""


def checked(query: str) -> str:
    """``query`` as it is, once it holds text and is valid UTF-8; :class:`QueryError` saying which it is not."""
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise QueryError("the query is not valid UTF-8 text") from None
    if all(char.isspace() or unicodedata.category(char) == "Cc" for char in query):
        raise QueryError("the query is empty: it holds no text besides whitespace and control characters")
    return query
