"""Every DAG param is its stage field's param: same type, choices, bounds, pattern and items, and the
stage's default unless the description says why not. Params that feed no stage field are listed here."""

from __future__ import annotations

import re
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import Param
from jsonschema.validators import Draft7Validator, validator_for
from pydantic import BaseModel

from tasks.core.config import StageParams
from tasks.orchestration import run_records
from tasks.orchestration.dag_params import DIALECT, FIELD_KEY, field_schema, stage_param
from tasks.stages import params as stage_params
from tasks.stages.params import DistillParams, StageCorpusParams
from tests.support.paths import DAGS

# Params that only steer the orchestration (no stage field behind them), by DAG.
ORCHESTRATION_ONLY = {("hpd_ingest", "shard_groups"), ("hpd_ingest", "arrival_timeout_h")}
# What a DAG param does not take from its field's schema (its default and description are checked apart).
NOT_COMPARED = {"type", "title", "section", "description", "default", FIELD_KEY, *DIALECT}
_MISSING = object()
SHOWN = {"title": "A title", "section": "A section"}
_OVERRIDE = re.compile(r"DAG default (?P<dag>.+?) \(stage default (?P<stage>.+?)\): (?P<why>\S.*)$", re.S)


def _model(name: str) -> type[BaseModel] | None:
    """The stage parameter model, or the DAG's own run-record model (``RetrainParams``), named ``name``."""
    model = StageParams if name == "StageParams" else getattr(stage_params, name, getattr(run_records, name, None))
    return model if isinstance(model, type) and issubclass(model, StageParams | run_records.DagParams) else None


def _types(schema: dict[str, Any]) -> list[Any]:
    kind = schema.get("type", [])
    return list(kind) if isinstance(kind, list) else [kind]


def param_problems(dag_id: str, name: str, param: Param) -> list[str]:
    """What is wrong with one DAG param, each problem naming the DAG and the param."""
    where = f"{dag_id}.{name}"
    schema = dict(param.schema)
    ref = schema.get(FIELD_KEY)
    if ref is None:
        if (dag_id, name) in ORCHESTRATION_ONLY:
            return []
        return [f"{where}: no {FIELD_KEY} and not an allowed orchestration-only param"]
    model_name, _, field = str(ref).partition(".")
    model = _model(model_name)
    if model is None or field not in model.model_fields:
        return [f"{where}: {FIELD_KEY} {ref!r} names no stage parameter"]
    expected = field_schema(model, field)
    return [
        f"{where}: {problem}"
        for problem in (_schema_problems(ref, schema, expected, param.value) + _default_problems(ref, param, expected))
    ]


def _schema_problems(ref: str, schema: dict[str, Any], expected: dict[str, Any], default: Any) -> list[str]:
    problems = []
    dag_types, field_types = _types(schema), _types(expected)
    widened = default is None and "null" not in field_types and sorted(dag_types) == sorted([*field_types, "null"])
    if sorted(map(str, dag_types)) != sorted(map(str, field_types)) and not widened:
        problems.append(f"type {schema.get('type')!r} != {ref} type {expected.get('type')!r}")
    for key in sorted((set(schema) | set(expected)) - NOT_COMPARED):
        if schema.get(key, _MISSING) != expected.get(key, _MISSING):
            problems.append(f"{key} {schema.get(key, '(none)')!r} != {ref} {key} {expected.get(key, '(none)')!r}")
    return problems


def _default_problems(ref: str, param: Param, expected: dict[str, Any]) -> list[str]:
    default, stage_default = param.value, expected.get("default", _MISSING)
    if stage_default is not _MISSING and default == stage_default and type(default) is type(stage_default):
        return []
    description = param.description or ""
    override = _OVERRIDE.search(description)
    if "stage default" not in description or override is None:
        return [
            f"default {default!r} differs from {ref}'s "
            f"({'required' if stage_default is _MISSING else repr(stage_default)}) with no reason"
        ]
    if override["dag"] != repr(default):
        return [f"description states DAG default {override['dag']}, the param's is {default!r}"]
    return []


