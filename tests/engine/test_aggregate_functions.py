"""The aggregate functions of a streaming ``agg()`` against Spark's built-in streaming aggregation:
the same file feed, batch by batch, in update and complete mode (on memory; test_windows runs them
on rocksdb), with a restart on the same checkpoint in the middle; the later ones (logical and
bitwise, moments, percentiles, percentile_approx, DataSketches HLL sketches) all in one query, in
update mode on both providers and windowed append mode on rocksdb, and in session windows (on
rocksdb); and PySpark's own aggregates taken as their twins or refused naming the ``SF`` function
to use. The window_time chain, the distinct counts past a few thousand values and the decimal
overflow outside ANSI mode run on memory."""

from __future__ import annotations

import base64
import decimal
import math
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.plan.aggregate.plan import AggregateStep, recognise
from sparkstate.engine.plan.chain import plan_stages
from sparkstate.exceptions import ConfigurationError

from .conftest import FileFeed
from .helpers import (
    Collector,
    Differential,
    SparkRuns,
    at,
    same_schema,
    source,
    start_ours,
    start_spark,
)

SCHEMA = "k string, v int, d double, s string, m decimal(10,2)"
D = decimal.Decimal
NAN = float("nan")


def row(k: str | None, v: int | None, d: float | None, s: str | None, m: str | None) -> dict:  # type: ignore[type-arg]
    return {"k": k, "v": v, "d": d, "s": s, "m": None if m is None else float(m)}


BATCHES: list[list[dict[str, Any]]] = [
    [
        row("a", None, -0.0, "x", "1.25"),  # a null first value; -0.0 and 0.0 are one set value
        row("a", 1, 0.0, "y", None),
        row("a", 2, 2.5, "x", "0.01"),
        row("b", 7, 1e9 + 0.5, None, "99999999.99"),  # one value: sample statistics are null
        row("n", None, None, None, None),  # a group of nothing but nulls
        row(None, 3, -1.0, "k", "-2.00"),
    ],
    [],  # an empty batch
    [
        row("a", 5, 2.5, None, "-0.26"),
        row("b", None, 1e9 + 0.25, "q", None),
        row("c", 4, NAN, "z", "3.00"),  # NaN: stddev and variance are NaN
        row("n", None, None, None, None),
    ],
    # a restart on the checkpoint here
    [
        row("c", 4, 1.0, "z", "3.00"),
        row("a", None, None, None, None),
        row("b", -7, 1e9, "q", "0.03"),
        row("d", 10, 3.0, "w", "1.00"),
        row("d", 11, 3.0, "w", None),
        row(None, None, 4.0, "k", "2.00"),
    ],
]
RESTART_AFTER = 3


def aggregates(fn: Any) -> list[Any]:
    """Every aggregate function, spelled with ``fn``: ``pyspark.sql.functions`` (Spark's query) or
    ``SF`` (ours, where some are PySpark's own on purpose: taken as their SF twin)."""
    return [
        fn.count("*").alias("n"),
        F.count("v"),
        fn.sum("v"),
        fn.sum("m"),
        fn.avg("m"),
        F.avg("d"),
        fn.min("s"),
        fn.max("d"),
        fn.first("v"),
        fn.first("v", ignorenulls=True).alias("first_nn"),
        F.last("s", True),
        fn.last("v"),
        fn.collect_list("s"),
        fn.collect_set("d"),
        F.collect_set("v").alias("vs"),
        fn.stddev("d"),
        fn.stddev_pop("v"),
        fn.variance("d"),
        fn.var_pop("d"),
        fn.var_samp("v"),
        fn.stddev_samp("d"),
        fn.std("v"),
        fn.approx_count_distinct("s"),
        fn.approx_count_distinct("d", 0.1),
    ]


class RawCollector(Collector):
    """A :class:`Collector` of each batch's rows as they are (doubles not rounded), sorted by the
    grouping key."""

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.schema = df.schema
        rows = [tuple(r) for r in df.collect()]
        self.batches[batch_id] = sorted(rows, key=lambda r: (r[0] is None, r[0] or ""))


