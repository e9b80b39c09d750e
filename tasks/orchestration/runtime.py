"""What the Airflow DAG tasks call at run time: the run's partition and store, stage runs, shard planning,
the events a run emits, the retrain decision, the quality gate's verdict and a partition's drift."""

from __future__ import annotations

import logging
from datetime import date
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from tasks.core import catalog, config, manifest, promoted
from tasks.core.catalog import Stage
from tasks.core.config import StageParams
from tasks.core.manifest import StageResult
from tasks.core.reports import DATA_DOCS_INDEX, VALIDATED_CARD, VALIDATION_REPORT
from tasks.core.stage_records import DistillOutcome, ValidateStats
from tasks.orchestration import assets
from tasks.orchestration.defaults import CARD_XCOM, DATA_DOCS_XCOM, PLAN_XCOM, REPORT_XCOM
from tasks.orchestration.run_records import (
    DagParams,
    DriftResult,
    IndexParams,
    IngestParams,
    QualityReportParams,
    RetrainParams,
    Verdict,
    WrittenRows,
)
from tasks.stages import registry

log = logging.getLogger(__name__)


class QualityGateFailed(AirflowFailException):
    """A validated student failed the quality gate: the run fails (no retry) and nothing is promoted."""


def push(context: dict, values: dict[str, Any]) -> None:
    """Push each of ``values`` as an XCom of the running task, under its key."""
    for key, value in values.items():
        context["ti"].xcom_push(key=key, value=value)


def partition_date(context: dict) -> date:
    """The run's partition: its partition key (a run of a partitioned asset), else the day its data interval
    starts (never the wall clock)."""
    if key := context.get("partition_key"):
        return date.fromisoformat(key)
    start = context.get("data_interval_start") or context["logical_date"]
    return start.date()


def run_params(context: dict) -> dict:
    """The run's params; a run that names no store works on the store of the events that triggered it."""
    params = dict(context["params"])
    return {**params, "store": DagParams.model_validate(params).store or assets.triggering_extra(context, "store")}


def pick(params: dict, *names: str) -> dict[str, Any]:
    """The run's params ``names``: DAG params that feed the stage field of the same name."""
    return {name: params[name] for name in names}


def with_store(values: dict, params: dict) -> dict:
    """Stage values plus the store from the run's params (default: ``$HPD_STORE`` / ``./var/store``)."""
    return {**values, "store": params.get("store") or config.default_store()}


def store_of(params: dict) -> str:
    """The run's store URI, validated (default: ``$HPD_STORE`` / ``./var/store``)."""
    return config.parse(StageParams, with_store({}, params)).store


def stage_params(stage: Stage, values: dict[str, Any], params: dict) -> StageParams:
    """``values`` and the run's store, validated into the stage's parameter model."""
    return config.parse(registry.STAGES[stage], with_store(values, params))


def staging_params(context: dict) -> StageParams:
    """The stage-corpus params of the run's partition (its source still a template)."""
    params = run_params(context)
    values = {**pick(params, "source", "column", "limit"), "ingest_date": partition_date(context)}
    return stage_params(Stage.STAGE_CORPUS, values, params)


def run_stage(stage: Stage, parsed: StageParams) -> StageResult:
    """Run ``stage`` (through the stage registry) with validated parameters, in the current Airflow task:
    its manifest records the task instance, and its inputs and outputs become the task's lineage."""
    from airflow.sdk import get_current_context

    from tasks.orchestration import openlineage

    openlineage.forget_earlier_tasks()
    with manifest.orchestrated_by(openlineage.airflow_run(get_current_context())):
        result = registry.run(stage, parsed)
    openlineage.report(result, parsed.store)
    return result


def shard_groups(params: dict, day: str) -> list[list[int]]:
    """The partition's sentences shards split round-robin into at most ``shard_groups`` non-empty groups."""
    from tasks.core import sentences

    store = store_of(params)
    count = len(sentences.shards(store, date.fromisoformat(day)))
    groups = min(IngestParams.model_validate(params).shard_groups, count)
    return [list(range(g, count, groups)) for g in range(groups)]


def run_name(context: dict) -> str:
    """A store-safe name for the Airflow run (the default name of a distill run)."""
    return catalog.airflow_run_name(context["run_id"])


def _outlet(context: dict, asset: Any) -> Any:
    """This task's outlet event for ``asset`` (its ``extra`` is what the event carries)."""
    return context["outlet_events"][asset]


