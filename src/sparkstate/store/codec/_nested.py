"""Nested columns of values (structs, maps, lists of nested types): one compact binary layout per
value, written a whole Arrow column at a time and read back value by value.

The bytes of a value of type ``t`` (its *payload*):

- ``list<T>``: ``[uint32 count][uint32 k][k x uint32: positions of the null elements][elements]``,
  the layout of :class:`._columns.ListLayout`, so a list of scalars reads the same either way;
- ``struct<f1..fn>``: ``[null bitmap, ceil(n/8) bytes, bit i = field i][fields]``;
- ``map<K, V>``: the list of its keys, then the list of its values (both as above).

Inside a payload, each element or field is *framed*: a fixed-width scalar takes its width
(little-endian, zeros when null), anything else a ``uint32`` length and its bytes (length 0 when
null; the enclosing bitmap or null positions say it is null). The value row holds the payload of
a nested column as it holds any variable column (:mod:`._values`), behind the row's version byte.

Writing goes through Arrow compute over the child arrays (element bytes, then one join per value)
with no Python step per value; reading parses each value with precompiled ``struct`` readers and
gives what ``pyarrow``'s ``to_pylist()`` gives: lists, dicts for structs, lists of ``(key,
value)`` tuples for maps.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, SchemaMismatchError
from sparkstate.store.codec._arrow import LB, LB_EMPTY, fsb_to_large_binary, validity
from sparkstate.store.codec._columns import Column, _is_nested_value_type, takes_nested_layout
from sparkstate.store.codec._lists import element_bytes, joined

__all__ = ["NestedLayout", "columns_of", "is_nested_value_type", "nested_payloads"]

#: Reads one framed value at a position: (value, position after it).
Reader = Callable[[bytes, int], tuple[Any, int]]

_U32 = struct.Struct("<I")
_U32x2 = struct.Struct("<II")


def is_nested_value_type(t: pa.DataType) -> bool:
    """Whether ``t`` takes this module's layout: a struct, a map, or a list of a nested type (a
    list of scalars is :class:`._columns.ListLayout`'s, the same bytes)."""
    return _is_nested_value_type(t)


def _scalar_column(field: pa.Field) -> Column:
    return Column(0, field, "nested")


def _framed(field: pa.Field, arr: pa.Array) -> pa.Array:
    """Every value of ``arr`` framed (see the module docstring), as large_binary."""
    if pa.types.is_nested(field.type):
        payload = _payloads(field.type, arr)
        lengths = np.asarray(pc.binary_length(payload), dtype=np.int64)
        if len(lengths) and lengths.max() >= 1 << 32:
            msg = f"field {field.name!r} has a value of 4 GiB or more"
            raise SchemaMismatchError(msg)
        prefix = fsb_to_large_binary(lengths.astype("<u4").view(np.uint8).reshape(-1, 4))
        return pc.binary_join_element_wise(prefix, payload, LB_EMPTY)
    return element_bytes(_scalar_column(field), arr)


def _list_bytes(
    offsets: np.ndarray, framed: pa.Array, valid: np.ndarray | None, n: int
) -> pa.Array:
    """Per list (``offsets`` into the framed elements): count, null positions, elements."""
    header = np.zeros((n, 2), "<u4")
    header[:, 0] = np.diff(offsets)
    body = joined(offsets, framed)
    if valid is None:
        return pc.binary_join_element_wise(
            fsb_to_large_binary(header.view(np.uint8)), body, LB_EMPTY
        )
    at = np.flatnonzero(~valid)
    row = np.searchsorted(offsets, at, side="right") - 1
    header[:, 1] = np.bincount(row, minlength=n)
    positions = (at - offsets[row]).astype("<u4").view(np.uint8).reshape(-1, 4)
    null_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(header[:, 1], out=null_offsets[1:])
    nulls = joined(null_offsets, fsb_to_large_binary(positions))
    return pc.binary_join_element_wise(
        fsb_to_large_binary(header.view(np.uint8)), nulls, body, LB_EMPTY
    )


