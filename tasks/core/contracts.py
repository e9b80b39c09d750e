"""Data contracts: the versioned Arrow schemas in ``schemas/datasets`` and their enforcement.

Writers call :func:`conform` before publishing; a table that does not match its contract is
refused with a :class:`ContractError` naming the column, so nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import pyarrow as pa
from pydantic import TypeAdapter

META_CONTRACT = b"hpd.contract"
META_VERSION = b"hpd.contract_version"
META_DIM = b"hpd.dim"
META_MODEL = b"hpd.model_id"

_SCALAR_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float32": pa.float32(),
    "float16": pa.float16(),
    "float64": pa.float64(),
    "date32": pa.date32(),
    "bool": pa.bool_(),
}


class ContractError(ValueError):
    """A table does not match its data contract."""


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    nullable: bool
    value_types: tuple[str, ...] = ()
    description: str = ""
    dictionary: bool = False  # few distinct values: dictionary-encoded in Parquet (no other column is)


@dataclass(frozen=True)
class Contract:
    """One versioned dataset contract, as declared in ``schemas/datasets/<name>.json``."""

    name: str
    version: int
    fields: tuple[Field, ...]
    description: str = ""

    @property
    def dictionary_columns(self) -> list[str]:
        """The columns Parquet dictionary-encodes: those declared ``"dictionary": true``."""
        return [f.name for f in self.fields if f.dictionary]

    @property
    def embedding_field(self) -> Field | None:
        return next((f for f in self.fields if f.type == "embedding"), None)

    def arrow_schema(
        self, dim: int | None = None, model_id: str | None = None, value_type: str = "float32"
    ) -> pa.Schema:
        """The concrete Arrow schema; embedding datasets need ``dim`` and ``model_id``."""
        metadata = {META_CONTRACT: self.name.encode(), META_VERSION: str(self.version).encode()}
        arrow_fields = []
        for field in self.fields:
            if field.type == "embedding":
                if dim is None or dim < 1 or not model_id:
                    raise ContractError(f"{self.name}: an embedding dataset needs dim >= 1 and a model_id")
                if value_type not in field.value_types:
                    raise ContractError(
                        f"{self.name}.{field.name}: value type {value_type!r} not in {list(field.value_types)}"
                    )
                arrow_type = pa.list_(_SCALAR_TYPES[value_type], dim)
                metadata[META_DIM] = str(dim).encode()
                metadata[META_MODEL] = model_id.encode()
            else:
                arrow_type = _SCALAR_TYPES[field.type]
            arrow_fields.append(pa.field(field.name, arrow_type, nullable=field.nullable))
        return pa.schema(arrow_fields, metadata=metadata)

    def conform(
        self, table: pa.Table, dim: int | None = None, model_id: str | None = None, value_type: str = "float32"
    ) -> pa.Table:
        """Check ``table`` against this contract and return it with the contract's schema and metadata.

        Refuses missing, extra or mistyped columns, nulls in non-nullable columns and non-finite
        embedding values, naming the column. Columns are reordered to the contract's order.
        """
        schema = self.arrow_schema(dim, model_id, value_type)
        missing = [name for name in schema.names if name not in table.column_names]
        if missing:
            raise ContractError(f"{self.name}: missing column(s) {missing}")
        extra = [name for name in table.column_names if name not in schema.names]
        if extra:
            raise ContractError(f"{self.name}: unexpected column(s) {extra}")
        columns = []
        for field in schema:
            column = table.column(field.name)
            if not column.type.equals(field.type):
                raise ContractError(
                    f"{self.name}.{field.name}: type {column.type} does not match the contract's {field.type}"
                )
            if not field.nullable and column.null_count:
                raise ContractError(
                    f"{self.name}.{field.name}: {column.null_count} null value(s) in a non-nullable column"
                )
            if pa.types.is_fixed_size_list(field.type):
                _check_finite(self.name, field.name, column)
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=schema)


def _check_finite(contract: str, column_name: str, column: pa.ChunkedArray) -> None:
    import numpy as np

    for chunk in column.chunks:
        values = chunk.flatten().to_numpy(zero_copy_only=False)
        bad = ~np.isfinite(values)
        if bad.any():
            first_row = int(np.flatnonzero(bad)[0]) // chunk.type.list_size
            raise ContractError(
                f"{contract}.{column_name}: {int(bad.sum())} NaN or infinite value(s), first in row {first_row}"
            )


@cache
def load(name: str) -> Contract:
    """The contract ``name`` from ``schemas/datasets``."""
    path = resources.files("schemas").joinpath("datasets", f"{name}.json")
    if not path.is_file():
        raise ContractError(f"no data contract named {name!r}")
    contract = TypeAdapter(Contract).validate_json(path.read_text())
    for field in contract.fields:
        if field.type != "embedding" and field.type not in _SCALAR_TYPES:
            raise ContractError(f"contract {name}: unknown type {field.type!r} for {field.name}")
    return contract


def identify(schema: pa.Schema) -> tuple[str, int] | None:
    """The (contract name, version) recorded in a written table's schema metadata, if any."""
    metadata = schema.metadata or {}
    if META_CONTRACT not in metadata:
        return None
    return metadata[META_CONTRACT].decode(), int(metadata[META_VERSION])
