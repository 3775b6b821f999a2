"""PySpark's aggregates read as sparkstate's: ``F.sum("v")`` recognised as its ``SF`` twin, or
refused naming the ``SF`` function to use.

Recognising a PySpark column reads its expression tree: a classic Column's ``ColumnNode``
(``col._jc.node()``) or a Spark Connect Column's expression (``col._expr``); nothing here touches
the JVM of a Spark Connect client's session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pyspark.sql import functions as F

import sparkstate.functions as SF
from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression
from sparkstate.operators.aggregation import hll, hll_sketch

__all__ = ["MOMENTS", "Node", "checked", "recognise", "twin_of_function"]

MOMENTS = ("stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop")
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
    **{name: name for name in MOMENTS},
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
class Node:
    """One node of a column's expression tree, whichever client built it."""

    kind: str  # alias | function | column | expression | star | literal | other
    name: str = ""
    args: list[Any] = dataclasses.field(default_factory=list)
    distinct: bool = False
    #: column: the name parts (classic) or the unparsed identifier (Connect); alias: the names.
    parts: list[str] = dataclasses.field(default_factory=list)
    value: Any = None
    #: The client's own node (Connect: an expression a Column can wrap); of an expression, the
    #: Column that computes it.
    raw: Any = None


def _seq(seq: Any) -> list[Any]:
    """A Scala ``Seq`` through py4j as a list."""
    return [seq.apply(i) for i in range(seq.length())]


def _classic_node(node: Any) -> Node:
    kind = node.getClass().getSimpleName()
    if kind == "Alias":
        return Node("alias", args=[node.child()], parts=[str(n) for n in _seq(node.name())])
    if kind == "UnresolvedFunction":
        args = _seq(node.arguments())
        return Node("function", node.functionName(), args, bool(node.isDistinct()))
    if kind == "UnresolvedAttribute":
        return Node("column", parts=[str(p) for p in _seq(node.nameParts())], raw=node)
    if kind == "UnresolvedStar":
        return Node("star" if not node.unparsedTarget().isDefined() else "other")
    if kind == "Literal":
        return Node("literal", value=node.value())
    return Node("other", kind)


def _connect_node(expr: Any) -> Node:
    kind = type(expr).__name__
    if kind == "ColumnAlias":
        return Node("alias", args=[expr._child], parts=list(expr._alias))
    if kind == "UnresolvedFunction":
        return Node("function", expr._name, list(expr._args), bool(expr._is_distinct))
    if kind == "ColumnReference":
        return Node("column", parts=[expr._unparsed_identifier], raw=expr)
    if kind == "UnresolvedStar":
        return Node("star" if expr._unparsed_target is None else "other")
    if kind == "LiteralExpression":
        return Node("literal", value=expr._value)
    return Node("other", kind)


def _is_connect(column_class: type) -> bool:
    return column_class.__module__.startswith("pyspark.sql.connect")


def _quoted(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def recognise(agg: Any) -> AggregateExpression:
    """``agg`` as a sparkstate aggregate: an ``SF`` aggregate as it is, a ``pyspark.sql.functions``
    aggregate of a plain column (or ``*``) as its twin; anything else fails naming what to use."""
    return checked(agg if isinstance(agg, AggregateExpression) else _twin_of(agg))


def checked(agg: AggregateExpression) -> AggregateExpression:
    """``agg``, its options checked with our messages (before Spark analyses them)."""
    if agg.func == "approx_count_distinct":
        hll.precision(agg.option("rsd"))
    if agg.func == "hll_sketch_agg":  # Spark checks it only when the batch runs
        hll_sketch.check_lg_k(agg.option("lgConfigK", hll_sketch.DEFAULT_LG_K))
    return agg


def _twin_of(agg: Any) -> AggregateExpression:
    shown = str(agg)
    node_of: Callable[[Any], Node]
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
    return twin_of_function(node, node_of, shown, name, agg, type(agg))


def twin_of_function(
    node: Node,
    node_of: Callable[[Any], Node],
    shown: str,
    name: str | None,
    source: Any,
    column_class: type,
) -> AggregateExpression:
    """The sparkstate aggregate of one aggregate function's ``node`` (its arguments read with
    ``node_of``), output as ``name``; ``source`` is Spark's column it reproduces, if it names
    the output."""
    args = [node_of(a) for a in node.args]
    func = _TWINS.get(node.name)
    column = _column_of(args[0], column_class) if args else None
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
        other = _column_of(rest[0], column_class) if rest else None
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
            rest = [Node("literal", value=[i.value for i in items]), *rest[1:]]
    options = _options(func, rest, shown)
    return AggregateExpression(func, column, name, options, source=source, others=others)


def _column_of(node: Node, column_class: type) -> Any:
    """The column a plain reference names (a name, or a Column for a nested or quoted one)."""
    if node.kind == "expression":  # an expression Spark computes (read off Spark's plan)
        return node.raw
    if node.kind != "column":
        return None
    parts = node.parts
    if _is_connect(column_class):
        ident = parts[0]
        return ident if "." not in ident and "`" not in ident else column_class(node.raw)
    return parts[0] if len(parts) == 1 else F.col(".".join(_quoted(p) for p in parts))


def _options(func: str, rest: list[Node], shown: str) -> tuple[tuple[str, Any], ...]:
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


def _percentile_options(rest: list[Node], shown: str) -> tuple[tuple[str, Any], ...]:
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


def _approx_options(func: str, rest: list[Node], shown: str) -> tuple[tuple[str, Any], ...]:
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


def _sketch_options(func: str, rest: list[Node], shown: str) -> tuple[tuple[str, Any], ...]:
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
