"""One key's state, read from a checkpoint: ``sparkstate inspect CHECKPOINT --key user=alice``.

The key is given as its columns' values in the shape the state reader shows a key (a window as
``window.start`` and ``window.end``), by name (``user=alice``) or in key order (``alice``), as
text cast to each column's type. Its state partition is the one Spark's ``repartition`` sent it
to, computed with Spark's hash (:mod:`.spark_hash`) from the columns the engine shuffles an
operator's input by; where a column's type has no hash here, every partition is searched. Only
that partition's state is loaded, read-only, from the durable files.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.checkpoint import OperatorInfo, StateCheckpoint
from sparkstate.observe.spark_hash import spark_partition
from sparkstate.observe.views import StateView, view_for
from sparkstate.operators.registry import layout_of

__all__ = [
    "KeyColumn",
    "KeyLookup",
    "key_columns",
    "look_up",
    "parse_key",
    "plain",
    "partition_columns",
    "spark_type",
    "store_views",
]


_SPARK_TYPES = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float": "float",
    "double": "double",
    "bool": "boolean",
    "string": "string",
    "large_string": "string",
    "binary": "binary",
    "large_binary": "binary",
    "date32[day]": "date",
    "null": "void",
}
#: How a value of a type is written, where the error for a bad one should say so.
_FORMATS = {
    "timestamp": " (write 2024-01-01T00:00:00 in UTC, or with an offset: ...T02:00:00+02:00)",
    "timestamp_ntz": " (write 2024-01-01T00:00:00)",
    "date": " (write 2024-01-01)",
    "boolean": " (write true or false)",
}


def spark_type(typ: pa.DataType) -> str:
    """The Spark SQL name of an Arrow type (``bigint``, ``struct<start:timestamp,...>``)."""
    if pa.types.is_timestamp(typ):
        return "timestamp" if typ.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(typ):
        return f"decimal({typ.precision},{typ.scale})"
    if pa.types.is_struct(typ):
        return f"struct<{','.join(f'{f.name}:{spark_type(f.type)}' for f in typ)}>"
    if pa.types.is_map(typ):
        return f"map<{spark_type(typ.key_type)},{spark_type(typ.item_type)}>"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return f"array<{spark_type(typ.value_type)}>"
    return _SPARK_TYPES.get(str(typ), str(typ))


@dataclasses.dataclass(frozen=True)
class KeyColumn:
    """A column of an operator's key: its name as given on the command line, and the store's
    key column it is."""

    name: str
    store_column: str
    type: pa.DataType


@dataclasses.dataclass(frozen=True)
class KeyLookup:
    """What a key lookup found: per store (a state variable, a join side, ``default``) the rows
    of the key, in the state reader's shape; no store with rows: the key is not in the state."""

    operator: OperatorInfo
    batch_id: int
    key: dict[str, Any]
    partition: int | None
    #: How the partition was chosen: ``hash`` (Spark's) or ``scan`` (every partition).
    found_by: str
    searched: list[int]
    stores: dict[str, list[dict[str, Any]]]

    @property
    def found(self) -> bool:
        return any(self.stores.values())


def key_columns(described: dict[str, Any], key_schema: pa.Schema) -> list[KeyColumn]:
    """The columns of an operator's key in the state reader's order (as its class shows them:
    a window's ``start`` and ``end`` as two columns, say)."""
    types = {f.name: f.type for f in key_schema}
    shown = layout_of(str(described.get("kind", ""))).shown_key(described, key_schema)
    return [KeyColumn(name, column, types[column]) for name, column in shown]


def partition_columns(described: dict[str, Any], key_schema: pa.Schema) -> list[str]:
    """The columns the engine shuffles the operator's input by (``repartition(n, *columns)``)."""
    return layout_of(str(described.get("kind", ""))).shuffle_columns(described, key_schema)


def _shown(columns: list[KeyColumn]) -> str:
    return ", ".join(f"{c.name} {spark_type(c.type)}" for c in columns)


