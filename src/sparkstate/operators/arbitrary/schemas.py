"""State and output schemas as users write them: a pyarrow schema, a DDL string or a StructType.

PySpark users declare schemas as ``StructType`` objects or DDL strings (``"count long, last
string"``, ``"struct<count:bigint>"``); this module turns any of them into the ``pa.Schema`` the
store codecs use, without importing pyspark (a ``StructType`` is read through its duck type:
``.fields`` with ``name``, ``dataType.simpleString()`` and ``nullable``). Types map as PySpark maps
them to Arrow (``timestamp`` is UTC microseconds, ``timestamp_ntz`` naive microseconds).
A state schema may instead be :data:`PICKLED`: Python objects, pickled, only when asked for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, cast

import pyarrow as pa

from sparkstate.exceptions import ConfigurationError
from sparkstate.store.evolution import PICKLED_FIELD

__all__ = [
    "PICKLED",
    "PICKLED_SCHEMA",
    "PickledState",
    "SchemaLike",
    "arrow_type_of",
    "parse_ddl",
    "parse_type",
    "state_schema_of",
    "to_arrow_schema",
]

#: Anything a schema may be given as.
SchemaLike: TypeAlias = "pa.Schema | str | Sequence[tuple[str, Any]] | Any"


class PickledState:
    """The type of :data:`PICKLED` (one instance; it pickles as a reference to it)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "sparkstate.PICKLED"

    def __reduce__(self) -> str:
        return "PICKLED"


#: Given as a state schema (``stateStructType`` of ``applyInPandasWithState`` /
#: ``flatMapGroupsWithState``, the schema of ``getValueState`` / ``getListState`` or the value
#: schema of ``getMapState``), state values are any picklable Python objects, stored pickled in
#: one binary field. Unpickling runs code: only restart from checkpoints you trust.
PICKLED = PickledState()
#: How a ``PICKLED`` state value is stored.
PICKLED_SCHEMA = pa.schema([pa.field(PICKLED_FIELD, pa.binary(), nullable=False)])

_SIMPLE: dict[str, Callable[[], pa.DataType]] = {
    "boolean": pa.bool_,
    "bool": pa.bool_,
    "tinyint": pa.int8,
    "byte": pa.int8,
    "smallint": pa.int16,
    "short": pa.int16,
    "int": pa.int32,
    "integer": pa.int32,
    "bigint": pa.int64,
    "long": pa.int64,
    "float": pa.float32,
    "real": pa.float32,
    "double": pa.float64,
    "string": pa.string,
    "binary": pa.binary,
    "date": pa.date32,
    "timestamp": lambda: pa.timestamp("us", tz="UTC"),
    "timestamp_ltz": lambda: pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": lambda: pa.timestamp("us"),
}
_DECIMAL = re.compile(r"(?:decimal|dec|numeric)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?")
_VARCHAR = re.compile(r"(?:var)?char\s*\(\s*\d+\s*\)")
_NAME = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)\s*(:)?\s*(.*)", re.DOTALL)
_COMPLEX = re.compile(r"(array|map|struct)\s*<(.*)>", re.IGNORECASE | re.DOTALL)
_NOT_NULL = re.compile(r"(.*?)\s+not\s+null\s*$", re.IGNORECASE | re.DOTALL)
_COMMENT = re.compile(r"(.*?)\s+comment\s+'(?:[^']|'')*'\s*$", re.IGNORECASE | re.DOTALL)


def parse_type(text: str) -> pa.DataType:
    """The Arrow type of a Spark SQL type name (``"bigint"``, ``"decimal(10,2)"``,
    ``"array<int>"``, ``"struct<a:int,b:string>"``, ``"map<string,bigint>"``, nested), mapped as
    PySpark's ``to_arrow_type`` maps it: an array's elements and a map's values are nullable, a
    map's keys are not."""
    stripped = text.strip()
    name = stripped.lower()
    simple = _SIMPLE.get(name)
    if simple is not None:
        return simple()
    if m := _DECIMAL.fullmatch(name):
        precision = int(m.group(1) or 10)
        scale = int(m.group(2) or 0)
        return pa.decimal128(precision, scale)
    if _VARCHAR.fullmatch(name):
        return pa.string()
    if m := _COMPLEX.fullmatch(stripped):
        return _complex_type(m.group(1).lower(), m.group(2), stripped)
    msg = (
        f"type {stripped!r} is not supported; use a Spark SQL type "
        f"({', '.join(sorted(_SIMPLE))}, decimal(p,s), varchar(n), array<t>, map<k,v>, "
        "struct<name:t,...>)"
    )
    raise ConfigurationError(msg)


def _complex_type(kind: str, inner: str, shown: str) -> pa.DataType:
    if kind == "array":
        return pa.list_(pa.field("element", parse_type(inner), nullable=True))
    if kind == "map":
        parts = _split_top_level(inner)
        if len(parts) != 2:
            msg = f"cannot parse {shown!r}: expected map<key type, value type>"
            raise ConfigurationError(msg)
        key = pa.field("key", parse_type(parts[0]), nullable=False)
        return pa.map_(key, pa.field("value", parse_type(parts[1]), nullable=True))
    return pa.struct(_fields_of(inner, shown, allow_empty=True))