def _float_key(x: Any) -> tuple[bool, Any]:
    return (
        isinstance(x, float) and math.isnan(x),
        0.0 if isinstance(x, float) and math.isnan(x) else x,
    )


def close(a: Any, b: Any, *, as_set: bool = False) -> bool:
    """Equal; doubles within a relative 1e-9 (NaN equal to NaN); sets in any order."""
    if isinstance(a, list) and isinstance(b, list):
        if as_set:
            a, b = sorted(a, key=_float_key), sorted(b, key=_float_key)
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b) and type(a) is type(b)


def assert_same(mine: Collector, spark_side: Collector, sets: tuple[str, ...] = ()) -> None:
    assert same_schema(mine.schema, spark_side.schema), (mine.schema, spark_side.schema)
    names = spark_side.schema.names
    assert sorted(mine.batches) == sorted(spark_side.batches)
    for b, expected in spark_side.batches.items():
        got = mine.batches[b]
        assert [r[0] for r in got] == [r[0] for r in expected], b
        for r_got, r_exp in zip(got, expected, strict=True):
            for name, x, y in zip(names, r_got, r_exp, strict=True):
                assert close(x, y, as_set=name in sets), (b, r_exp[0], name, x, y)


def grouped_by_k(mode: str) -> Differential:
    def build(df: DataFrame, ours: bool) -> Any:
        if ours:
            return ss.stream(df).groupBy("k").agg(*aggregates(SF))
        return df.groupBy("k").agg(*aggregates(F))

    return Differential(mode, SCHEMA, BATCHES, mode, build, RESTART_AFTER, RawCollector)


@pytest.fixture(scope="module")
def spark_runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkRuns:
    return SparkRuns(spark, tmp_path_factory)


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_aggregates_match_spark_across_a_restart(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path, mode: str
) -> None:
    """On the memory provider: test_windows runs every kind of aggregate in update and complete
    mode on rocksdb (the merges do not depend on the mode; the output does)."""
    case = grouped_by_k(mode)
    expected = spark_runs.of(case)
    mine, _ = case.run(spark, tmp_path, "memory")
    assert_same(mine, expected, sets=("collect_set(d)", "vs"))
    some = expected.batches[0][0]
    assert some[expected.schema.names.index("sum(m)")] == D("1.26")  # a decimal(20,2)


def test_thousands_of_distinct_values_and_decimal_overflow_outside_ansi(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """approx_count_distinct of a few thousand values: exactly Spark's estimate (the counts are
    where Spark uses linear counting or the raw estimate, so the same registers give the same
    number; in between Spark subtracts a bias from tables we do not carry), and within three
    relative standard deviations of the exact count. Decimal sum and avg past their precision
    outside ANSI mode: null, as Spark's (within a batch and across batches; an overflowed sum
    stays null)."""
    schema = "k string, v int, d double, s string, m decimal(38,0)"
    big = 9 * 10**37

    def rows(k: str, column: str, values: Any) -> list[dict[str, Any]]:
        return [{"k": k, column: x} for x in values]

    batches = [
        rows("ints", "v", (i % 4000 for i in range(4500)))
        + rows("doubles", "d", [*(i / 7 - 100 for i in range(700)), NAN, -0.0, 0.0])
        + rows("strings", "s", (f"s{i % 2500}" for i in range(2600)))
        + rows("big", "m", [big, 1])
        + rows("twice", "m", [big, big]),
        rows("big", "m", [big, -1]) + rows("small", "m", [5, 6]),
    ]
    exact = {"ints": 4000, "doubles": 700 + 2, "strings": 2500}

    def aggs(fn: Any) -> list[Any]:
        return [
            fn.approx_count_distinct("v").alias("v5"),
            fn.approx_count_distinct("v", 0.01).alias("v1"),
            fn.approx_count_distinct("d").alias("d5"),
            fn.approx_count_distinct("s", 0.02).alias("s2"),
            fn.sum("m"),
            fn.avg("m"),
        ]

    mine, spark_side = RawCollector(), RawCollector()
    their_feed = FileFeed(tmp_path / "input-b")
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "false")  # each query keeps the conf it started with
    try:
        stream = ss.stream(source(spark, feed, schema)).groupBy("k").agg(*aggs(SF))
        queries = [
            start_ours(stream, "complete", tmp_path / "a", "memory", mine),
            start_spark(
                source(spark, their_feed, schema).groupBy("k").agg(*aggs(F)),
                "complete",
                tmp_path / "b",
                spark_side,
            ),
        ]
    finally:
        spark.conf.set("spark.sql.ansi.enabled", str(ansi))
    try:
        for batch in batches:
            feed.add(batch)
            their_feed.add(batch)
            for q in queries:
                q.processAllAvailable()
    finally:
        for q in queries:
            q.stop()
    assert_same(mine, spark_side, sets=())
    by_key = {r[0]: r for r in spark_side.batches[1]}
    assert by_key["big"][5:] == (None, None) and by_key["small"][5:] == (D(11), D("5.5000"))
    names = spark_side.schema.names
    rsd = {"v5": 0.05, "v1": 0.01, "d5": 0.05, "s2": 0.02}
    for got in mine.batches[1]:
        for name, x in zip(names[1:5], got[1:5], strict=True):
            column = {"v": "ints", "d": "doubles", "s": "strings"}[name[0]]
            n = exact[column] if got[0] == column else 0
            assert abs(x - n) <= 3 * rsd[name] * n, (got[0], name, x, n)


