"""Mergeable aggregate functions for ``ss.stream(df).groupBy(...).agg(...)``.

The names and arguments mirror :mod:`pyspark.sql.functions`: ``SF.count("*")``,
``SF.sum("amount")``, ``SF.avg(F.col("x") * 2).alias("mean")``, ``SF.first("v", True)``. Each
returns a small description that the engine turns into Spark's per-batch partial aggregate and into
the operator that merges it with the state; results, their names and types are Spark's. This module
does not import pyspark: a column may be a name or a ``pyspark.sql.Column``. PySpark's own
aggregates of a plain column (``F.sum("v")``) are taken too, as their twin here.
``SF.window`` and ``SF.session_window`` are grouping keys, Spark's ``window`` and
``session_window`` (passing those from ``pyspark.sql.functions`` works the same);
``SF.window_time`` is ``window_time`` as the time column of ``SF.window``/``SF.session_window``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "AggregateExpression",
    "SessionWindow",
    "TimeWindow",
    "WindowTime",
    "any",
    "any_value",
    "approx_count_distinct",
    "approx_percentile",
    "avg",
    "bit_and",
    "bit_or",
    "bit_xor",
    "bool_and",
    "bool_or",
    "collect_list",
    "collect_set",
    "corr",
    "count",
    "count_if",
    "covar_pop",
    "covar_samp",
    "every",
    "first",
    "hll_sketch_agg",
    "hll_union_agg",
    "kurtosis",
    "last",
    "max",
    "max_by",
    "mean",
    "median",
    "min",
    "min_by",
    "mode",
    "percentile",
    "percentile_approx",
    "session_window",
    "skewness",
    "some",
    "std",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "sum",
    "var_pop",
    "var_samp",
    "variance",
    "window",
    "window_time",
]


@dataclasses.dataclass(frozen=True)
class AggregateExpression:
    """One aggregate of a streaming ``agg``: a function over a column, optionally renamed."""

    func: str
    #: A column name, ``"*"`` (count only) or a ``pyspark.sql.Column``.
    column: Any
    name: str | None = None
    #: ``first``/``last``/``any_value``: ``ignorenulls``; ``approx_count_distinct``: ``rsd``;
    #: ``percentile``: ``percentage``; ``percentile_approx``: ``percentage``, ``accuracy``;
    #: ``mode``: ``deterministic``; ``hll_sketch_agg``: ``lgConfigK``; ``hll_union_agg``:
    #: ``allowDifferentLgConfigK``.
    options: tuple[tuple[str, Any], ...] = ()
    #: The ``pyspark.sql.functions`` column this aggregate was taken from, if any: Spark names
    #: the result after it.
    source: Any = None
    #: The function's second column (``max_by``'s ordering, ``corr``'s ``col2``), if it has one.
    others: tuple[Any, ...] = ()

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def alias(self, name: str) -> AggregateExpression:
        """The same aggregate with output column ``name`` (as ``Column.alias``)."""
        return dataclasses.replace(self, name=name)

    #: PySpark spells it both ways.
    name_as = alias

    def __repr__(self) -> str:
        col = ", ".join(
            repr(c) if isinstance(c, str) else "<Column>" for c in (self.column, *self.others)
        )
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


def count_if(col: Any) -> AggregateExpression:
    """Number of rows where the boolean ``col`` is true; a long, never null."""
    return AggregateExpression("count_if", _column(col, "count_if"))


def bool_and(col: Any) -> AggregateExpression:
    """Whether every non-null value of the boolean ``col`` is true; null when there are none."""
    return AggregateExpression("bool_and", _column(col, "bool_and"))


def every(col: Any) -> AggregateExpression:
    """:func:`bool_and` under Spark's other name."""
    return AggregateExpression("every", _column(col, "every"))


def bool_or(col: Any) -> AggregateExpression:
    """Whether some non-null value of the boolean ``col`` is true; null when there are none."""
    return AggregateExpression("bool_or", _column(col, "bool_or"))


def some(col: Any) -> AggregateExpression:
    """:func:`bool_or` under Spark's other name."""
    return AggregateExpression("some", _column(col, "some"))


def any(col: Any) -> AggregateExpression:  # noqa: A001 - Spark's SQL function any()
    """:func:`bool_or` under Spark's SQL name ``any``."""
    return AggregateExpression("any", _column(col, "any"))


def any_value(col: Any, ignoreNulls: bool | None = None) -> AggregateExpression:  # noqa: N803
    """Some value of the group: the first one it saw, as :func:`first` (with ``ignoreNulls``,
    the first non-null one)."""
    options = () if ignoreNulls is None else (("ignorenulls", bool(ignoreNulls)),)
    return AggregateExpression("any_value", _column(col, "any_value"), options=options)


