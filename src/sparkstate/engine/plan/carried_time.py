"""The event time of a streaming DataFrame carried past the projections that dropped it.

Spark's watermark is the largest event time of the rows read at its ``withWatermark``, before
any projection: a side of a join written as ``select("key", window("time", ...), "value")``
keeps its watermark in the window struct, but no longer the time it is computed from. Here
Spark's analyzed plan of such a DataFrame is rebuilt with the watermarked time kept through
every projection above its ``EventTimeWatermark``, and given back as one more column.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame

from sparkstate.engine.spark.expressions import node_name, seq_list

__all__ = ["EVENT_TIME_CARRIER", "carry_event_time"]

#: The column of a wrapped stream's event time, carried past a projection before an aggregation
#: that dropped it.
EVENT_TIME_CARRIER = "__ss_event_time"

#: Plan nodes above the watermark that keep their child's columns as they are.
_PASSING = ("Filter", "SubqueryAlias", "Sample", "Repartition", "RepartitionByExpression")


def carry_event_time(df: DataFrame, name: str) -> DataFrame | None:
    """``df`` with one more column ``name``: the event time of its (one) watermark, as its
    ``EventTimeWatermark`` reads it; None where the plan above the watermark is not one of
    projections and filters."""
    jvm = df.sparkSession._jvm  # noqa: SLF001
    if jvm is None:
        return None
    plan = df._jdf.queryExecution().analyzed()  # noqa: SLF001
    rebuilt = _rebuilt(jvm, plan)
    if rebuilt is None:
        return None
    node, time = rebuilt
    jspark = df.sparkSession._jsparkSession  # noqa: SLF001
    classic = jvm.org.apache.spark.sql.classic
    carried = DataFrame(classic.Dataset.ofRows(jspark, node), df.sparkSession)
    utils = classic.ExpressionUtils
    kept = [Column(utils.column(a)) for a in seq_list(plan.output())]  # by id, not by name
    return carried.select(*kept, Column(utils.column(time)).alias(name))


def _rebuilt(jvm: Any, node: Any) -> tuple[Any, Any] | None:
    """``node`` with the watermark's time among its output, and that time's attribute."""
    kind = node_name(node)
    if kind == "EventTimeWatermark":
        wanted = node.eventTime().exprId()
        time = next(a for a in seq_list(node.output()) if a.exprId().equals(wanted))
        return node, time
    children = seq_list(node.children())
    if len(children) != 1 or (kind != "Project" and kind not in _PASSING):
        return None
    below = _rebuilt(jvm, children[0])
    if below is None:
        return None
    child, time = below
    if kind != "Project":
        return node.withNewChildren(_seq(jvm, [child])), time
    projected = seq_list(node.projectList())
    if not any(e.exprId().equals(time.exprId()) for e in projected):
        projected.append(time)
    logical = jvm.org.apache.spark.sql.catalyst.plans.logical
    return logical.Project(_seq(jvm, projected), child), time


def _seq(jvm: Any, items: list[Any]) -> Any:
    """A Scala ``Seq`` of ``items``."""
    buffer = jvm.scala.collection.mutable.ArrayBuffer()
    for item in items:
        buffer.append(item)
    return buffer.toSeq()