def _children(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """A list or map array's offsets (from 0) and the slice of its child they cover."""
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    return offsets - start, arr.values.slice(start, end - start)


def _check_nulls(field: pa.Field, values: pa.Array, what: str) -> np.ndarray | None:
    valid = validity(values)
    if valid is not None and not field.nullable:
        msg = f"{what} does not take null {field.name}s, got one"
        raise SchemaMismatchError(msg)
    return valid


def _payloads(t: pa.DataType, arr: pa.Array) -> pa.Array:
    """The payload of every value of ``arr`` (of nested type ``t``); a null value gives b""."""
    n = len(arr)
    if pa.types.is_map(t):
        offsets, entries = _children(arr)
        keys, items = entries.field(0), entries.field(1)
        key_valid = _check_nulls(t.key_field, keys, f"{t}")
        item_valid = _check_nulls(t.item_field, items, f"{t}")
        out = pc.binary_join_element_wise(
            _list_bytes(offsets, _framed(t.key_field, keys), key_valid, n),
            _list_bytes(offsets, _framed(t.item_field, items), item_valid, n),
            LB_EMPTY,
        )
    elif pa.types.is_list(t):
        offsets, values = _children(arr)
        valid = _check_nulls(t.value_field, values, f"{t}")
        out = _list_bytes(offsets, _framed(t.value_field, values), valid, n)
    elif pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        if not fields:
            return pa.array([b""] * n, LB)
        children = [arr.field(i) for i in range(len(fields))]
        nulls = np.zeros((n, len(fields)), np.bool_)
        for i, (f, child) in enumerate(zip(fields, children, strict=True)):
            valid = validity(child)
            if valid is not None:
                if not f.nullable and (~valid & np.asarray(arr.is_valid())).any():
                    msg = f"field {f.name!r} ({f.type}) of {t} is not nullable, got a null"
                    raise SchemaMismatchError(msg)
                nulls[:, i] = ~valid
        bitmap = fsb_to_large_binary(np.packbits(nulls, axis=1, bitorder="little"))
        framed = [_framed(f, c) for f, c in zip(fields, children, strict=True)]
        out = pc.binary_join_element_wise(bitmap, *framed, LB_EMPTY)
    else:
        msg = f"{t} is not a nested type"
        raise TypeError(msg)
    if arr.null_count:
        out = pc.if_else(arr.is_valid(), out, LB_EMPTY)
    return out


def nested_payloads(t: pa.DataType, arr: pa.Array, column: str) -> pa.Array:
    """The payload of every value of ``arr``, the column ``column`` of nested type ``t``, as
    large_binary (a null value gives empty bytes: the row's null bitmap says it is null)."""
    try:
        return _payloads(t, arr)
    except SchemaMismatchError as exc:
        msg = f"column {column!r} ({t}): {exc}"
        raise SchemaMismatchError(msg) from None


class NestedLayout:
    """One nested column's values: ``encode`` (a Python value to its payload, through Arrow) and
    ``decode`` (a payload to the Python value ``to_pylist()`` would give)."""

    def __init__(self, field: pa.Field) -> None:
        self.field = field
        self.type: pa.DataType = field.type
        self._read = _payload_reader(self.type)

    def encode(self, v: Any) -> bytes:
        try:
            arr = pa.array([_plain(v)], self.type)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            shown = repr(v)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            msg = f"column {self.field.name!r} ({self.type}) cannot hold {shown}: {exc}"
            raise SchemaMismatchError(msg) from None
        out: bytes = nested_payloads(self.type, arr, self.field.name)[0].as_py()
        return out

    def decode(self, data: bytes) -> Any:
        value, end = self._read(data, 0)
        if end != len(data):
            msg = f"a {self.type} value does not fill its {len(data)} bytes"
            raise ValueError(msg)
        return value


def _plain(v: Any) -> Any:
    """A Python value as ``pa.array`` takes it: Rows by field name, numpy arrays as lists."""
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()] if v.dtype == object else v.tolist()
    if isinstance(v, tuple) and hasattr(v, "__fields__"):  # a PySpark Row with names
        return {k: _plain(x) for k, x in zip(v.__fields__, v, strict=True)}
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, tuple):  # a struct by position, or a map's (key, value)
        return tuple(map(_plain, v))
    return v


def _payload_reader(t: pa.DataType) -> Reader:
    if pa.types.is_map(t):
        keys = _list_reader(t.key_field)
        items = _list_reader(t.item_field)

        def read_map(data: bytes, pos: int) -> tuple[Any, int]:
            k, pos = keys(data, pos)
            v, pos = items(data, pos)
            return list(zip(k, v, strict=True)), pos

        return read_map
    if pa.types.is_list(t):
        return _list_reader(t.value_field)
    if pa.types.is_struct(t):
        return _struct_reader(t)
    msg = f"{t} is not a nested type"
    raise TypeError(msg)


def _framed_reader(field: pa.Field) -> Reader:
    t = field.type
    if pa.types.is_nested(t):
        payload = _payload_reader(t)
        empty_ok = pa.types.is_struct(t) and t.num_fields == 0

        def read_nested(data: bytes, pos: int) -> tuple[Any, int]:
            (size,) = _U32.unpack_from(data, pos)
            end = pos + 4 + size
            if size == 0 and not empty_ok:
                return None, end
            value, at = payload(data, pos + 4)
            if at != end:
                msg = f"a {t} value does not fill its {size} bytes"
                raise ValueError(msg)
            return value, end

        return read_nested
    col = _scalar_column(field)
    if col.phys == "var":
        convert = col.from_phys

        def read_var(data: bytes, pos: int) -> tuple[Any, int]:
            (size,) = _U32.unpack_from(data, pos)
            raw = data[pos + 4 : pos + 4 + size]
            if len(raw) != size:
                msg = "truncated variable-width field"
                raise ValueError(msg)
            return (raw if convert is None else convert(raw)), pos + 4 + size

        return read_var
    width = col.width
    if col.struct_code == "16s":
        wide = col._decimal_from_unscaled

        def read_wide(data: bytes, pos: int) -> tuple[Any, int]:
            return wide(int.from_bytes(data[pos : pos + 16], "little", signed=True)), pos + 16

        return read_wide
    unpack = struct.Struct("<" + col.struct_code).unpack_from
    scalar = col.from_phys

    def read_fixed(data: bytes, pos: int) -> tuple[Any, int]:
        (value,) = unpack(data, pos)
        return (value if scalar is None else scalar(value)), pos + width

    return read_fixed