def max_by(col: Any, ord: Any) -> AggregateExpression:  # noqa: A002 - PySpark's name
    """The value of ``col`` on the row of the largest ``ord`` (rows of a null ``ord`` are
    skipped; of equal ones, the later batch's); null when there are none."""
    return AggregateExpression("max_by", _column(col, "max_by"), others=(_column(ord, "max_by"),))


def min_by(col: Any, ord: Any) -> AggregateExpression:  # noqa: A002 - PySpark's name
    """The value of ``col`` on the row of the smallest ``ord``, as :func:`max_by`."""
    return AggregateExpression("min_by", _column(col, "min_by"), others=(_column(ord, "min_by"),))


def bit_and(col: Any) -> AggregateExpression:
    """Bitwise AND of the non-null values of an integral ``col``, of its type; null without
    values."""
    return AggregateExpression("bit_and", _column(col, "bit_and"))


def bit_or(col: Any) -> AggregateExpression:
    """Bitwise OR of the non-null values, as :func:`bit_and`."""
    return AggregateExpression("bit_or", _column(col, "bit_or"))


def bit_xor(col: Any) -> AggregateExpression:
    """Bitwise XOR of the non-null values, as :func:`bit_and`."""
    return AggregateExpression("bit_xor", _column(col, "bit_xor"))


def _pair(func: str, col1: Any, col2: Any) -> AggregateExpression:
    return AggregateExpression(func, _column(col1, func), others=(_column(col2, func),))


def corr(col1: Any, col2: Any) -> AggregateExpression:
    """Pearson correlation of the pairs where neither value is null, as a double; null without
    pairs and for one pair (NaN under ``spark.sql.legacy.statisticalAggregate``)."""
    return _pair("corr", col1, col2)


def covar_pop(col1: Any, col2: Any) -> AggregateExpression:
    """Population covariance of the pairs where neither value is null; null without pairs."""
    return _pair("covar_pop", col1, col2)


def covar_samp(col1: Any, col2: Any) -> AggregateExpression:
    """Sample covariance of the pairs where neither value is null; null without pairs and for
    one pair (NaN in legacy mode)."""
    return _pair("covar_samp", col1, col2)


def skewness(col: Any) -> AggregateExpression:
    """Skewness of the non-null values as a double; null without values or when they are all
    equal (NaN in legacy mode)."""
    return AggregateExpression("skewness", _column(col, "skewness"))


def kurtosis(col: Any) -> AggregateExpression:
    """Excess kurtosis of the non-null values as a double; null as :func:`skewness`."""
    return AggregateExpression("kurtosis", _column(col, "kurtosis"))


def _percentage(value: Any) -> float | tuple[float, ...]:
    def one(p: Any) -> float:
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            msg = f"percentile's percentage is a number in [0, 1] or a list of them, got {p!r}"
            raise ValueError(msg)
        return float(p)

    if isinstance(value, list | tuple):
        return tuple(one(p) for p in value)
    return one(value)


def percentile(col: Any, percentage: Any, frequency: int = 1) -> AggregateExpression:
    """The exact percentile (or a list of them, for a list of percentages) of the non-null
    numeric values, interpolated as Spark's; a double (a list of doubles); null without values.
    Every value is kept in state, as ``collect_list`` keeps them. ``frequency`` is 1."""
    if frequency != 1:
        msg = f"percentile(): sparkstate takes frequency 1 only, got {frequency!r}"
        raise ValueError(msg)
    options = (("percentage", _percentage(percentage)),)
    return AggregateExpression("percentile", _column(col, "percentile"), options=options)


def percentile_approx(
    col: Any, percentage: Any = 0.5, accuracy: int = 10000
) -> AggregateExpression:
    """Spark's approximate percentile (or a list of them) of the non-null values, of the
    column's type: its Greenwald-Khanna summary (relative error ``1 / accuracy``) is kept in
    state and each batch's values merge into it as Spark merges them."""
    return _approx("percentile_approx", col, percentage, accuracy)


def approx_percentile(
    col: Any, percentage: Any = 0.5, accuracy: int = 10000
) -> AggregateExpression:
    """:func:`percentile_approx` under Spark's other name."""
    return _approx("approx_percentile", col, percentage, accuracy)


def _approx(func: str, col: Any, percentage: Any, accuracy: Any) -> AggregateExpression:
    if isinstance(accuracy, bool) or not isinstance(accuracy, int) or accuracy <= 0:
        msg = f"{func}(): accuracy is a positive integer, got {accuracy!r}"
        raise ValueError(msg)
    options = (("percentage", _percentage(percentage)), ("accuracy", accuracy))
    return AggregateExpression(func, _column(col, func), options=options)


