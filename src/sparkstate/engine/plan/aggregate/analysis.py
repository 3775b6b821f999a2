"""The aggregates of ``groupBy().agg()`` read off Spark's analyzed plan of the query.

An aggregate of a plain column (``F.sum("v")``, ``SF.avg("d")``) is taken as it is
(:func:`~sparkstate.engine.plan.aggregate.recognise.recognise`). Any other shape is Spark's to
resolve: the user's ``agg`` is analysed by Spark, and each output column of its ``Aggregate``
node is cut in two. The aggregate functions inside it (``sum((v * 2))``, ``avg(v)``, ``sum(v)
FILTER (WHERE ...)``) are merged with the state by the operator, each under a name of its own;
the expression around them (``round(_, 2)``, a division, a cast, ``size``) is evaluated by Spark
over the operator's output, with the output name Spark gave it. The result's names and types are
checked against Spark's own analysis of the query.
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sparkstate.engine.plan.aggregate.partials import spark_twin
from sparkstate.engine.plan.aggregate.recognise import Node, checked, recognise, twin_of_function
from sparkstate.engine.spark.connect_analysis import stand_in_aggregate
from sparkstate.engine.spark.expressions import node_name, quoted, seq_list, sql_of
from sparkstate.engine.spark.session import is_connect
from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression

__all__ = ["AggregateSplit", "split_aggregates"]

#: The prefix of the operator's own names for the aggregates inside expressions.
INNER_PREFIX = "__ss_agg"
#: Functions a ``FILTER (WHERE ...)`` can be moved into the input of (as ``CASE WHEN``): those
#: that skip null inputs. first/last/any_value skip them only with ``ignoreNulls``.
_MAY_IGNORE_NULLS = ("first", "first_value", "last", "last_value", "any_value")


@dataclasses.dataclass(frozen=True)
class AggregateSplit:
    """The aggregates the operator merges, and how Spark makes the user's output of them."""

    aggregates: list[AggregateExpression]
    #: The user's output columns over the operator's output (keys first), or None where the
    #: operator's output is the user's.
    projection: list[Column] | None = None
    #: Spark's own schema of the user's output, where there is a projection.
    expected: StructType | None = None

    def output_of(self, merged: DataFrame) -> tuple[DataFrame, list[list[Column]]]:
        """The user's output over ``merged`` (the operator's output), checked against Spark's
        analysis of the query, and the projections that make it, in order."""
        assert self.projection is not None and self.expected is not None
        out = merged.select(*self.projection)
        got = [(f.name, f.dataType) for f in out.schema.fields]
        if got != [(f.name, f.dataType) for f in self.expected.fields]:
            msg = (
                f"cannot compute the aggregation's output as Spark does: Spark's columns are "
                f"{self.expected.simpleString()}, sparkstate's {out.schema.simpleString()}"
            )
            raise ConfigurationError(msg)
        pairs = zip(self.expected.fields, out.schema.fields, strict=True)
        if all(mine.nullable or not field.nullable for field, mine in pairs):
            return out, [self.projection]
        nullable = [  # Spark's aggregate output may be null where the expression alone may not
            F.expr(f"nullif({quoted(f.name)}, NULL)").alias(f.name, metadata=f.metadata)
            if f.nullable and not mine.nullable
            else F.col(quoted(f.name))
            for f, mine in zip(self.expected.fields, out.schema.fields, strict=True)
        ]
        return out.select(*nullable), [self.projection, nullable]


def split_aggregates(df: DataFrame, keys: Sequence[Column], aggs: Sequence[Any]) -> AggregateSplit:
    """The aggregates of ``df.groupBy(*keys).agg(*aggs)`` for the operator to merge."""
    taken: list[AggregateExpression | ConfigurationError] = []
    for agg in aggs:
        try:
            taken.append(recognise(agg))
        except ConfigurationError as exc:
            taken.append(exc)
    refused = [t for t in taken if isinstance(t, ConfigurationError)]
    if not refused:
        return AggregateSplit([t for t in taken if isinstance(t, AggregateExpression)])
    for agg, took in zip(aggs, taken, strict=True):
        if isinstance(took, ConfigurationError) and type(agg).__name__ != "Column":
            raise took  # not PySpark's column (classic or Connect) for Spark to analyse
    columns = [
        spark_twin(t) if isinstance(t, AggregateExpression) else a
        for t, a in zip(taken, aggs, strict=True)
    ]
    spark_output = df.groupBy(*keys).agg(*columns)  # Spark's errors for what it refuses
    sql: Callable[[Any], str] = sql_of
    if is_connect(df.sparkSession):  # the plan of a local JVM's analysis (as a join's)
        analysis = stand_in_aggregate(df, list(keys), columns)
        plan, sql = analysis.plan, analysis.sql
        _ = spark_output.schema  # the server's errors for what it refuses
    else:
        plan = spark_output._jdf.queryExecution().analyzed()  # noqa: SLF001
    node = _aggregate_node(plan)
    outputs = seq_list(node.aggregateExpressions())
    nkeys = len(outputs) - len(aggs)
    fields = spark_output.schema.fields
    projection = [F.col(quoted(f.name)) for f in fields[:nkeys]]
    merged: list[AggregateExpression] = []
    inner = _Inner(merged, sql)
    for i, agg in enumerate(taken):
        field = fields[nkeys + i]
        if isinstance(agg, AggregateExpression):
            merged.append(agg)
            projection.append(F.col(quoted(field.name)))
        else:  # named as Spark names it, with its metadata (an automatic alias is marked)
            column = inner.projected(outputs[nkeys + i])
            projection.append(column.alias(field.name, metadata=field.metadata))
    return AggregateSplit(merged, projection, spark_output.schema)


