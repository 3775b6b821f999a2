"""How a reader shows one store of an operator, in the shape Spark's ``statestore`` source gives.

A view picks a column family and turns its encoded keys and values into Arrow rows: ``key`` and
``value`` structs in the state's own schemas, renamed or reshaped where Spark's differ, and the
same rows as changes for the change feed. The views of one kind of state (a join side's rows, a
``StatefulProcessor``'s lists and maps) live beside the operator that keeps it; each operator
class says which of them shows its state (:mod:`sparkstate.operators.state_layout`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sparkstate.store.families import ColumnFamily

__all__ = ["CHANGE_COLUMNS", "KeyValueView", "StateView", "as_struct"]

#: Columns of the change feed before a view's own.
CHANGE_COLUMNS = [pa.field("batch_id", pa.int64()), pa.field("change_type", pa.string())]


def as_struct(table: pa.Table | pa.RecordBatch, valid: Any = None) -> pa.StructArray:
    """The columns of ``table`` as one struct array (null where ``valid`` is false)."""
    columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in table.columns]
    mask = None if valid is None else pa.array(~valid)
    if not columns:
        return (
            pa.StructArray.from_arrays([], fields=[], mask=mask)
            if mask is not None
            else (pa.array([{}] * table.num_rows, pa.struct([])))
        )
    return pa.StructArray.from_arrays(columns, fields=list(table.schema), mask=mask)


class StateView(ABC):
    """One readable store of an operator: its column family and the rows it shows."""

    def __init__(self, family: str) -> None:
        self.family = family

    @property
    @abstractmethod
    def schema(self) -> pa.Schema:
        """The columns of a row of state (``partition_id`` is added by the reader)."""

    @abstractmethod
    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        """The rows of encoded ``keys`` and ``values`` (a None value: the key was deleted; its
        row has a null value)."""

    def changes(
        self,
        families: dict[str, ColumnFamily],
        batch_id: int,
        keys: list[bytes],
        values: Sequence[bytes | None],
    ) -> pa.Table:
        """The change feed rows of one batch: ``update`` for a write, ``delete`` for a removal."""
        rows = self.rows(families, keys, values)
        kinds = self._change_kinds(families, keys, values)
        return pa.Table.from_arrays(
            [pa.array([batch_id] * rows.num_rows, pa.int64()), pa.array(kinds, pa.string())]
            + rows.columns,
            schema=pa.schema(CHANGE_COLUMNS + list(rows.schema)),
        )

    def _change_kinds(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> list[str]:
        return ["update" if v is not None else "delete" for v in values]


class KeyValueView(StateView):
    """One row per key: the key struct and the value struct, the value's fields renamed or
    replaced as ``value_schema`` and ``convert`` say."""

    def __init__(
        self,
        family: str,
        key_schema: pa.Schema,
        value_schema: pa.Schema,
        *,
        key_shape: Any = None,
        value_shape: Any = None,
        row_shape: Any = None,
    ) -> None:
        """``key_shape`` and ``value_shape`` turn decoded keys or values into what the row
        shows; ``row_shape(keys, values)`` makes the value from both, where Spark's value
        repeats the key's columns."""
        super().__init__(family)
        self._key_shape = key_shape or (lambda t: t)
        shape = value_shape or (lambda t: t)
        self._row_shape = row_shape or (lambda _keys, values: shape(values))
        self.key_type = as_struct(self._key_shape(key_schema.empty_table())).type
        empty = self._row_shape(key_schema.empty_table(), value_schema.empty_table())
        self.value_type = as_struct(empty).type

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field("key", self.key_type), pa.field("value", self.value_type)])

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        fam = families[self.family]
        decoded_keys = fam.key_codec.decode_many_arrow(keys)
        value_table, found = fam.value_codec.decode_many_arrow(values)
        value = as_struct(self._row_shape(decoded_keys, value_table), found)
        key_table = self._key_shape(decoded_keys)
        return pa.Table.from_arrays([as_struct(key_table), value], schema=self.schema)