# --- PySpark's own aggregates ---------------------------------------------------------------------


def test_pyspark_aggregates_are_taken_as_their_twins(spark: SparkSession, feed: FileFeed) -> None:
    df = source(spark, feed, SCHEMA)
    step = AggregateStep(
        ("k",),
        (
            F.count("*").alias("n"),
            F.count(F.lit(1)),
            F.sum("v"),
            F.first("v", True),
            F.mean("d").alias("mean"),
            F.approx_count_distinct(F.col("s"), 0.1),
            F.std("v"),
            F.collect_list("s"),
            F.max_by("s", "d"),
            F.percentile("v", [0.25, 0.5]),
            F.any_value("s", True),
            F.hll_sketch_agg("s", 10),
        ),
    )
    (stage,) = plan_stages(df, [step], "update", None)
    described = [a.describe() for a in stage.operator.aggregates]  # type: ignore[attr-defined]
    assert described == [
        {"func": "count", "name": "n", "type": "int64"},
        {"func": "count", "name": "count(1)", "type": "int64"},
        {"func": "sum", "name": "sum(v)", "type": "int64"},
        {"func": "first", "name": "first(v)", "type": "int32", "ignorenulls": True},
        {"func": "avg", "name": "mean", "type": "double"},
        {
            "func": "approx_count_distinct",
            "name": "approx_count_distinct(s)",
            "type": "int64",
            "rsd": 0.1,
        },
        {"func": "std", "name": "std(v)", "type": "double"},
        {
            "func": "collect_list",
            "name": "collect_list(s)",
            "type": "list<element: string>",
        },
        {"func": "max_by", "name": "max_by(s, d)", "type": "string"},
        {
            "func": "percentile",
            "name": "percentile(v, array(0.25, 0.5), 1)",
            "type": "list<element: double>",
            "percentage": [0.25, 0.5],
        },
        {"func": "any_value", "name": "any_value(s)", "type": "string", "ignorenulls": True},
        {
            "func": "hll_sketch_agg",
            "name": "hll_sketch_agg(s, 10)",
            "type": "binary",
            "lgConfigK": 10,
        },
    ]


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (
            lambda: F.countDistinct("v"),
            r"count\(DISTINCT \.\.\.\).*SF\.approx_count_distinct\('v'\)",
        ),
        (lambda: F.sum_distinct("v"), r"sum\(DISTINCT \.\.\.\).*SF\.collect_set\('v'\)"),
        (
            lambda: F.regr_count("v", "d"),
            r"regr_count\(\) cannot be merged.*SF\.percentile_approx.*SF\.hll_union_agg",
        ),
        (
            lambda: F.hll_sketch_agg("v", 22),
            r"HLL_INVALID_LG_K.*`hll_sketch_agg`.*between 4 and 21, inclusive: 22\.",
        ),
        (lambda: SF.hll_sketch_agg("s", 3), r"HLL_INVALID_LG_K.*inclusive: 3\."),
        (lambda: F.hll_sketch_agg("v", F.col("v")), r"HLL_K_MUST_BE_CONSTANT.*`hll_sketch_agg`"),
        (lambda: F.regr_slope("v", "d"), r"regr_slope\(\) cannot be merged.*SF\.count, SF\.sum"),
        (lambda: F.product("v"), r"product\(\) cannot be merged.*SF\.mode"),
        (
            lambda: F.percentile("v", 0.5, 2),
            r"percentile\(\) with literal percentages and frequency 1",
        ),
        (lambda: F.count(F.lit(None)), r"count\(NULL\) is always 0"),
        (lambda: "v", r"takes aggregates such as SF\.count"),
    ],
)
def test_pyspark_aggregates_that_cannot_merge_are_refused_at_start(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, column: Any, message: str
) -> None:
    stream = ss.stream(source(spark, feed, SCHEMA)).groupBy("k").agg(column())
    writer = stream.writeStream.outputMode("update").format("noop")
    with pytest.raises(ConfigurationError, match=message):
        writer.option("checkpointLocation", str(tmp_path / "chk")).start()


