"""The Spark side of a streaming aggregation's functions.

For each aggregate of ``agg()``: PySpark's own aggregate (``F.sum("v")``) recognised as its
sparkstate twin, or refused naming the ``SF`` function to use; the Spark function whose result the
merged state reproduces (Spark's analyzer names and types the output after it); and the partial
buffers Spark computes per batch, one row per key, for the operator to merge
(:mod:`sparkstate.operators.aggregate_functions`).

Recognising a PySpark column reads its expression tree: a classic Column's ``ColumnNode``
(``col._jc.node()``) or a Spark Connect Column's expression (``col._expr``); nothing here touches
the JVM of a Spark Connect client's session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import DataType, DecimalType, DoubleType, FloatType

from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression
from sparkstate.operators import hll
from sparkstate.operators.aggregate_functions import AggregateFunction, buffer_column

__all__ = [
    "aggregate_function",
    "input_types",
    "partial_columns",
    "recognise",
    "spark_twin",
]

_MOMENTS = ("stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop")
#: PySpark's aggregate functions (as Spark names them) taken as the sparkstate function.
_TWINS = {
    "count": "count",
    "sum": "sum",
    "avg": "avg",
    "mean": "avg",
    "min": "min",
    "max": "max",
    "first": "first",
    "first_value": "first",
    "any_value": "first",
    "last": "last",
    "last_value": "last",
    "collect_list": "collect_list",
    "array_agg": "collect_list",
    "collect_set": "collect_set",
    "approx_count_distinct": "approx_count_distinct",
    **{name: name for name in _MOMENTS},
}
#: What to use instead of an aggregate that cannot be merged across batches.
_INSTEAD = {
    "count_distinct": "SF.approx_count_distinct({col}) for an estimate",
    "sum_distinct": "SF.collect_set({col}) and sum the set after the aggregation",
    "median": "SF.collect_list({col}) and take the median of the list after the aggregation",
    "percentile": "SF.collect_list({col}) and take the percentile after the aggregation",
    "percentile_approx": "SF.collect_list({col}) and take the percentile after the aggregation",
    "approx_percentile": "SF.collect_list({col}) and take the percentile after the aggregation",
    "count_if": "SF.sum(F.when(<condition>, 1).otherwise(0))",
}
_SUPPORTED = (
    "SF.count, SF.sum, SF.avg, SF.min, SF.max, SF.first, SF.last, SF.collect_list, "
    "SF.collect_set, SF.stddev, SF.stddev_samp, SF.stddev_pop, SF.variance, SF.var_samp, "
    "SF.var_pop, SF.approx_count_distinct"
)


# --- PySpark's own aggregates ---------------------------------------------------------------------


@dataclasses.dataclass
class _Node:
    """One node of a column's expression tree, whichever client built it."""

    kind: str  # alias | function | column | star | literal | other
    name: str = ""
    args: list[Any] = dataclasses.field(default_factory=list)
    distinct: bool = False
    #: column: the name parts (classic) or the unparsed identifier (Connect); alias: the names.
    parts: list[str] = dataclasses.field(default_factory=list)
    value: Any = None
    #: The client's own node (Connect: an expression a Column can wrap).
    raw: Any = None


def _seq(seq: Any) -> list[Any]:
    """A Scala ``Seq`` through py4j as a list."""
    return [seq.apply(i) for i in range(seq.length())]


def _classic_node(node: Any) -> _Node:
    kind = node.getClass().getSimpleName()
    if kind == "Alias":
        return _Node("alias", args=[node.child()], parts=[str(n) for n in _seq(node.name())])
    if kind == "UnresolvedFunction":
        args = _seq(node.arguments())
        return _Node("function", node.functionName(), args, bool(node.isDistinct()))
    if kind == "UnresolvedAttribute":
        return _Node("column", parts=[str(p) for p in _seq(node.nameParts())], raw=node)
    if kind == "UnresolvedStar":
        return _Node("star" if not node.unparsedTarget().isDefined() else "other")
    if kind == "Literal":
        return _Node("literal", value=node.value())
    return _Node("other", kind)


def _connect_node(expr: Any) -> _Node:
    kind = type(expr).__name__
    if kind == "ColumnAlias":
        return _Node("alias", args=[expr._child], parts=list(expr._alias))
    if kind == "UnresolvedFunction":
        return _Node("function", expr._name, list(expr._args), bool(expr._is_distinct))
    if kind == "ColumnReference":
        return _Node("column", parts=[expr._unparsed_identifier], raw=expr)
    if kind == "UnresolvedStar":
        return _Node("star" if expr._unparsed_target is None else "other")
    if kind == "LiteralExpression":
        return _Node("literal", value=expr._value)
    return _Node("other", kind)