def _cast(text: str, column: KeyColumn) -> pa.Scalar:
    typ = column.type
    try:
        return pa.array([text], pa.string()).cast(typ)[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        if pa.types.is_timestamp(typ) and typ.tz is not None:  # no zone given: UTC
            try:
                return pa.array([text]).cast(pa.timestamp(typ.unit)).cast(typ)[0]
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        name = spark_type(typ)
        msg = f"key column {column.name} is a {name}: {text!r} is not one{_FORMATS.get(name, '')}"
        raise ConfigurationError(msg) from exc


def parse_key(texts: list[str], columns: list[KeyColumn]) -> dict[str, pa.Scalar]:
    """The key's value per store key column, from ``NAME=VALUE`` texts or values in key order
    (one form or the other)."""
    names = {c.name: c for c in columns}
    named = [t.partition("=") for t in texts]
    assigned = [bool(sep) and name in names for name, sep, _ in named]
    by_name = all(assigned)
    if any(assigned) and not by_name and len(texts) > 1:
        msg = (
            f"give every key column by name (NAME=VALUE), or every value in key order "
            f"({_shown(columns)}), not some of each"
        )
        raise ConfigurationError(msg)
    if by_name:
        given: dict[str, str] = {}
        for name, _, value in named:
            if name in given:
                msg = f"key column {name} is given twice"
                raise ConfigurationError(msg)
            given[name] = value
        missing = [c.name for c in columns if c.name not in given]
        if missing:
            msg = f"the key has columns {_shown(columns)}: give a value for {', '.join(missing)}"
            raise ConfigurationError(msg)
        values = [given[c.name] for c in columns]
    else:
        if len(texts) != len(columns):
            unknown = [n for n, sep, _ in named if sep and n not in names]
            hint = f" (no key column {', '.join(unknown)})" if unknown else ""
            msg = (
                f"the key has {len(columns)} column{'s' if len(columns) != 1 else ''} "
                f"({_shown(columns)}); got {len(texts)} value{'s' if len(texts) != 1 else ''}"
                f"{hint}: give NAME=VALUE for each column, or the values in key order"
            )
            raise ConfigurationError(msg)
        values = texts
    return {c.store_column: _cast(v, c) for c, v in zip(columns, values, strict=True)}


def store_views(
    op: OperatorInfo,
    families: dict[str, tuple[pa.Schema, pa.Schema]],
    *,
    store_name: str | None = None,
    join_side: str | None = None,
    flatten: bool = False,
) -> list[tuple[str, StateView]]:
    """The stores of an operator as the state reader shows them, by the name that picks each
    (a state variable, a join side, ``default``): the one asked for, else all of them."""
    described = op.description

    def view(**kwargs: Any) -> StateView:
        return view_for(described, families, flatten=flatten, **kwargs)

    return [
        (label, view(store_name=name, join_side=side))
        for label, name, side in op.layout.shown_stores(described, store_name, join_side)
    ]


def plain(value: Any) -> Any:
    """Arrow's Python values with a map's entries as ``{"key": ..., "value": ...}`` objects
    (Arrow gives them as pairs, which JSON cannot tell from a list)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return [{"key": plain(k), "value": plain(v)} for k, v in value]
        return [plain(v) for v in value]
    return value


def look_up(
    chk: StateCheckpoint,
    op: OperatorInfo,
    batch_id: int,
    texts: list[str],
    *,
    store_name: str | None = None,
    join_side: str | None = None,
) -> KeyLookup:
    """The rows of the key ``texts`` in operator ``op``'s state after batch ``batch_id``."""
    if op.layout.unkeyed is not None:
        msg = f"operator {op.id} ({op.name}) {op.layout.unkeyed}"
        raise ConfigurationError(msg)
    families = chk.operator_families(op.id)
    if families is None:
        msg = f"operator {op.id} ({op.name}) of {chk.location} has no state yet"
        raise ConfigurationError(msg)
    views = dict(store_views(op, families, store_name=store_name, join_side=join_side))
    key_schema = families[next(iter(views.values())).family][0]
    columns = key_columns(op.description, key_schema)
    key = parse_key(texts, columns)
    row = pa.table({n: pa.array([key[n].as_py()], key[n].type) for n in key_schema.names})
    count = chk.partitions_at(batch_id)
    hashed = spark_partition([key[c] for c in partition_columns(op.description, key_schema)], count)
    candidates = list(range(count)) if hashed is None else [hashed]
    found_by = "scan" if hashed is None else "hash"
    shown = {c.name: key[c.store_column].as_py() for c in columns}
    searched: list[int] = []
    stores: dict[str, list[dict[str, Any]]] = {name: [] for name in views}
    for p in candidates:
        searched.append(p)
        stores = _read_key(chk, op, p, batch_id, views, row)
        if any(stores.values()):
            return KeyLookup(op, batch_id, shown, p, found_by, searched, stores)
    return KeyLookup(op, batch_id, shown, hashed, found_by, searched, stores)


def _read_key(
    chk: StateCheckpoint,
    op: OperatorInfo,
    partition: int,
    batch_id: int,
    views: dict[str, StateView],
    row: pa.Table,
) -> dict[str, list[dict[str, Any]]]:
    """Per store, the rows of the one-row key ``row`` in the partition's state (none: absent)."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in views}
    with chk.read_store(op.id, partition, batch_id) as store:
        if store is None:
            return out
        names = chk.families(op.id, partition) or {}
        families = {n: store.column_family(n) for n in names}
        for name, view in views.items():
            fam = families[view.family]
            encoded = fam.key_codec.encode_many(row.select(fam.key_schema.names))
            value = store.get_encoded(encoded[0], cf=view.family)
            if value is None:
                continue
            rows = view.rows(families, encoded, [value]).drop_columns(["key"])
            out[name] = [plain(r) for r in rows.to_pylist()]
    return out
