"""The aggregate functions a streaming ``agg()`` merges across batches, as Spark defines them.

Each function keeps a few buffers per key in state (Spark's aggregation buffers: a count, a sum
and an "is empty" flag, a value and a "value set" flag, ``(n, avg, m2)``, a list, HyperLogLog
registers); Spark computes each batch's partial buffers in the JVM
(:mod:`sparkstate.engine.plan.aggregate.plan`), and here they merge into the state's and give the
function's result. Merges follow Spark's merge expressions, and results its evaluate expressions,
nulls and NaN included:

* ``count`` is a long, never null; ``sum`` of nothing but nulls is null; a decimal ``sum`` or
  ``avg`` past its precision is null, or fails in ANSI mode (``AggregateOverflowError``), and
  ``avg`` of decimals divides as Spark does (half up, to the result's scale);
* ``first`` keeps the state's value once one is set (with ``ignorenulls``, the first non-null);
  ``last`` takes the batch's (with ``ignorenulls``, its last non-null);
* ``collect_list`` appends the batch's values to the state's, ``collect_set`` adds the new ones
  (NaN equal to NaN, ``-0.0`` to ``0.0``, as Spark's set); both are empty lists, never null;
* the ``stddev`` and ``variance`` family merges ``(n, avg, m2)`` as Chan et al.'s parallel
  algorithm does, in doubles; a sample statistic of one value is null (NaN under Spark's
  ``spark.sql.legacy.statisticalAggregate``);
* ``approx_count_distinct`` keeps HyperLogLog registers
(:mod:`sparkstate.operators.aggregation.hll`);
* ``count_if`` is a count; ``bool_and``/``every`` and ``bool_or``/``some``/``any`` a boolean
  (null without values), ``bit_and``/``bit_or``/``bit_xor`` a value of the column's type;
  ``any_value`` is ``first``;
* ``max_by``/``min_by`` keep the value and its ordering; of equal orderings the batch's wins,
  as Spark's merge keeps the right side;
* ``corr``, ``covar_pop``, ``covar_samp``, ``skewness`` and ``kurtosis`` keep Spark's moments
  (:mod:`sparkstate.operators.aggregation._moments`);
* ``percentile``, ``median`` and ``mode`` keep every value as ``collect_list`` does
  (:mod:`sparkstate.operators.aggregation._distribution`);
* ``percentile_approx``/``approx_percentile`` keep Spark's Greenwald-Khanna summary, each
  batch's values inserted in their order (:mod:`sparkstate.operators.aggregation._quantiles`);
* ``hll_sketch_agg`` and ``hll_union_agg`` keep Spark's DataSketches HLL sketch, as its bytes,
  and union each batch's sketch into it (:mod:`sparkstate.operators.aggregation.hll_sketch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, SparkstateError
from sparkstate.operators.aggregation import hll, hll_sketch
from sparkstate.operators.aggregation.aggregate_merges import (
    MERGES,
    RESULTS,
    SAMPLE_STATISTICS,
    merge_summaries,
)
from sparkstate.store.codec import ValueCodec

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "AggregateFunction",
    "AggregateOverflowError",
    "buffer_column",
]

Arrays = Sequence[pa.Array]
_F64 = pa.float64()
_POPULATION = ("stddev_pop", "var_pop")
_MOMENTS = SAMPLE_STATISTICS + _POPULATION
_BOOL_AND = ("bool_and", "every")
_BOOL_OR = ("bool_or", "some", "any")
_BITS = ("bit_and", "bit_or", "bit_xor")
_COMOMENTS = ("covar_pop", "covar_samp", "corr")
_PERCENTILES = ("percentile", "median")
_APPROX = ("percentile_approx", "approx_percentile")

#: Buffer names of each function, by position (a function may use the first ones only).
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "count": ("count",),
    "sum": ("sum", "empty"),
    "avg": ("sum", "count"),
    "min": ("min",),
    "max": ("max",),
    "first": ("first", "set"),
    "last": ("last", "set"),
    "collect_list": ("values",),
    "collect_set": ("values",),
    **{name: ("n", "avg", "m2") for name in _MOMENTS},
    "approx_count_distinct": ("registers",),
    "count_if": ("count",),
    **{name: ("min",) for name in _BOOL_AND},
    **{name: ("max",) for name in _BOOL_OR},
    "any_value": ("first", "set"),
    "max_by": ("valueWithExtremumOrdering", "extremumOrdering"),
    "min_by": ("valueWithExtremumOrdering", "extremumOrdering"),
    **{name: ("value",) for name in _BITS},
    "covar_pop": ("n", "xAvg", "yAvg", "ck"),
    "covar_samp": ("n", "xAvg", "yAvg", "ck"),
    "corr": ("n", "xAvg", "yAvg", "ck", "xMk", "yMk"),
    "skewness": ("n", "avg", "m2", "m3"),
    "kurtosis": ("n", "avg", "m2", "m3", "m4"),
    **{name: ("values",) for name in _PERCENTILES},
    "mode": ("values",),
    **{name: ("sampled", "g", "delta", "count") for name in _APPROX},
    "hll_sketch_agg": ("sketch",),
    "hll_union_agg": ("union",),
}
#: Functions computed as another is (the name is Spark's; the merge is the other's).
_SAME_AS = {
    "count_if": "count",
    "any_value": "first",
    **{name: "bool_and" for name in _BOOL_AND},
    **{name: "bool_or" for name in _BOOL_OR},
    "min_by": "max_by",
    **{name: "moments" for name in _MOMENTS},
    **{name: "comoments" for name in _COMOMENTS},
    "skewness": "central",
    "kurtosis": "central",
    "median": "percentile",
    "approx_percentile": "percentile_approx",
}
AGGREGATE_FUNCTIONS = tuple(_SUFFIXES)


class AggregateOverflowError(SparkstateError, OverflowError):
    """A merged aggregate left the range of its type (Spark's ARITHMETIC_OVERFLOW in ANSI mode)."""


def buffer_column(index: int, func: str, part: int) -> str:
    """Name of the ``part``-th buffer of the ``index``-th aggregate, in input batches and state."""
    return f"__ss_agg{index}_{_SUFFIXES[func][part]}"


@dataclasses.dataclass(frozen=True)
class AggregateFunction:
    """One aggregate of the query: its function, output column and types, and options.

    ``input_type`` is the type of the aggregated column (None for ``count(*)``); ``output_type`` is
    the result type Spark gives it; buffer types follow from both (for ``max_by``/``min_by``,
    a struct of the value's and the ordering's types). ``ignore_nulls`` is ``first``, ``last``
    and ``any_value``'s, ``rsd`` ``approx_count_distinct``'s, ``percentage`` ``percentile``'s
    (a number, or a tuple of them for a list result); ``legacy_statistics`` is Spark's
    ``spark.sql.legacy.statisticalAggregate`` (a result setting: it is not part of the state).
    """

    func: str
    output_name: str
    output_type: pa.DataType
    input_type: pa.DataType | None = None
    ignore_nulls: bool = False
    rsd: float | None = None
    legacy_statistics: bool = False
    percentage: float | tuple[float, ...] | None = None
    #: ``percentile_approx``'s accuracy (Spark's default 10000): its relative error is 1/accuracy.
    accuracy: int | None = None
    #: ``hll_sketch_agg``'s ``lgConfigK`` (Spark's default 12).
    lg_config_k: int | None = None
    #: ``hll_union_agg``'s ``allowDifferentLgConfigK``.
    allow_different_lg_config_k: bool = False

    def __post_init__(self) -> None:
        if self.func not in _SUFFIXES:
            msg = (
                f"aggregate {self.func!r} cannot be merged across batches; "
                f"use one of {list(AGGREGATE_FUNCTIONS)}"
            )
            raise ConfigurationError(msg)
        if self.func == "approx_count_distinct":
            hll.precision(self.rsd)
        if self.func == "hll_sketch_agg":
            hll_sketch.check_lg_k(self.effective_lg_k())
        if self.func in _PERCENTILES + _APPROX and self.percentage is None:
            msg = f"{self.func}() into column {self.output_name!r} needs its percentage"
            raise ConfigurationError(msg)
        for _, typ in self.buffers():
            _check_storable(self, typ)

    # --- buffers ---------------------------------------------------------------------------------

    def empty_buffers(self) -> list[Any] | None:
        """The buffers of this aggregate over no rows, as Spark's initial values are (an
        aggregate added to a running query starts from them); None where they are not plain
        values (a sketch, a digest)."""
        func = self.func
        if func == "count":
            return [0]
        if func == "sum":
            return [None, True] if pa.types.is_decimal(self.output_type) else [None]
        if func == "avg":
            return [0 if self._decimal_avg() else 0.0, 0]
        if func in ("min", "max"):
            return [None]
        if func in ("first", "last", "any_value"):
            return [None, False]
        if func in ("collect_list", "collect_set"):
            return [[]]
        return None

    def buffers(self) -> list[tuple[str, pa.DataType]]:
        """The buffers kept in state: (name suffix, type)."""
        func, out = self.func, self.output_type
        suffixes = _SUFFIXES[func]
        if func == "count":
            types: list[pa.DataType] = [pa.int64()]
        elif func == "sum":
            types = [out, pa.bool_()] if pa.types.is_decimal(out) else [out]
        elif func == "avg":
            types = (
                [_decimal_sum_type(self.input_type), pa.int64()]
                if self._decimal_avg()
                else [
                    _F64,
                    pa.int64(),
                ]
            )
        elif func in ("first", "last", "any_value"):
            types = [out, pa.bool_()]
        elif func in ("collect_list", "collect_set"):
            types = [pa.list_(_element_type(out))]
        elif func in _PERCENTILES:
            types = [pa.list_(_F64)]
        elif func == "mode":
            types = [pa.list_(out)]
        elif func in _APPROX:
            types = [pa.list_(_F64), pa.list_(pa.int64()), pa.list_(pa.int64()), pa.int64()]
        elif func in ("max_by", "min_by"):
            types = [out, _ordering_type(self)]
        elif func in ("count_if", "bool_and", "every", "bool_or", "some", "any"):
            types = [pa.int64() if func == "count_if" else pa.bool_()]
        elif func in _MOMENTS or func in _COMOMENTS or func in ("skewness", "kurtosis"):
            types = [_F64] * len(suffixes)
        elif func in ("approx_count_distinct", "hll_sketch_agg", "hll_union_agg"):
            types = [pa.binary()]
        else:  # min, max
            types = [out]
        return list(zip(suffixes, types, strict=False))

    def inputs(self) -> list[tuple[str, pa.DataType]]:
        """The buffers of each batch's partial rows, as Spark computes them: the state's, except
        that ``first``/``last`` send the value only and ``approx_count_distinct`` its packed
        (index, rank) pairs."""
        kept = self.buffers()
        if self.func in ("first", "last", "any_value"):
            return kept[:1]
        if self.func == "approx_count_distinct":
            return [(kept[0][0], pa.list_(pa.int64()))]
        if self.func in _APPROX:
            return [(kept[0][0], pa.list_(_F64))]  # the batch's values, in their order
        return kept

    def buffer_types(self) -> list[pa.DataType]:
        return [t for _, t in self.buffers()]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "func": self.func,
            "name": self.output_name,
            "type": str(self.output_type),
        }
        if self.ignore_nulls:
            out["ignorenulls"] = True
        if self.func == "approx_count_distinct":
            out["rsd"] = 0.05 if self.rsd is None else float(self.rsd)
        if self.percentage is not None:
            p = self.percentage
            out["percentage"] = list(p) if isinstance(p, tuple) else p
        if self.func in _APPROX:
            out["accuracy"] = self.effective_accuracy()
        if self.func == "hll_sketch_agg":
            out["lgConfigK"] = self.effective_lg_k()
        if self.func == "hll_union_agg":
            out["allowDifferentLgConfigK"] = self.allow_different_lg_config_k
        return out

    def effective_accuracy(self) -> int:
        return 10000 if self.accuracy is None else int(self.accuracy)

    def effective_lg_k(self) -> int:
        return hll_sketch.DEFAULT_LG_K if self.lg_config_k is None else self.lg_config_k

    def _decimal_avg(self) -> bool:
        return self.func == "avg" and pa.types.is_decimal(self.output_type)

    # --- merge and result ------------------------------------------------------------------------

    def merge(self, state: Arrays, batch: Arrays, *, ansi: bool = True) -> list[pa.Array]:
        """The state's buffers with a batch's partial buffers merged in (row by row)."""
        try:
            return MERGES[self._kind()](self, list(state), list(batch), ansi)
        except pa.ArrowInvalid as exc:
            typ = self.buffers()[0][1]
            msg = (
                f"{self.func}() into column {self.output_name!r} overflowed {typ} ({exc}); "
                "Spark fails the same way in ANSI mode. Aggregate a wider type instead, "
                f"e.g. SF.{self.func}(F.col(...).cast('decimal(38,0)'))"
            )
            raise AggregateOverflowError(msg) from exc

    def merge_states(self, state: Arrays, other: Arrays, *, ansi: bool = True) -> list[pa.Array]:
        """Two states' buffers merged row by row, ``other`` coming after ``state`` (the merge of
        session windows that join). Buffers that a batch sends as the state keeps them merge as
        ``merge`` does; ``first``/``last`` and ``approx_count_distinct`` merge state with state."""
        s = [b.combine_chunks() if isinstance(b, pa.ChunkedArray) else b for b in state]
        o = [b.combine_chunks() if isinstance(b, pa.ChunkedArray) else b for b in other]
        if self.func == "approx_count_distinct":
            return [hll.union(s[0], o[0], hll.precision(self.rsd))]
        if self.func in _APPROX:
            return merge_summaries(self, s, o, from_values=False)
        if self.func in ("first", "last", "any_value"):
            s_set, o_set = pc.fill_null(s[1], False), pc.fill_null(o[1], False)
            keep = pc.invert(o_set) if self.func == "last" else s_set
            return [pc.if_else(keep, s[0], o[0]), pc.or_(s_set, o_set)]
        return self.merge(s, o, ansi=ansi)

    def result(self, buffers: Arrays, *, ansi: bool = True) -> pa.Array:
        """The function's value from its merged buffers."""
        bufs = [b.combine_chunks() if isinstance(b, pa.ChunkedArray) else b for b in buffers]
        return RESULTS[self._kind()](self, bufs, ansi)

    def _kind(self) -> str:
        if self.func in _SAME_AS:
            return _SAME_AS[self.func]
        if self.func in ("sum", "avg") and pa.types.is_decimal(self.output_type):
            return "decimal_" + self.func
        return self.func

    def overflow(self, detail: str) -> AggregateOverflowError:
        msg = (
            f"{self.func}() into column {self.output_name!r} overflowed {detail}; Spark fails "
            "the same way in ANSI mode (spark.sql.ansi.enabled=false gives null instead)"
        )
        return AggregateOverflowError(msg)


