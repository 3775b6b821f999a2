"""TTL of value, list and map state against Spark's ``transformWithStateInPandas``.

Spark's rules (``ValueStateImplWithTTL``, ``ListStateImplWithTTL``, ``MapStateImplWithTTL``,
``TTLState``): every write sets the value's (list: the element's; map: the entry's) expiration to
the batch timestamp plus the TTL; a value whose expiration is at or before the batch timestamp is
invisible to reads (``get``, ``exists``, ``containsKey``, iteration) even before the end-of-batch
cleanup deletes it. Spark, in ProcessingTime mode, runs a no-data batch on every trigger and
cleans up there; sparkstate runs none for TTL alone, so its reads must hide what expired.

Expiry is made deterministic by the feeds' spacing: a batch's timestamp is taken after its file
was added, and the next file is added only after the previous batch finished plus a sleep longer
than the short TTL, so every short-TTL value has expired by the next batch however loaded the
machine is, and no long-TTL value (one hour) has. Spark's query and sparkstate's (pandas and row
mode) run side by side on the same timeline.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import Row, SparkSession

import sparkstate as ss

from .conftest import PROVIDERS, FileFeed
from .helpers import Collector, same_schema, source

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.spark

SCHEMA = "k string, v long"
OUTPUT = "k string, before string, after string"
SHORT_MS = 2_000
LONG_MS = 3_600_000
GAP_S = SHORT_MS / 1000 + 3.0  # between a batch's end and the next file
TRIGGER = "500 milliseconds"
FEEDS: list[list[dict[str, Any]]] = [
    [{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": 3}],
    [{"k": "a", "v": 4}, {"k": "c", "v": 5}],
    [{"k": "a", "v": 6}, {"k": "b", "v": 7}, {"k": "c", "v": 8}],
]
RocksDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


def _processor_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class TtlProcessor(_processor_base()):  # type: ignore[misc]
    """Shows what a key's short- and long-TTL state holds before and after this batch's writes."""

    def __init__(self, pandas: bool) -> None:
        self.pandas = pandas

    def init(self, handle: Any) -> None:
        self.values = [handle.getValueState(f"value_{t}", "v long", ms) for t, ms in _TTLS]
        self.lists = [handle.getListState(f"list_{t}", "v long", ms) for t, ms in _TTLS]
        self.maps = [handle.getMapState(f"map_{t}", "mk string", "v long", ms) for t, ms in _TTLS]

    def _show(self) -> str:
        parts = []
        for value in self.values:
            current = value.get()
            parts.append(f"{value.exists()}:{None if current is None else current[0]}")
        previous = self.values[1].get()  # long TTL: the value the last batch wrote
        for lst in self.lists:
            parts.append(f"{lst.exists()}:" + ",".join(str(v[0]) for v in lst.get()))
        for mp in self.maps:
            entries = sorted(f"{k[0]}={v[0]}" for k, v in mp.iterator())
            point = ""
            if previous is not None:
                key = (f"m{previous[0]}",)
                got = mp.getValue(key)
                point = f"{mp.containsKey(key)}/{None if got is None else got[0]}"
            parts.append(f"{mp.exists()}:" + ",".join(entries) + f":{point}")
        return " ".join(parts)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        vs: list[int] = []
        for item in rows:
            if isinstance(item, pd.DataFrame):
                vs.extend(int(v) for v in item["v"])
            else:
                vs.append(int(item["v"]))
        vs.sort()
        before = self._show()
        for value in self.values:
            value.update((vs[-1],))
        for lst in self.lists:
            for v in vs:
                lst.appendValue((v,))
        for mp in self.maps:
            mp.updateValue((f"m{vs[-1]}",), (vs[-1],))
        after = self._show()
        if self.pandas:
            yield pd.DataFrame({"k": [key[0]], "before": [before], "after": [after]})
        else:
            yield Row(k=key[0], before=before, after=after)

    def close(self) -> None:
        pass


_TTLS = (("short", SHORT_MS), ("long", LONG_MS))


def _state(
    short: int | None, long: int | None, lists: tuple[str, str], maps: tuple[str, str]
) -> str:
    """The expected ``_show`` of a key (maps: entries, then the point read of the long value)."""
    return " ".join(
        [f"{short is not None}:{short}", f"{long is not None}:{long}"]
        + [f"{bool(lst)}:{lst}" for lst in lists]
        + [f"{bool(m.split(':')[0])}:{m}" for m in maps]
    )


#: Short-TTL state never survives the gap to the next batch; long-TTL state always does.
EXPECTED = [
    [
        (
            "a",
            _state(None, None, ("", ""), (":", ":")),
            _state(2, 2, ("1,2", "1,2"), ("m2=2:True/2", "m2=2:True/2")),
        ),
        (
            "b",
            _state(None, None, ("", ""), (":", ":")),
            _state(3, 3, ("3", "3"), ("m3=3:True/3", "m3=3:True/3")),
        ),
    ],
    [
        (
            "a",
            _state(None, 2, ("", "1,2"), (":False/None", "m2=2:True/2")),
            _state(4, 4, ("4", "1,2,4"), ("m4=4:True/4", "m2=2,m4=4:True/4")),
        ),
        (
            "c",
            _state(None, None, ("", ""), (":", ":")),
            _state(5, 5, ("5", "5"), ("m5=5:True/5", "m5=5:True/5")),
        ),
    ],
    [
        (
            "a",
            _state(None, 4, ("", "1,2,4"), (":False/None", "m2=2,m4=4:True/4")),
            _state(6, 6, ("6", "1,2,4,6"), ("m6=6:True/6", "m2=2,m4=4,m6=6:True/6")),
        ),
        (
            "b",
            _state(None, 3, ("", "3"), (":False/None", "m3=3:True/3")),
            _state(7, 7, ("7", "3,7"), ("m7=7:True/7", "m3=3,m7=7:True/7")),
        ),
        (
            "c",
            _state(None, 5, ("", "5"), (":False/None", "m5=5:True/5")),
            _state(8, 8, ("8", "5,8"), ("m8=8:True/8", "m5=5,m8=8:True/8")),
        ),
    ],
]


def _start(planned: Any, checkpoint: Path, collector: Collector, **options: str) -> Any:
    writer = (
        planned.writeStream.outputMode("update")
        .foreachBatch(collector)
        .trigger(processingTime=TRIGGER)
        .option("checkpointLocation", str(checkpoint))
    )
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.start()


def _wait_for_rows(
    query: Any, collector: Collector, seen: set[int], count: int
) -> list[tuple[Any, ...]]:
    """The rows of the batches after ``seen``, once there are ``count`` of them.

    (Not ``processAllAvailable``: in ProcessingTime mode Spark runs a batch on every trigger,
    and the call may never see the query idle.)
    """
    deadline = time.time() + 180
    while True:
        assert query.exception() is None, query.exception()
        got = [r for b in sorted(set(collector.batches) - seen) for r in collector.batches[b]]
        if len(got) >= count or time.time() > deadline:
            return sorted(got)
        time.sleep(0.2)


def test_ttl_matches_spark_tws(spark: SparkSession, tmp_path: Path) -> None:
    runs: dict[str, tuple[FileFeed, Collector, Any]] = {}
    previous = spark.conf.get(PROVIDER_CONF, None)
    spark.conf.set(PROVIDER_CONF, RocksDB)  # Spark's transformWithState needs it
    try:
        feed, collector = FileFeed(tmp_path / "spark-input"), Collector()
        planned = (
            source(spark, feed, SCHEMA)
            .groupBy("k")
            .transformWithStateInPandas(TtlProcessor(True), OUTPUT, "Update", "ProcessingTime")
        )
        runs["spark"] = (feed, collector, _start(planned, tmp_path / "spark", collector))
    finally:
        if previous is None:
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, previous)
    for pandas, provider in ((True, PROVIDERS[0]), (False, PROVIDERS[-1])):
        feed, collector = FileFeed(tmp_path / f"ours-{pandas}-input"), Collector()
        grouped = ss.stream(source(spark, feed, SCHEMA)).groupBy("k")
        api = grouped.transformWithStateInPandas if pandas else grouped.transformWithState
        planned = api(TtlProcessor(pandas), OUTPUT, "update", "ProcessingTime")
        query = _start(planned, tmp_path / f"ours-{pandas}", collector, stateStore=provider)
        runs[f"ours-{pandas}-{provider}"] = (feed, collector, query)
    outputs: dict[str, list[list[tuple[Any, ...]]]] = {name: [] for name in runs}
    try:
        for i, rows in enumerate(FEEDS):
            if i:
                time.sleep(GAP_S)
            seen = {name: set(collector.batches) for name, (_, collector, _) in runs.items()}
            for feed, _, _ in runs.values():
                feed.add(rows)
            for name, (_, collector, query) in runs.items():
                keys = len({r["k"] for r in rows})
                outputs[name].append(_wait_for_rows(query, collector, seen[name], keys))
    finally:
        for _, _, query in runs.values():
            query.stop()
    theirs = outputs.pop("spark")
    assert theirs == EXPECTED
    spark_schema = runs["spark"][1].schema
    for name, ours in outputs.items():
        assert same_schema(runs[name][1].schema, spark_schema), name
        assert ours == theirs, name