@pytest.fixture(scope="module")
def dagbag() -> DagBag:
    bag = DagBag(str(DAGS))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"hpd_ingest", "hpd_retrain", "hpd_index", "hpd_quality_report", "hpd_maintenance"}
    return bag


def test_every_dag_param_matches_its_stage_field(dagbag):
    problems, checked = [], 0
    for dag_id, dag in sorted(dagbag.dags.items()):
        for name in dag.params:
            problems += param_problems(dag_id, name, dag.params.get_param(name))
            checked += 1
    assert checked > 20
    assert problems == []


def test_orchestration_only_params_exist(dagbag):
    """The allow-list names real params that feed no stage field (a stale entry would hide nothing)."""
    for dag_id, name in ORCHESTRATION_ONLY:
        param = dagbag.dags[dag_id].params.get_param(name)
        assert FIELD_KEY not in param.schema, f"{dag_id}.{name} feeds a stage field; drop it from the list"


def test_every_param_with_a_field_names_a_real_one(dagbag):
    for dag_id, dag in dagbag.dags.items():
        for name in dag.params:
            ref = dag.params.get_param(name).schema.get(FIELD_KEY)
            if ref is None:
                continue
            model_name, _, field = ref.partition(".")
            assert _model(model_name) is not None, f"{dag_id}.{name}: {ref}"
            assert field in _model(model_name).model_fields, f"{dag_id}.{name}: {ref}"


# -- the checker catches what it should ---------------------------------------------------------------------
def _tagged(default: Any, ref: str, description: str | None = None, **schema: Any) -> Param:
    return Param(default, description=description, **schema, **{FIELD_KEY: ref})


def test_checker_flags_a_param_without_a_field():
    problems = param_problems("hpd_retrain", "gpus", Param(1, type="integer"))
    assert len(problems) == 1 and "hpd_retrain.gpus" in problems[0]
    assert param_problems("hpd_ingest", "shard_groups", Param(2, type="integer", minimum=1)) == []
    assert param_problems("hpd_retrain", "shard_groups", Param(2, type="integer", minimum=1)) != []


def test_checker_flags_unknown_fields():
    assert param_problems("d", "k", _tagged(128, "FitPCAParams.kay", type="integer", exclusiveMinimum=0))
    assert param_problems("d", "k", _tagged(128, "NoSuchParams.k", type="integer", exclusiveMinimum=0))


def test_checker_accepts_a_faithful_param():
    assert param_problems("d", "k", _tagged(128, "FitPCAParams.k", type="integer", exclusiveMinimum=0)) == []
    assert (
        param_problems("d", "n", _tagged(None, "StageCorpusParams.limit", type=["integer", "null"], exclusiveMinimum=0))
        == []
    )


@pytest.mark.parametrize(
    ("schema", "what"),
    [
        ({"type": "number", "exclusiveMinimum": 0}, "type"),
        ({"type": "integer"}, "exclusiveMinimum"),
        ({"type": "integer", "minimum": 1}, "minimum"),
        ({"type": "integer", "exclusiveMinimum": 0, "maximum": 4096}, "maximum"),
        ({"type": ["integer", "null"], "exclusiveMinimum": 0}, "type"),  # null only with a None default
    ],
)
def test_checker_flags_a_drifted_schema(schema, what):
    problems = param_problems("d", "k", _tagged(128, "FitPCAParams.k", **schema))
    assert any(what in problem for problem in problems), problems


def test_checker_flags_drifted_enum_pattern_and_items():
    amp = {"type": "string", "enum": ["auto", "off", "bf16"]}
    assert any("enum" in p for p in param_problems("d", "amp", _tagged("auto", "DistillParams.amp", **amp)))
    name = {"type": ["string", "null"], "pattern": "^.*$"}
    assert any(
        "pattern" in p
        for p in param_problems(
            "d", "name", _tagged(None, "DistillParams.name", "x. DAG default None (stage default ''): why", **name)
        )
    )
    items = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    assert any("items" in p for p in param_problems("d", "m", _tagged(["wordnet"], "AugmentParams.methods", **items)))


