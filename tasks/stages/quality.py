"""Data quality with great-expectations 1.x: the suites in ``schemas/expectations`` run through checkpoints.

Each suite applies to a profile of a dataset shard: ``sentences`` (the rows as they are, plus the
text length), ``embeddings`` (one row per vector: id, dimension, finiteness, L2 norm) and
``dimension_variance`` (one row per dimension of the projected targets). A failed check raises
:class:`QualityError` listing every failing expectation with a sample of the bad rows; the
``quality`` stage checks a partition's datasets, each shard read verified against the sha256 its
writer's manifest records, and publishes its results only when all pass: ``results.json`` and the
great-expectations Data Docs of the run, built to open offline (:mod:`tasks.stages.data_docs`), whose index
``results.json`` names by store-relative key under ``data_docs`` (:func:`data_docs_index` gives its URI).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from datetime import date
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ConfigDict

from tasks.core import catalog, manifest, parquet_shards, sentences, storage, uris
from tasks.core.catalog import Dataset, Stage
from tasks.core.stage_records import Record
from tasks.stages import data_docs
from tasks.stages.params import QualityParams

SAMPLE_ROWS = 5

log = logging.getLogger(__name__)


class QualityError(ValueError):
    """Data that fails its expectation suite; the message lists the failures and sample bad rows."""


class ExpectationSpec(Record):
    """One expectation of a suite: its great-expectations type and kwargs (``"$name"``: a setting's value)."""

    type: str
    kwargs: dict[str, Any]


class SuiteSpec(Record):
    """An expectation suite of ``schemas/expectations``: the profile it checks and its expectations."""

    profile: str
    expectations: list[ExpectationSpec]


class SuiteSettings(Record):
    """The values a suite's ``"$name"`` kwargs take; each suite uses some (``dim`` None: as the shard records)."""

    model_config = ConfigDict(extra="forbid")

    max_chars: int | None = None
    dim: int | None = None
    min_norm: float | None = None
    max_norm: float | None = None
    min_variance: float | None = None


class Outcome(Record):
    """One expectation's result: its type and kwargs, whether it passed, and a sample of the bad rows."""

    expectation: str
    kwargs: dict[str, Any]
    success: bool
    unexpected_count: int | None
    sample_rows: list[dict[str, Any]]


class CheckResult(Record):
    """A suite's results on one shard."""

    uri: str
    suite: str
    rows: int
    expectations: list[Outcome]


class QualityResults(Record):
    """A quality run's ``results.json``: its partition, the store key of its Data Docs' index (None in runs from
    before the Data Docs) and every check."""

    partition: str
    data_docs: str | None = None
    checks: list[CheckResult]


class QualityStats(Record):
    """The quality stage's stats: how many checks, over how many rows, all passed."""

    checks: int
    rows: int
    passed: bool


def profile(kind: str, table: pa.Table) -> pd.DataFrame:
    """The frame a suite of profile ``kind`` is checked against."""
    if kind == "sentences":
        return pd.DataFrame(
            {
                "sentence_id": table.column("sentence_id").to_pylist(),
                "text": table.column("text").to_pylist(),
                "text_length": pc.utf8_length(table.column("text")).to_pylist(),
            }
        )
    vector_column = "embedding" if "embedding" in table.column_names else "target"
    if kind == "embeddings":
        column = table.column(vector_column).combine_chunks()
        rows = [np.asarray(v, dtype=np.float64) for v in column.to_pylist()]
        return pd.DataFrame(
            {
                "sentence_id": table.column("sentence_id").to_pylist(),
                "dim": pc.list_value_length(column).to_numpy(zero_copy_only=False),
                "finite": [bool(np.isfinite(r).all()) for r in rows],
                "norm": [float(np.linalg.norm(r)) if np.isfinite(r).all() else np.nan for r in rows],
            }
        )
    values = parquet_shards.vectors(table, vector_column).astype(np.float64)
    return pd.DataFrame({"dimension": np.arange(values.shape[1]), "variance": values.var(axis=0)})


@cache
def suite_spec(name: str) -> SuiteSpec:
    path = resources.files("schemas").joinpath("expectations", f"{name}.json")
    return SuiteSpec.parse(json.loads(path.read_text()), str(path))


def _fill(value: Any, settings: dict[str, Any]) -> Any:
    """``value`` with each ``"$name"`` replaced by setting ``name`` (a KeyError names one that is not set)."""
    if isinstance(value, str) and value.startswith("$"):
        return settings[value[1:]]
    if isinstance(value, list):
        return [_fill(v, settings) for v in value]
    return value


def check(suite: str, table: pa.Table, uri: str, **settings: Any) -> CheckResult:
    """Run suite ``suite`` on a shard through a great-expectations checkpoint; raise on failure."""
    return _checked(_context(), suite, table, uri, SuiteSettings(**settings))[0]


def _checked(
    context: Any, suite: str, table: pa.Table, uri: str, settings: SuiteSettings
) -> tuple[CheckResult, list[Any]]:
    """:func:`check` in ``context``, and the identifiers of the validation results its checkpoint stored (for
    Data Docs)."""
    spec = suite_spec(suite)
    frame = profile(spec.profile, table)
    result = _checkpoint(context, suite, spec, settings).run(batch_parameters={"dataframe": frame})
    outcomes = [_outcome(item, frame) for run in result.run_results.values() for item in run.results]
    failed = [o for o in outcomes if not o.success]
    _log_outcomes(suite, uri, len(frame), outcomes)
    if failed:
        lines = [f"{uri}: {len(failed)} of {len(outcomes)} expectations of suite {suite!r} failed:"]
        for o in failed:
            lines.append(
                f"  {o.expectation}({o.kwargs}): {o.unexpected_count} bad row(s), e.g. {o.sample_rows[:SAMPLE_ROWS]}"
            )
        raise QualityError("\n".join(lines))
    checked = CheckResult(uri=uri, suite=suite, rows=len(frame), expectations=outcomes)
    return checked, list(result.run_results)


def _checkpoint(context: Any, suite: str, spec: SuiteSpec, settings: SuiteSettings) -> Any:
    """A new checkpoint in ``context`` of suite ``suite`` (its expectations filled in from ``settings``) on a
    dataframe, named after the suite and how many the context holds: the same names in every run."""
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    name = f"{suite}-{len(context.suites.all())}"
    gx_suite = context.suites.add(gx.ExpectationSuite(name=name))
    values = settings.model_dump(exclude_none=True)
    for expectation in spec.expectations:
        kwargs = {k: _fill(v, values) for k, v in expectation.kwargs.items()}
        gx_suite.add_expectation(ExpectationConfiguration(type=expectation.type, kwargs=kwargs).to_domain_obj())
    batch = context.data_sources.get("hpd").add_dataframe_asset(name).add_batch_definition_whole_dataframe("all")
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=gx_suite))
    return context.checkpoints.add(
        gx.Checkpoint(name=name, validation_definitions=[definition], result_format={"result_format": "COMPLETE"})
    )


