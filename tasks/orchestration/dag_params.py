"""Airflow ``Param``s generated from the stages' parameter models (:mod:`tasks.stages.params`).

One source for each setting: a DAG param takes its type, bounds, choices, pattern, description and
default from the stage field it feeds. A DAG may choose another default (a deployment default, a
sample size for the demo ...); :func:`stage_param` then requires the reason, and states it and the
stage's own default in the param's description. The field a param feeds is recorded in its schema
under ``x-hpd-field`` (JSON Schema ignores unknown keywords), so a test can hold every DAG to it. Each param
also carries the ``title`` and ``section`` Airflow's trigger form shows it under.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel

FIELD_KEY = "x-hpd-field"
# The JSON Schema dialect every param declares: the keywords kept below are draft 7's, and Airflow checks a param's
# schema against its dialect's metaschema whenever it resolves the param (at each DAG serialisation, trigger and
# task start), which takes jsonschema a third as long for draft 7 as for the default 2020-12 (serialising the five
# DAGs: 0.151 -> 0.062 CPU-s).
DIALECT = {"$schema": "http://json-schema.org/draft-07/schema#"}
_UNSET: Any = object()
# JSON Schema keywords a Param carries over from the field's schema.
_KEPT = (
    "type",
    "enum",
    "items",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
)


def field_schema(model: type[BaseModel], name: str) -> dict[str, Any]:
    """The JSON schema of one field of ``model``, flattened for Airflow's form: ``X | None`` becomes
    ``X`` with ``null`` added to its type (and enum)."""
    schema = copy.deepcopy(_field_schemas(model)[name])
    options = schema.pop("anyOf", None)
    if options:
        (inner,) = [o for o in options if o.get("type") != "null"]
        schema = {**inner, **schema, "type": [inner["type"], "null"]}
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    return schema


@functools.cache
def _field_schemas(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's JSON schema, generated once per model (a DAG file takes many params from one model, and each task
    parses its DAG file)."""
    return dict(model.model_json_schema()["properties"])


def stage_param(
    model: type[BaseModel], name: str, default: Any = _UNSET, why: str = "", *, title: str, section: str
) -> Any:
    """The ``Param`` for field ``name`` of ``model``, shown as ``title`` in the trigger form's ``section``.
    ``default`` overrides the stage's default (or gives one to a required field) and then needs ``why``."""
    from airflow.sdk import Param

    schema = field_schema(model, name)
    stage_default = schema.get("default", _UNSET)
    description = schema.get("description", "")
    if default is _UNSET:
        default = stage_default
    elif default != stage_default:
        if not why:
            raise ValueError(
                f"DAG default {default!r} for {model.__name__}.{name} differs from the stage's "
                f"({'required' if stage_default is _UNSET else repr(stage_default)}); say why"
            )
        shown = _stage_default_text(model, name, stage_default)
        description = f"{description}. DAG default {default!r} (stage default {shown}): {why}".lstrip(". ")
    kept = {key: schema[key] for key in _KEPT if key in schema}
    if default is None and "null" not in kept.get("type", []):  # empty: the task falls back, as ``why`` says
        kept["type"] = [kept["type"], "null"]
    return Param(
        None if default is _UNSET else default,
        description=description or None,
        title=title,
        section=section,
        **{**kept, FIELD_KEY: f"{model.__name__}.{name}", **DIALECT},
    )


def _stage_default_text(model: type[BaseModel], name: str, stage_default: Any) -> str:
    if model.model_fields[name].default_factory is not None:
        return "computed when the stage runs"
    return "none: required" if stage_default is _UNSET else repr(stage_default)
