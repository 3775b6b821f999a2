"""The aggregate functions a streaming ``agg()`` merges across batches, as Spark defines them.

Each function keeps a few buffers per key in state (Spark's aggregation buffers: a count, a sum
and an "is empty" flag, a value and a "value set" flag, ``(n, avg, m2)``, a list, HyperLogLog
registers); Spark computes each batch's partial buffers in the JVM
(:mod:`sparkstate.engine.aggregate_plan`), and here they merge into the state's and give the
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
* ``approx_count_distinct`` keeps HyperLogLog registers (:mod:`sparkstate.operators.hll`);
* ``count_if`` is a count; ``bool_and``/``every`` and ``bool_or``/``some``/``any`` a boolean
  (null without values), ``bit_and``/``bit_or``/``bit_xor`` a value of the column's type;
  ``any_value`` is ``first``;
* ``max_by``/``min_by`` keep the value and its ordering; of equal orderings the batch's wins,
  as Spark's merge keeps the right side;
* ``corr``, ``covar_pop``, ``covar_samp``, ``skewness`` and ``kurtosis`` keep Spark's moments
  (:mod:`sparkstate.operators._moments`);
* ``percentile``, ``median`` and ``mode`` keep every value as ``collect_list`` does
  (:mod:`sparkstate.operators._distribution`);
* ``percentile_approx``/``approx_percentile`` keep Spark's Greenwald-Khanna summary, each
  batch's values inserted in their order (:mod:`sparkstate.operators._quantiles`);
* ``hll_sketch_agg`` and ``hll_union_agg`` keep Spark's DataSketches HLL sketch, as its bytes,
  and union each batch's sketch into it (:mod:`sparkstate.operators.hll_sketch`).
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkstate.exceptions import ConfigurationError, SparkstateError
from sparkstate.operators import _distribution, _moments, _quantiles, hll, hll_sketch
from sparkstate.operators._decimals import add_within, average
from sparkstate.operators._lists import concat_lists, distinct_lists, no_null_lists
from sparkstate.store.codec import ValueCodec

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "AggregateFunction",
    "AggregateOverflowError",
    "buffer_column",
]

Arrays = Sequence[pa.Array]
_F64 = pa.float64()
_SAMPLE = ("stddev", "std", "stddev_samp", "variance", "var_samp")
_POPULATION = ("stddev_pop", "var_pop")
_ROOTS = ("stddev", "std", "stddev_samp", "stddev_pop")
_MOMENTS = _SAMPLE + _POPULATION
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
            hll_sketch.check_lg_k(self._lg_k())
        if self.func in _PERCENTILES + _APPROX and self.percentage is None:
            msg = f"{self.func}() into column {self.output_name!r} needs its percentage"
            raise ConfigurationError(msg)
        for _, typ in self.buffers():
            _check_storable(self, typ)

    # --- buffers ---------------------------------------------------------------------------------

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
            out["accuracy"] = self._accuracy()
        if self.func == "hll_sketch_agg":
            out["lgConfigK"] = self._lg_k()
        if self.func == "hll_union_agg":
            out["allowDifferentLgConfigK"] = self.allow_different_lg_config_k
        return out

    def _accuracy(self) -> int:
        return 10000 if self.accuracy is None else int(self.accuracy)

    def _lg_k(self) -> int:
        return hll_sketch.DEFAULT_LG_K if self.lg_config_k is None else self.lg_config_k

    def _decimal_avg(self) -> bool:
        return self.func == "avg" and pa.types.is_decimal(self.output_type)

    # --- merge and result ------------------------------------------------------------------------

    def merge(self, state: Arrays, batch: Arrays, *, ansi: bool = True) -> list[pa.Array]:
        """The state's buffers with a batch's partial buffers merged in (row by row)."""
        try:
            return _MERGES[self._kind()](self, list(state), list(batch), ansi)
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
            return _merge_summaries(self, s, o, from_values=False)
        if self.func in ("first", "last", "any_value"):
            s_set, o_set = pc.fill_null(s[1], False), pc.fill_null(o[1], False)
            keep = pc.invert(o_set) if self.func == "last" else s_set
            return [pc.if_else(keep, s[0], o[0]), pc.or_(s_set, o_set)]
        return self.merge(s, o, ansi=ansi)

    def result(self, buffers: Arrays, *, ansi: bool = True) -> pa.Array:
        """The function's value from its merged buffers."""
        bufs = [b.combine_chunks() if isinstance(b, pa.ChunkedArray) else b for b in buffers]
        return _RESULTS[self._kind()](self, bufs, ansi)

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


# --- merges ---------------------------------------------------------------------------------------

Bufs = list[pa.Array]
Merge = Callable[[AggregateFunction, Bufs, Bufs, bool], Bufs]
Result = Callable[[AggregateFunction, Bufs, bool], pa.Array]