def _check_storable(agg: AggregateFunction, typ: pa.DataType) -> None:
    # the value codec keeps nested values too, but the merges are not written for them
    flat = not pa.types.is_nested(typ) or (
        pa.types.is_list(typ) and not pa.types.is_nested(typ.value_type)
    )
    try:
        if not flat:
            raise ConfigurationError(typ)
        ValueCodec(pa.schema([("v", typ)]))
    except ConfigurationError:
        msg = (
            f"{agg.func}() into column {agg.output_name!r}: values of type {agg.output_type} "
            "cannot be kept in state yet (numbers, strings, binary, booleans, dates, timestamps "
            "and decimals can, and lists of those)"
        )
        raise ConfigurationError(msg) from None


def _ordering_type(agg: AggregateFunction) -> pa.DataType:
    """``max_by``/``min_by``'s ordering type: the second field of its input's struct."""
    typ = agg.input_type
    if typ is None or not pa.types.is_struct(typ) or typ.num_fields != 2:
        msg = f"{agg.func}() into column {agg.output_name!r} needs its value and ordering types"
        raise ConfigurationError(msg)
    ordering: pa.DataType = typ.field(1).type
    return ordering


def _element_type(list_type: pa.DataType) -> pa.DataType:
    if not pa.types.is_list(list_type):
        msg = f"collect_list/collect_set gives a list, not {list_type}"
        raise ConfigurationError(msg)
    element: pa.DataType = list_type.value_type
    return element


def _decimal_sum_type(input_type: pa.DataType | None) -> pa.DataType:
    """Spark's sum buffer of decimal(p, s): decimal(min(38, p + 10), s)."""
    assert input_type is not None and pa.types.is_decimal(input_type)
    return pa.decimal128(min(38, input_type.precision + 10), input_type.scale)