@pytest.mark.parametrize(
    ("column", "condition"),
    [
        (lambda: F.col("v"), "MISSING_AGGREGATION"),
        (lambda: F.hll_union_agg("s", F.col("v") > 0), "DATATYPE_MISMATCH.UNEXPECTED_INPUT_TYPE"),
        (lambda: F.percentile_approx("v", F.col("d")), "DATATYPE_MISMATCH.NON_FOLDABLE_INPUT"),
    ],
)
def test_aggregates_spark_refuses_fail_with_spark_s_own_error(
    spark: SparkSession, feed: FileFeed, tmp_path: Path, column: Any, condition: str
) -> None:
    """What Spark's analyzer refuses, it refuses for the wrapped query too, with its condition."""
    stream = ss.stream(source(spark, feed, SCHEMA)).groupBy("k").agg(column())
    writer = stream.writeStream.outputMode("update").format("noop")
    with pytest.raises(AnalysisException) as refused:
        writer.option("checkpointLocation", str(tmp_path / "chk")).start()
    assert refused.value.getCondition() == condition
    with pytest.raises(AnalysisException) as spark_refused:
        source(spark, feed, SCHEMA).groupBy("k").agg(column())
    assert spark_refused.value.getCondition() == condition


def test_spark_connect_columns_are_read_without_a_session() -> None:
    """A Spark Connect client's columns are Python expression trees: read without a server."""
    connect = pytest.importorskip("pyspark.sql.connect.functions")
    first = recognise(connect.first("v", True).alias("f"))
    assert (first.func, first.column, first.name, first.options) == (
        "first",
        "v",
        "f",
        (("ignorenulls", True),),
    )
    assert recognise(connect.count("*")).column == "*"
    assert recognise(connect.count(connect.lit(1))).column == "*"
    assert recognise(connect.approx_count_distinct("v", 0.02)).options == (("rsd", 0.02),)
    nested = recognise(connect.max(connect.col("`a.b`")))
    assert nested.func == "max" and not isinstance(nested.column, str)
    with pytest.raises(ConfigurationError, match=r"SF\.approx_count_distinct\('v'\)"):
        recognise(connect.countDistinct("v"))
    with pytest.raises(ConfigurationError, match=r"plain column only.*SF\.sum"):
        recognise(connect.sum(connect.col("v") * 2))
    pairs = recognise(connect.max_by("s", "v"))
    assert (pairs.func, pairs.column, pairs.others) == ("max_by", "s", ("v",))
    several = recognise(connect.percentile("v", [0.25, 0.5]))
    assert several.options == (("percentage", (0.25, 0.5)),)
    assert recognise(connect.median("d")).options == (("percentage", 0.5),)
    assert recognise(connect.mode("v", True)).options == (("deterministic", True),)
    approx = recognise(connect.percentile_approx("v", [0.25, 0.5], 100))
    assert approx.options == (("percentage", (0.25, 0.5)), ("accuracy", 100))
    assert recognise(connect.hll_sketch_agg("v", 10)).options == (("lgConfigK", 10),)
    assert recognise(connect.hll_sketch_agg("v")).options == ()
    union = recognise(connect.hll_union_agg("sk", True))
    assert (union.func, union.options) == ("hll_union_agg", (("allowDifferentLgConfigK", True),))
    with pytest.raises(ConfigurationError, match=r"HLL_INVALID_LG_K.*inclusive: 2\."):
        recognise(connect.hll_sketch_agg("v", 2))