def _is_connect(column_class: type) -> bool:
    return column_class.__module__.startswith("pyspark.sql.connect")


def _quoted(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def recognise(agg: Any) -> AggregateExpression:
    """``agg`` as a sparkstate aggregate: an ``SF`` aggregate as it is, a ``pyspark.sql.functions``
    aggregate of a plain column (or ``*``) as its twin; anything else fails naming what to use."""
    out = agg if isinstance(agg, AggregateExpression) else _twin_of(agg)
    if out.func == "approx_count_distinct":
        hll.precision(out.option("rsd"))  # before Spark analyses it, with our message
    return out


def _twin_of(agg: Any) -> AggregateExpression:
    shown = str(agg)
    node_of: Callable[[Any], _Node]
    if _is_connect(type(agg)):
        node_of, root = _connect_node, agg._expr
    elif type(agg).__name__ == "Column" and hasattr(agg, "_jc"):
        node_of, root = _classic_node, agg._jc.node()
    else:
        msg = (
            f"ss ... .agg() takes aggregates such as SF.count('*') or F.sum('v'), got {shown!r} "
            f"({type(agg).__name__})"
        )
        raise ConfigurationError(msg)
    node, name = node_of(root), None
    while node.kind == "alias":
        if len(node.parts) != 1:
            msg = f"{shown}: an aggregate takes one alias, got {node.parts}"
            raise ConfigurationError(msg)
        name = name or node.parts[0]
        node = node_of(node.args[0])
    if node.kind != "function":
        msg = f"{shown} is not an aggregate function sparkstate can merge; use one of {_SUPPORTED}"
        raise ConfigurationError(msg)
    args = [node_of(a) for a in node.args]
    func = _TWINS.get(node.name)
    column = _column_of(args[0], type(agg)) if args else None
    col = repr(column) if isinstance(column, str) else "<column>"
    if node.distinct or func is None:
        key = node.name + ("_distinct" if node.distinct else "")
        instead = _INSTEAD.get(key, f"one of {_SUPPORTED}").format(col=col)
        what = f"{node.name}(DISTINCT ...)" if node.distinct else f"{node.name}()"
        msg = f"{shown}: {what} cannot be merged across batches; use {instead}"
        raise ConfigurationError(msg)
    if node.name == "count" and args and args[0].kind in ("star", "literal"):
        if args[0].kind == "literal" and args[0].value is None:
            msg = f"{shown}: count(NULL) is always 0; use SF.count('*') or SF.count(<column>)"
            raise ConfigurationError(msg)
        column = "*"
    if column is None:
        example = f"SF.{func}(F.col('v') * 2)"
        msg = (
            f"{shown}: sparkstate takes PySpark's {node.name}() over a plain column only; for an "
            f"expression use SF.{func}(<the expression>), e.g. {example}"
        )
        raise ConfigurationError(msg)
    options = _options(func, args[1:], shown)
    return AggregateExpression(func, column, name, options, source=agg)


def _column_of(node: _Node, column_class: type) -> Any:
    """The column a plain reference names (a name, or a Column for a nested or quoted one)."""
    if node.kind != "column":
        return None
    parts = node.parts
    if _is_connect(column_class):
        ident = parts[0]
        return ident if "." not in ident and "`" not in ident else column_class(node.raw)
    return parts[0] if len(parts) == 1 else F.col(".".join(_quoted(p) for p in parts))


def _options(func: str, rest: list[_Node], shown: str) -> tuple[tuple[str, Any], ...]:
    if not rest:
        return ()
    if len(rest) == 1 and rest[0].kind == "literal":
        value = rest[0].value
        if func in ("first", "last") and isinstance(value, bool):
            return (("ignorenulls", value),)
        if func == "approx_count_distinct" and isinstance(value, int | float):
            return (("rsd", float(value)),)
    msg = f"{shown}: sparkstate takes {func}() with these arguments only as SF.{func}(...)"
    raise ConfigurationError(msg)


# --- the Spark functions --------------------------------------------------------------------------


def _as_column(col: Any) -> Column:
    return F.col(_quoted(col)) if isinstance(col, str) else col


def input_types(df: DataFrame, aggs: Sequence[AggregateExpression]) -> list[DataType | None]:
    """The Spark type of each aggregate's column (None for ``count('*')``), in one analysis."""
    columns = [
        _as_column(a.column).alias(f"__ss_in{i}")
        for i, a in enumerate(aggs)
        if not (isinstance(a.column, str) and a.column == "*")
    ]
    fields = iter(df.select(*columns).schema.fields if columns else [])
    return [
        None if isinstance(a.column, str) and a.column == "*" else next(fields).dataType
        for a in aggs
    ]


def spark_twin(agg: AggregateExpression) -> Column:
    """Spark's own aggregate that ``agg`` reproduces, named as the user named it."""
    if agg.source is not None:
        source: Column = agg.source
        return source
    if agg.func == "count" and isinstance(agg.column, str) and agg.column == "*":
        out = F.count("*")
    elif agg.func in ("first", "last"):
        out = getattr(F, agg.func)(_as_column(agg.column), agg.option("ignorenulls", False))
    elif agg.func == "approx_count_distinct":
        out = F.approx_count_distinct(_as_column(agg.column), agg.option("rsd"))
    else:
        out = getattr(F, agg.func)(_as_column(agg.column))
    return out.alias(agg.name) if agg.name else out


def aggregate_function(
    agg: AggregateExpression,
    output_name: str,
    output_type: DataType,
    input_type: DataType | None,
    *,
    legacy_statistics: bool = False,
) -> AggregateFunction:
    """The operator's description of ``agg``, whose result Spark names and types as given."""
    return AggregateFunction(
        agg.func,
        output_name,
        to_arrow_type(output_type, timezone="UTC"),
        _arrow_or_none(input_type),
        ignore_nulls=bool(agg.option("ignorenulls", False)),
        rsd=agg.option("rsd"),
        legacy_statistics=legacy_statistics,
    )


def _arrow_or_none(typ: DataType | None) -> pa.DataType | None:
    if typ is None:
        return None
    try:
        return to_arrow_type(typ, timezone="UTC")
    except Exception:  # noqa: BLE001 - a type Arrow has no twin for: only min/max need none
        return None


def partial_columns(
    aggs: Sequence[AggregateExpression], types: Sequence[DataType | None]
) -> list[Column]:
    """Each aggregate's partial buffers of one batch, per key, named by ``buffer_column``."""
    out: list[Column] = []
    for i, (agg, typ) in enumerate(zip(aggs, types, strict=True)):
        parts = _partials(agg, typ)
        out += [part.alias(buffer_column(i, agg.func, p)) for p, part in enumerate(parts)]
    return out


def _partials(agg: AggregateExpression, typ: DataType | None) -> list[Column]:
    func = agg.func
    if func == "count":
        star = isinstance(agg.column, str) and agg.column == "*"
        return [F.count(F.lit(1) if star else _as_column(agg.column))]
    col = _as_column(agg.column)
    decimal = isinstance(typ, DecimalType)
    if func == "sum":
        return [F.sum(col), F.count(col) == 0] if decimal else [F.sum(col)]
    if func == "avg":
        return [F.sum(col if decimal else col.cast("double")), F.count(col)]
    if func in ("first", "last"):
        return [getattr(F, func)(col, agg.option("ignorenulls", False))]
    if func in _MOMENTS:
        x = col.cast("double")
        return [F.count(x).cast("double"), F.avg(x), F.var_pop(x) * F.count(x)]
    if func == "approx_count_distinct":
        return [F.collect_set(_hll_pair(col, typ, hll.precision(agg.option("rsd"))))]
    return [getattr(F, func)(col)]  # min, max, collect_list, collect_set


def _hll_pair(col: Column, typ: DataType | None, p: int) -> Column:
    """Spark's HyperLogLog++ update of one value, as a packed (register index, rank) pair: the
    XxHash64 (seed 42) of the value, floats normalised (NaN, -0.0) as Spark normalises them; the
    index is the hash's top ``p`` bits, the rank the leading zeros of the rest plus one."""
    value = col
    if isinstance(typ, FloatType | DoubleType):
        nan, zero = F.lit(float("nan")).cast(typ), F.lit(0).cast(typ)
        value = F.when(F.isnan(col), nan).when(col == 0, zero).otherwise(col)
    h = F.xxhash64(value)
    index = F.shiftrightunsigned(h, 64 - p)
    rest = h.bitwiseAND(F.lit((1 << (64 - p)) - 1))
    bits = F.when(rest == 0, F.lit(0)).otherwise(F.length(F.bin(rest)))
    rank = F.lit(64 - p + 1) - bits
    pair = F.shiftleft(index, hll.RANK_BITS).bitwiseOR(rank.cast("long"))
    return F.when(col.isNotNull(), pair)
