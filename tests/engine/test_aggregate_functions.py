"""The aggregate functions of a streaming ``agg()`` against Spark's built-in streaming aggregation:
the same file feed, batch by batch, in update and complete mode, on both providers, with a
restart on the same checkpoint in the middle; and PySpark's own aggregates taken as their twins or
refused naming the ``SF`` function to use."""

from __future__ import annotations

import decimal
import math
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate import functions as SF
from sparkstate.engine.aggregate_plan import recognise
from sparkstate.engine.plan import AggregateStep, plan_stages
from sparkstate.exceptions import ConfigurationError

from .conftest import PROVIDERS, FileFeed
from .helpers import run_batches, same_schema, source, start_ours, start_spark

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
    ],
    [row("d", 11, 3.0, "w", None), row(None, None, 4.0, "k", "2.00")],
]
RESTART_AFTER = 3


def ours() -> list[Any]:
    return [
        SF.count("*").alias("n"),
        F.count("v"),  # PySpark's own, taken as SF.count
        SF.sum("v"),
        SF.sum("m"),
        SF.avg("m"),
        F.avg("d"),
        SF.min("s"),
        SF.max("d"),
        SF.first("v"),
        SF.first("v", ignorenulls=True).alias("first_nn"),
        F.last("s", True),
        SF.last("v"),
        SF.collect_list("s"),
        SF.collect_set("d"),
        F.collect_set("v").alias("vs"),
        SF.stddev("d"),
        SF.stddev_pop("v"),
        SF.variance("d"),
        SF.var_pop("d"),
        SF.var_samp("v"),
        SF.stddev_samp("d"),
        SF.std("v"),
        SF.approx_count_distinct("s"),
        SF.approx_count_distinct("d", 0.1),
    ]


def theirs() -> list[Any]:
    return [
        F.count("*").alias("n"),
        F.count("v"),
        F.sum("v"),
        F.sum("m"),
        F.avg("m"),
        F.avg("d"),
        F.min("s"),
        F.max("d"),
        F.first("v"),
        F.first("v", ignorenulls=True).alias("first_nn"),
        F.last("s", True),
        F.last("v"),
        F.collect_list("s"),
        F.collect_set("d"),
        F.collect_set("v").alias("vs"),
        F.stddev("d"),
        F.stddev_pop("v"),
        F.variance("d"),
        F.var_pop("d"),
        F.var_samp("v"),
        F.stddev_samp("d"),
        F.std("v"),
        F.approx_count_distinct("s"),
        F.approx_count_distinct("d", 0.1),
    ]


class RawCollector:
    """``foreachBatch``: each batch's rows as tuples, sorted by the grouping key, and the schema."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[Any, ...]]] = {}
        self.schema: Any = None

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


def assert_same(mine: RawCollector, spark_side: RawCollector, sets: tuple[str, ...] = ()) -> None:
    assert same_schema(mine.schema, spark_side.schema), (mine.schema, spark_side.schema)
    names = spark_side.schema.names
    assert sorted(mine.batches) == sorted(spark_side.batches)
    for b, expected in spark_side.batches.items():
        got = mine.batches[b]
        assert [r[0] for r in got] == [r[0] for r in expected], b
        for r_got, r_exp in zip(got, expected, strict=True):
            for name, x, y in zip(names, r_got, r_exp, strict=True):
                assert close(x, y, as_set=name in sets), (b, r_exp[0], name, x, y)


_SPARK: dict[str, RawCollector] = {}


def spark_run(spark: SparkSession, tmp: Path, mode: str) -> RawCollector:
    """Spark's own query over the batches (once per mode: it does not depend on our provider)."""
    if mode not in _SPARK:
        feed = FileFeed(tmp / "input")
        collector = RawCollector()
        q = start_spark(
            source(spark, feed, SCHEMA).groupBy("k").agg(*theirs()), mode, tmp / "chk", collector
        )
        run_batches(feed, q, BATCHES)
        _SPARK[mode] = collector
    return _SPARK[mode]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("mode", ["update", "complete"])
