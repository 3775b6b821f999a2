"""Mergeable aggregate functions for ``ss.stream(df).groupBy(...).agg(...)``.

The names and arguments mirror :mod:`pyspark.sql.functions`: ``SF.count("*")``,
``SF.sum("amount")``, ``SF.avg(F.col("x") * 2).alias("mean")``, ``SF.first("v", True)``. Each
returns a small description that the engine turns into Spark's per-batch partial aggregate and into
the operator that merges it with the state; results, their names and types are Spark's. This module
does not import pyspark: a column may be a name or a ``pyspark.sql.Column``. PySpark's own
aggregates of a plain column (``F.sum("v")``) are taken too, as their twin here.
``SF.window`` and ``SF.session_window`` are grouping keys, Spark's ``window`` and
``session_window`` (passing those from ``pyspark.sql.functions`` works the same).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "AggregateExpression",
    "SessionWindow",
    "TimeWindow",
    "approx_count_distinct",
    "avg",
    "collect_list",
    "collect_set",
    "count",
    "first",
    "last",
    "max",
    "mean",
    "min",
    "session_window",
    "std",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "sum",
    "var_pop",
    "var_samp",
    "variance",
    "window",
]


@dataclasses.dataclass(frozen=True)
class AggregateExpression:
    """One aggregate of a streaming ``agg``: a function over a column, optionally renamed."""

    func: str
    #: A column name, ``"*"`` (count only) or a ``pyspark.sql.Column``.
    column: Any
    name: str | None = None
    #: ``first``/``last``: ``ignorenulls``; ``approx_count_distinct``: ``rsd``.
    options: tuple[tuple[str, Any], ...] = ()
    #: The ``pyspark.sql.functions`` column this aggregate was taken from, if any: Spark names
    #: the result after it.
    source: Any = None

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def alias(self, name: str) -> AggregateExpression:
        """The same aggregate with output column ``name`` (as ``Column.alias``)."""
        return dataclasses.replace(self, name=name)

    #: PySpark spells it both ways.
    name_as = alias

    def __repr__(self) -> str:
        col = repr(self.column) if isinstance(self.column, str) else "<Column>"
        options = "".join(f", {k}={v!r}" for k, v in self.options)
        alias = f".alias({self.name!r})" if self.name else ""
        return f"{self.func}({col}{options}){alias}"


def _column(col: Any, func: str) -> Any:
    if isinstance(col, str):
        if col == "*" and func != "count":
            msg = f"{func}('*') is not an aggregate; name a column"
            raise ValueError(msg)
        return col
    if type(col).__name__ == "Column":
        return col
    msg = f"{func}() takes a column name or a pyspark Column, got {type(col).__name__}"
    raise TypeError(msg)


def count(col: Any) -> AggregateExpression:
    """Number of rows (``"*"``) or of non-null values of ``col``; a long, never null."""
    return AggregateExpression("count", _column(col, "count"))


def sum(col: Any) -> AggregateExpression:  # noqa: A001 - mirrors pyspark.sql.functions.sum
    """Sum of the non-null values; null when there are none. Integers sum as a long (wrapping
    around outside ANSI mode), decimal(p, s) as decimal(min(38, p + 10), s) (null past it, or an
    error in ANSI mode)."""
    return AggregateExpression("sum", _column(col, "sum"))


def min(col: Any) -> AggregateExpression:  # noqa: A001 - mirrors pyspark.sql.functions.min
    """Smallest non-null value; null when there are none."""
    return AggregateExpression("min", _column(col, "min"))


def max(col: Any) -> AggregateExpression:  # noqa: A001 - mirrors pyspark.sql.functions.max
    """Largest non-null value (NaN is the largest double); null when there are none."""
    return AggregateExpression("max", _column(col, "max"))


def avg(col: Any) -> AggregateExpression:
    """Mean of the non-null values as a double, or for decimal(p, s) as decimal(min(38, p + 4),
    min(38, s + 4)), rounded half up; null when there are none."""
    return AggregateExpression("avg", _column(col, "avg"))


#: PySpark's alias of :func:`avg`.
mean = avg


def first(col: Any, ignorenulls: bool = False) -> AggregateExpression:
    """The first value the group saw (in arrival order: batch after batch, and within a batch
    Spark's order); with ``ignorenulls``, the first non-null one."""
    options = (("ignorenulls", bool(ignorenulls)),)
    return AggregateExpression("first", _column(col, "first"), options=options)


def last(col: Any, ignorenulls: bool = False) -> AggregateExpression:
    """The last value the group saw; with ``ignorenulls``, the last non-null one."""
    options = (("ignorenulls", bool(ignorenulls)),)
    return AggregateExpression("last", _column(col, "last"), options=options)


def collect_list(col: Any) -> AggregateExpression:
    """The non-null values in arrival order, as a list (empty, never null). The list is kept in
    state and grows with every value: mind the memory of large groups, as in Spark."""
    return AggregateExpression("collect_list", _column(col, "collect_list"))


def collect_set(col: Any) -> AggregateExpression:
    """The distinct non-null values, as a list in no particular order (empty, never null)."""
    return AggregateExpression("collect_set", _column(col, "collect_set"))


def stddev(col: Any) -> AggregateExpression:
    """Sample standard deviation (as :func:`stddev_samp`)."""
    return AggregateExpression("stddev", _column(col, "stddev"))


def std(col: Any) -> AggregateExpression:
    """Sample standard deviation (as :func:`stddev_samp`)."""
    return AggregateExpression("std", _column(col, "std"))


def stddev_samp(col: Any) -> AggregateExpression:
    """Sample standard deviation of the non-null values as a double; null without values and,
    as in Spark 4, for a single value."""
    return AggregateExpression("stddev_samp", _column(col, "stddev_samp"))


def stddev_pop(col: Any) -> AggregateExpression:
    """Population standard deviation of the non-null values; null without values."""
    return AggregateExpression("stddev_pop", _column(col, "stddev_pop"))


def variance(col: Any) -> AggregateExpression:
    """Sample variance (as :func:`var_samp`)."""
    return AggregateExpression("variance", _column(col, "variance"))


def var_samp(col: Any) -> AggregateExpression:
    """Sample variance of the non-null values as a double; null without values and for a
    single value."""
    return AggregateExpression("var_samp", _column(col, "var_samp"))


def var_pop(col: Any) -> AggregateExpression:
    """Population variance of the non-null values; null without values."""
    return AggregateExpression("var_pop", _column(col, "var_pop"))


def approx_count_distinct(col: Any, rsd: float | None = None) -> AggregateExpression:
    """Estimated number of distinct non-null values (HyperLogLog++, as Spark's), a long; ``rsd``
    is the largest relative standard deviation allowed (default 0.05)."""
    options = () if rsd is None else (("rsd", float(rsd)),)
    return AggregateExpression(
        "approx_count_distinct", _column(col, "approx_count_distinct"), options=options
    )


@dataclasses.dataclass(frozen=True)
class TimeWindow:
    """``window(timeColumn, windowDuration, slideDuration, startTime)`` as a grouping key: a struct
    column ``window`` of ``start`` and ``end`` timestamps, exactly Spark's."""

    time_column: Any
    window_duration: str
    slide_duration: str | None = None
    start_time: str | None = None
    name: str | None = None

    def alias(self, name: str) -> TimeWindow:
        return dataclasses.replace(self, name=name)

    name_as = alias


@dataclasses.dataclass(frozen=True)
class SessionWindow:
    """``session_window(timeColumn, gapDuration)`` as a grouping key: a struct column
    ``session_window`` of ``start`` and ``end``; the gap is a duration string or a Column
    expression giving each row's gap (a dynamic gap)."""

    time_column: Any
    gap_duration: Any
    name: str | None = None

    def alias(self, name: str) -> SessionWindow:
        return dataclasses.replace(self, name=name)

    name_as = alias


def _duration(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        msg = f"{what} is a duration string such as '10 minutes', got {value!r}"
        raise TypeError(msg)
    return value


def window(
    timeColumn: Any,  # noqa: N803 - PySpark's names
    windowDuration: str,  # noqa: N803
    slideDuration: str | None = None,  # noqa: N803
    startTime: str | None = None,  # noqa: N803
) -> TimeWindow:
    """Tumbling (no ``slideDuration``) or sliding time windows of ``timeColumn``, as
    ``pyspark.sql.functions.window``; Spark checks the durations when the query starts."""
    _column(timeColumn, "window")
    _duration(windowDuration, "windowDuration")
    if slideDuration is not None:
        _duration(slideDuration, "slideDuration")
    if startTime is not None:
        _duration(startTime, "startTime")
    return TimeWindow(timeColumn, windowDuration, slideDuration, startTime)


def session_window(timeColumn: Any, gapDuration: Any) -> SessionWindow:  # noqa: N803
    """Session windows of ``timeColumn`` closed by ``gapDuration`` of inactivity, as
    ``pyspark.sql.functions.session_window`` (a string, or a Column for a per-row gap)."""
    _column(timeColumn, "session_window")
    if isinstance(gapDuration, str):
        _duration(gapDuration, "gapDuration")
    else:
        _column(gapDuration, "session_window")
    return SessionWindow(timeColumn, gapDuration)