def _add_counts(state: pa.Array, batch: pa.Array) -> pa.Array:
    return pc.add_checked(pc.fill_null(state, 0), pc.fill_null(batch, 0))


def _add_sums(state: pa.Array, batch: pa.Array, ansi: bool) -> pa.Array:
    """Spark's non-decimal sum: null + x = x; integers wrap around outside ANSI mode."""
    if not ansi and pa.types.is_integer(state.type):
        return pc.coalesce(pc.add(state, batch), state, batch)
    total = pc.add_checked(state, batch)
    return pc.coalesce(total, state, batch).cast(state.type)


def _merge_count(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [_add_counts(s[0], b[0])]


def _merge_sum(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [_add_sums(s[0], b[0], ansi)]


def _merge_avg(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [_add_sums(s[0], b[0], True), _add_counts(s[1], b[1])]


def _emptiness(total: pa.Array, empty: pa.Array) -> pa.Array:
    """Spark's ``isEmpty``; where it was not kept, a null sum means no value."""
    return pc.coalesce(empty, pc.is_null(total))


def _merge_decimal_sum(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Spark's decimal ``(sum, isEmpty)``: an overflowed side (null sum, not empty) stays null."""
    empty_s, empty_b = _emptiness(s[0], s[1]), _emptiness(b[0], b[1].cast(pa.bool_()))
    overflowed = pc.or_(
        pc.and_(pc.invert(empty_s), pc.is_null(s[0])),
        pc.and_(pc.invert(empty_b), pc.is_null(b[0])),
    )
    zero = pa.scalar(decimal.Decimal(0), s[0].type)
    total = add_within(
        pc.fill_null(s[0], zero),
        pc.fill_null(b[0].cast(s[0].type), zero),
        agg.overflow if ansi else None,
    )
    total = pc.if_else(overflowed, pa.scalar(None, total.type), total)
    both_empty = pc.and_(empty_s, empty_b)
    return [pc.if_else(both_empty, pa.scalar(None, total.type), total), both_empty]


def _merge_decimal_avg(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Spark's decimal ``(sum, count)``: the sum starts at 0 and stays null once past its
    precision."""
    count_s, count_b = pc.fill_null(s[1], 0), pc.fill_null(b[1], 0)
    overflowed = pc.or_(
        pc.and_(pc.greater(count_s, 0), pc.is_null(s[0])),
        pc.and_(pc.greater(count_b, 0), pc.is_null(b[0])),
    )
    zero = pa.scalar(decimal.Decimal(0), s[0].type)
    total = add_within(
        pc.fill_null(s[0], zero),
        pc.fill_null(b[0].cast(s[0].type), zero),
        agg.overflow if ansi else None,
    )
    total = pc.if_else(overflowed, pa.scalar(None, total.type), total)
    return [total, pc.add_checked(count_s, count_b)]


def _pick(better: Callable[[pa.Array, pa.Array], pa.Array]) -> Merge:
    def merge(
        agg: AggregateFunction, s: list[pa.Array], b: list[pa.Array], ansi: bool
    ) -> list[pa.Array]:
        state, batch = s[0], b[0]
        take_batch = pc.or_kleene(
            pc.is_null(state), pc.and_kleene(pc.is_valid(batch), better(batch, state))
        )
        return [pc.if_else(pc.fill_null(take_batch, False), batch, state)]

    return merge


def _less(a: pa.Array, b: pa.Array) -> pa.Array:
    if pa.types.is_floating(a.type):  # NaN is the largest value in Spark
        nan_a, nan_b = pc.is_nan(a), pc.is_nan(b)
        return pc.or_kleene(pc.less(a, b), pc.and_kleene(nan_b, pc.invert(nan_a)))
    return pc.less(a, b)


def _greater(a: pa.Array, b: pa.Array) -> pa.Array:
    return _less(b, a)


def _batch_set(agg: AggregateFunction, value: pa.Array) -> pa.Array:
    """Whether a batch's partial row sets the value: always (a row of the group came), or with
    ``ignorenulls`` when the value is not null."""
    if agg.ignore_nulls:
        return pc.is_valid(value)
    return pa.array(np.ones(len(value), np.bool_))


def _merge_first(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    was_set = pc.fill_null(s[1], False)
    now_set = _batch_set(agg, b[0])
    return [pc.if_else(was_set, s[0], b[0]), pc.or_(was_set, now_set)]


def _merge_last(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    was_set = pc.fill_null(s[1], False)
    now_set = _batch_set(agg, b[0])
    return [pc.if_else(now_set, b[0], s[0]), pc.or_(was_set, now_set)]


def _merge_collect_list(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [concat_lists(s[0], b[0])]


def _merge_collect_set(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [distinct_lists(concat_lists(s[0], b[0]))]


def _doubles(arr: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(arr.cast(_F64), 0.0), dtype=np.float64)


def _merge_moments(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Chan et al.'s merge of ``(n, avg, m2)``, in Spark's order of operations."""
    n1, avg1, m2_1 = (_doubles(a) for a in s)
    n2, avg2, m2_2 = (_doubles(a) for a in b)
    with np.errstate(all="ignore"):
        n = n1 + n2
        delta = avg2 - avg1
        delta_n = np.where(n == 0.0, 0.0, delta / np.where(n == 0.0, 1.0, n))
        avg = avg1 + delta_n * n2
        m2 = m2_1 + m2_2 + delta * delta_n * n1 * n2
    return [pa.array(n, _F64), pa.array(avg, _F64), pa.array(m2, _F64)]


def _merge_bool(op: Callable[[pa.Array, pa.Array], pa.Array]) -> Merge:
    """Spark's ``bool_and``/``bool_or`` (and ``bit_*``): a null side (no value yet) gives the
    other side."""

    def merge(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
        state, batch = s[0], b[0].cast(s[0].type)
        return [pc.coalesce(op(state, batch), state, batch)]

    return merge


def _merge_extremum_by(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    """Spark's ``max_by``/``min_by`` merge: a null ordering gives the other side; else the
    state's stays only when its ordering is strictly better."""
    better = _greater if agg.func == "max_by" else _less
    order_s, order_b = s[1], b[1].cast(s[1].type)
    keep = pc.or_kleene(pc.is_null(order_b), better(order_s, order_b))
    keep = pc.and_(pc.is_valid(order_s), pc.fill_null(keep, False))
    return [pc.if_else(keep, s[0], b[0]), pc.if_else(keep, order_s, order_b)]


def _merge_central(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return _moments.merge_central(s, b)


def _merge_comoments(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return _moments.merge_comoments(s, b)


def _summaries(bufs: Bufs) -> list[_quantiles.Summary]:
    values, gs, deltas, counts = (b.to_pylist() for b in bufs)
    return [
        (v or [], g or [], d or [], c or 0)
        for v, g, d, c in zip(values, gs, deltas, counts, strict=True)
    ]


def _merge_summaries(agg: AggregateFunction, s: Bufs, b: Bufs, *, from_values: bool) -> Bufs:
    """Each row's quantile summary merged with the batch's (built from its values in order) or,
    between sessions, with another summary."""
    eps = 1.0 / agg._accuracy()
    if from_values:
        batch = [_quantiles.from_values(v or [], eps) for v in b[0].to_pylist()]
    else:
        batch = _summaries(b)
    merged = [_quantiles.merge(x, y, eps) for x, y in zip(_summaries(s), batch, strict=True)]
    return [
        pa.array([m[0] for m in merged], pa.list_(_F64)),
        pa.array([m[1] for m in merged], pa.list_(pa.int64())),
        pa.array([m[2] for m in merged], pa.list_(pa.int64())),
        pa.array([m[3] for m in merged], pa.int64()),
    ]


def _merge_quantiles(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return _merge_summaries(agg, s, b, from_values=True)


def _merge_registers(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [hll.fold(s[0], b[0], hll.precision(agg.rsd))]


def _merge_hll_sketches(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    return [hll_sketch.merge_sketches(s[0], b[0], agg._lg_k())]


def _merge_hll_unions(agg: AggregateFunction, s: Bufs, b: Bufs, ansi: bool) -> Bufs:
    allow = agg.allow_different_lg_config_k
    return [hll_sketch.merge_unions(s[0], b[0], allow_different_lg_k=allow)]


_MERGES: dict[str, Merge] = {
    "count": _merge_count,
    "sum": _merge_sum,
    "avg": _merge_avg,
    "decimal_sum": _merge_decimal_sum,
    "decimal_avg": _merge_decimal_avg,
    "min": _pick(_less),
    "max": _pick(_greater),
    "first": _merge_first,
    "last": _merge_last,
    "collect_list": _merge_collect_list,
    "collect_set": _merge_collect_set,
    "moments": _merge_moments,
    "approx_count_distinct": _merge_registers,
    "bool_and": _merge_bool(pc.and_),
    "bool_or": _merge_bool(pc.or_),
    "bit_and": _merge_bool(pc.bit_wise_and),
    "bit_or": _merge_bool(pc.bit_wise_or),
    "bit_xor": _merge_bool(pc.bit_wise_xor),
    "max_by": _merge_extremum_by,
    "central": _merge_central,
    "comoments": _merge_comoments,
    "percentile": _merge_collect_list,
    "mode": _merge_collect_list,
    "percentile_approx": _merge_quantiles,
    "hll_sketch_agg": _merge_hll_sketches,
    "hll_union_agg": _merge_hll_unions,
}


# --- results --------------------------------------------------------------------------------------


def _first_buffer(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    return bufs[0]


def _count(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    return pc.fill_null(bufs[0], 0)


def _average(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    total, count = bufs
    nonzero = pc.greater(pc.fill_null(count, 0), 0)
    quotient = pc.divide(total, pc.if_else(nonzero, count, 1).cast(_F64))
    return pc.if_else(nonzero, quotient, pa.scalar(None, _F64))


def _decimal_average(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    """Spark's ``sum / count`` of decimals (null without values)."""
    return average(bufs[0], bufs[1], agg.output_type, agg.overflow if ansi else None)


def _decimal_sum(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    total, empty = bufs
    return pc.if_else(_emptiness(total, empty), pa.scalar(None, total.type), total)


def _collected(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    return no_null_lists(bufs[0])


def _moment(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    """Spark's evaluation: null without values; a sample statistic of one value is null (NaN
    in legacy mode)."""
    n, m2 = _doubles(bufs[0]), _doubles(bufs[2])
    sample = agg.func in _SAMPLE
    with np.errstate(all="ignore"):
        value = m2 / (n - 1.0) if sample else m2 / n
        if agg.func in _ROOTS:
            value = np.sqrt(value)
    null = n == 0.0
    if sample:
        one = n == 1.0
        if agg.legacy_statistics:
            value = np.where(one, np.nan, value)
        else:
            null = null | one
    return pa.array(value, _F64, mask=null)


def _approx_count(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    return hll.estimate(bufs[0], hll.precision(agg.rsd))


def _sketch(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    """The state's sketch; where no sketch came (``hll_union_agg`` of nulls only), Spark's
    empty union: an empty sketch of ``lgConfigK`` 12."""
    lg_k = agg._lg_k() if agg.func == "hll_sketch_agg" else hll_sketch.DEFAULT_LG_K
    return pc.fill_null(bufs[0].cast(pa.binary()), pa.scalar(hll_sketch.empty(lg_k), pa.binary()))


def _central(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    return _moments.moment_result(agg.func, bufs, legacy=agg.legacy_statistics)


def _comoments(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    return _moments.comoments_result(agg.func, bufs, legacy=agg.legacy_statistics)


def _percentile(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    assert agg.percentage is not None
    return _distribution.percentiles(bufs[0], agg.percentage)


def _mode(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    return _distribution.mode(bufs[0])


def _approx_percentile(agg: AggregateFunction, bufs: Bufs, ansi: bool) -> pa.Array:
    """Spark's answers from each summary, as the column's type (a list of them for a list of
    percentages); null without values."""
    eps = 1.0 / agg._accuracy()
    percentage = agg.percentage
    assert percentage is not None
    several = isinstance(percentage, tuple)
    shares = percentage if isinstance(percentage, tuple) else (percentage,)
    rows: list[Any] = []
    for summary in _summaries(bufs):
        got = [_quantiles.query(summary, p, eps) for p in shares]
        rows.append(None if not summary[0] else (got if several else got[0]))
    out = agg.output_type
    element = out.value_type if several else out
    doubles = pa.array(rows, pa.list_(_F64) if several else _F64)
    if several:
        values = _as_output(doubles.flatten(), element)
        return pa.ListArray.from_arrays(doubles.offsets, values, mask=doubles.is_null())
    return _as_output(doubles, element)


def _as_output(doubles: pa.Array, typ: pa.DataType) -> pa.Array:
    """Spark's conversion of a summary's double back to the column's type (integers, dates and
    timestamps truncate toward zero)."""
    if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        return doubles.cast(typ)
    if pa.types.is_date32(typ):
        return pc.trunc(doubles).cast(pa.int32()).cast(typ)
    if pa.types.is_timestamp(typ):
        return pc.trunc(doubles).cast(pa.int64()).cast(typ)
    return pc.trunc(doubles).cast(typ, safe=False)


_RESULTS: dict[str, Result] = {
    "count": _count,
    "sum": _first_buffer,
    "avg": _average,
    "decimal_sum": _decimal_sum,
    "decimal_avg": _decimal_average,
    "min": _first_buffer,
    "max": _first_buffer,
    "first": _first_buffer,
    "last": _first_buffer,
    "collect_list": _collected,
    "collect_set": _collected,
    "moments": _moment,
    "approx_count_distinct": _approx_count,
    "bool_and": _first_buffer,
    "bool_or": _first_buffer,
    "bit_and": _first_buffer,
    "bit_or": _first_buffer,
    "bit_xor": _first_buffer,
    "max_by": _first_buffer,
    "central": _central,
    "comoments": _comoments,
    "percentile": _percentile,
    "mode": _mode,
    "percentile_approx": _approx_percentile,
    "hll_sketch_agg": _sketch,
    "hll_union_agg": _sketch,
}
