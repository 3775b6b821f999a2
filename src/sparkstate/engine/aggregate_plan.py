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
from pyspark.sql.types import (
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    StructField,
    StructType,
    TimestampType,
)

import sparkstate.functions as SF
from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression
from sparkstate.operators import hll, hll_sketch
from sparkstate.operators.aggregate_functions import AggregateFunction, buffer_column

__all__ = [
    "aggregate_function",
    "input_types",
    "partial_columns",
    "recognise",
    "spark_twin",
]

_MOMENTS = ("stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop")
#: Functions of two columns: the second is the aggregate's ``others[0]``.
_PAIRS = ("max_by", "min_by", "corr", "covar_pop", "covar_samp")
_SAME_NAME = (
    "count_if",
    "bool_and",
    "every",
    "bool_or",
    "some",
    "any",
    "any_value",
    "bit_and",
    "bit_or",
    "bit_xor",
    "skewness",
    "kurtosis",
    "percentile",
    "median",
    "mode",
    "percentile_approx",
    "approx_percentile",
    "hll_sketch_agg",
    "hll_union_agg",
    *_PAIRS,
)
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
    "last": "last",
    "last_value": "last",
    "collect_list": "collect_list",
    "array_agg": "collect_list",
    "collect_set": "collect_set",
    "approx_count_distinct": "approx_count_distinct",
    **{name: name for name in _MOMENTS},
    **{name: name for name in _SAME_NAME},
}
#: What to use instead of an aggregate that cannot be merged across batches.
_INSTEAD = {
    "count_distinct": "SF.approx_count_distinct({col}) for an estimate",
    "sum_distinct": "SF.collect_set({col}) and sum the set after the aggregation",
}
_SUPPORTED = ", ".join(
    f"SF.{name}"
    for name in (
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "first",
        "last",
        "collect_list",
        "collect_set",
        "stddev",
        "stddev_samp",
        "stddev_pop",
        "variance",
        "var_samp",
        "var_pop",
        "approx_count_distinct",
        *_SAME_NAME,
    )
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
    if out.func == "hll_sketch_agg":  # Spark checks it only when the batch runs
        hll_sketch.check_lg_k(out.option("lgConfigK", hll_sketch.DEFAULT_LG_K))
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
        what = (
            "a SQL expression string (F.expr): write the aggregate with pyspark.sql.functions "
            "or SF instead"
            if node.name in ("SqlExpression", "SQLExpression")
            else "not an aggregate function sparkstate can merge"
        )
        msg = f"{shown} is {what}; use one of {_SUPPORTED}"
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
    others: tuple[Any, ...] = ()
    rest = args[1:]
    if func in _PAIRS:
        other = _column_of(rest[0], type(agg)) if rest else None
        if other is None:
            msg = (
                f"{shown}: sparkstate takes PySpark's {node.name}() over plain columns only; "
                f"for expressions use SF.{func}(<col1>, <col2>)"
            )
            raise ConfigurationError(msg)
        rest, others = rest[1:], (other,)
    is_list = rest and rest[0].kind == "function" and rest[0].name == "array"
    if func in ("percentile", "percentile_approx", "approx_percentile") and is_list:
        items = [node_of(a) for a in rest[0].args]  # a list of percentages
        if all(i.kind == "literal" for i in items):
            rest = [_Node("literal", value=[i.value for i in items]), *rest[1:]]
    options = _options(func, rest, shown)
    return AggregateExpression(func, column, name, options, source=agg, others=others)


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
    if func == "percentile":
        return _percentile_options(rest, shown)
    if func in ("percentile_approx", "approx_percentile"):
        return _approx_options(func, rest, shown)
    if func in ("hll_sketch_agg", "hll_union_agg"):
        return _sketch_options(func, rest, shown)
    if not rest:
        return (("percentage", 0.5),) if func == "median" else ()
    if len(rest) == 1 and rest[0].kind == "literal":
        value = rest[0].value
        if func in ("first", "last", "any_value") and isinstance(value, bool):
            return (("ignorenulls", value),)
        if func == "approx_count_distinct" and isinstance(value, int | float):
            return (("rsd", float(value)),)
        if func == "mode" and isinstance(value, bool):
            return (("deterministic", value),)
    msg = f"{shown}: sparkstate takes {func}() with these arguments only as SF.{func}(...)"
    raise ConfigurationError(msg)


def _percentile_options(rest: list[_Node], shown: str) -> tuple[tuple[str, Any], ...]:
    """``percentile(col, percentage[, frequency])`` with literal percentages and frequency 1."""
    values = rest[0].value if rest and rest[0].kind == "literal" else None
    frequency = rest[1].value if len(rest) > 1 and rest[1].kind == "literal" else None
    if values is None or len(rest) > 2 or (len(rest) == 2 and frequency != 1):
        msg = (
            f"{shown}: sparkstate takes percentile() with literal percentages and frequency 1 "
            "only (SF.percentile(col, 0.5) or SF.percentile(col, [0.25, 0.75]))"
        )
        raise ConfigurationError(msg)
    try:
        return SF.percentile("_", values).options
    except ValueError as exc:
        msg = f"{shown}: {exc}"
        raise ConfigurationError(msg) from None


def _approx_options(func: str, rest: list[_Node], shown: str) -> tuple[tuple[str, Any], ...]:
    """``percentile_approx(col, percentage, accuracy)`` with literals."""
    literals = [r.value for r in rest if r.kind == "literal"]
    if len(literals) != len(rest) or len(rest) > 2:
        msg = (
            f"{shown}: sparkstate takes {func}() with a literal percentage (or list of them) "
            "and accuracy only"
        )
        raise ConfigurationError(msg)
    try:
        return getattr(SF, func)("_", *literals).options  # type: ignore[no-any-return]
    except ValueError as exc:
        msg = f"{shown}: {exc}"
        raise ConfigurationError(msg) from None


def _sketch_options(func: str, rest: list[_Node], shown: str) -> tuple[tuple[str, Any], ...]:
    """``hll_sketch_agg(col, lgConfigK)`` and ``hll_union_agg(col, allowDifferentLgConfigK)``
    with a literal second argument."""
    if not rest:
        return ()
    value = rest[0].value if len(rest) == 1 and rest[0].kind == "literal" else None
    if func == "hll_sketch_agg":
        if value is None:
            msg = (
                f"{shown}: [HLL_K_MUST_BE_CONSTANT] Invalid call to `hll_sketch_agg`; the `K` "
                "value must be a constant value; sparkstate takes a literal integer"
            )
            raise ConfigurationError(msg)
        return (("lgConfigK", hll_sketch.check_lg_k(value)),)
    if not isinstance(value, bool):
        msg = f"{shown}: hll_union_agg() takes a literal boolean allowDifferentLgConfigK only"
        raise ConfigurationError(msg)
    return (("allowDifferentLgConfigK", value),)


# --- the Spark functions --------------------------------------------------------------------------


def _as_column(col: Any) -> Column:
    return F.col(_quoted(col)) if isinstance(col, str) else col


def input_types(df: DataFrame, aggs: Sequence[AggregateExpression]) -> list[DataType | None]:
    """The Spark type of each aggregate's column (None for ``count('*')``), in one analysis; of
    a function of two columns, a struct of both types."""
    columns = [
        _as_column(c).alias(f"__ss_in{i}_{j}")
        for i, a in enumerate(aggs)
        if not (isinstance(a.column, str) and a.column == "*")
        for j, c in enumerate((a.column, *a.others))
    ]
    fields = iter(df.select(*columns).schema.fields if columns else [])
    out: list[DataType | None] = []
    for a in aggs:
        if isinstance(a.column, str) and a.column == "*":
            out.append(None)
        elif a.others:
            parts = [next(fields) for _ in range(1 + len(a.others))]
            out.append(StructType([StructField(f"_{j}", f.dataType) for j, f in enumerate(parts)]))
        else:
            out.append(next(fields).dataType)
    return out


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
    elif agg.func == "any_value":
        out = F.any_value(_as_column(agg.column), agg.option("ignorenulls"))
    elif agg.func == "percentile":
        percentage = agg.option("percentage")
        p = list(percentage) if isinstance(percentage, tuple) else percentage
        out = F.percentile(_as_column(agg.column), p)
    elif agg.func in ("percentile_approx", "approx_percentile"):
        percentage = agg.option("percentage")
        p = list(percentage) if isinstance(percentage, tuple) else percentage
        out = getattr(F, agg.func)(_as_column(agg.column), p, agg.option("accuracy"))
    elif agg.func == "mode":
        out = F.mode(_as_column(agg.column), agg.option("deterministic", False))
    elif agg.func == "hll_sketch_agg":
        out = F.hll_sketch_agg(_as_column(agg.column), agg.option("lgConfigK"))
    elif agg.func == "hll_union_agg":
        out = F.hll_union_agg(_as_column(agg.column), agg.option("allowDifferentLgConfigK"))
    elif agg.func == "any":  # Spark's SQL name, not in pyspark.sql.functions
        out = F.call_function("any", _as_column(agg.column))
    elif agg.others:
        out = getattr(F, agg.func)(_as_column(agg.column), *map(_as_column, agg.others))
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
        percentage=agg.option("percentage"),
        accuracy=agg.option("accuracy"),
        lg_config_k=agg.option("lgConfigK"),
        allow_different_lg_config_k=bool(agg.option("allowDifferentLgConfigK", False)),
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
    if func in ("first", "last", "any_value"):
        return [getattr(F, func)(col, agg.option("ignorenulls", False))]
    if func in _MOMENTS:
        x = col.cast("double")
        return [F.count(x).cast("double"), F.avg(x), F.var_pop(x) * F.count(x)]
    if func in ("skewness", "kurtosis"):
        return _central_partials(col.cast("double"), func == "kurtosis")
    if func in ("corr", "covar_pop", "covar_samp"):
        return _comoment_partials(col, _as_column(agg.others[0]), func == "corr")
    if func in ("max_by", "min_by"):
        by = _as_column(agg.others[0])
        extremum = F.max(by) if func == "max_by" else F.min(by)
        return [getattr(F, func)(col, by), extremum]
    if func in ("percentile", "median"):
        return [F.collect_list(col.cast("double"))]
    if func == "mode":
        return [F.collect_list(col)]
    if func in ("percentile_approx", "approx_percentile"):
        return [F.collect_list(_as_double(col, typ))]
    if func in ("bool_and", "every"):
        return [F.bool_and(col)]
    if func in ("bool_or", "some", "any"):
        return [F.bool_or(col)]
    if func in ("count_if", "bit_and", "bit_or", "bit_xor"):
        return [getattr(F, func)(col)]
    if func == "approx_count_distinct":
        return [F.collect_set(_hll_pair(col, typ, hll.precision(agg.option("rsd"))))]
    if func == "hll_sketch_agg":  # the batch's sketch, unioned into the state's
        return [F.hll_sketch_agg(col, agg.option("lgConfigK", hll_sketch.DEFAULT_LG_K))]
    if func == "hll_union_agg":  # null where the batch has no sketch (Spark's empty buffer)
        union = F.hll_union_agg(col, agg.option("allowDifferentLgConfigK", False))
        return [F.when(F.count(col) > 0, union)]
    return [getattr(F, func)(col)]  # min, max, collect_list, collect_set


def _as_double(col: Column, typ: DataType | None) -> Column:
    """A value as Spark's approximate percentile keeps it: a date as its day number, a timestamp
    as its microseconds."""
    if isinstance(typ, DateType):
        return F.unix_date(col).cast("double")
    if isinstance(typ, TimestampType):
        return F.unix_micros(col.cast("timestamp")).cast("double")
    return col.cast("double")


def _central_partials(x: Column, fourth: bool) -> list[Column]:
    """A batch's ``(n, avg, m2, m3[, m4])``: Spark's own skewness and kurtosis of the batch
    turned back into its third and fourth central moments (0 where every value is the same)."""
    n, m2 = F.count(x).cast("double"), F.var_pop(x) * F.count(x)
    flat = F.coalesce(m2, F.lit(0.0)) == 0.0
    m3 = F.when(flat, F.lit(0.0)).otherwise(F.skewness(x) * F.pow(m2, 1.5) / F.sqrt(n))
    out = [n, F.avg(x), m2, m3]
    if fourth:
        out.append(F.when(flat, F.lit(0.0)).otherwise((F.kurtosis(x) + 3.0) * m2 * m2 / n))
    return out


def _comoment_partials(x: Column, y: Column, marginals: bool) -> list[Column]:
    """A batch's ``(n, xAvg, yAvg, ck[, xMk, yMk])`` over the pairs where neither is null."""
    both = x.isNotNull() & y.isNotNull()
    xs, ys = F.when(both, x.cast("double")), F.when(both, y.cast("double"))
    n = F.count(xs)
    out = [n.cast("double"), F.avg(xs), F.avg(ys), F.covar_pop(xs, ys) * n]
    if marginals:
        out += [F.var_pop(xs) * n, F.var_pop(ys) * n]
    return out


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
