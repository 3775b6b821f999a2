"""Value schemas that change across restarts: which changes are compatible, and a codec that reads
values written under every schema a column family has had.

A column family records each value schema it was opened with, in ``_schema.json``: ``"value"`` is
the current schema and ``"value_history"`` lists all of them (a file without it has the history
``[value]``). A schema's id is its position in that list, and reverting to an earlier schema reuses
its id. Values written under id 0 keep the original format (version byte ``1``); values written
under a later id start with byte ``2`` and the id as a little-endian ``uint16``, so checkpoints
whose schemas never changed read and write exactly as before.

Reading projects a value onto the current schema by field name: fields its writer did not have
are null, fields the current schema dropped are skipped. Compatible changes: adding nullable
fields, dropping fields, reordering fields, making a field nullable; with ``widening`` (Spark's
Avro state encoding, which reads old values through Avro's schema resolution) also a top-level
field's type widened as Avro promotes it (:data:`WIDENINGS`: ``int`` to ``long``, ``float`` or
``double``, ``long`` to ``float`` or ``double``, ``float`` to ``double``, ``string`` to and from
``binary``), old values read widened. Refused when the store opens (as Spark's
``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``, or ``STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION``
with ``widening``): a field whose type differs from the one it had in any schema of the history
other than by such a widening (a dropped field cannot come back with another type), a field
added or made non-nullable, a schema that keeps none of the current one's fields (``n long`` to
``s string``: every stored value would be lost), and a switch between pickled Python objects (one
``__pickled`` binary field) and schema-encoded values. Schemas are
compared as :mod:`.schema_json`'s ``Field`` tuples (re-exported here, with ``fields_of``).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.store.codec import VALUE_FORMAT_VERSION, ValueCodec
from sparkstate.store.schema_json import Field, fields_of

__all__ = [
    "EVOLVED_VALUE_FORMAT",
    "INVALID_EVOLUTION",
    "KEY_NOT_COMPATIBLE",
    "MAX_SCHEMA_ID",
    "NOT_COMPATIBLE",
    "PICKLED_FIELD",
    "WIDENINGS",
    "EvolvingValueCodec",
    "Field",
    "condition",
    "evolve",
    "fields_of",
    "incompatibility",
    "refusal",
    "show_fields",
    "value_codec_for",
    "value_header",
    "widens",
]

#: First byte of a value written under a schema id above 0 (followed by the id, uint16 LE).
EVOLVED_VALUE_FORMAT = 2
MAX_SCHEMA_ID = 0xFFFF
#: The one binary field of a value that holds a pickled Python object.
PICKLED_FIELD = "__pickled"
#: The error condition Spark names an incompatible state schema change with.
NOT_COMPATIBLE = "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"
#: ... and the one under its Avro encoding, where a change is checked by Avro's resolution rules.
INVALID_EVOLUTION = "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION"
#: Spark's condition of a changed state key schema (its fields' number or types).
KEY_NOT_COMPATIBLE = "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
_INTS = ("int8", "int16", "int32")
#: Stored type -> the types a value of it may be read as, under ``widening``: the promotions of
#: Avro's schema resolution that Spark's Avro state encoding reads old values through (Spark
#: writes byte, short and int as Avro ``int``; a narrowing between them is refused here).
WIDENINGS: dict[str, frozenset[str]] = {
    **{t: frozenset({*_INTS[i + 1 :], "int64", "float", "double"}) for i, t in enumerate(_INTS)},
    "int64": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"binary"}),
    "binary": frozenset({"string"}),
}
#: What a refused change message ends with.
WHAT_TO_DO = (
    "Compatible changes are adding nullable fields, dropping fields and reordering fields; "
    "restore the original schema, or start from a new checkpoint location"
)
WIDENING_WHAT_TO_DO = (
    "Compatible changes are adding nullable fields, dropping fields, reordering fields and "
    "widening a field's type as Avro's schema resolution does (int to long, float or double; "
    "long to float or double; float to double; string to and from binary); restore the "
    "original schema, or start from a new checkpoint location"
)

Row: TypeAlias = tuple[Any, ...]


def value_header(schema_id: int) -> bytes:
    """The bytes every value written under ``schema_id`` starts with."""
    if schema_id == 0:
        return bytes([VALUE_FORMAT_VERSION])
    return bytes([EVOLVED_VALUE_FORMAT]) + schema_id.to_bytes(2, "little")


def show_fields(fields: Sequence[Field]) -> str:
    """``[count: int64, label: string not null]``."""
    shown = [f"{n}: {t}{' not null' if nullable is False else ''}" for n, t, nullable in fields]
    return "[" + ", ".join(shown) + "]"


def _is_pickled(fields: Sequence[Field]) -> bool:
    return any(f[0] == PICKLED_FIELD for f in fields)


def widens(stored: str, wanted: str) -> bool:
    """Whether a value of type ``stored`` may be read as ``wanted`` under ``widening``."""
    return wanted in WIDENINGS.get(stored, ())


def condition(widening: bool) -> str:
    """Spark's error condition of a refused value schema change."""
    return INVALID_EVOLUTION if widening else NOT_COMPATIBLE


