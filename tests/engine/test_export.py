"""A query run wrapped with ``ss.stream``, handed back to Spark's own operators with
``ss.export``: the query run without ``ss.stream`` goes on from the checkpoint with the output of
a run that never left Spark, batch for batch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.engine.run.batch_job import session_conf
from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.inspect import inspect_checkpoint

from .conftest import PROVIDERS, FileFeed
from .helpers import JOIN_BATCHES, LEFT, RIGHT, Collector, counted_in_a_processor
from .test_take_over import (
    BATCHES,
    SCHEMA,
    SPARK_STORES,
    arbitrary,
    by_key,
    dedup,
    dedup_within,
    global_count,
    limited,
    sessions,
    windowed,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: The batches of each run: ``FIRST`` run by Spark where the case starts on Spark's operators,
#: ``WRAPPED`` by the wrapped query, the rest by Spark's own after the export.
FIRST, WRAPPED = 2, 4


class Back:
    """One query, run on its checkpoint as a user moves it: (by Spark first, then) wrapped, then
    exported and run by Spark; and the same query run by Spark throughout on a checkpoint of its
    own, through the same stops and starts (the expected output)."""

    def __init__(self, spark: SparkSession, tmp_path: Path, query: Callable[[Any], Any]) -> None:
        self.spark = spark
        self.query = query
        self.mode = "append"
        self.feeds = {name: FileFeed(tmp_path / f"input-{name}") for name in ("spark", "ours")}
        self.chk = {name: tmp_path / name for name in ("spark", "ours")}
        self.out = {name: Collector() for name in ("spark", "ours")}

    def run(self, name: str, rows: list[list[dict[str, Any]]], *, wrapped: bool = False) -> None:
        """Add ``rows`` (a file each), run the query until it has read them, and stop it."""
        feed = self.feeds[name]
        for file in rows:
            feed.add(file)
        df = feed.stream(self.spark, SCHEMA)
        df = ss.stream(df) if wrapped else df
        writer = self.query(df).writeStream.outputMode(self.mode).foreachBatch(self.out[name])
        if wrapped:
            writer = writer.option("stateStore", PROVIDERS[0])
        query = writer.option("checkpointLocation", str(self.chk[name])).start()
        query.processAllAvailable()
        query.stop()

    def both(self, first: str | None) -> None:
        """The case's runs; ``first``: Spark's store the query starts on (None: the wrapped
        query starts the checkpoint)."""
        with session_conf(self.spark, SPARK_STORES[first or "hdfs"]):
            self.run("spark", BATCHES[:FIRST])
            self.run("ours", BATCHES[:FIRST], wrapped=first is None)
        self.run("spark", BATCHES[FIRST:WRAPPED])
        self.run("ours", BATCHES[FIRST:WRAPPED], wrapped=True)
        assert ss.export(self.spark, str(self.chk["ours"])) == max(self.out["ours"].batches)
        for name in ("spark", "ours"):
            self.run(name, BATCHES[WRAPPED:])
            self.run(name, [])


CASES = [
    pytest.param(windowed, "update", None, id="window-update"),
    pytest.param(windowed, "append", "rocksdb", id="window-append-from-rocksdb"),
    pytest.param(by_key, "update", "hdfs", id="keys-update-from-hdfs"),
    pytest.param(sessions, "append", None, id="sessions-append"),
    pytest.param(global_count, "complete", None, id="global-complete"),
    pytest.param(dedup, "append", None, id="dedup"),
    pytest.param(dedup_within, "append", "rocksdb-changelog-v2", id="dedup-within-from-v2"),
    pytest.param(limited, "append", None, id="limit"),
    pytest.param(arbitrary, "update", None, id="applyInPandasWithState"),
]


@pytest.mark.parametrize(("query", "mode", "first"), CASES)
def test_spark_goes_on_from_an_exported_checkpoint(
    spark: SparkSession, tmp_path: Path, query: Callable[[Any], Any], mode: str, first: str | None
) -> None:
    back = Back(spark, tmp_path, query)
    back.mode = mode
    back.both(first)
    assert back.out["ours"].batches == back.out["spark"].batches
    # Spark's state reader reads what was exported as Spark's own state
    assert (tmp_path / "ours" / "sparkstate-exported").is_dir()
    assert not (tmp_path / "ours" / "sparkstate").exists()  # nothing of it left, not even dirs
    with pytest.raises(ConfigurationError, match="handed back to Spark's own operators by"):
        inspect_checkpoint(str(tmp_path / "ours"))


def _state(spark: SparkSession, chk: Path, batch_id: int, fmt: str) -> list[Any]:
    rows = spark.read.format(fmt).option("batchId", batch_id).load(str(chk)).collect()
    return sorted((tuple(r["key"]), tuple(r["value"])) for r in rows)


def test_spark_reads_the_exported_state_as_its_own_and_the_wrapped_query_takes_it_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Right after ``sparkstate export``, Spark's state reader reads every row sparkstate's
    reader read; a wrapped start takes the checkpoint over again, and goes on as Spark does."""
    back = Back(spark, tmp_path, windowed)
    back.mode = "update"
    back.run("ours", BATCHES[:WRAPPED], wrapped=True)
    last = max(back.out["ours"].batches)
    ours = _state(spark, back.chk["ours"], last, "sparkstate")
    command = [str(Path(sys.executable).parent / "sparkstate"), "export", str(back.chk["ours"])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert f"to Spark's HDFSBackedStateStoreProvider after batch {last}" in done.stdout
    assert (done.stdout + done.stderr).count("exported the state of") == 1  # said once
    assert _state(spark, back.chk["ours"], last, "statestore") == ours
    assert ss.export(spark, str(back.chk["ours"])) is None  # exported already
    back.run("spark", BATCHES[:WRAPPED])
    for name in ("spark", "ours"):
        back.run(name, BATCHES[WRAPPED:], wrapped=name == "ours")
        back.run(name, [], wrapped=name == "ours")
    assert back.out["ours"].batches == back.out["spark"].batches


#: A driver that exports the checkpoint and is SIGKILLed in the middle: before its commit
#: point (Spark's snapshot files written, nothing committed) or after it (``exported.json``
#: written and Spark's commit rewritten, its offsets not).
KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pyspark.sql import SparkSession
    import sparkstate as ss
    from sparkstate.engine.jobs import export as export_job
    from sparkstate.runtime import export

    chk, point = sys.argv[1], sys.argv[2]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "commit":
        export_job.commit_export = die
    else:
        export.is_clock = die
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    ss.export(builder.getOrCreate(), chk)
    """
)


@pytest.mark.parametrize("dies_in", ["commit", "settle"])
def test_an_export_killed_midway_leaves_a_checkpoint_one_of_them_goes_on_from(
    spark: SparkSession, tmp_path: Path, dies_in: str
) -> None:
    """The driver SIGKILLed during the export: before its commit point, the wrapped query goes
    on from the checkpoint; after it, Spark's restart refuses the checkpoint until the export
    runs again and finishes. Either way the output is Spark's."""
    back = Back(spark, tmp_path, windowed)
    back.mode = "update"
    back.run("spark", BATCHES[:WRAPPED])
    back.run("ours", BATCHES[:WRAPPED], wrapped=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(back.chk["ours"]), dies_in],
        env=env,
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    engine = back.chk["ours"] / "sparkstate"
    assert (engine / "exported.json").exists() == (dies_in == "settle")
    if dies_in == "commit":  # the wrapped query goes on; the export runs again later
        back.run("ours", BATCHES[WRAPPED : WRAPPED + 1], wrapped=True)
        back.run("spark", BATCHES[WRAPPED : WRAPPED + 1])
    else:  # Spark's restart is refused until the export finishes
        with pytest.raises(Exception, match="(?i)assert|source"):
            back.run("ours", [])
    ss.export(spark, str(back.chk["ours"]))
    rest = BATCHES[WRAPPED + 1 :] if dies_in == "commit" else BATCHES[WRAPPED:]
    for name in ("spark", "ours"):
        back.run(name, rest)
        back.run(name, [])
    assert back.out["ours"].batches == back.out["spark"].batches


def test_an_operator_spark_keeps_otherwise_is_refused_and_the_checkpoint_left_as_it_was(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark keeps a ``transformWithState``'s state in RocksDB only: it is not exported."""
    back = Back(spark, tmp_path, counted_in_a_processor)
    back.mode = "update"
    back.run("ours", BATCHES[:FIRST], wrapped=True)
    before = sorted((p, p.stat().st_size) for p in back.chk["ours"].rglob("*") if p.is_file())
    with pytest.raises(ConfigurationError, match=r"operator\(s\) 0 \(transformWithState\)"):
        ss.export(spark, str(back.chk["ours"]))
    after = sorted((p, p.stat().st_size) for p in back.chk["ours"].rglob("*") if p.is_file())
    assert after == before


@pytest.mark.parametrize("how", ["inner", "leftOuter", "fullOuter"])
def test_spark_goes_on_from_an_exported_stream_stream_join(
    spark: SparkSession, tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both sides' rows, under their keys and indexes, with their matched flags: Spark's outer
    join emits the rows that never matched as it would have. Its progress: the join's four
    stores' partitions written."""
    feeds = {
        (name, side): FileFeed(tmp_path / f"{name}-{side}")
        for name in ("spark", "ours")
        for side in ("left", "right")
    }
    out = {name: Collector() for name in ("spark", "ours")}

    def run(name: str, batches: list[Any], *, wrapped: bool = False) -> None:
        for left_rows, right_rows in batches:
            feeds[name, "left"].add(left_rows)
            feeds[name, "right"].add(right_rows)
        frames = []
        for side, schema, ts in (("left", LEFT, "lt"), ("right", RIGHT, "rt")):
            df = feeds[name, side].stream(spark, schema)
            frames.append((ss.stream(df) if wrapped else df).withWatermark(ts, "10 seconds"))
        condition = F.expr(
            "lk = rk AND lt BETWEEN rt - interval 5 seconds AND rt + interval 5 seconds"
        )
        joined = frames[0].join(frames[1], condition, how)
        writer = joined.writeStream.outputMode("append").foreachBatch(out[name])
        if wrapped:
            writer = writer.option("stateStore", PROVIDERS[-1])
        query = writer.option("checkpointLocation", str(tmp_path / name)).start()
        query.processAllAvailable()
        query.stop()

    for i in range(2):
        run("spark", JOIN_BATCHES[i : i + 1])
        run("ours", JOIN_BATCHES[i : i + 1], wrapped=True)
    capsys.readouterr()
    assert ss.export(spark, str(tmp_path / "ours"), progress=True) == max(out["ours"].batches)
    err = capsys.readouterr().err
    bar = re.search(r"operator 0 \(join\) write .* (\d+)/(\d+) ", err)
    assert bar and bar[1] == bar[2] and int(bar[1]) % 4 == 0, err
    for name in ("spark", "ours"):
        run(name, JOIN_BATCHES[2:])
        run(name, [])
    assert out["ours"].batches == out["spark"].batches
    stores = {p.name for p in (tmp_path / "ours" / "state" / "0" / "0").iterdir()}
    assert {"left-keyToNumValues", "right-keyWithIndexToValue"} <= stores