def hll_sketch_agg(col: Any, lgConfigK: int | None = None) -> AggregateExpression:  # noqa: N803
    """Spark's DataSketches HLL sketch (HLL_8, ``lgConfigK`` from 4 to 21, 12 by default) of
    the non-null int, long, string or binary values (empty strings and byte arrays left out),
    as its updatable bytes; ``hll_sketch_estimate`` reads it. The sketch is kept in state and
    each batch's sketch unions into it as Spark's does, to the same bytes."""
    options: tuple[tuple[str, Any], ...] = ()
    if lgConfigK is not None:
        if isinstance(lgConfigK, bool) or not isinstance(lgConfigK, int):
            msg = f"hll_sketch_agg(): lgConfigK is a literal integer, got {lgConfigK!r}"
            raise TypeError(msg)
        options = (("lgConfigK", lgConfigK),)
    return AggregateExpression("hll_sketch_agg", _column(col, "hll_sketch_agg"), options=options)


def hll_union_agg(
    col: Any,
    allowDifferentLgConfigK: bool | None = None,  # noqa: N803 - PySpark's name
) -> AggregateExpression:
    """The union of a binary column of HLL sketches (as ``hll_sketch_agg`` makes them), as
    Spark's ``hll_union_agg`` gives it: sketches of different ``lgConfigK`` fail unless
    ``allowDifferentLgConfigK``, nulls are skipped, and a group of nulls only gives an empty
    sketch."""
    options: tuple[tuple[str, Any], ...] = ()
    if allowDifferentLgConfigK is not None:
        if not isinstance(allowDifferentLgConfigK, bool):
            msg = (
                "hll_union_agg(): allowDifferentLgConfigK is a literal boolean, got "
                f"{allowDifferentLgConfigK!r}"
            )
            raise TypeError(msg)
        options = (("allowDifferentLgConfigK", allowDifferentLgConfigK),)
    return AggregateExpression("hll_union_agg", _column(col, "hll_union_agg"), options=options)


def median(col: Any) -> AggregateExpression:
    """The exact median of the non-null numeric values (:func:`percentile` at 0.5)."""
    return AggregateExpression("median", _column(col, "median"), options=(("percentage", 0.5),))


def mode(col: Any, deterministic: bool = False) -> AggregateExpression:
    """The most frequent non-null value; null without values. Of equally frequent values,
    the smallest (Spark's choice with ``deterministic``; without it Spark may return any of
    them). Every value is kept in state, as ``collect_list`` keeps them."""
    options = (("deterministic", bool(deterministic)),)
    return AggregateExpression("mode", _column(col, "mode"), options=options)


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


def _time_column(col: Any, func: str) -> Any:
    """A window's time column: a name, a Column, or ``SF.window_time(...)``."""
    return col if isinstance(col, WindowTime) else _column(col, func)


def window(
    timeColumn: Any,  # noqa: N803 - PySpark's names
    windowDuration: str,  # noqa: N803
    slideDuration: str | None = None,  # noqa: N803
    startTime: str | None = None,  # noqa: N803
) -> TimeWindow:
    """Tumbling (no ``slideDuration``) or sliding time windows of ``timeColumn``, as
    ``pyspark.sql.functions.window``; Spark checks the durations when the query starts."""
    _time_column(timeColumn, "window")
    _duration(windowDuration, "windowDuration")
    if slideDuration is not None:
        _duration(slideDuration, "slideDuration")
    if startTime is not None:
        _duration(startTime, "startTime")
    return TimeWindow(timeColumn, windowDuration, slideDuration, startTime)


def session_window(timeColumn: Any, gapDuration: Any) -> SessionWindow:  # noqa: N803
    """Session windows of ``timeColumn`` closed by ``gapDuration`` of inactivity, as
    ``pyspark.sql.functions.session_window`` (a string, or a Column for a per-row gap)."""
    _time_column(timeColumn, "session_window")
    if isinstance(gapDuration, str):
        _duration(gapDuration, "gapDuration")
    else:
        _column(gapDuration, "session_window")
    return SessionWindow(timeColumn, gapDuration)


def window_time(windowColumn: Any) -> WindowTime:  # noqa: N803 - PySpark's name
    """The event time of a window (its end minus one microsecond), as
    ``pyspark.sql.functions.window_time``: the time column of an ``SF.window`` or
    ``SF.session_window`` that groups a windowed aggregation's output into the windows of a next
    one. Elsewhere, use ``pyspark.sql.functions.window_time`` itself."""
    _column(windowColumn, "window_time")
    return WindowTime(windowColumn)


@dataclasses.dataclass(frozen=True)
class WindowTime:
    """``window_time(windowColumn)``, made Spark's column when the query is planned."""

    window_column: Any