def refusal(what: str, old: str, new: str, reason: str, *, widening: bool = False) -> str:
    """The message of a refused change of ``what`` from schema ``old`` to ``new``."""
    lead = "Schema evolution is not possible: " if widening else ""
    return (
        f"[{condition(widening)}] {lead}{what} cannot change from {old} to {new}: {reason}, so "
        f"values stored before could not be read. {WIDENING_WHAT_TO_DO if widening else WHAT_TO_DO}"
    )


def incompatibility(
    history: Sequence[Sequence[Field]],
    new: Sequence[Field],
    current: int = -1,
    *,
    widening: bool = False,
) -> str | None:
    """Why values stored under the schemas of ``history`` (``current`` is the one in use) cannot
    be read as ``new``; None if they can (with ``widening``, also by a widened type). A schema
    that keeps none of the current one's fields is refused too: every stored value would read
    as nulls (Spark refuses it as it refuses any change of the fields' number or types)."""
    names = [f[0] for f in new]
    if len(set(names)) != len(names):
        return f"its field names repeat ({names})"
    for old in history:
        if _is_pickled(old) != _is_pickled(new):
            if _is_pickled(old):
                return "it switches from pickled Python objects to schema-encoded values"
            return "it switches from schema-encoded values to pickled Python objects"
        before = {f[0]: f for f in old}
        for name, typ, nullable in new:
            was = before.get(name)
            if was is None:
                if nullable is False:
                    return f"field {name!r} ({typ}) is added but not nullable"
            elif was[1] != typ and not (widening and widens(was[1], typ)):
                return f"field {name!r} changed type from {was[1]} to {typ}"
            elif nullable is False and was[2] is True:
                return f"field {name!r} ({typ}) became non-nullable"
    if history and history[current] and not _is_pickled(new):
        kept = {f[0] for f in history[current]} & set(names)
        if not kept:
            return "it keeps none of the stored fields, so every stored value would be lost"
    return None


def evolve(
    history: Sequence[pa.Schema],
    current: int,
    new: pa.Schema,
    what: str,
    *,
    widening: bool = False,
) -> tuple[list[pa.Schema], int]:
    """The history with ``new`` in it, and the id of ``new``; raises when the change from the
    schemas of ``history`` (``current`` is the one in use) is not compatible. With
    ``widening``, a return to an earlier schema is checked too: a later one may have widened a
    field, whose values the earlier type cannot hold."""
    reverted = next((i for i, s in enumerate(history) if s.equals(new)), None)
    if reverted is not None and (not widening or reverted == current):
        return list(history), reverted
    fields = [fields_of(s) for s in history]
    reason = incompatibility(fields, fields_of(new), current, widening=widening)
    if reverted is not None and reason is None:
        return list(history), reverted
    if reason is not None:
        old = show_fields(fields_of(history[current]))
        shown = f"{what}: the value schema"
        msg = refusal(shown, old, show_fields(fields_of(new)), reason, widening=widening)
        raise SchemaMismatchError(msg, condition(widening))
    if len(history) > MAX_SCHEMA_ID:
        msg = f"{what}: more than {MAX_SCHEMA_ID + 1} value schemas; start a new checkpoint"
        raise SchemaMismatchError(msg)
    return [*history, new], len(history)


def value_codec_for(history: Sequence[pa.Schema], schema_id: int) -> ValueCodec:
    """The codec of a column family: the plain one until its schema first changed."""
    if len(history) == 1:
        return ValueCodec(history[0])
    return EvolvingValueCodec(history, schema_id)


class _Projection:
    """Reads values of one earlier schema as rows of the current one."""

    def __init__(self, writer: pa.Schema, writer_id: int, reader: pa.Schema) -> None:
        self.codec = ValueCodec(writer, value_header(writer_id))
        self.reader = reader
        position = {name: i for i, name in enumerate(writer.names)}
        #: Per field of the reader schema: its position in the writer schema, or -1.
        self.index = [position.get(name, -1) for name in reader.names]
        width = len(writer)  # a row extended with one None serves every missing field
        self._pick = itemgetter(*[i if i >= 0 else width for i in self.index])
        self._single = len(self.index) == 1
        #: Reader positions whose writer type was narrower (a widened field), with the
        #: conversion of a stored Python value.
        self._widen = [
            (i, _python_widening(writer.field(p).type, f.type))
            for i, (p, f) in enumerate(zip(self.index, reader, strict=True))
            if p >= 0 and writer.field(p).type != f.type
        ]

    def row(self, row: Row) -> Row:
        picked = self._pick((*row, None))
        out: Row = (picked,) if self._single else picked
        if self._widen:
            values = list(out)
            for i, convert in self._widen:
                if values[i] is not None:
                    values[i] = convert(values[i])
            out = tuple(values)
        return out

    def decode(self, data: bytes) -> Row:
        return self.row(self.codec.decode(data))

    def decode_many(self, data: Sequence[bytes]) -> list[Row]:
        row = self.row
        return [row(r) for r in self.codec.decode_many(data) if r is not None]

    def decode_many_arrow(self, data: Sequence[bytes]) -> pa.Table:
        table, _ = self.codec.decode_many_arrow(data)
        n = table.num_rows
        columns = [
            _cast(table.column(i), f.type)
            if i >= 0
            else pa.chunked_array([pa.nulls(n, f.type)], f.type)
            for i, f in zip(self.index, self.reader, strict=True)
        ]
        return pa.Table.from_arrays(columns, schema=self.reader)


