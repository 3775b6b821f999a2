"""``initialState`` of ``transformWithState(InPandas)``: a grouped batch DataFrame, applied once.

As in Spark, ``handleInitialState`` runs in the query's first batch only (batch 0; a restart from
a checkpoint does not apply it again). The engine brings the initial-state rows to the operator
inside that batch's input: both sides are put in one frame of the stream's columns, the
initial-state columns under private names and a marker column
(:data:`~sparkstate.operators.arbitrary.transform_with_state.INITIAL_STATE_MARKER`); the initial
state's
keys are also written into the stream's key columns, cast to their types, so that
``repartition(n, keys)`` sends both sides of a key to the same state partition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import DataFrame, GroupedData
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StructField,
    StructType,
)

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.transform_with_state import INITIAL_STATE_MARKER

__all__ = ["InitialState", "PlannedInitialState", "initial_state_of", "plan_initial_state"]

#: Key types an initial-state key may have for a stream key of the type on the left: the same
#: type or a narrower one of the same kind (cast without loss before the shuffle).
_WIDER: dict[type[DataType], tuple[type[DataType], ...]] = {
    ShortType: (ByteType,),
    IntegerType: (ByteType, ShortType),
    LongType: (ByteType, ShortType, IntegerType),
    DoubleType: (FloatType, ByteType, ShortType, IntegerType),
}


@dataclasses.dataclass(frozen=True)
class InitialState:
    """``initialState``: a batch DataFrame and the columns it is grouped by."""

    df: DataFrame
    keys: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PlannedInitialState:
    """What the operator and the driver need: the rows' schema, where they travel, the union."""

    #: The initial state's columns, its keys cast to the stream's key types.
    struct: StructType
    keys: list[str]
    #: The input columns that carry ``struct``'s fields, in order.
    columns: list[str]
    #: The first batch's input plus the marked initial-state rows.
    add_to: Callable[[DataFrame], DataFrame]


def initial_state_of(api: str, grouped: Any) -> InitialState:
    """The DataFrame and grouping columns of ``initialState`` (``initial_df.groupBy(...)``)."""
    if not isinstance(grouped, GroupedData):
        msg = (
            f"{api}: initialState must be a grouped batch DataFrame, e.g. "
            f"initial_df.groupBy('key'), got {type(grouped).__name__}"
        )
        raise ConfigurationError(msg)
    df = grouped._df
    if df.isStreaming:
        msg = (
            f"{api}: initialState must group a batch DataFrame (it is applied in the query's "
            "first batch), not a streaming one"
        )
        raise ConfigurationError(msg)
    return InitialState(df, _grouping_columns(api, grouped))


def _grouping_columns(api: str, grouped: GroupedData) -> tuple[str, ...]:
    jgd = grouped._jgd
    described = str(jgd.toString())
    if not described.endswith("type: GroupBy]"):
        msg = f"{api}: initialState must come from groupBy(), not rollup/cube/pivot ({described})"
        raise ConfigurationError(msg)
    names: list[str] = []
    exprs = jgd.groupingExprs()
    for i in range(exprs.length()):
        expr = exprs.apply(i)
        kind = str(expr.getClass().getSimpleName())
        name: str | None = None
        if kind == "AttributeReference":
            name = str(expr.name())
        elif kind == "UnresolvedAttribute" and expr.nameParts().length() == 1:
            name = str(expr.nameParts().apply(0))
        if name is None or name not in grouped._df.columns:
            msg = (
                f"{api}: group initialState by column names of its DataFrame "
                f"({grouped._df.columns}), not by {expr.toString()}"
            )
            raise ConfigurationError(msg)
        names.append(name)
    if not names:
        msg = f"{api}: initialState must be grouped by its key columns, e.g. groupBy('key')"
        raise ConfigurationError(msg)
    return tuple(names)


def plan_initial_state(
    api: str, stream: StructType, keys: Sequence[str], initial: InitialState
) -> PlannedInitialState:
    """Check the initial state's keys against the stream's and build the first batch's union."""
    if len(initial.keys) != len(keys):
        msg = (
            f"{api}: initialState is grouped by {list(initial.keys)} but the stream by "
            f"{list(keys)}; group both by the same key (one column per grouping column)"
        )
        raise ConfigurationError(msg)
    source = initial.df.schema
    cast_to: dict[str, DataType] = {}
    for init_key, key in zip(initial.keys, keys, strict=True):
        have, want = source[init_key].dataType, stream[key].dataType
        if have != want and type(have) not in _WIDER.get(type(want), ()):
            msg = (
                f"{api}: initialState key {init_key!r} is {have.simpleString()} but the stream's "
                f"key {key!r} is {want.simpleString()}; cast it, e.g. "
                f"F.col({init_key!r}).cast({want.simpleString()!r})"
            )
            raise ConfigurationError(msg)
        cast_to[init_key] = want
    struct = StructType(
        [
            StructField(f.name, cast_to.get(f.name, f.dataType), f.nullable, f.metadata)
            for f in source.fields
        ]
    )
    columns = [f"{INITIAL_STATE_MARKER}{i}" for i in range(len(struct.fields))]
    key_of = dict(zip(keys, initial.keys, strict=True))
    init_df = initial.df

    def add_to(batch: DataFrame) -> DataFrame:
        types = {f.name: f.dataType for f in batch.schema.fields}
        data = batch.select(
            *[_col(c) for c in batch.columns],
            *[F.lit(None).cast(f.dataType).alias(c) for f, c in zip(struct, columns, strict=True)],
            F.lit(False).alias(INITIAL_STATE_MARKER),
        )
        rows = init_df.select(
            *[
                (_col(key_of[c]) if c in key_of else F.lit(None)).cast(types[c]).alias(c)
                for c in batch.columns
            ],
            *[_col(f.name).cast(f.dataType).alias(c) for f, c in zip(struct, columns, strict=True)],
            F.lit(True).alias(INITIAL_STATE_MARKER),
        )
        return data.union(rows)

    return PlannedInitialState(struct, list(initial.keys), columns, add_to)


def _col(name: str) -> Any:
    return F.col("`" + name.replace("`", "``") + "`")
