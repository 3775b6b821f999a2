"""Spark's analysed join read through its JVM objects (plan nodes, expressions, attributes), and
the columns a side of the join is split into: state keys and values are flat, so a struct (a
window) travels as its fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkstate.exceptions import ConfigurationError
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY

__all__ = [
    "SPARK_STATEFUL",
    "as_attribute",
    "conjuncts_of",
    "from_side_columns",
    "inferred_filters",
    "is_watermarked",
    "join_node",
    "key_columns",
    "metadata_of",
    "node_name",
    "quoted",
    "seq_list",
    "side_column_names",
    "side_columns",
    "side_shape",
    "spark_stateful",
    "spark_type_of",
    "sql_of",
    "stateful_side",
    "struct_fields",
    "time_of",
]


def stateful_side(side: str, stateful: str) -> str:
    return (
        f"join: the {side} side runs a stateful step in Spark ({stateful}); wrap that side's "
        "input in ss.stream() and write the step on it, so that sparkstate runs it before the join"
    )


def side_shape(
    pred: Column | None, columns: list[Column]
) -> Callable[[DataFrame, Sequence[str]], DataFrame]:
    """A side's DataFrame as the join reads it: filtered by ``pred``, then ``columns`` (and the
    columns named in the second argument, carried as they are)."""

    def shape(df: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
        return (df if pred is None else df.where(pred)).select(*columns, *keep)

    return shape


def time_of(col: Column, expr: Any) -> Column:
    """The time of ``col`` (the value of Spark expression ``expr``) as Spark's watermark reads
    it: the column itself, or a window struct's ``end``."""
    if str(expr.dataType().typeName()) == "struct":
        return col.getField("end")
    return col


def struct_fields(expr: Any) -> list[str] | None:
    """The field names of a struct-typed Spark expression (a window), None for other types."""
    dtype = expr.dataType()
    if str(dtype.typeName()) != "struct":
        return None
    return [str(n) for n in dtype.fieldNames()]


def side_column_names(name: str, attr: Any) -> dict[str, str]:
    """The query's name of each column :func:`side_columns` makes of ``attr``."""
    fields = struct_fields(attr)
    if fields is None:
        return {name: attr.name()}
    return {f"{name}_{j}": f"{attr.name()}.{f}" for j, f in enumerate(fields)}


def side_columns(name: str, col: Column, attr: Any) -> list[Column]:
    """A side's column as the union carries it: as it is, or a struct (a window) as its fields
    and whether it is there at all, since state values are flat."""
    fields = struct_fields(attr)
    if fields is None:
        return [col.alias(name)]
    return [
        col.isNotNull().alias(f"{name}_present"),
        *[col.getField(f).alias(f"{name}_{j}") for j, f in enumerate(fields)],
    ]


def from_side_columns(name: str, attr: Any) -> Column:
    """The column :func:`side_columns` split, put back together."""
    fields = struct_fields(attr)
    if fields is None:
        return F.col(name)
    struct = F.struct(*[F.col(f"{name}_{j}").alias(f) for j, f in enumerate(fields)])
    return F.when(F.col(f"{name}_present"), struct)


def as_attribute(jvm: Any, column: Column, attr: Any) -> Column:
    """``column`` named as Spark's attribute ``attr``: its name, id, qualifier and metadata,
    so that a Column of ``attr`` (``df["key"]``) resolves against it."""
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
    nil = getattr(getattr(jvm.scala.collection.immutable, "Nil$"), "MODULE$")
    alias = expressions.Alias(
        utils.expression(column._jc),  # noqa: SLF001
        attr.name(),
        attr.exprId(),
        attr.qualifier(),
        jvm.scala.Some(attr.metadata()),
        nil,
    )
    return Column(utils.column(alias))


def key_columns(i: int, expr: Any, sql: Callable[[Any], str]) -> list[Column]:
    """Key ``i`` of one side as key columns: the expression, or the fields of a struct (a
    window) one by one, since state keys are flat."""
    col = F.expr(sql(expr))
    fields = struct_fields(expr)
    if fields is None:
        return [col.alias(f"__ss_k{i}")]
    return [col.getField(f).alias(f"__ss_k{i}_{j}") for j, f in enumerate(fields)]


def spark_type_of(field: pa.Field, frames: dict[str, DataFrame]) -> Any:
    for df in frames.values():
        if field.name in df.columns:
            return df.schema[field.name].dataType
    msg = f"join: no column {field.name}"
    raise ConfigurationError(msg)


def metadata_of(name: str, frames: dict[str, DataFrame]) -> dict[str, Any]:
    for df in frames.values():
        if name in df.columns:
            return dict(df.schema[name].metadata or {})
    return {}


def is_watermarked(expr: Any) -> bool:
    return node_name(expr) == "AttributeReference" and bool(
        expr.metadata().contains(WATERMARK_DELAY_KEY)
    )


#: Spark's logical plan nodes of stateful streaming operators.
SPARK_STATEFUL = (
    "Aggregate",
    "Deduplicate",
    "DeduplicateWithinWatermark",
    "Join",
    "FlatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState",
    "TransformWithState",
    "TransformWithStateInPySpark",
    "GlobalLimit",
)


def spark_stateful(plan: Any) -> str | None:
    """The name of a stateful streaming operator in Spark's ``plan``, if it has one."""
    if not plan.isStreaming():
        return None
    if node_name(plan) in SPARK_STATEFUL:
        return node_name(plan)
    for child in seq_list(plan.children()):
        found = spark_stateful(child)
        if found is not None:
            return found
    return None


def join_node(plan: Any) -> Any | None:
    """The Join below ``plan``'s nodes of one child (a projection, an alias), if any."""
    node = plan
    while node_name(node) != "Join":
        if node.children().size() != 1:
            return None
        node = node.children().apply(0)
    return node


def inferred_filters(analysed: Any, optimised: Any) -> list[Any]:
    """The filters that Spark's optimizer adds to a join's input (``analysed``, as the join
    reads it after optimisation: ``optimised``), inferred from the join's condition and the
    other input's filters: deterministic, over the input's columns, none over a watermarked
    column (Spark keeps those above the watermark, which sees the rows they drop)."""
    held = analysed.constraints()
    columns = analysed.outputSet()
    out = []
    for c in seq_list(optimised.constraints().toSeq()):
        refs = c.references()
        if held.contains(c) or not c.deterministic() or not refs.subsetOf(columns):
            continue
        if any(a.metadata().contains(WATERMARK_DELAY_KEY) for a in seq_list(refs.toSeq())):
            continue
        out.append(c)
    return out


def conjuncts_of(expr: Any) -> list[Any]:
    if node_name(expr) == "And":
        a, b = seq_list(expr.children())
        return conjuncts_of(a) + conjuncts_of(b)
    return [expr]


def sql_of(expr: Any) -> str:
    return str(expr.sql())


def node_name(node: Any) -> str:
    return str(node.getClass().getSimpleName())


def seq_list(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