def announce_partition(context: dict, day: str) -> dict[str, Any]:
    """Attach a finished partition's facts to this task's outlet events (``assets.CORPUS_PARTITION``, keyed by
    the ingest date, and ``assets.CORPUS_UPDATED``): its store, date, row counts and staging manifest."""
    from tasks.core import manifest

    store = store_of(run_params(context))
    key = catalog.partition_key(date.fromisoformat(day))
    staged, augmented = (manifest.read(store, stage, key) for stage in (Stage.STAGE_CORPUS, Stage.AUGMENT))
    rows = {
        "sentences": WrittenRows.model_validate(staged.stats).rows_written if staged else 0,
        "augmented": WrittenRows.model_validate(augmented.stats).rows_written if augmented else 0,
    }
    manifest_key = catalog.store_key(store, catalog.manifest_uri(store, Stage.STAGE_CORPUS, key))
    extra = {"store": store, "ingest_date": day, "rows": rows, "manifest": manifest_key}
    for asset in (assets.CORPUS_PARTITION, assets.CORPUS_UPDATED):
        _outlet(context, asset).extra = extra
    _outlet(context, assets.CORPUS_PARTITION).add_partitions(day)
    log.info("partition %s of %s announced: %s", day, store, rows)
    return extra


def is_backfill(context: dict) -> bool:
    """Whether the run is one of a backfill's (a DagRunType is a str enum: "backfill")."""
    return getattr(context.get("dag_run"), "run_type", None) == "backfill"


def plan_day(context: dict) -> bool:
    """Today's plan (:mod:`tasks.orchestration.day_plan`), made once: logged, pushed as the task's ``plan`` XCom
    (what every later task of the run reads, and the run's record of why), and whether the run retrains."""
    from tasks.orchestration import day_plan

    params = run_params(context)
    retrain = RetrainParams.model_validate(params)
    made = day_plan.plan(store_of(params), retrain, run_name(context), backfill=is_backfill(context))
    push(context, {PLAN_XCOM: made.model_dump(mode="json")})
    log.info("%s", made.summary())
    return made.decision.retrain


def _plan(plan: dict[str, Any]) -> Any:
    """The plan a task was handed (the ``plan`` task's XCom), typed."""
    from tasks.orchestration.day_plan import DayPlan

    return DayPlan.parse(plan, "the run's plan (XCom plan)")


def training_partitions(plan: dict[str, Any]) -> list[str]:
    """The partitions (ingest dates) the plan learns from, one mapped quality check each."""
    return [day.isoformat() for day in _plan(plan).partitions]


def fit_pca(context: dict, plan: dict[str, Any]) -> str:
    """The fit-pca stage over the plan's partitions, keeping the PCA basis the plan names (a warm start's) or
    fitting one; the PCA run's name."""
    params, planned = run_params(context), _plan(plan)
    values = {**pick(params, "teacher", "k", "mode", "max_rows"), "partitions": planned.partitions}
    parsed = stage_params(Stage.FIT_PCA, {**values, "basis_from": planned.pca_basis}, params)
    run_stage(Stage.FIT_PCA, parsed)
    return parsed.name


def check_quality(context: dict, day: str | date, pca_name: str | None) -> dict[str, Any]:
    """The quality stage on partition ``day`` (with the targets of PCA run ``pca_name``, when named): a failure fails
    the task. Its Data Docs index is pushed as XCom ``data_docs`` (the ``Data Docs`` button of
    ``hpd_quality_report``'s ``check_partition``)."""
    params = run_params(context)
    values = {**pick(params, "teacher"), "pca_name": pca_name, "ingest_date": day}
    result = run_stage(Stage.QUALITY, stage_params(Stage.QUALITY, values, params))
    push(context, {DATA_DOCS_XCOM: output_uri(result, DATA_DOCS_INDEX)})
    return result.stats


DISTILL_SETTINGS = ("teacher", "student", "student_layers", "epochs", "max_steps", "batch_size", "lr", "amp", "onnx")


def distill(context: dict, plan: dict[str, Any], pca_name: str) -> str:
    """The distill stage on the targets of ``pca_name`` with the run's params, named and warm-started as the plan
    says; the model run's name."""
    params, planned = run_params(context), _plan(plan)
    values = {**pick(params, *DISTILL_SETTINGS), "pca_name": pca_name, "name": planned.model_run}
    parsed = stage_params(Stage.DISTILL, {**values, "warm_start": planned.warm_start}, params)
    run_stage(Stage.DISTILL, parsed)
    return parsed.name


def validate(context: dict, model_run: str) -> dict[str, Any]:
    """The validate stage on ``model_run`` with the run's gate params; its verdict (a failed gate raises; a run that
    exports its warm start unchanged skips). Passed or not, the report's URI is logged and pushed as XCom
    ``validation_report``: the task's ``Validation report`` link."""
    params = run_params(context)
    _skip_a_retrain_that_kept_its_start(store_of(params), model_run)
    gate = pick(params, "min_stsb", "min_sickr", "max_regression", "max_dev_regression")
    values = {"model_run": model_run, **gate}
    result = run_stage(Stage.VALIDATE, stage_params(Stage.VALIDATE, values, params))
    report = output_uri(result, VALIDATION_REPORT)
    push(context, {REPORT_XCOM: report, CARD_XCOM: output_uri(result, VALIDATED_CARD)})
    log.info("validation report of %s: %s", model_run, report)
    return gate_verdict(result).model_dump()