def test_checker_wants_a_reason_for_another_default():
    schema = {"type": "integer", "exclusiveMinimum": 0}
    assert param_problems("d", "k", _tagged(64, "FitPCAParams.k", "output dimension", **schema))
    explained = "output dimension. DAG default 64 (stage default 128): smaller"
    assert param_problems("d", "k", _tagged(64, "FitPCAParams.k", explained, **schema)) == []
    # the stated DAG default must be the param's own
    assert param_problems("d", "k", _tagged(32, "FitPCAParams.k", explained, **schema))
    # a bool default that merely equals the stage's int-wise is still a different default
    assert param_problems("d", "w", _tagged(1, "FitPCAParams.write_targets", None, type="boolean"))


# -- stage_param ------------------------------------------------------------------------------------------
def test_stage_param_needs_a_reason_for_another_default():
    with pytest.raises(ValueError, match=r"StageCorpusParams\.column"):
        stage_param(StageCorpusParams, "column", "sentence", **SHOWN)
    with pytest.raises(ValueError, match="required"):
        stage_param(StageCorpusParams, "source", "data/corpus", **SHOWN)
    with pytest.raises(ValueError):
        stage_param(DistillParams, "epochs", 3, why="", **SHOWN)


def test_stage_param_keeps_the_stage_default_without_a_reason():
    param = stage_param(DistillParams, "epochs", 5, **SHOWN)
    assert param.value == 5 and param.schema[FIELD_KEY] == "DistillParams.epochs"
    assert param.schema["title"] == "A title" and param.schema["section"] == "A section"
    assert "stage default" not in (param.description or "")
    plain = stage_param(StageCorpusParams, "column", **SHOWN)
    assert plain.value == "text" and plain.description == "text field (JSONL) or column (CSV/TSV/Parquet)"
    assert plain.schema["minLength"] == 1


def test_stage_param_description_states_the_stage_default_and_why():
    param = stage_param(StageCorpusParams, "column", "sentence", "the corpus's column", **SHOWN)
    assert param.value == "sentence"
    assert param.description == (
        "text field (JSONL) or column (CSV/TSV/Parquet). "
        "DAG default 'sentence' (stage default 'text'): the corpus's column"
    )
    required = stage_param(StageCorpusParams, "source", "data/x.tsv", "the demo's corpus", **SHOWN)
    assert "(stage default none: required): the demo's corpus" in required.description
    computed = stage_param(StageParams, "store", None, "empty: $HPD_STORE", **SHOWN)
    assert "(stage default computed when the stage runs): empty: $HPD_STORE" in computed.description
    assert computed.value is None and sorted(computed.schema["type"]) == ["null", "string"]


def test_a_models_schema_is_generated_once_however_many_params_it_feeds(monkeypatch):
    """Each task parses its DAG file, which takes many params from one model: its JSON schema is generated once, and
    a field's schema changed by whoever asked for it is not changed for the next."""

    class Counted(StageCorpusParams):
        pass

    generated = []
    original = Counted.model_json_schema.__func__
    monkeypatch.setattr(Counted, "model_json_schema", classmethod(lambda cls: generated.append(cls) or original(cls)))
    first = stage_param(Counted, "shard_rows", **SHOWN)
    assert stage_param(Counted, "shard_rows", **SHOWN).schema == first.schema
    stage_param(Counted, "source", **SHOWN)
    assert len(generated) == 1
    field_schema(Counted, "shard_rows").clear()
    assert field_schema(Counted, "shard_rows") == field_schema(StageCorpusParams, "shard_rows") != {}


def test_every_dag_param_declares_draft_7(dagbag):
    """Airflow checks a param's schema against its dialect's metaschema at each resolution: every param declares
    draft 7 (checked in a third of the time of 2020-12, the default), and its schema is a valid draft 7 schema."""
    for dag_id in sorted(dagbag.dag_ids):
        params = dagbag.dags[dag_id].params
        for name in params:
            schema = params.get_param(name).schema
            assert validator_for(schema) is Draft7Validator, f"{dag_id}.{name}"
            Draft7Validator.check_schema(schema)