# --- the aggregates beyond the basic ones, by group -----------------------------------------------

MORE_SCHEMA = (
    "k string, ts timestamp, v int, w int, d double, e double, b boolean, s string, "
    "sk binary, mx binary"
)


def more_row(
    k: str,
    t: int,
    v: int | None = None,
    w: int | None = None,
    d: float | None = None,
    e: float | None = None,
    b: bool | None = None,
    s: str | None = None,
) -> dict[str, Any]:
    return {"k": k, "ts": at(t), "v": v, "w": w, "d": d, "e": e, "b": b, "s": s}


def more_rows(i: int) -> list[dict[str, Any]]:
    """File ``i``: 20 s of event time (a 10 s window closes with each file). ``p`` has nulls
    among its values and the same most frequent ``v`` in every window and batch, ``q`` one row
    per window, ``r`` two equal rows (no spread: null moments), ``n`` NaN in ``d`` then in
    ``e``, ``z`` nothing but nulls; no two orderings of a key tie where their values differ."""
    base = 20 * i + 60
    return [
        more_row("p", base + 1, 7, 3, 1.5 + i, 2.0 * i + 0.25, True, "a"),
        more_row("p", base + 3, 7, 5, -0.5 * i, 1.0, None, "b"),
        more_row("p", base + 5, i + 1, None, None, 3.5, i % 2 == 1, "a"),
        more_row("p", base + 12, 7, 12 + i, 4.25 + i, -1.5, True, "c"),
        more_row("p", base + 14, None, 6, 0.75 * i + 0.1, None, False, None),
        more_row("q", base + 2, 4, 9 - i, 2.0 + i / 4, i * 1.5, i != 1, f"x{i}"),
        more_row("r", base + 4, 5, 5, 3.0, 3.0, True, "y"),
        more_row("r", base + 6, 5, 5, 3.0, 3.0, True, "y"),
        more_row("n", base + 7, 1, 2, NAN, 1.0, False, "m"),
        more_row("n", base + 9, 2, 3, 2.0, NAN, None, "o"),
        more_row("z", base + 8),
    ]


MORE_FILES = [more_rows(i) for i in range(4)]


def any_of(fn: Any, col: str) -> Any:
    """``any(col)``: Spark's SQL name of ``bool_or``, which pyspark.sql.functions lacks."""
    return fn.any(col) if fn is SF else F.call_function("any", F.col(col))


#: Each group's aggregates, spelled with ``fn`` (ours mixes in PySpark's own on purpose).
MORE_GROUPS: dict[str, Any] = {
    "logical": lambda fn: [
        fn.count_if("b"),
        fn.bool_and("b"),
        fn.every("b"),
        F.bool_or("b"),
        fn.some("b"),
        any_of(fn, "b"),
        fn.any_value("s", True),
        F.any_value("v"),
        fn.max_by("s", "d"),
        F.min_by("v", "e").alias("v_at_min_e"),
        fn.bit_and("v"),
        fn.bit_or("w"),
        F.bit_xor("v"),
    ],
    "moments": lambda fn: [
        fn.corr("d", "e"),
        F.covar_pop("d", "e"),
        fn.covar_samp("v", "w"),
        fn.kurtosis("d"),
        F.skewness("e"),
        fn.skewness(F.col("v") * 2).alias("skew2v"),
    ],
    "percentiles": lambda fn: [
        fn.percentile("v", 0.3),
        F.percentile("d", [0.25, 0.5, 0.9]),
        fn.median("e"),
        F.median("w"),
        fn.mode("v"),
        fn.mode("s", True),
    ],
}


