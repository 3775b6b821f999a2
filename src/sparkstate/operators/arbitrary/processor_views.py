"""How a ``StatefulProcessor``'s state is shown: a state variable's value, list elements or map
entries (flattened as Spark flattens them), its registered timers, and Spark's
``operatorProperties`` of the operator (its time mode, output mode and state variables).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.state_collections import decode_list, decode_map
from sparkstate.operators.arbitrary.state_vars import elements_cf_name
from sparkstate.operators.arbitrary.timers import TIMERS_CF, timer_expiries
from sparkstate.operators.arbitrary.ttl import TTL_FIELD
from sparkstate.operators.state_views import KeyValueView, StateView, as_struct
from sparkstate.store.codec import KeyCodec
from sparkstate.store.families import ColumnFamily
from sparkstate.store.schema_json import schema_from_json

__all__ = [
    "ListView",
    "MapView",
    "TimersView",
    "processor_properties",
    "timers_view",
    "variable_summary",
    "variable_view",
]

#: The one row a key without elements shows (flattened): null element, or null entry.
_NOTHING: list[Any] = [None]
_NO_ENTRY: list[Any] = [(None, None)]
#: Spark's names of the kinds of state variable.
_VARIABLE_TYPES = {"value": "ValueState", "list": "ListState", "map": "MapState"}


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
        key_array = as_struct(key_rows)
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
        key_array = as_struct(families[self.family].key_codec.decode_many_arrow(keys))
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
        key_array = as_struct(families[self.family].key_codec.decode_many_arrow(keys))
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


def variable_view(
    described: dict[str, Any],
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    var: str | None,
    flatten: bool,
) -> StateView:
    """The view of state variable ``var`` (the reader's ``stateVarName``)."""
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


def timers_view(families: dict[str, tuple[pa.Schema, pa.Schema]]) -> StateView | None:
    """The view of the registered timers; None without a time mode (no timers kept)."""
    if TIMERS_CF not in families:
        return None
    return TimersView(families[TIMERS_CF][0])


def variable_summary(described: dict[str, Any], name: str) -> dict[str, Any]:
    """What ``inspect`` shows of state variable ``name``: its Spark type, and whether it has a
    TTL."""
    spec = described.get("state", {}).get(name)
    if spec is None:
        return {}
    return {
        "state_type": _VARIABLE_TYPES.get(spec["kind"], spec["kind"]),
        "ttl": bool(spec.get("ttl")),
    }


def processor_properties(described: dict[str, Any], output_mode: str) -> str:
    """Spark's ``operatorProperties`` of a ``transformWithState``: its state variables."""
    variables = [
        {
            "stateName": name,
            "stateVariableType": _VARIABLE_TYPES[s["kind"]],
            "ttlEnabled": bool(s["ttl"]),
        }
        for name, s in described.get("state", {}).items()
    ]
    time_mode = str(described.get("time_mode"))
    timers = _TIMER_STATE.get(time_mode)
    if timers is not None:
        variables.append(
            {"stateName": timers, "stateVariableType": "TimerState", "ttlEnabled": False}
        )
    modes = {"None": "NoTime", "ProcessingTime": "ProcessingTime", "EventTime": "EventTime"}
    return json.dumps(
        {
            "timeMode": modes.get(time_mode, described.get("time_mode")),
            "outputMode": output_mode.capitalize(),
            "stateVariables": _in_spark_order(variables),
        },
        separators=(",", ":"),
    )


#: The state variable Spark keeps a processor's timers in, by time mode.
_TIMER_STATE = {
    "ProcessingTime": "$procTimers_keyToTimestamp",
    "EventTime": "$eventTimers_keyToTimestamp",
}


def _in_spark_order(variables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state variables in the order Spark lists them: the iteration order of the Scala
    ``mutable.HashMap`` it keeps them in by name (bucket by the improved ``String.hashCode``,
    then that hash as a signed Int; 16 buckets, doubled at a load of 0.75)."""
    buckets = 16
    while len(variables) >= buckets * 3 // 4:
        buckets *= 2

    def place(variable: dict[str, Any]) -> tuple[int, int]:
        h = _java_hash(str(variable["stateName"]))
        improved = h ^ (h >> 16)
        signed = improved - (1 << 32) if improved >= 1 << 31 else improved  # a Scala Int
        return improved & (buckets - 1), signed

    return sorted(variables, key=place)


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` as an unsigned 32-bit value (UTF-16 code units)."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h
