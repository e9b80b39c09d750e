"""Data quality with great-expectations 1.x: the suites in ``schemas/expectations`` run through checkpoints.

Each suite applies to a profile of a dataset shard: ``sentences`` (the rows as they are, plus the
text length), ``embeddings`` (one row per vector: id, dimension, finiteness, L2 norm) and
``dimension_variance`` (one row per dimension of the projected targets). A failed check raises
:class:`QualityError` listing every failing expectation with a sample of the bad rows; the
``quality`` stage checks a partition's datasets and publishes its results only when all pass.
"""

from __future__ import annotations

import json
import os
from datetime import date
from functools import cache
from importlib import resources

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from tasks import datasets, manifest, models, sentences, storage
from tasks.config import StageParams

STAGE = "quality"
SAMPLE_ROWS = 5


class QualityError(ValueError):
    """Data that fails its expectation suite; the message lists the failures and sample bad rows."""


class QualityParams(StageParams):
    ingest_date: date = Field(description="the partition to check")
    teacher: str | None = Field(models.DEFAULT_TEACHER, description="also check this teacher's embeddings")
    teacher_dim: int | None = Field(None, gt=0, description="expected teacher dimension (default: as recorded)")
    max_chars: int = Field(1000, gt=0)
    min_norm: float = Field(0.5, ge=0, description="embedding L2 norm bounds")
    max_norm: float = Field(1.5, gt=0)
    pca_name: str | None = Field(None, description="also check the targets of this PCA run")
    min_variance: float = Field(1e-8, ge=0, description="smallest acceptable per-dimension target variance")


def profile(kind: str, table: pa.Table) -> pd.DataFrame:
    """The frame a suite of profile ``kind`` is checked against."""
    if kind == "sentences":
        return pd.DataFrame({"sentence_id": table.column("sentence_id").to_pylist(),
                             "text": table.column("text").to_pylist(),
                             "text_length": pc.utf8_length(table.column("text")).to_pylist()})
    vector_column = "embedding" if "embedding" in table.column_names else "target"
    if kind == "embeddings":
        column = table.column(vector_column).combine_chunks()
        rows = [np.asarray(v, dtype=np.float64) for v in column.to_pylist()]
        return pd.DataFrame({"sentence_id": table.column("sentence_id").to_pylist(),
                             "dim": pc.list_value_length(column).to_numpy(zero_copy_only=False),
                             "finite": [bool(np.isfinite(r).all()) for r in rows],
                             "norm": [float(np.linalg.norm(r)) if np.isfinite(r).all() else np.nan for r in rows]})
    values = datasets.vectors(table, vector_column).astype(np.float64)
    return pd.DataFrame({"dimension": np.arange(values.shape[1]), "variance": values.var(axis=0)})


@cache
def suite_spec(name: str) -> dict:
    path = resources.files("schemas").joinpath("expectations", f"{name}.json")
    return json.loads(path.read_text())


def _fill(value, settings: dict):
    if isinstance(value, str) and value.startswith("$"):
        return settings[value[1:]]
    if isinstance(value, list):
        return [_fill(v, settings) for v in value]
    return value