def _cast(column: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    return column if column.type == to else column.cast(to)


def _python_widening(stored: pa.DataType, wanted: pa.DataType) -> Any:
    """How a stored Python value of type ``stored`` reads as ``wanted`` (a widening)."""
    if pa.types.is_floating(wanted):
        return float
    if pa.types.is_binary(wanted):
        return lambda v: v.encode() if isinstance(v, str) else v
    if pa.types.is_string(wanted):
        return lambda v: v.decode() if isinstance(v, bytes) else v
    return lambda v: v  # a wider integer


class EvolvingValueCodec(ValueCodec):
    """Writes values under the current schema of a history; reads values of any of them."""

    def __init__(self, history: Sequence[pa.Schema], schema_id: int) -> None:
        super().__init__(history[schema_id], value_header(schema_id))
        self.history = list(history)
        self.schema_id = schema_id
        self._projections: dict[bytes, _Projection] = {}
        self._header_of = itemgetter(slice(0, len(self.header)))

    def __repr__(self) -> str:
        return f"EvolvingValueCodec({self.schema.names}, schema_id={self.schema_id})"

    def _projection(self, data: bytes) -> _Projection:
        header = data[:1] if data[:1] == bytes([VALUE_FORMAT_VERSION]) else data[:3]
        found = self._projections.get(header)
        if found is not None:
            return found
        if header[:1] == bytes([VALUE_FORMAT_VERSION]):
            writer_id = 0
        elif header[:1] == bytes([EVOLVED_VALUE_FORMAT]) and len(header) == 3:
            writer_id = int.from_bytes(header[1:], "little")
        else:
            raise self.header_error(data)
        if writer_id >= len(self.history):
            msg = (
                f"a value was written under schema id {writer_id}, but _schema.json records "
                f"{len(self.history)} value schemas (current: {self.schema.names}); the schema "
                "file does not belong to this state"
            )
            raise SchemaMismatchError(msg)
        found = _Projection(self.history[writer_id], writer_id, self.schema)
        self._projections[header] = found
        return found

    def _all_current(self, data: Sequence[bytes | None]) -> bool:
        return set(map(self._header_of, filter(None, data))) <= {self.header}

    def _groups(self, data: Sequence[bytes | None]) -> dict[_Projection | None, list[int]]:
        """Positions of the values of each writer schema (None: the current one)."""
        groups: dict[_Projection | None, list[int]] = {}
        header = self.header
        for i, d in enumerate(data):
            if d is not None:
                key = None if d.startswith(header) else self._projection(d)
                groups.setdefault(key, []).append(i)
        return groups

    def decode(self, data: bytes) -> Row:
        if data.startswith(self.header):
            return super().decode(data)
        return self._projection(data).decode(data)

    def decode_many(self, data: Sequence[bytes | None]) -> list[Row | None]:
        if self._all_current(data):
            return super().decode_many(data)
        out: list[Row | None] = [None] * len(data)
        for projection, positions in self._groups(data).items():
            values = [data[i] for i in positions]
            if projection is None:
                rows: Sequence[Row | None] = super().decode_many(values)
            else:
                rows = projection.decode_many(values)  # type: ignore[arg-type]
            for i, row in zip(positions, rows, strict=True):
                out[i] = row
        return out

    def decode_many_arrow(
        self, data: Sequence[bytes | None]
    ) -> tuple[pa.Table, npt.NDArray[np.bool_]]:
        if self._all_current(data):
            return super().decode_many_arrow(data)
        found = np.fromiter((d is not None for d in data), np.bool_, len(data))
        tables, order = [], []
        for projection, positions in self._groups(data).items():
            values: list[Any] = [data[i] for i in positions]
            if projection is None:
                tables.append(super().decode_many_arrow(values)[0])
            else:
                tables.append(projection.decode_many_arrow(values))
            order.append(np.asarray(positions, np.int64))
        absent = np.flatnonzero(~found)
        if len(absent):
            n = len(absent)
            nulls = [pa.chunked_array([pa.nulls(n, f.type)], f.type) for f in self.schema]
            tables.append(pa.Table.from_arrays(nulls, schema=self.schema))
            order.append(absent)
        table = pa.concat_tables(tables)
        return table.take(np.argsort(np.concatenate(order), kind="stable")), found
