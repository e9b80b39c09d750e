"""The OpenLineage extractor of the stage tasks: the datasets a task reported to Airflow's hook-lineage collector
(:func:`tasks.orchestration.openlineage.report`), each dataset shard with a schema facet and a documentation facet
from its data contract (``schemas/datasets``). Enabled by the provider's config, which every deployment here sets:
``[openlineage] extractors = tasks.orchestration.lineage_extractor.StageTaskExtractor``. Only the OpenLineage
provider imports this module (when it emits an event), never a DAG file."""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.openlineage.facet import (
    Dataset,
    DocumentationDatasetFacet,
    SchemaDatasetFacet,
    SchemaDatasetFacetFields,
)
from airflow.providers.openlineage.extractors.base import BaseExtractor, OperatorLineage
from airflow.providers.openlineage.utils.utils import translate_airflow_asset
from airflow.sdk.lineage import get_hook_lineage_collector

from tasks.core import contracts
from tasks.orchestration.openlineage import CONTRACT


class StageTaskExtractor(BaseExtractor):
    """Inputs and outputs of a ``@task`` that ran a stage; a task that reported none falls back to the provider's
    own handling (hook lineage, then inlets and outlets)."""

    @classmethod
    def get_operator_classnames(cls) -> list[str]:
        return ["_PythonDecoratedOperator"]

    def _execute_extraction(self) -> OperatorLineage | None:
        return None  # as the task starts nothing has been read yet

    def extract_on_complete(self, task_instance: Any) -> OperatorLineage | None:
        collector = get_hook_lineage_collector()
        if not collector.has_collected:
            return None
        collected = collector.collected_assets
        return OperatorLineage(
            inputs=[d for a in collected.inputs if (d := with_contract(a.asset, a.context)) is not None],
            outputs=[d for a in collected.outputs if (d := with_contract(a.asset, a.context)) is not None],
        )


def with_contract(asset: Any, context: Any) -> Dataset | None:
    """The OpenLineage dataset of ``asset`` (as the provider translates its URI), with the schema and description
    of the data contract its extra names, if any."""
    dataset = translate_airflow_asset(asset, context)
    name = (asset.extra or {}).get(CONTRACT)
    if dataset is None or name is None:
        return dataset
    contract = contracts.load(name)
    schema = [
        SchemaDatasetFacetFields(f.name, _type(f), f.description or None, ordinal_position=position)
        for position, f in enumerate(contract.fields, start=1)
    ]
    facets = {
        **(dataset.facets or {}),
        "schema": SchemaDatasetFacet(fields=schema),
        "documentation": DocumentationDatasetFacet(
            description=f"{contract.description} Data contract {contract.name} v{contract.version}."
        ),
    }
    return Dataset(namespace=dataset.namespace, name=dataset.name, facets=facets)


def _type(field: contracts.Field) -> str:
    """A contract field's type as a schema facet names it: an embedding is a fixed-size list of floats."""
    return f"fixed_size_list<{'|'.join(field.value_types)}>" if field.type == "embedding" else field.type