def check(suite: str, table: pa.Table, uri: str, **settings) -> dict:
    """Run suite ``suite`` on a shard through a great-expectations checkpoint; raise on failure."""
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    spec = suite_spec(suite)
    frame = profile(spec["profile"], table)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    context = _context()
    name = f"{suite}-{len(context.suites.all())}"
    gx_suite = context.suites.add(gx.ExpectationSuite(name=name))
    for expectation in spec["expectations"]:
        kwargs = {k: _fill(v, settings) for k, v in expectation["kwargs"].items()}
        gx_suite.add_expectation(ExpectationConfiguration(type=expectation["type"], kwargs=kwargs).to_domain_obj())
    batch = context.data_sources.get("hpd").add_dataframe_asset(name).add_batch_definition_whole_dataframe("all")
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=gx_suite))
    checkpoint = context.checkpoints.add(gx.Checkpoint(name=name, validation_definitions=[definition],
                                                       result_format={"result_format": "COMPLETE"}))
    result = checkpoint.run(batch_parameters={"dataframe": frame})
    outcomes = []
    for run in result.run_results.values():
        for item in run.results:
            kwargs = {k: v for k, v in item.expectation_config.kwargs.items() if k != "batch_id"}
            rows = (item.result.get("unexpected_index_list") or [])[:SAMPLE_ROWS]
            outcomes.append({"expectation": item.expectation_config.type, "kwargs": kwargs,
                             "success": bool(item.success), "unexpected_count": item.result.get("unexpected_count"),
                             "sample_rows": frame.iloc[list(rows)].to_dict("records") if rows else []})
    failed = [o for o in outcomes if not o["success"]]
    if failed:
        lines = [f"{uri}: {len(failed)} of {len(outcomes)} expectations of suite {suite!r} failed:"]
        for o in failed:
            lines.append(f"  {o['expectation']}({o['kwargs']}): {o['unexpected_count']} bad row(s), "
                         f"e.g. {o['sample_rows'][:SAMPLE_ROWS]}")
        raise QualityError("\n".join(lines))
    return {"uri": uri, "suite": suite, "rows": len(frame), "expectations": outcomes}


@cache
def _context():
    import great_expectations as gx

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = {"globally": False}
    context.data_sources.add_pandas("hpd")
    return context


def run(params: QualityParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Check a partition's sentences, teacher embeddings and (optionally) a PCA run's targets."""
    key = sentences.partition_key(params.ingest_date)
    shards = sentences.published(params.store, params.ingest_date)
    if not shards:
        raise QualityError(f"{params.store}: nothing staged for {key}")
    # (published output as its writer's manifest records it, suite, suite settings)
    checks: list[tuple[dict, str, dict]] = [(shard, "sentences", {"max_chars": params.max_chars}) for shard in shards]
    if params.teacher:
        for shard in shards:
            encoded = manifest.read(params.store, "encode_teacher",
                                    datasets.teacher_shard_key(params.teacher, params.ingest_date, shard["uri"]))
            for output in (encoded or {"outputs": []})["outputs"]:
                checks.append((output, "embeddings", {"dim": params.teacher_dim, "min_norm": params.min_norm,
                                                      "max_norm": params.max_norm}))
    if params.pca_name and params.teacher:
        fitted = manifest.read(params.store, "fit_pca", f"{models.slug(params.teacher)}/{params.pca_name}")
        if fitted is None:
            raise QualityError(f"{params.store}: no PCA run {params.pca_name!r} for {params.teacher!r}")
        checks.extend((o, "targets", {"min_variance": params.min_variance})
                      for o in fitted["outputs"] if o["contract"] == "projected_targets")
    inputs = [{"uri": o["uri"], "sha256": o["sha256"], "rows": o["rows"]} for o, _, _ in checks]
    stage_run = manifest.StageRun(stage=STAGE, key=key, store=params.store, params=params.model_dump(mode="json"),
                                  inputs=inputs)
    if not force and (done := stage_run.completed()) is not None:
        return manifest.StageResult(stage_run.uri, skipped=True, manifest=done)
    results = []
    with stage_run.phase("check"):
        for output, suite, settings in checks:
            uri = output["uri"]
            table = storage.read_parquet(uri)
            if suite == "embeddings" and settings["dim"] is None:
                settings = {**settings, "dim": table.schema.field("embedding").type.list_size}
            results.append(check(suite, table, uri, **settings))
    body = json.dumps({"partition": key, "checks": results}, indent=2, default=str).encode()
    out = storage.join(params.store, "quality", key, stage_run.fingerprint[:12], "results.json")
    storage.write_bytes(out, body)
    stage_run.add_output(out, manifest.sha256_hex(body), len(body), None)
    stage_run.stats = {"checks": len(results), "rows": sum(r["rows"] for r in results), "passed": True}
    return manifest.StageResult(stage_run.uri, skipped=False, manifest=stage_run.publish())

