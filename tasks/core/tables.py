"""Records shown as plain-text tables on the command line: nested fields flattened to dotted names, values as cells,
columns aligned."""

from __future__ import annotations

from typing import Any


def flat(prefix: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """``values`` as ``prefix.name`` rows, nested dicts flattened the same way."""
    rows: dict[str, Any] = {}
    for name, value in (values or {}).items():
        if isinstance(value, dict):
            rows |= flat(f"{prefix}.{name}", value)
        else:
            rows[f"{prefix}.{name}"] = value
    return rows


def shown(value: Any) -> str:
    """A value as a table cell: ``-`` for none, floats to 6 significant digits, lists comma-separated."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, list):
        return ", ".join(shown(v) for v in value) or "[]"
    return str(value)


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)