class KeyedCollector(RawCollector):
    """Each batch's rows as they are, sorted by their grouping keys (a window, then ``k``)."""

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.schema = df.schema
        rows = [tuple(r) for r in df.collect()]
        nkeys = 2 if {"window", "session_window"} & set(df.schema.names) else 1
        self.batches[batch_id] = sorted(rows, key=lambda r: repr(r[:nkeys]))


def approx_rows(i: int) -> list[dict[str, Any]]:
    """:func:`more_rows` and 3000 rows of key ``big`` a file: past 1 / (2 * relative error)
    values, where Spark's summary starts to compress (and ``big``'s sketches are in HLL mode);
    twenty of its ``v`` a window are 7, its one most frequent value. Its ``d`` are whole
    numbers, a few hundred distinct ones: percentile's exact state stays small."""
    rnd = random.Random(i)
    base = 20 * i + 60
    big = [
        more_row("big", base + j % 20, rnd.randint(-500, 500), None, float(round(rnd.gauss(0, 50))))
        for j in range(3000)
    ]
    sevens = [more_row("big", base + j % 20, 7) for j in range(40)]
    return more_rows(i) + big + sevens


def input_sketches(spark: SparkSession) -> dict[tuple[int, int], str]:
    """Base64 (as a JSON file holds binary) HLL sketches of 48 groups of 1 to 3000 values, of
    ``lgConfigK`` 10 and 12, made by Spark's ``hll_sketch_agg``."""
    rnd = random.Random(7)
    groups = [(g, rnd.choice([1, 5, 40, 400, 3000]), rnd.randint(0, 5000)) for g in range(48)]
    values = [(g, lo + rnd.randint(0, n)) for g, n, lo in groups for _ in range(n)]
    made = spark.createDataFrame(values, "g int, x long")
    return {
        (r["g"], lg): base64.b64encode(bytes(r["h"])).decode()
        for lg in (10, 12)
        for r in made.groupBy("g").agg(F.hll_sketch_agg("x", lg).alias("h")).collect()
    }