def _outcome(item: Any, frame: pd.DataFrame) -> Outcome:
    """One expectation's result: its type and kwargs, whether it passed, and a sample of the bad rows."""
    kwargs = {k: v for k, v in item.expectation_config.kwargs.items() if k != "batch_id"}
    rows = (item.result.get("unexpected_index_list") or [])[:SAMPLE_ROWS]
    return Outcome(
        expectation=item.expectation_config.type,
        kwargs=kwargs,
        success=bool(item.success),
        unexpected_count=item.result.get("unexpected_count"),
        sample_rows=frame.iloc[list(rows)].to_dict("records") if rows else [],
    )


def _log_outcomes(suite: str, uri: str, rows: int, outcomes: list[Outcome]) -> None:
    """How many expectations of ``suite`` passed on the shard, naming those that failed."""
    failed = [o for o in outcomes if not o.success]
    log.log(
        logging.WARNING if failed else logging.INFO,
        "quality: suite %s on %s (%d rows): %d of %d expectations passed%s",
        suite,
        uris.redact(uri),
        rows,
        len(outcomes) - len(failed),
        len(outcomes),
        "".join(f"; failed {o.expectation} ({o.unexpected_count} bad rows)" for o in failed),
    )


def _context() -> Any:
    """A new in-memory great-expectations context (one a run: what it names depends on nothing before it)."""
    import great_expectations as gx

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = {"globally": False}
    context.data_sources.add_pandas("hpd")
    return context