def _aggregate_node(plan: Any) -> Any:
    node = plan
    while node_name(node) != "Aggregate":
        if node.children().size() != 1:
            msg = f"cannot read Spark's plan of the aggregation ({node_name(node)} above it)"
            raise ConfigurationError(msg)
        node = node.children().apply(0)
    return node


class _Inner:
    """The aggregate functions inside the user's output columns, each merged once."""

    def __init__(self, merged: list[AggregateExpression], sql: Callable[[Any], str]) -> None:
        self.merged = merged
        #: An expression of Spark's plan as SQL over the input's columns.
        self.sql = sql
        #: Each aggregate function's SQL, and its own name and Catalyst expression.
        self.by_sql: dict[str, tuple[str, Any]] = {}

    def projected(self, output: Any) -> Column:
        """``output`` (an ``Alias`` of Spark's plan) over the operator's output: its aggregate
        functions replaced by the columns the operator merges them in."""
        expr = output.child() if node_name(output) == "Alias" else output
        sql = self.sql(expr)
        found: list[Any] = []
        _aggregates_in(expr, found)
        for ae in found:
            self._merge(ae, sql)
        names = {s: n for s, (n, _) in self.by_sql.items() if s in sql}
        for ae_sql in sorted(names, key=len, reverse=True):
            sql = sql.replace(ae_sql, quoted(names[ae_sql]))
        return F.expr(sql)

    def _merge(self, ae: Any, shown: str) -> None:
        sql = self.sql(ae)
        if sql in self.by_sql:
            if not ae.semanticEquals(self.by_sql[sql][1]):
                msg = (
                    f"{shown}: two different aggregates read {sql!r} in Spark's plan; give "
                    "each its own agg() column"
                )
                raise ConfigurationError(msg)
            return
        name = f"{INNER_PREFIX}{len(self.by_sql)}"
        self.by_sql[sql] = (name, ae)
        self.merged.append(checked(_twin_of_plan(ae, name, shown, self.sql)))


def _aggregates_in(expr: Any, out: list[Any]) -> None:
    if node_name(expr) == "AggregateExpression":
        out.append(expr)
        return
    for child in seq_list(expr.children()):
        _aggregates_in(child, out)


def _twin_of_plan(ae: Any, name: str, shown: str, sql: Callable[[Any], str]) -> AggregateExpression:
    """The sparkstate aggregate of one of Spark's analysed aggregate expressions."""
    fn = ae.aggregateFunction()
    fname = str(fn.prettyName())
    args = seq_list(fn.children())
    flags: list[Node] = []
    ignore_nulls = _flag(fn, "ignoreNulls") if fname in _MAY_IGNORE_NULLS else None
    if ignore_nulls is not None:
        flags.append(Node("literal", value=ignore_nulls))
    relative_sd = _flag(fn, "relativeSD")
    if relative_sd is not None and fname == "approx_count_distinct":
        flags.append(Node("literal", value=float(relative_sd)))
    if ae.filter().isDefined():
        if fname in _MAY_IGNORE_NULLS and not ignore_nulls:
            msg = (
                f"{shown}: {fname}() with FILTER (WHERE ...) is not supported; filter the rows "
                "before the aggregation"
            )
            raise ConfigurationError(msg)
        condition = sql(ae.filter().get())
        inputs = (
            2
            if len(args) > 1 and fname in ("max_by", "min_by", "corr", "covar_pop", "covar_samp")
            else 1
        )
        filtered = [_when(condition, sql(a)) for a in args[:inputs]]
        nodes = filtered + [_node(a, sql) for a in args[inputs:]]
    else:
        nodes = [_argument(a, i, fname, sql) for i, a in enumerate(args)]
    node = Node("function", fname, [*nodes, *flags], bool(ae.isDistinct()))
    return twin_of_function(node, _same, shown, name, None, Column)


def _flag(fn: Any, method: str) -> Any:
    """A parameter of Spark's aggregate function that is not one of its children, if it has it."""
    try:
        return getattr(fn, method)()
    except Exception:  # noqa: BLE001 - py4j: no such method on this function
        return None


def _same(node: Node) -> Node:
    return node


def _when(condition: str, arg: str) -> Node:
    """``arg`` where ``condition`` holds, null elsewhere (a ``FILTER`` moved into the input)."""
    return Node("expression", raw=F.expr(f"CASE WHEN {condition} THEN {arg} END"))


def _argument(arg: Any, position: int, fname: str, sql: Callable[[Any], str]) -> Node:
    """An argument of an aggregate function: its input columns as columns or expressions (a
    literal ``count(1)`` as it is); its parameters as literals."""
    node = _node(arg, sql)
    is_input = position == 0 or (
        position == 1 and fname in ("max_by", "min_by", "corr", "covar_pop", "covar_samp")
    )
    if is_input and node.kind == "literal" and fname != "count":
        return Node("expression", raw=F.expr(sql(arg)))
    return node


def _node(expr: Any, sql: Callable[[Any], str]) -> Node:
    kind = node_name(expr)
    if kind == "AttributeReference":
        return Node("column", parts=[str(expr.name())])
    if kind == "Literal":
        return Node("literal", value=_literal(expr))
    if kind == "CreateArray":
        return Node("function", "array", [_node(c, sql) for c in seq_list(expr.children())])
    return Node("expression", raw=F.expr(sql(expr)))


def _literal(expr: Any) -> Any:
    value = expr.value()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    type_name = str(expr.dataType().typeName())
    if type_name == "string":
        return str(value.toString())
    if type_name.startswith("decimal"):
        return decimal.Decimal(str(value.toString()))
    return value
