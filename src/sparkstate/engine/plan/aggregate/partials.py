"""The Spark side of an aggregate: the type of its input, the Spark function whose result the
merged state reproduces (Spark's analyzer names and types the output after it), and the partial
buffers Spark computes per batch, one row per key, for the operator to merge
(:mod:`sparkstate.operators.aggregation.aggregate_functions`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
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

from sparkstate.engine.plan.aggregate.recognise import MOMENTS
from sparkstate.engine.spark.versions import to_arrow_type
from sparkstate.functions import AggregateExpression
from sparkstate.operators.aggregation import hll, hll_sketch
from sparkstate.operators.aggregation.aggregate_functions import AggregateFunction, buffer_column

__all__ = ["aggregate_function", "input_types", "partial_columns", "spark_twin"]


def _quoted(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


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
        to_arrow_type(output_type),
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
        return to_arrow_type(typ)
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
    if func in MOMENTS:
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
