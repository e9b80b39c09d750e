"""Typed, validated stage parameters.

Each stage declares a frozen pydantic model; :func:`parse` turns raw values (from the CLI, an
Airflow ``Param`` or a test) into it, or raises :class:`ConfigError` listing every wrong value.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.core.settings import Settings, SettingsError, current
from tasks.core.uris import StorageError, redact, store_root, to_uri

DEFAULT_STORE: str = Settings.model_fields["store"].default


def default_store() -> str:
    """The store root: ``HPD_STORE`` or the embedded ``file://`` folder ``./var/store``."""
    try:
        return store_root(to_uri(current().store))
    except StorageError as exc:
        raise ConfigError(f"HPD_STORE: {exc}") from None
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None


class ConfigError(ValueError):
    """Stage parameters that fail validation; the message names each wrong field, and ``problems`` holds each
    as (the parameter's path: its name, then list positions; empty for the parameters as a whole, the problem)."""

    def __init__(self, message: str, problems: tuple[tuple[tuple[str, ...], str], ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


class StageParams(BaseModel):
    """Common ground of every stage's parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: str = Field(default_factory=default_store, description="root URI of the object store (file:// or s3://)")

    @field_validator("store")
    @classmethod
    def _store_uri(cls, value: str) -> str:
        try:
            return store_root(to_uri(value))
        except StorageError as exc:  # a parameter error (exit 2), not a storage failure
            raise ValueError(str(exc)) from None


P = TypeVar("P", bound=StageParams)


def parse(model: type[P], values: dict[str, Any]) -> P:
    """Validate ``values`` into ``model``; unknown keys and wrong values raise :class:`ConfigError`."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            given = error.get("input")
            shown = "" if isinstance(given, dict) or error["type"] == "missing" else f" (got {redact(repr(given))})"
            message = error["msg"].removeprefix("Value error, ")  # a validator's own words
            problems.append((tuple(str(part) for part in error["loc"]), f"{message}{shown}"))
        listed = "; ".join(f"{'.'.join(where) or 'the parameters'}: {problem}" for where, problem in problems)
        raise ConfigError(f"invalid parameters: {listed}", tuple(problems)) from None