def _skip_a_retrain_that_kept_its_start(store: str, model_run: str) -> None:
    """An :class:`AirflowSkipException` (validation and promotion skipped, the run green) when the distill run
    exports the promoted student it was warm-started from, unchanged: promoting it would re-encode the corpus for
    nothing, and the partitions it read stay unlearned for the next retrain."""
    distilled = manifest.read(store, Stage.DISTILL, model_run)
    if distilled is not None and DistillOutcome.parse(distilled.stats, distilled.key).exports_its_start:
        raise AirflowSkipException(
            f"distill run {model_run} exports the weights it was warm-started from (no trained checkpoint or blend "
            "scored above them where runs are selected): nothing new to validate or promote"
        )


def output_uri(result: StageResult, name: str) -> str | None:
    """The URI of the output of a stage run whose path ends with ``name`` (``report.html``, ``data_docs/index.html``;
    None: it wrote none)."""
    return next((o.uri for o in result.outputs if o.uri.endswith(f"/{name}")), None)


def partition_drift(context: dict) -> dict[str, Any]:
    """The drift stage's result for the run's partition against the promoted model's training data, flagged at
    the run's ``drift_threshold``; ``{"flagged": False, "model_run": None}`` while no model is promoted."""
    params = run_params(context)
    store, day = store_of(params), partition_date(context)
    model_run = promoted.model_run(store)
    if model_run is None:
        log.info("drift of %s: no promoted model in %s, so no training data to compare with", day, store)
        return {"flagged": False, "model_run": None}
    threshold = QualityReportParams.model_validate(params).drift_threshold
    values = {"ingest_date": day, "model_run": model_run, "threshold": threshold}
    result = run_stage(Stage.DRIFT, stage_params(Stage.DRIFT, values, params))
    return {**result.stats, "manifest": catalog.store_key(store, result.manifest_uri)}


def announce_drift(context: dict, drift: dict[str, Any]) -> dict[str, Any]:
    """A flagged drift becomes this task's ``assets.CORPUS_UPDATED`` event (a retrain trigger) with reason
    ``drift``, its store, partition, score, threshold, model run and manifest; otherwise the task is skipped,
    and skipped tasks emit no event."""
    found = DriftResult.model_validate(drift)
    if not found.flagged:
        raise AirflowSkipException("no drift flagged: no retrain trigger")
    day = partition_date(context).isoformat()
    extra = {
        "store": store_of(run_params(context)),
        "ingest_date": day,
        "reason": "drift",
        "score": found.score,
        "threshold": found.threshold,
        "model_run": found.model_run,
        "manifest": found.manifest,
    }
    _outlet(context, assets.CORPUS_UPDATED).extra = extra
    log.warning("partition %s drifted from the training data of %s: retrain triggered", day, found.model_run)
    return extra


def announce_promotion(context: dict, model_run: str, verdict: dict[str, Any]) -> dict[str, Any]:
    """Attach the promoted model run, its store, scores and report to this task's ``assets.PROMOTED_MODEL`` event."""
    store = store_of(run_params(context))
    decided = Verdict.model_validate(verdict)
    extra = {"store": store, "model_run": model_run, "scores": decided.scores, "report": decided.report}
    _outlet(context, assets.PROMOTED_MODEL).extra = extra
    log.info("model run %s promoted in %s", model_run, store)
    return extra


def model_to_index(context: dict) -> str | None:
    """The model run ``hpd_index`` encodes with: its params', else the promotion event's that triggered it, else
    None (the promoted one). A run with none of them while nothing is promoted is skipped."""
    named = IndexParams.model_validate(context["params"]).model_run or assets.triggering_extra(
        context, "model_run", assets.PROMOTED_MODEL
    )
    if named is None and promoted.model_run(store_of(run_params(context))) is None:
        raise AirflowSkipException("no model is promoted yet: nothing to index with (hpd_retrain promotes one)")
    return named


def gate_verdict(result: StageResult) -> Verdict:
    """The validate stage's decision with the report's URI; :class:`QualityGateFailed` (its reasons, the
    student's scores against the reference and the report) when the gate failed."""
    stats = ValidateStats.parse(result.stats, f"the stats of {result.manifest_uri}")
    gate, report = stats.gate, output_uri(result, VALIDATION_REPORT)
    scores = stats.sts.student
    if not gate.passed:
        raise QualityGateFailed(
            f"quality gate failed: {'; '.join(gate.reasons)}. Student scores: {_scores(scores)}; "
            f"{gate.reference}: {_scores(gate.reference_scores)}. Nothing was promoted. Report: {report}"
        )
    log.info("quality gate passed: %s; report %s", _scores(scores), report)
    return Verdict(passed=gate.passed, reasons=gate.reasons, scores=scores, report=report)


def _scores(scores: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in scores.items()) or "none"