def run(params: QualityParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Check a partition's sentences, teacher embeddings and (optionally) a PCA run's targets."""
    checks = planned_checks(params)
    stage_run = manifest.StageRun(
        stage=Stage.QUALITY,
        key=catalog.partition_key(params.ingest_date),
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[output.as_input() for output, _, _ in checks],
    )
    if skipped := stage_run.skip_result(force):
        return skipped
    results: list[CheckResult] = []
    validated: list[Any] = []
    context = _context()
    with stage_run.phase("check"):
        for output, suite, settings in checks:
            table = storage.read_parquet(output.uri, sha256=output.sha256)
            if suite == "embeddings" and settings.dim is None:
                settings = settings.model_copy(update={"dim": table.schema.field("embedding").type.list_size})
            result, identifiers = _checked(context, suite, table, output.uri, settings)
            results.append(result)
            validated.extend(identifiers)
    log.info("quality %s: all %d checks passed", stage_run.key, len(results))
    docs = catalog.quality_data_docs_prefix(params.store, params.ingest_date, stage_run.run_id)
    index_uri = uris.join(docs, "index.html")
    with tempfile.TemporaryDirectory(prefix="hpd-data-docs-") as folder:
        with stage_run.phase("data_docs"):
            site = data_docs.render(context, validated, Path(folder))
        index = catalog.store_key(params.store, index_uri)
        recorded = QualityResults(partition=stage_run.key, data_docs=index, checks=results)
        body = json.dumps(recorded.model_dump(), indent=2, default=str)
        uri = catalog.quality_results_uri(params.store, params.ingest_date, stage_run.run_id)
        stage_run.write_output(uri, body.encode())
        with stage_run.phase("publish_data_docs"):
            data_docs.publish(stage_run, site, docs)
    log.info("quality %s: Data Docs %s", stage_run.key, uris.redact(index_uri))
    stage_run.stats = QualityStats(checks=len(results), rows=sum(r.rows for r in results), passed=True).model_dump()
    return stage_run.publish()


def data_docs_index(store: str, ingest_date: date) -> str | None:
    """The URI of the Data Docs index of the quality run published for partition ``ingest_date`` (resolved
    against ``store``), or None when none is (no run, or one from before the Data Docs)."""
    published = manifest.read(store, Stage.QUALITY, catalog.partition_key(ingest_date))
    if published is None:
        return None
    index = uris.join(catalog.quality_data_docs_prefix(store, ingest_date, published.run_id), "index.html")
    return index if any(output.uri == index for output in published.outputs) else None


def planned_checks(params: QualityParams) -> list[tuple[manifest.Output, str, SuiteSettings]]:
    """(a published shard as its writer's manifest records it, suite, suite settings) for the partition: its
    sentences, what the teacher encoded of them (its sample: a shard of which none is sampled is empty, and not
    checked) and the PCA run's targets."""
    shards = sentences.published(params.store, params.ingest_date)
    if not shards:
        raise QualityError(f"{params.store}: nothing staged for {catalog.partition_key(params.ingest_date)}")
    checks = [(s, "sentences", SuiteSettings(max_chars=params.max_chars)) for s in shards]
    if params.teacher:
        embedding_settings = SuiteSettings(dim=params.teacher_dim, min_norm=params.min_norm, max_norm=params.max_norm)
        for shard in shards:
            key = catalog.teacher_shard_key(params.teacher, params.ingest_date, shard.uri)
            encoded = manifest.read(params.store, Stage.ENCODE_TEACHER, key)
            checks.extend((o, "embeddings", embedding_settings) for o in (encoded.outputs if encoded else ()) if o.rows)
    if params.pca_name and params.teacher:
        fitted = manifest.read(params.store, Stage.FIT_PCA, catalog.pca_key(params.teacher, params.pca_name))
        if fitted is None:
            raise QualityError(f"{params.store}: no PCA run {params.pca_name!r} for {params.teacher!r}")
        targets = fitted.outputs_of(Dataset.PROJECTED_TARGETS)
        checks.extend((o, "targets", SuiteSettings(min_variance=params.min_variance)) for o in targets if o.rows)
    return checks
