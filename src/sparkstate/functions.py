"""Mergeable aggregate functions for ``ss.stream(df).groupBy(...).agg(...)``.

The names mirror :mod:`pyspark.sql.functions`: ``SF.count("*")``, ``SF.sum("amount")``,
``SF.avg(F.col("x") * 2).alias("mean")``. Each returns a small description that the engine turns
into Spark's per-batch partial aggregate and into the operator that merges it with the state.
This module does not import pyspark: a column may be a name or a ``pyspark.sql.Column``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["AggregateExpression", "avg", "count", "max", "mean", "min", "sum"]


@dataclasses.dataclass(frozen=True)
class AggregateExpression:
    """One aggregate of a streaming ``agg``: a function over a column, optionally renamed."""

    func: str
    #: A column name, ``"*"`` (count only) or a ``pyspark.sql.Column``.
    column: Any
    name: str | None = None

    def alias(self, name: str) -> AggregateExpression:
        """The same aggregate with output column ``name`` (as ``Column.alias``)."""
        return dataclasses.replace(self, name=name)

    #: PySpark spells it both ways.
    name_as = alias

    def __repr__(self) -> str:
        col = self.column if isinstance(self.column, str) else "<Column>"
        alias = f".alias({self.name!r})" if self.name else ""
        return f"{self.func}({col!r}){alias}"


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
    """Sum of the non-null values; null when there are none. Integers sum as a long."""
    return AggregateExpression("sum", _column(col, "sum"))


def min(col: Any) -> AggregateExpression:  # noqa: A001 - mirrors pyspark.sql.functions.min
    """Smallest non-null value; null when there are none."""
    return AggregateExpression("min", _column(col, "min"))


def max(col: Any) -> AggregateExpression:  # noqa: A001 - mirrors pyspark.sql.functions.max
    """Largest non-null value (NaN is the largest double); null when there are none."""
    return AggregateExpression("max", _column(col, "max"))


def avg(col: Any) -> AggregateExpression:
    """Mean of the non-null values as a double; null when there are none."""
    return AggregateExpression("avg", _column(col, "avg"))


#: PySpark's alias of :func:`avg`.
mean = avg
