"""OpenLineage from the stage tasks: each task reports what its stage's manifest lists as read and as written to
Airflow's hook-lineage collector, which the OpenLineage provider turns into the task's input and output datasets
(the objects' store URIs: ``file://`` or ``s3://``), each dataset shard with the name of its data contract, which
:mod:`tasks.orchestration.lineage_extractor` turns into a schema facet. Consecutive tasks name the same objects, so
a chain's events link the corpus, teacher embeddings, targets, student and index. The provider emits nothing until
a transport is configured (``[openlineage] transport``, e.g. HTTP to Marquez, or a file)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk.lineage import get_hook_lineage_collector

from tasks.core import catalog

CONTRACT = "hpd.contract"  # the asset extra naming a dataset shard's data contract
EXTRACTOR = "tasks.orchestration.lineage_extractor.StageTaskExtractor"  # [openlineage] extractors

if TYPE_CHECKING:  # DAG files import this module (defaults.py): nothing heavy at parse time
    from tasks.core.manifest import StageResult


def forget_earlier_tasks(context: object = None) -> None:
    """Start this task's lineage afresh: a process that ran other tasks before (``dag.test`` runs every task of a
    run in one) would otherwise report theirs too. Every task's ``on_execute_callback`` (``defaults``)."""
    get_hook_lineage_collector.cache_clear()


def report(result: StageResult, store: str) -> None:
    """The stage run's inputs and outputs, as its manifests list them, and its manifest and kept version (which
    the next stage may read, as build-index reads the student's) as this task's lineage; also when the run was
    skipped: the manifests still say what the outputs were made from. A dataset shard carries its contract's name."""
    collector = get_hook_lineage_collector()
    for read in result.inputs:
        collector.add_input_asset(None, uri=read.uri, asset_extra=_contract(catalog.dataset_at(store, read.uri)))
    for written in result.outputs:
        collector.add_output_asset(None, uri=written.uri, asset_extra=_contract(written.contract))
    if result.manifest is not None:
        collector.add_output_asset(None, uri=result.manifest_uri)
        if catalog.Stage(result.manifest.stage) in catalog.VERSIONED:  # what the next stage records reading
            collector.add_output_asset(None, uri=result.manifest.version_uri(store))


def _contract(name: str | None) -> dict[str, str] | None:
    return None if name is None else {CONTRACT: name}


def airflow_run(context: dict) -> dict[str, str | int]:
    """The task instance a stage ran in, as its manifest records it."""
    ti = context["ti"]
    return {
        "orchestrator": "airflow",
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "try_number": ti.try_number,
        "map_index": ti.map_index,
    }