def test_aggregates_match_spark_across_a_restart(
    spark: SparkSession,
    feed: FileFeed,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    provider: str,
    mode: str,
) -> None:
    expected = spark_run(spark, tmp_path_factory.mktemp(f"spark-{mode}"), mode)
    mine = RawCollector()
    chk = tmp_path / "chk"

    def start() -> Any:
        stream = ss.stream(source(spark, feed, SCHEMA)).groupBy("k").agg(*ours())
        return start_ours(stream, mode, chk, provider, mine)

    run_batches(feed, start(), BATCHES[:RESTART_AFTER])
    run_batches(feed, start(), BATCHES[RESTART_AFTER:])
    assert_same(mine, expected, sets=("collect_set(d)", "vs"))
    some = expected.batches[0][0]
    assert some[expected.schema.names.index("sum(m)")] == D("1.26")  # a decimal(20,2)


def test_approx_count_distinct_of_thousands_of_values(
    spark: SparkSession, feed: FileFeed, tmp_path: Path
) -> None:
    """Exactly Spark's estimate where Spark uses linear counting or the raw estimate (the same
    registers), and within three relative standard deviations of the exact count."""
    batches = [
        [{"k": "ints", "v": i % 6000, "d": None, "s": None, "m": None} for i in range(9000)]
        + [{"k": "doubles", "v": None, "d": i / 7 - 100, "s": None, "m": None} for i in range(700)]
        + [{"k": "doubles", "v": None, "d": x, "s": None, "m": None} for x in (NAN, -0.0, 0.0)]
        + [
            {"k": "strings", "v": None, "d": None, "s": f"s{i % 2500}", "m": None}
            for i in range(5000)
        ],
    ]
    exact = {"ints": 6000, "doubles": 700 + 2, "strings": 2500}

    def aggs(fn: Any) -> list[Any]:
        return [
            fn.approx_count_distinct("v").alias("v5"),
            fn.approx_count_distinct("v", 0.01).alias("v1"),
            fn.approx_count_distinct("d").alias("d5"),
            fn.approx_count_distinct("s", 0.02).alias("s2"),
        ]

    mine, spark_side = RawCollector(), RawCollector()
    q = start_ours(
        ss.stream(source(spark, feed, SCHEMA)).groupBy("k").agg(*aggs(SF)),
        "complete",
        tmp_path / "a",
        "memory",
        mine,
    )
    run_batches(feed, q, batches)
    feed.reset()
    df = source(spark, feed, SCHEMA).groupBy("k").agg(*aggs(F))
    run_batches(feed, start_spark(df, "complete", tmp_path / "b", spark_side), batches)
    names = spark_side.schema.names
    rsd = {"v5": 0.05, "v1": 0.01, "d5": 0.05, "s2": 0.02}
    for got, want in zip(mine.batches[0], spark_side.batches[0], strict=True):
        for name, x, y in zip(names[1:], got[1:], want[1:], strict=True):
            key = got[0]
            column = {"v": "ints", "d": "doubles", "s": "strings"}[name[0]]
            n = exact[column] if key == column else 0
            assert abs(x - n) <= 3 * rsd[name] * n, (key, name, x, y, n)
            m = 1 << math.ceil(2 * math.log(1.106 / rsd[name]) / math.log(2))
            if n == 0 or x >= 5 * m or x <= 2.5 * m:  # outside Spark's bias-corrected range
                assert x == y, (key, name, x, y)
            else:
                assert abs(x - y) <= 2 * rsd[name] * n, (key, name, x, y)


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
    ]


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (
            lambda: F.countDistinct("v"),
            r"count\(DISTINCT \.\.\.\).*SF\.approx_count_distinct\('v'\)",
        ),
        (lambda: F.sum_distinct("v"), r"sum\(DISTINCT \.\.\.\).*SF\.collect_set\('v'\)"),
        (lambda: F.sum(F.col("v") + 1), r"plain column only.*SF\.sum\(<the expression>\)"),
        (lambda: F.first(F.upper("s")), r"plain column only.*SF\.first\("),
        (lambda: F.percentile_approx("v", 0.5), r"percentile_approx\(\).*SF\.collect_list\('v'\)"),
        (lambda: F.kurtosis("v"), r"kurtosis\(\) cannot be merged.*SF\.count, SF\.sum"),
        (lambda: F.col("v"), r"not an aggregate function.*SF\.count"),
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
