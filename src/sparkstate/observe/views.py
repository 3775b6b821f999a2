"""How a reader shows one store of an operator: in the shape Spark's ``statestore`` source gives.

A view picks a column family and turns its encoded keys and values into Arrow rows: ``key`` and
``value`` structs in the state's own schemas (aggregation buffers under Spark's buffer names,
deduplication's empty value, a ``StatefulProcessor`` variable's value, list elements or map
entries, flattened as Spark flattens them), and the same rows as changes for the change feed.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.join import unpack_rows
from sparkstate.operators.state_collections import decode_list, decode_map
from sparkstate.operators.state_vars import elements_cf_name
from sparkstate.operators.timers import TIMERS_CF, timer_expiries
from sparkstate.operators.ttl import TTL_FIELD
from sparkstate.store.base import DEFAULT_CF, ColumnFamily
from sparkstate.store.codec import KeyCodec, ValueCodec
from sparkstate.store.schema_json import fields_from_json, schema_from_json

__all__ = ["StateView", "view_for"]

#: Our aggregation buffer suffixes that Spark names otherwise.
_SPARK_BUFFER_NAMES = {"empty": "isEmpty", "set": "valueSet"}
_BUFFER = re.compile(r"^__ss_agg\d+_(.+)$")
#: Columns of the change feed before a view's own.
#: The one row a key without elements shows (flattened): null element, or null entry.
_NOTHING: list[Any] = [None]
_NO_ENTRY: list[Any] = [(None, None)]
CHANGE_COLUMNS = [pa.field("batch_id", pa.int64()), pa.field("change_type", pa.string())]


def _struct(table: pa.Table | pa.RecordBatch, valid: Any = None) -> pa.StructArray:
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
        self.key_type = _struct(self._key_shape(key_schema.empty_table())).type
        empty = self._row_shape(key_schema.empty_table(), value_schema.empty_table())
        self.value_type = _struct(empty).type

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field("key", self.key_type), pa.field("value", self.value_type)])

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        fam = families[self.family]
        decoded_keys = fam.key_codec.decode_many_arrow(keys)
        value_table, found = fam.value_codec.decode_many_arrow(values)
        value = _struct(self._row_shape(decoded_keys, value_table), found)
        key_table = self._key_shape(decoded_keys)
        return pa.Table.from_arrays([_struct(key_table), value], schema=self.schema)


class _CollectionView(StateView):
    """List and map state: a key's elements, one row each when flattened."""

    flatten: bool

    @abstractmethod
    def _collections(
        self, families: dict[str, ColumnFamily], values: Sequence[bytes | None]
    ) -> Sequence[Sequence[Any] | None]:
        """Each value's elements (None for a deleted key)."""

    def _change_kinds(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> list[str]:
        """Flattened: ``update`` per element written, one ``delete`` per key removed (or left
        empty)."""
        if not self.flatten:
            return super()._change_kinds(families, keys, values)
        collections = self._collections(families, values)
        return [
            k for items in collections for k in (["update"] * len(items) if items else ["delete"])
        ]


class ListView(_CollectionView):
    """A ``ListState``: one row per element (``list_element``), or per key with ``list_value``."""

    def __init__(self, name: str, key_schema: pa.Schema, element: pa.Schema, flatten: bool):
        super().__init__(name)
        self.flatten = flatten
        self.key_type = pa.struct(list(key_schema))
        self.element_type = pa.struct([f for f in element if f.name != TTL_FIELD])

    @property
    def schema(self) -> pa.Schema:
        if self.flatten:
            return pa.schema([("key", self.key_type), ("list_element", self.element_type)])
        return pa.schema([("key", self.key_type), ("list_value", pa.list_(self.element_type))])

    def _elements(self, families: dict[str, ColumnFamily], blob: bytes) -> list[dict[str, Any]]:
        codec = families[elements_cf_name(self.family)].value_codec
        names = [f.name for f in self.element_type]
        return [dict(zip(names, e, strict=False)) for e in decode_list(codec, blob)]

    def _collections(
        self, families: dict[str, ColumnFamily], values: Sequence[bytes | None]
    ) -> list[list[dict[str, Any]] | None]:
        blobs = families[self.family].value_codec.decode_many(values)
        return [None if b is None else self._elements(families, b[0]) for b in blobs]

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        key_rows = families[self.family].key_codec.decode_many_arrow(keys)
        lists = self._collections(families, values)
        key_array = _struct(key_rows)
        if not self.flatten:
            return pa.Table.from_arrays(
                [key_array, pa.array(lists, pa.list_(self.element_type))], schema=self.schema
            )
        at = [i for i, items in enumerate(lists) for _ in (items or _NOTHING)]
        elements: list[Any] = [e for items in lists for e in (items or _NOTHING)]
        return pa.Table.from_arrays(
            [key_array.take(pa.array(at, pa.int64())), pa.array(elements, self.element_type)],
            schema=self.schema,
        )


class TimersView(_CollectionView):
    """A ``StatefulProcessor``'s registered timers (Spark's ``readRegisteredTimers``): one row
    per timer, its grouping key and ``expiration_timestamp_ms``."""

    flatten = True

    def __init__(self, key_schema: pa.Schema) -> None:
        super().__init__(TIMERS_CF)
        self.key_type = pa.struct(list(key_schema))

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([("key", self.key_type), ("expiration_timestamp_ms", pa.int64())])

    def _collections(
        self, families: dict[str, ColumnFamily], values: Sequence[bytes | None]
    ) -> list[list[int] | None]:
        blobs = families[self.family].value_codec.decode_many(values)
        return [None if b is None else timer_expiries(b[0]) for b in blobs]

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        key_array = _struct(families[self.family].key_codec.decode_many_arrow(keys))
        timers = self._collections(families, values)
        at = [i for i, expiries in enumerate(timers) for _ in (expiries or _NOTHING)]
        expiry = [e for expiries in timers for e in (expiries or _NOTHING)]
        return pa.Table.from_arrays(
            [key_array.take(pa.array(at, pa.int64())), pa.array(expiry, pa.int64())],
            schema=self.schema,
        )


class MapView(_CollectionView):
    """A ``MapState``: one row per entry (``user_map_key``, ``user_map_value``), or per key with
    ``map_value``."""

    def __init__(
        self,
        name: str,
        key_schema: pa.Schema,
        user_key: pa.Schema,
        value: pa.Schema,
        flatten: bool,
    ) -> None:
        super().__init__(name)
        self.flatten = flatten
        self.user_key = user_key
        self.key_type = pa.struct(list(key_schema))
        self.user_key_type = pa.struct(list(user_key))
        self.value_type = pa.struct([f for f in value if f.name != TTL_FIELD])

    @property
    def schema(self) -> pa.Schema:
        if self.flatten:
            return pa.schema(
                [
                    ("key", self.key_type),
                    ("user_map_key", self.user_key_type),
                    ("user_map_value", self.value_type),
                ]
            )
        typ = pa.map_(self.user_key_type, self.value_type)
        return pa.schema([("key", self.key_type), ("map_value", typ)])

    def _collections(
        self, families: dict[str, ColumnFamily], values: Sequence[bytes | None]
    ) -> list[list[tuple[dict[str, Any], dict[str, Any]]] | None]:
        codec = families[elements_cf_name(self.family)].value_codec
        user_codec = KeyCodec(self.user_key)
        knames = [f.name for f in self.user_key_type]
        vnames = [f.name for f in self.value_type]
        out: list[list[tuple[dict[str, Any], dict[str, Any]]] | None] = []
        for blob in families[self.family].value_codec.decode_many(values):
            if blob is None:
                out.append(None)
                continue
            entries = decode_map(user_codec, codec, blob[0])
            out.append(
                [
                    (dict(zip(knames, k, strict=True)), dict(zip(vnames, v, strict=False)))
                    for k, v in entries
                ]
            )
        return out

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        key_array = _struct(families[self.family].key_codec.decode_many_arrow(keys))
        maps = self._collections(families, values)
        if not self.flatten:
            typ = pa.map_(self.user_key_type, self.value_type)
            return pa.Table.from_arrays([key_array, pa.array(maps, typ)], schema=self.schema)
        at = [i for i, items in enumerate(maps) for _ in (items or _NOTHING)]
        pairs: list[Any] = [p for items in maps for p in (items or _NO_ENTRY)]
        return pa.Table.from_arrays(
            [
                key_array.take(pa.array(at, pa.int64())),
                pa.array([k for k, _ in pairs], self.user_key_type),
                pa.array([v for _, v in pairs], self.value_type),
            ],
            schema=self.schema,
        )


class JoinSideView(StateView):
    """One side of a stream-stream join: one row per buffered input row, under its join key,
    in the query's column names (Spark's ``joinSide`` view)."""

    def __init__(
        self, family: str, key_schema: pa.Schema, row_schema: pa.Schema, names: dict[str, str]
    ) -> None:
        super().__init__(family)
        self.row_codec = ValueCodec(row_schema)
        #: The side's own columns (not the condition's helpers), as the query names them.
        self.columns = [f.name for f in row_schema if f.name in names]
        self.key_type = pa.struct([f.with_name(names.get(f.name, f.name)) for f in key_schema])
        self.value_type = pa.struct([row_schema.field(c).with_name(names[c]) for c in self.columns])

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field("key", self.key_type), pa.field("value", self.value_type)])

    def _rows_of(
        self, families: dict[str, ColumnFamily], values: Sequence[bytes | None]
    ) -> tuple[pa.Table, list[int]]:
        packed = [v[0] for v in families[self.family].value_codec.decode_many(values) if v]
        at = [i for i, v in enumerate(values) if v is not None]
        row_bytes, parents = unpack_rows(packed)
        rows, _ = self.row_codec.decode_many_arrow(row_bytes)
        return rows.select(self.columns), [at[p] for p in parents]

    def rows(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> pa.Table:
        key_table = families[self.family].key_codec.decode_many_arrow(keys)
        key_array = _struct(key_table.rename_columns([f.name for f in self.key_type]))
        rows, owners = self._rows_of(families, values)
        deleted = [i for i, v in enumerate(values) if v is None]
        key_rows = key_array.take(pa.array(owners + deleted, pa.int64()))
        value = pa.concat_arrays(
            [
                _struct(rows.rename_columns([f.name for f in self.value_type])),
                pa.nulls(len(deleted), self.value_type),
            ]
        )
        return pa.Table.from_arrays([key_rows, value], schema=self.schema)

    def _change_kinds(
        self, families: dict[str, ColumnFamily], keys: list[bytes], values: Sequence[bytes | None]
    ) -> list[str]:
        _, owners = self._rows_of(families, values)
        return ["update"] * len(owners) + ["delete"] * sum(v is None for v in values)


# --- the views of each operator ------------------------------------------------------------------


def _aggregate_view(described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
    """Spark's aggregation state: the grouping keys (a window as its ``start``/``end`` struct)
    and the aggregation buffers under Spark's names."""
    output_keys = described.get("output_keys")

    def key_shape(table: pa.Table) -> pa.Table:
        if not output_keys:
            return table
        arrays, fields = [], []
        for k in output_keys:
            if isinstance(k, str):
                arrays.append(table.column(k).combine_chunks())
                fields.append(table.schema.field(k))
                continue
            start, end = table.column(k["start"]), table.column(k["end"])
            window = pa.StructArray.from_arrays(
                [start.combine_chunks(), end.combine_chunks()],
                fields=[pa.field("start", start.type), pa.field("end", end.type)],
            )
            arrays.append(window)
            fields.append(pa.field(k["window"], window.type))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    return KeyValueView(
        DEFAULT_CF, key, value, key_shape=key_shape, value_shape=_buffers_shape(described)
    )


def _buffers_shape(described: dict[str, Any], taken: Sequence[str] = ()) -> Any:
    """Aggregation buffers under Spark's names (after the names in ``taken``)."""
    funcs = [a.get("func") for a in described.get("aggregates", [])]

    def value_shape(table: pa.Table) -> pa.Table:
        table = _avg_sums_from_zero(table, funcs)
        names: list[str] = list(taken)
        for name in table.schema.names:
            m = _BUFFER.match(name)
            suffix = m.group(1) if m else name
            names.append(_unique(_SPARK_BUFFER_NAMES.get(suffix, suffix), names))
        return table.rename_columns(names[len(taken) :])

    return value_shape


def _session_view(described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
    """Spark's session window state: the key is the grouping keys and ``sessionStartTime``, the
    value the whole partial row (the grouping keys in the query's order, the session window as
    its ``start``/``end`` struct, then the buffers under Spark's names)."""
    window = described["window"]
    n_keys = len(key.names)  # the user's keys and the session's start
    output = [f[0] for f in fields_from_json(described["output_schema"])]
    grouping = output[:n_keys]  # the window and the user's keys, as grouped

    def key_shape(table: pa.Table) -> pa.Table:
        names = ["sessionStartTime" if n == window["start"] else n for n in table.schema.names]
        return table.rename_columns(names)

    buffers = _buffers_shape(described, taken=grouping)

    def value_shape(keys: pa.Table, values: pa.Table) -> pa.Table:
        arrays, fields = [], []
        for name in grouping:
            if name == window["window"]:
                start = keys.column(window["start"]).combine_chunks()
                end = values.column(window["end"]).combine_chunks()
                column: Any = pa.StructArray.from_arrays(
                    [start, end],
                    fields=[pa.field("start", start.type), pa.field("end", end.type)],
                )
            else:
                column = keys.column(name).combine_chunks()
            arrays.append(column)
            fields.append(pa.field(name, column.type))
        rest = buffers(values.drop_columns([window["end"]]))
        return pa.Table.from_arrays(
            arrays + rest.columns, schema=pa.schema(fields + list(rest.schema))
        )

    return KeyValueView(DEFAULT_CF, key, value, key_shape=key_shape, row_shape=value_shape)


def _limit_key(table: pa.Table) -> pa.Table:
    """Spark's limit keeps its count under one null key named ``key``."""
    return pa.table({"key": pa.nulls(table.num_rows)})


def _limit_value(table: pa.Table) -> pa.Table:
    return table.rename_columns(["value"])


def _avg_sums_from_zero(table: pa.Table, funcs: list[Any]) -> pa.Table:
    """An ``avg`` buffer's sum as Spark keeps it: 0 before the first value, where ours is null
    (the same average: its count is 0)."""
    for i, func in enumerate(funcs):
        name = f"__ss_agg{i}_sum"
        if func != "avg" or name not in table.schema.names:
            continue
        at = table.schema.get_field_index(name)
        column = table.column(at)
        zero = pa.scalar(0, column.type)
        table = table.set_column(at, table.schema.field(at), pc.fill_null(column, zero))
    return table


def _unique(name: str, taken: list[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... when taken: Spark names the buffers of two
    aggregates alike (``count`` of ``count()`` and of ``avg()``), which no reader can return."""
    found, n = name, 1
    while found in taken:
        n += 1
        found = f"{name}_{n}"
    return found


def _dedup_key_order(described: dict[str, Any]) -> Any:
    """Deduplication keys in the order the query gave its columns (ours lead with the event
    time, for eviction by range scans; Spark's keep the order given)."""
    columns = described.get("columns") or []

    def in_order(table: pa.Table) -> pa.Table:
        if sorted(columns) != sorted(table.schema.names):
            return table
        return table.select(columns)

    return in_order


def _empty_value(table: pa.Table) -> pa.Table:
    """Spark's deduplication value: ``__dummy__``, null."""
    return pa.table({"__dummy__": pa.nulls(table.num_rows)})


def _group_state_view(described: dict[str, Any], key: pa.Schema, value: pa.Schema) -> StateView:
    """Spark's ``(flatMap|applyInPandas)GroupsWithState`` state: ``groupState``, and with a
    timeout its ``timeoutTimestamp`` (-1 when none is set)."""
    state_fields = [f for f in value if not f.name.startswith("__")]
    with_timeout = described.get("timeout", "NoTimeout") != "NoTimeout"

    def shape(table: pa.Table) -> pa.Table:
        group = _struct(table.select([f.name for f in state_fields]))
        defined = table.column("__defined").combine_chunks()
        group = pa.StructArray.from_arrays(
            group.flatten(), fields=list(group.type), mask=pc.invert(defined)
        )
        if not with_timeout:
            return pa.table({"groupState": group})
        timeout = table.column("__timeout_ms").combine_chunks()
        return pa.table({"groupState": group, "timeoutTimestamp": timeout})

    return KeyValueView(DEFAULT_CF, key, value, value_shape=shape)


def _processor_view(
    described: dict[str, Any],
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    var: str | None,
    flatten: bool,
) -> StateView:
    state = described.get("state", {})
    if var is None:
        msg = (
            f"transformWithState keeps its state in variables {sorted(state)}: pick one with "
            ".option('stateVarName', name)"
        )
        raise ConfigurationError(msg)
    spec = state.get(var)
    if spec is None:
        msg = f"transformWithState has no state variable {var!r}; it has {sorted(state)}"
        raise ConfigurationError(msg)
    key, value = families[var]
    if spec["kind"] == "value":

        def no_ttl(table: pa.Table) -> pa.Table:
            return table.drop_columns([n for n in table.schema.names if n == TTL_FIELD])

        return KeyValueView(var, key, value, value_shape=no_ttl)
    element = families[elements_cf_name(var)][1]
    if spec["kind"] == "list":
        return ListView(var, key, element, flatten)
    user_key = schema_from_json(spec["key_schema"])
    return MapView(var, key, user_key, element, flatten)


def _join_view(
    described: dict[str, Any],
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    side: str | None,
) -> StateView:
    if side not in ("left", "right"):
        msg = (
            "a stream-stream join keeps the rows of both sides: pick one with "
            ".option('joinSide', 'left') or 'right'"
        )
        raise ConfigurationError(msg)
    family = DEFAULT_CF if side == "left" else "right"
    row_schema = schema_from_json(described["row_schemas"][side])
    names = described.get("column_names") or {
        f.name: f.name for f in row_schema if re.fullmatch(r"__ss_[lr]\d+(_\d+)?", f.name)
    }
    return JoinSideView(family, families[family][0], row_schema, names)


def view_for(
    described: dict[str, Any],
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    *,
    store_name: str | None = None,
    join_side: str | None = None,
    flatten: bool = True,
    timers: bool = False,
) -> StateView:
    """The view of an operator's store: ``described`` is its entry in ``metadata.json``,
    ``families`` its partition's column families, ``store_name`` a state variable or family."""
    kind = described["kind"]
    if timers:
        if kind != "transformWithState" or TIMERS_CF not in families:
            msg = (
                f"readRegisteredTimers reads the timers of a transformWithState operator with "
                f"a time mode; operator {described['id']} ({kind}) has none"
            )
            raise ConfigurationError(msg)
        return TimersView(families[TIMERS_CF][0])
    if kind == "join" and store_name is None:
        return _join_view(described, families, join_side)
    side = (store_name or "").split("-")[0]
    if kind == "join" and side in ("left", "right"):
        msg = (
            f"sparkstate keeps a join side's rows in one store, not Spark's {store_name!r}: "
            f"read them with .option('joinSide', {side!r})"
        )
        raise ConfigurationError(msg)
    if join_side is not None:
        msg = f"joinSide applies to a stream-stream join; operator {described['id']} is {kind}"
        raise ConfigurationError(msg)
    if kind == "transformWithState":
        return _processor_view(described, families, store_name, flatten)
    if store_name not in (None, DEFAULT_CF):
        if store_name not in families:
            msg = f"operator {described['id']} ({kind}) has no store {store_name!r}"
            raise ConfigurationError(msg)
        key, value = families[store_name]
        return KeyValueView(store_name, key, value)
    key, value = families[DEFAULT_CF]
    if kind == "aggregate":
        return _aggregate_view(described, key, value)
    if kind == "session_window_aggregate":
        return _session_view(described, key, value)
    if kind == "limit":
        return KeyValueView(DEFAULT_CF, key, value, key_shape=_limit_key, value_shape=_limit_value)
    if kind == "dedup":
        order = _dedup_key_order(described)
        return KeyValueView(DEFAULT_CF, key, value, key_shape=order, value_shape=_empty_value)
    if kind == "dedup_within_watermark":
        return KeyValueView(DEFAULT_CF, key, value, key_shape=_dedup_key_order(described))
    if kind in ("flatMapGroupsWithState", "applyInPandasWithState"):
        return _group_state_view(described, key, value)
    return KeyValueView(DEFAULT_CF, key, value)