def sketch_rows(i: int, sketches: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    """File ``i``'s column of sketches: six for each of keys ``u`` and ``w`` in ``sk`` (all of
    ``lgConfigK`` 12) and ``mx`` (10 or 12), a null one, and ``y`` whose one ``s`` is an empty
    string."""
    base = 20 * i + 60
    rows = []
    for j in range(12):
        g = (12 * i + j) % 48
        sk, mx = sketches[(g, 12)], sketches[(g, 10 if g % 3 == 0 else 12)]
        rows.append({**more_row("uw"[j % 2], base + j + j // 6), "sk": sk, "mx": mx})
    return [*rows, more_row("u", base + 15), more_row("y", base + 18, s="")]


def approx_aggregates(fn: Any) -> list[Any]:
    """percentile_approx and the HLL sketches, spelled with ``fn`` as :data:`MORE_GROUPS`."""
    return [
        fn.percentile_approx("v", 0.5),
        fn.percentile_approx("d", [0.1, 0.5, 0.99], 100),
        F.approx_percentile("ts", 0.25),
        F.percentile_approx("e", 0.9, 1000).alias("e90"),
        F.hll_sketch_agg("v"),
        fn.hll_sketch_agg("s", 10),
        F.hll_sketch_agg("v", 4).alias("v4"),
        F.hll_union_agg("sk"),
        fn.hll_union_agg("mx", True).alias("mixed"),
    ]


def more_case(mode: str, files: list[list[dict[str, Any]]]) -> Differential:
    """Every group of :data:`MORE_GROUPS` and :func:`approx_aggregates` in one ``agg()``: by
    ``k`` in update mode, by a tumbling window and ``k`` in append mode."""

    def build(df: DataFrame, ours: bool) -> Any:
        fn = SF if ours else F
        keys: list[Any] = ["k"]
        if mode == "append":
            df = df.withWatermark("ts", "5 seconds")
            keys = [fn.window("ts", "10 seconds"), "k"]
        aggs = [a for group in MORE_GROUPS.values() for a in group(fn)] + approx_aggregates(fn)
        return (ss.stream(df) if ours else df).groupBy(*keys).agg(*aggs)

    return Differential(f"more-{mode}", MORE_SCHEMA, files, mode, build, 2, KeyedCollector)


@pytest.fixture(scope="module")
def more_files(spark: SparkSession) -> list[list[dict[str, Any]]]:
    sketches = input_sketches(spark)
    return [approx_rows(i) + sketch_rows(i, sketches) for i in range(4)]


@pytest.mark.parametrize(
    ("mode", "providers"), [("update", ("memory", "rocksdb")), ("append", ("rocksdb",))]
)
def test_more_aggregates_match_spark(
    spark: SparkSession,
    spark_runs: SparkRuns,
    more_files: list[list[dict[str, Any]]],
    tmp_path: Path,
    mode: str,
    providers: tuple[str, ...],
) -> None:
    """The aggregates beyond the basic ones (logical and bitwise, moments, percentiles,
    percentile_approx, DataSketches HLL sketches) in one query: the same batches as Spark's,
    across a restart, in update mode on memory and on rocksdb (their buffers through both
    providers) and in windowed append mode on rocksdb (test_windows runs append on both).
    Values a user would look at (not all null) come out.

    percentile_approx: Spark's summary of each batch's values (one file, one partition), merged
    into the state's as Spark merges them: the same answers, of the column's type (integers,
    doubles, timestamps), compressed summaries included (``big``). HLL: Spark's sketch of each
    batch's ints and strings (three ``lgConfigK``), and its union of each batch's column of
    sketches (of one ``lgConfigK``, and of two with ``allowDifferentLgConfigK``), unioned into
    the state's: the same bytes, sketches in list, set and HLL mode; Spark's estimate of them is
    the distinct count."""
    case = more_case(mode, more_files)
    expected = spark_runs.of(case)
    for provider in providers:
        mine, _ = case.run(spark, tmp_path / provider, provider)
        assert_same(mine, expected)
    names = expected.schema.names
    nkeys = 2 if mode == "append" else 1
    rows = [r for batch in expected.batches.values() for r in batch]
    # update: the five keys of more_rows each batch; append: their six windows of each file but
    # the last, and the five of the last's first ten seconds (big's rows, 19 s into a file, move
    # the watermark past them)
    small = [r for r in rows if r[nkeys - 1] in ("p", "q", "r", "n", "z")]
    assert len(small) == (4 * 5 if mode == "update" else 3 * 6 + 5)
    for column in range(nkeys, len(names)):
        assert any(r[column] not in (None, 0) for r in rows), names[column]
    big = [r for r in rows if r[nkeys - 1] == "big"]
    median = names.index("percentile_approx(v, 0.5, 10000)")
    assert big and all(-500 <= r[median] <= 500 for r in big)
    assert all(r[names.index("mode(v)")] == 7 for r in big)
    if mode == "update":  # the whole stream's sketch of big's values, read back by Spark
        last = big[-1][names.index("hll_sketch_agg(v, 12)")]
        (estimate,) = (
            spark.createDataFrame([(last,)], "h binary").select(F.hll_sketch_estimate("h")).first()
        )
        exact = len({r["v"] for rows in more_files for r in rows if r["k"] == "big"})
        assert abs(estimate - exact) <= 0.05 * exact, (estimate, exact)


def test_window_time_groups_a_windowed_aggregation_into_wider_windows(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path
) -> None:
    """``SF.window_time`` in a chain of two windowed aggregations, as the README
    writes it with SF: the same batches as Spark's query written with F."""

    def build(df: DataFrame, ours: bool) -> Any:
        fn = SF if ours else F
        df = df.withWatermark("ts", "5 seconds")
        first = (ss.stream(df) if ours else df).groupBy(fn.window("ts", "10 seconds"), "k")
        counts = first.agg(fn.count("*").alias("n"), fn.max_by("s", "d").alias("top"))
        wider = counts.groupBy(fn.window(fn.window_time("window"), "20 seconds"))
        return wider.agg(fn.sum("n").alias("rows"), fn.count_if(F.col("top") == "c"))

    case = Differential("window-time", MORE_SCHEMA, MORE_FILES, "append", build, 2, KeyedCollector)
    expected = spark_runs.of(case)
    mine, _ = case.run(spark, tmp_path, "memory")
    assert_same(mine, expected)
    assert [r[1] for batch in expected.batches.values() for r in batch] == [11, 11, 11]


def test_more_aggregates_in_session_windows_that_merge_across_batches(
    spark: SparkSession, spark_runs: SparkRuns, tmp_path: Path
) -> None:
    """Session windows (a 6 s gap; ``j``'s session starts in the first file, grows in the second
    and closes after the restart) whose buffers of each kind of new aggregate merge across
    batches. On rocksdb (test_session_windows runs session windows on both providers, and
    test_more_aggregates_match_spark these buffers)."""

    def aggs(fn: Any) -> list[Any]:
        return [
            fn.any_value("s", True),
            fn.max_by("s", "d"),
            fn.bool_or("b"),
            fn.count_if("b"),
            fn.bit_or("w"),
            fn.corr("d", "e"),
            fn.kurtosis("d"),
            fn.percentile("v", [0.5]),
            fn.mode("v", True),
            fn.hll_sketch_agg("v"),
            F.hll_sketch_agg("s", 5),
        ]

    def build(df: DataFrame, ours: bool) -> Any:
        fn = SF if ours else F
        df = df.withWatermark("ts", "5 seconds")
        keys = [fn.session_window("ts", "6 seconds"), "k"]
        return (ss.stream(df) if ours else df).groupBy(*keys).agg(*aggs(fn))

    joined = [
        [more_row("j", 78, 1, 1, 1.0, 2.0, True, "j0")],
        [more_row("j", 82, 2, 2, 3.0, 1.0, False, "j1"), more_row("j", 85, 2, 4, 2.5, 0.5)],
    ]
    files = [rows + (joined[i] if i < 2 else []) for i, rows in enumerate(MORE_FILES)]
    case = Differential("sessions", MORE_SCHEMA, files, "append", build, 2, KeyedCollector)
    expected = spark_runs.of(case)
    mine, _ = case.run(spark, tmp_path, "rocksdb")
    assert_same(mine, expected)
    (joined_session,) = [r for rows in expected.batches.values() for r in rows if r[1] == "j"]
    assert (joined_session[0].end - joined_session[0].start).total_seconds() == 13
    assert joined_session[2:5] == ("j0", "j1", True)


def test_hll_union_of_another_lg_config_k_in_a_later_batch_fails_as_in_spark(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """A sketch of ``lgConfigK`` 10 after one of 12 for the same key, without
    ``allowDifferentLgConfigK``: the batch fails with Spark's error, in both queries."""
    made = spark.createDataFrame([(1,), (2,)], "x long")
    sketches = [
        base64.b64encode(bytes(made.agg(F.hll_sketch_agg("x", lg)).first()[0])).decode()
        for lg in (12, 10)
    ]
    their_feed = FileFeed(tmp_path / "input-b")
    ours = ss.stream(source(spark, feed, MORE_SCHEMA)).groupBy("k").agg(F.hll_union_agg("sk"))
    theirs = source(spark, their_feed, MORE_SCHEMA).groupBy("k").agg(F.hll_union_agg("sk"))
    queries = [
        start_ours(ours, "update", tmp_path / "a", "memory", RawCollector()),
        start_spark(theirs, "update", tmp_path / "b", RawCollector()),
    ]
    try:
        for sketch in sketches:
            feed.add([{"k": "u", "sk": sketch}])
            their_feed.add([{"k": "u", "sk": sketch}])
        message = r"HLL_UNION_DIFFERENT_LG_K.*values: 12 and 10"
        for q in queries:
            with pytest.raises(StreamingQueryException, match=message):
                q.processAllAvailable()
    finally:
        for q in queries:
            q.stop()