def _list_reader(element: pa.Field) -> Reader:
    t = element.type
    bulk: Callable[[bytes, int, int], tuple[list[Any], int]] | None = None
    if not pa.types.is_nested(t):
        col = _scalar_column(element)
        if col.phys != "var" and col.struct_code != "16s":
            code, width, scalar = col.struct_code, col.width, col.from_phys

            def bulk_fixed(data: bytes, pos: int, count: int) -> tuple[list[Any], int]:
                out = list(struct.unpack_from(f"<{count}{code}", data, pos))
                if scalar is not None:
                    out = [scalar(x) for x in out]
                return out, pos + count * width

            bulk = bulk_fixed
        elif col.phys == "var":
            text = pa.types.is_string(t) or pa.types.is_large_string(t)
            u32 = _U32.unpack_from

            def bulk_var(data: bytes, pos: int, count: int) -> tuple[list[Any], int]:
                out: list[Any] = []
                append = out.append
                for _ in range(count):
                    (n,) = u32(data, pos)
                    append(data[pos + 4 : pos + 4 + n])
                    pos += 4 + n
                if pos > len(data):
                    msg = "truncated variable-width field"
                    raise ValueError(msg)
                return ([b.decode("utf-8") for b in out] if text else out), pos

            bulk = bulk_var
    one = _framed_reader(element)

    def read_list(data: bytes, pos: int) -> tuple[Any, int]:
        count, k = _U32x2.unpack_from(data, pos)
        nulls = struct.unpack_from(f"<{k}I", data, pos + 8) if k else ()
        pos += 8 + 4 * k
        if bulk is not None:
            out, pos = bulk(data, pos, count)
        else:
            out = []
            for _ in range(count):
                value, pos = one(data, pos)
                out.append(value)
        for i in nulls:
            out[i] = None
        return out, pos

    return read_list


def _struct_reader(t: pa.StructType) -> Reader:
    """A reader of struct payloads compiled for ``t``: scalar fields read inline (one Python
    frame per struct instead of one per field), nested fields through their own readers."""
    fields = [t.field(i) for i in range(t.num_fields)]
    bitmap_len = (len(fields) + 7) // 8
    env: dict[str, Any] = {"U32": _U32.unpack_from, "from_bytes": int.from_bytes}
    lines = ["def read(data, pos):"]
    if bitmap_len == 1:
        lines.append("    nulls = data[pos]")
    elif bitmap_len:
        lines.append(f"    nulls = from_bytes(data[pos : pos + {bitmap_len}], 'little')")
    else:
        lines.append("    nulls = 0")
    lines.append(f"    pos += {bitmap_len}")
    out = []
    for i, f in enumerate(fields):
        v = f"v{i}"
        if pa.types.is_nested(f.type):
            env[f"R{i}"] = _framed_reader(f)
            lines.append(f"    {v}, pos = R{i}(data, pos)")
        else:
            col = _scalar_column(f)
            if col.phys == "var":
                lines.append("    (n,) = U32(data, pos)")
                if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
                    lines.append(f"    {v} = data[pos + 4 : pos + 4 + n].decode('utf-8')")
                else:
                    lines.append(f"    {v} = data[pos + 4 : pos + 4 + n]")
                lines.append("    pos += 4 + n")
            elif col.struct_code == "16s":
                env[f"C{i}"] = col._decimal_from_unscaled
                lines.append(
                    f"    {v} = C{i}(from_bytes(data[pos : pos + 16], 'little', signed=True))"
                )
                lines.append("    pos += 16")
            else:
                env[f"U{i}"] = struct.Struct("<" + col.struct_code).unpack_from
                if col.from_phys is None:
                    lines.append(f"    ({v},) = U{i}(data, pos)")
                else:
                    env[f"C{i}"] = col.from_phys
                    lines.append(f"    {v} = C{i}(U{i}(data, pos)[0])")
                lines.append(f"    pos += {col.width}")
        out.append(f"{f.name!r}: None if nulls >> {i} & 1 else {v}")
    lines.append("    if pos > len(data):")
    lines.append("        raise ValueError('truncated struct value')")
    lines.append("    return {" + ", ".join(out) + "}, pos")
    exec("\n".join(lines), env)  # noqa: S102 - generated from the schema's types only
    read: Reader = env["read"]
    return read


def columns_of(schema: pa.Schema, role: str) -> list[Column]:
    """The columns of a ``role`` codec's ``schema``, its nested ones laid out here."""
    if not isinstance(schema, pa.Schema):
        msg = f"{role} codec needs a pyarrow.Schema, got {schema!r}"
        raise ConfigurationError(msg)
    return [_column(i, schema.field(i), role) for i in range(len(schema))]


def _column(index: int, field: pa.Field, role: str) -> Column:
    nested = NestedLayout(field) if takes_nested_layout(field.type, role) else None
    return Column(index, field, role, nested)