def _fields_of(text: str, shown: str, allow_empty: bool = False) -> list[pa.Field]:
    """The fields of ``"a long, b string not null"`` (``name:type`` too, as Spark accepts)."""
    fields = []
    for part in _split_top_level(text):
        m = _NAME.fullmatch(part)
        if m is None or not m.group(3).strip():
            msg = f"cannot parse {part.strip()!r} in schema {shown!r}: expected 'name type'"
            raise ConfigurationError(msg)
        name = m.group(1)
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        rest = m.group(3)
        if c := _COMMENT.fullmatch(rest):
            rest = c.group(1)
        nullable = True
        if nn := _NOT_NULL.fullmatch(rest):
            rest, nullable = nn.group(1), False
        fields.append(pa.field(name, parse_type(rest), nullable=nullable))
    if not fields and not allow_empty:
        msg = f"schema {shown!r} has no fields"
        raise ConfigurationError(msg)
    names = [f.name for f in fields]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        msg = f"schema {shown!r} repeats the field name(s) {dupes}"
        raise ConfigurationError(msg)
    return fields


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses, angle brackets, quotes and backquotes."""
    parts, depth, start, quote = [], 0, 0, ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'`":
            quote = ch
        elif ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def parse_ddl(ddl: str) -> pa.Schema:
    """A schema from a DDL string: ``"a long, b string not null"`` or ``"struct<a:bigint>"``."""
    text = ddl.strip()
    if (m := _COMPLEX.fullmatch(text)) and m.group(1).lower() == "struct":
        text = m.group(2)
    return _unique(pa.schema(_fields_of(text, ddl)), ddl)


def _unique(schema: pa.Schema, shown: object) -> pa.Schema:
    names = schema.names
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        msg = f"schema {shown!r} repeats the field name(s) {dupes}"
        raise ConfigurationError(msg)
    return schema


def _from_struct_type(struct: Any) -> pa.Schema:
    fields = [
        pa.field(f.name, arrow_type_of(f.dataType), nullable=bool(f.nullable))
        for f in struct.fields
    ]
    return _unique(pa.schema(fields), struct)


def arrow_type_of(dtype: Any) -> pa.DataType:
    """The Arrow type of a PySpark ``DataType`` (read through its duck type: ``elementType`` and
    ``containsNull`` of an array, ``keyType``, ``valueType`` and ``valueContainsNull`` of a map,
    ``fields`` of a struct, ``simpleString()`` of the rest), as PySpark's ``to_arrow_type``."""
    if isinstance(dtype, pa.DataType):
        return dtype
    if isinstance(dtype, str):
        return parse_type(dtype)
    if hasattr(dtype, "elementType"):
        element = arrow_type_of(dtype.elementType)
        nullable = bool(getattr(dtype, "containsNull", True))
        return pa.list_(pa.field("element", element, nullable=nullable))
    if hasattr(dtype, "keyType") and hasattr(dtype, "valueType"):
        key = pa.field("key", arrow_type_of(dtype.keyType), nullable=False)
        nullable = bool(getattr(dtype, "valueContainsNull", True))
        return pa.map_(key, pa.field("value", arrow_type_of(dtype.valueType), nullable=nullable))
    if hasattr(dtype, "fields") and hasattr(dtype, "fieldNames"):
        return pa.struct(list(_from_struct_type(dtype)))
    text = dtype.simpleString() if hasattr(dtype, "simpleString") else str(dtype)
    return parse_type(text)


def to_arrow_schema(schema: SchemaLike, what: str = "schema") -> pa.Schema:
    """Any accepted schema form as a ``pa.Schema`` (``what`` names it in error messages)."""
    if isinstance(schema, pa.Schema):
        if not len(schema):
            msg = f"{what} has no fields"
            raise ConfigurationError(msg)
        return _unique(schema, schema)
    if isinstance(schema, str):
        return parse_ddl(schema)
    if hasattr(schema, "fields") and hasattr(schema, "fieldNames"):
        return _from_struct_type(schema)
    if isinstance(schema, Sequence) and all(isinstance(p, tuple) and len(p) == 2 for p in schema):
        pairs: list[tuple[str, Any]] = list(cast(Sequence[tuple[str, Any]], schema))
        fields = [pa.field(n, arrow_type_of(t), nullable=True) for n, t in pairs]
        return to_arrow_schema(pa.schema(fields), what)
    msg = (
        f"{what} must be a pyarrow.Schema, a DDL string like 'count long, last string', "
        f"a pyspark StructType or a list of (name, type) pairs; got {schema!r}"
    )
    raise ConfigurationError(msg)


def state_schema_of(schema: SchemaLike, what: str) -> tuple[pa.Schema, bool]:
    """The stored schema of a state value and whether it holds pickled objects (:data:`PICKLED`)."""
    if isinstance(schema, PickledState):
        return PICKLED_SCHEMA, True
    try:
        out = to_arrow_schema(schema, what)
    except ConfigurationError as exc:
        if isinstance(schema, str | pa.Schema) or hasattr(schema, "fields"):
            raise
        msg = f"{exc}; to keep Python objects as state, pickled, pass sparkstate.PICKLED"
        raise ConfigurationError(msg) from None
    if PICKLED_FIELD in out.names:
        msg = f"{what}: the field name {PICKLED_FIELD!r} is reserved"
        raise ConfigurationError(msg)
    return out, False
