"""``sparkstate inspect``: the checkpoints of real queries (an aggregation, a ``StatefulProcessor``
with value, list and map state, a deduplication with a watermark on the memory provider, a
stream-stream join), each shown as text and JSON and checked against the files on disk, the
queries' progress, the state reader and Spark's own hash; keys looked up; the errors; the same
checkpoint on S3."""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sparkstate import cli
from sparkstate.observe.reader import ReadRequest, StateReader

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

SCHEMA = "user string, n long, ts timestamp"
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
#: Three files, a batch each: alice twice a batch, bob in the first two, one newcomer a batch.
FILES = [
    [("alice", 1, 0), ("alice", 2, 1), ("bob", 10, 2), ("carol", 5, 3)],
    [("alice", 3, 20), ("alice", 4, 21), ("bob", 20, 22), ("dave", 6, 23)],
    [("alice", 5, 40), ("alice", 6, 41), ("erin", 7, 42)],
]
#: What the aggregation holds for alice after each batch: (count, sum of n).
ALICE = [(2, 3), (4, 10), (6, 21)]


def _rows(batch: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    return [
        {"user": u, "n": n, "ts": (T0 + datetime.timedelta(seconds=s)).isoformat()}
        for u, n, s in batch
    ]


class Counter:
    """A ``StatefulProcessor`` with every kind of state: rows seen, their values, and the values
    by their text."""

    def init(self, handle: Any) -> None:
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        self.count = handle.getValueState("count", StructType([StructField("rows", LongType())]))
        self.seen = handle.getListState("seen", StructType([StructField("n", LongType())]))
        self.named = handle.getMapState(
            "named",
            StructType([StructField("n", LongType())]),
            StructType([StructField("text", StringType())]),
        )

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802, N803
        total = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            total += len(pdf)
            values = [int(v) for v in pdf["n"]]
            self.seen.appendList([(v,) for v in values])
            for v in values:
                self.named.updateValue((v,), (f"n{v}",))
        self.count.update((total,))
        yield pd.DataFrame({"user": [key[0]], "rows": [total]})

    def close(self) -> None:
        pass


def _processor() -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return type("CounterProcessor", (Counter, StatefulProcessor), {})()


# --- the queries ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _processor_by_value() -> None:
    """The processor class goes to the Python workers by value (they cannot import this
    module by its pytest name)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _queries() -> dict[str, tuple[Any, str, str]]:
    """name -> (the query over the input, output mode, provider)."""
    from pyspark.sql import functions as F

    from sparkstate import functions as SF

    def join(df: Any) -> Any:
        left = df.withWatermark("ts", "10 seconds")
        right = df.select(F.col("user").alias("who"), F.col("ts").alias("at"))
        right = right.withWatermark("at", "10 seconds")
        cond = F.expr("user = who AND at >= ts AND at <= ts + interval 5 seconds")
        return left.join(right, cond, "inner")

    return {
        "aggregate": (
            lambda df: df.groupBy("user").agg(SF.count("*").alias("rows"), SF.sum("n")),
            "update",
            "rocksdb",
        ),
        "processor": (
            lambda df: df.groupBy("user").transformWithStateInPandas(
                _processor(), "user string, rows long", "update", "None"
            ),
            "update",
            "rocksdb",
        ),
        "dedup": (
            lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"]),
            "append",
            "memory",
        ),
        "join": (join, "append", "rocksdb"),
    }


@pytest.fixture(scope="module")
def checkpoints(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each query run over the three files (a batch each), and Spark's own aggregation."""
    import sparkstate as ss
    from sparkstate.testing import FileFeed

    base = tmp_path_factory.mktemp("inspect")
    feed = FileFeed(base / "input")
    for rows in FILES:
        feed.add(_rows(rows))
    out = {}
    for name, (build, mode, provider) in _queries().items():
        df = ss.stream(feed.stream(spark, SCHEMA))
        out[name] = str(base / name)
        query = (
            build(df)
            .writeStream.outputMode(mode)
            .format("noop")
            .option("checkpointLocation", out[name])
            .option("stateStore", provider)
            .option("stateStore.min_deltas_for_snapshot", "1")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    out["spark"] = str(base / "spark")
    query = (
        feed.stream(spark, SCHEMA)
        .groupBy("user")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", out["spark"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return out


def inspect(capsys: Any, *args: str) -> tuple[int, str, str]:
    code = cli.main(["inspect", *args])
    said = capsys.readouterr()
    return code, said.out, said.err


def document(capsys: Any, *args: str) -> dict[str, Any]:
    code, out, err = inspect(capsys, *args, "--json")
    assert code == 0, err
    found: dict[str, Any] = json.loads(out)
    return found


def progress(chk: str) -> list[dict[str, Any]]:
    path = Path(chk, "sparkstate", "progress.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def on_disk(chk: str, op: int, partition: int) -> dict[str, Any]:
    """A partition store's files, counted here from the directory itself."""
    store = Path(chk, "sparkstate", "state", str(op), str(partition))
    names = os.listdir(store) if store.exists() else []
    deltas = [n for n in names if n.endswith((".changelog", ".delta"))]
    snapshots = [n for n in names if n.endswith(".snapshot")]
    sst = list((store / "sst").iterdir()) if (store / "sst").exists() else []
    versions = {int(n.split("_")[0]) for n in deltas + snapshots}
    return {
        "versions": {
            "oldest": min(versions, default=None),
            "newest": max(versions, default=None),
            "count": len(versions),
        },
        "changelogs": {
            "files": len(deltas),
            "bytes": sum((store / n).stat().st_size for n in deltas),
        },
        "snapshots": {
            "files": len(snapshots),
            "bytes": sum((store / n).stat().st_size for n in snapshots),
        },
        "sst": {"files": len(sst), "bytes": sum(p.stat().st_size for p in sst)},
    }


KINDS = ["aggregate", "processor", "dedup", "join"]


# --- the summary ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KINDS)
def test_the_files_of_every_partition_are_counted_as_on_disk(
    name: str, checkpoints: dict[str, str], capsys: Any
) -> None:
    chk = checkpoints[name]
    doc = document(capsys, chk)
    (op,) = doc["operators"]
    assert [p["partition"] for p in op["partitions"]] == [0, 1]
    for part in op["partitions"]:
        expected = on_disk(chk, op["id"], part["partition"])
        assert {k: part[k] for k in expected} == expected
    assert op["partitions"][0]["versions"]["newest"] == doc["batches"]["state_version"]
    for kind in ("changelogs", "snapshots", "sst"):
        assert op["files"][kind]["files"] == sum(p[kind]["files"] for p in op["partitions"])
    # the text's table says the same
    code, text, _ = inspect(capsys, chk)
    assert code == 0
    table = _partition_table(text)
    for part in op["partitions"]:
        row = table[str(part["partition"])]
        v = part["versions"]
        assert row[0] == f"{v['oldest']}..{v['newest']}"
        assert row[1].split()[0] == str(part["changelogs"]["files"])  # and their size
        assert row[2].split()[0] == str(part["snapshots"]["files"])
        assert row[-1] == str(part["rows"])
    assert table["all"][-1] == str(op["rows"]["partitions_sum"])


def _partition_table(text: str) -> dict[str, list[str]]:
    """The operator's partition table: partition -> its other cells (files and their size
    are one cell); the rules above and below its rows skipped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["partition", "versions"])
    out = {}
    for line in lines[start + 1 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0].startswith("─"):
            continue
        if not cells[0].isdigit() and cells[0] != "all":
            break
        out[cells[0]] = cells[1:]
    return out


@pytest.mark.parametrize("name", KINDS)
def test_the_state_rows_are_what_the_query_reported(
    name: str, checkpoints: dict[str, str], capsys: Any
) -> None:
    chk = checkpoints[name]
    last = progress(chk)[-1]
    doc = document(capsys, chk)
    (op,) = doc["operators"]
    reported = last["stateOperators"][0]["numRowsTotal"]
    assert op["rows"]["total"] == reported
    assert op["rows"]["partitions_sum"] == reported
    assert op["rows"]["batch"] == doc["batches"]["last"] == last["batchId"]
    # (a processor's rows are not its store's keys: its timers' are none, a map's entries are)
    expected = "changelog" if name == "aggregate" else "loaded"
    assert op["rows"]["source"] == expected
    code, text, _ = inspect(capsys, chk)
    assert f"rows        {reported:,} after batch {last['batchId']}" in text


def test_the_rows_of_each_partition_are_the_keys_the_reader_reads(
    checkpoints: dict[str, str], capsys: Any
) -> None:
    chk = checkpoints["aggregate"]
    reader = StateReader(ReadRequest(chk))
    per_partition = [sum(b.num_rows for b in reader.read(p)) for p in range(2)]
    (op,) = document(capsys, chk)["operators"]
    assert [p["rows"] for p in op["partitions"]] == per_partition
    assert sum(per_partition) == 5  # alice, bob, carol, dave, erin


def test_an_earlier_batch_shows_that_batch_s_rows(checkpoints: dict[str, str], capsys: Any) -> None:
    chk = checkpoints["aggregate"]
    first = progress(chk)[0]
    doc = document(capsys, chk, "--batch", "0")
    assert doc["batches"]["shown"] == 0
    assert doc["batches"]["state_version"] == 1
    (op,) = doc["operators"]
    assert op["rows"]["total"] == first["stateOperators"][0]["numRowsTotal"] == 3


def test_the_text_names_the_query_operators_and_schemas(
    checkpoints: dict[str, str], capsys: Any
) -> None:
    for name in KINDS:
        chk = checkpoints[name]
        code, text, _ = inspect(capsys, chk)
        assert code == 0
        metadata = json.loads(Path(chk, "sparkstate", "metadata.json").read_text())
        assert f"query       {metadata['query_id']}" in text
        provider = _queries()[name][2]
        assert f"{provider}, 2 state partitions, output mode {metadata['output_mode']}" in text
        last = progress(chk)[-1]["batchId"]
        assert f"batches     0 to {last} committed ({last + 1} batches)" in text
        name_in_progress = progress(chk)[-1]["stateOperators"][0]["operatorName"]
        assert f"operator 0: {name_in_progress} (" in text
    _, text, _ = inspect(capsys, checkpoints["aggregate"])
    assert "  key         user string\n  value       count bigint, sum bigint\n" in text
    # the value as the state reader shows it
    value = StateReader(ReadRequest(checkpoints["aggregate"])).view.schema.field("value").type
    assert [f.name for f in value] == ["count", "sum"]
    _, text, _ = inspect(capsys, checkpoints["processor"])
    assert "operator 0: transformWithStateInPandasExec (transformWithState, time mode None)" in text
    assert re.search(r"state +count +ValueState +rows bigint\n", text)
    assert re.search(r"\n +named +MapState +n bigint -> text string\n", text)
    assert re.search(r"\n +seen +ListState +n bigint\n", text)
    _, text, _ = inspect(capsys, checkpoints["dedup"])
    assert "  key         user string, ts timestamp\n" in text
    _, text, _ = inspect(capsys, checkpoints["join"])
    for label, side in (("stores", "left"), ("", "right")):  # the rows as the reader shows them
        reader = StateReader(ReadRequest(checkpoints["join"], join_side=side))
        fields = reader.view.schema.field("value").type
        assert len(fields) > 1
        row = re.search(rf"\n  {label:<12}{side} +(.*)\n", text)
        assert row, text
        assert [c.split()[0] for c in row.group(1).split(", ")] == [f.name for f in fields]


def test_the_json_carries_the_query_stores_and_the_text_s_numbers(
    checkpoints: dict[str, str], capsys: Any
) -> None:
    chk = checkpoints["processor"]
    doc = document(capsys, chk)
    assert list(doc) == [
        "checkpoint", "query", "batches", "watermark", "history", "operators", "progress",
    ]  # fmt: skip
    assert doc["history"] == []  # a checkpoint sparkstate wrote from its first batch
    assert doc["query"]["provider"] == "rocksdb"
    assert doc["query"]["partitions"] == 2
    assert doc["query"]["output_mode"] == "update"
    assert doc["batches"] == {
        "first": 0,
        "last": 2,
        "committed": 3,
        "shown": 2,
        "state_version": 3,
        "committed_at": doc["batches"]["committed_at"],
    }
    (op,) = doc["operators"]
    stores = {s["name"]: s for s in op["stores"]}
    assert stores["count"]["state_type"] == "ValueState"
    assert stores["count"]["value"] == [{"name": "rows", "type": "bigint"}]
    assert stores["seen"]["state_type"] == "ListState"
    assert stores["named"]["map_key"] == [{"name": "n", "type": "bigint"}]
    assert stores["named"]["value"] == [{"name": "text", "type": "string"}]
    assert op["key"] == [{"name": "user", "type": "string"}]
    assert "$elements_seen" in op["column_families"]
    logged = progress(chk)
    assert [b["batch_id"] for b in doc["progress"]["batches"]] == [p["batchId"] for p in logged]
    for mine, theirs in zip(doc["progress"]["batches"], logged, strict=True):
        assert mine["input_rows"] == theirs["numInputRows"]
        assert mine["duration_ms"] == theirs["durationMs"]["triggerExecution"]
        assert mine["state_rows"] == [theirs["stateOperators"][0]["numRowsTotal"]]
    _, text, _ = inspect(capsys, chk)
    lines = text.split("\nlast 3 batches (")[1].splitlines()
    for b in doc["progress"]["batches"]:
        line = next(x for x in lines if x.split()[:1] == [str(b["batch_id"])])
        assert line.split()[-1] == f"{b['state_rows'][0]:,}"
        assert f" {b['input_rows']} " in line


def test_the_watermark_is_the_one_after_the_last_batch(
    checkpoints: dict[str, str], capsys: Any
) -> None:
    chk = checkpoints["dedup"]
    doc = document(capsys, chk)
    # the last event at 00:00:42, a delay of 10 seconds
    assert doc["watermark"]["time"] == "2024-01-01T00:00:32.000Z"
    assert doc["watermark"]["max_event_time_ms"] == {"input": doc["watermark"]["ms"] + 10_000}
    _, text, _ = inspect(capsys, chk)
    assert "watermark   2024-01-01 00:00:32 (max event time: input 2024-01-01 00:00:42)" in text
    assert document(capsys, checkpoints["aggregate"])["watermark"]["ms"] is None


def test_the_command_starts_no_spark(checkpoints: dict[str, str]) -> None:
    """A shell on a machine without Spark can run it: pyspark is never imported."""
    script = (
        "import sys\n"
        "from sparkstate import cli\n"
        f"assert cli.main(['inspect', {checkpoints['join']!r}]) == 0\n"
        f"assert cli.main(['inspect', {checkpoints['join']!r}, '--key', 'alice']) == 0\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')]\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "operator 0: symmetricHashJoin (join)" in done.stdout


# --- keys ----------------------------------------------------------------------------------------


def test_a_key_s_value_is_its_aggregation_so_far(
    spark: Any, checkpoints: dict[str, str], capsys: Any
) -> None:
    chk = checkpoints["aggregate"]
    code, text, err = inspect(capsys, chk, "--key", "user=alice")
    assert code == 0, err
    count, total = ALICE[-1]
    assert f"  value       count={count}, sum={total}\n" in text
    # its partition: Spark's hash of the key, and where the state reader finds it
    (expected,) = spark.sql("select pmod(hash('alice'), 2) as p").collect()
    reader = StateReader(ReadRequest(chk))
    found = [
        p
        for p in range(2)
        for b in reader.read(p)
        for k in b["key"].to_pylist()
        if k["user"] == "alice"
    ]
    assert found == [expected["p"]]
    assert f"  partition   {found[0]} (Spark's hash partition" in text
    doc = document(capsys, chk, "--key", "alice")  # a one-column key by position
    assert doc["found"] is True
    assert doc["partition"] == found[0]
    assert doc["partition_from"] == "hash"
    assert doc["stores"] == {"default": [{"value": {"count": count, "sum": total}}]}
    for batch, (count, total) in enumerate(ALICE):
        doc = document(capsys, chk, "--key", "alice", "--batch", str(batch))
        assert doc["stores"]["default"][0]["value"] == {"count": count, "sum": total}


def test_every_state_variable_of_a_key(checkpoints: dict[str, str], capsys: Any) -> None:
    chk = checkpoints["processor"]
    doc = document(capsys, chk, "--key", "user=bob")
    assert doc["stores"]["count"] == [{"value": {"rows": 2}}]
    assert doc["stores"]["seen"] == [{"list_value": [{"n": 10}, {"n": 20}]}]
    entries = doc["stores"]["named"][0]["map_value"]
    assert sorted(e["key"]["n"] for e in entries) == [10, 20]
    code, text, _ = inspect(capsys, chk, "--key", "bob")
    assert "  count       rows=2\n" in text
    assert "  seen        [{n=10}, {n=20}]\n" in text
    assert "{n=10} -> {text=n10}" in text
    doc = document(capsys, chk, "--key", "bob", "--store", "seen")
    assert list(doc["stores"]) == ["seen"]


def test_a_key_of_several_columns_and_a_join_side(checkpoints: dict[str, str], capsys: Any) -> None:
    doc = document(
        capsys, checkpoints["dedup"], "--key", "user=erin", "--key", "ts=2024-01-01T00:00:42"
    )
    assert doc["found"] and doc["key"] == {"user": "erin", "ts": "2024-01-01T00:00:42+00:00"}
    positional = document(
        capsys, checkpoints["dedup"], "--key", "erin", "--key", "2024-01-01T00:00:42Z"
    )
    assert positional["stores"] == doc["stores"]
    chk = checkpoints["join"]
    doc = document(capsys, chk, "--key", "alice", "--join-side", "right")
    assert list(doc["stores"]) == ["right"]
    reader = StateReader(ReadRequest(chk, join_side="right"))
    assert reader.schema.field("value").type.names == ["who", "at"]  # the query's names
    rows = [r for p in range(2) for b in reader.read(p) for r in b.to_pylist()]
    buffered = [r["value"] for r in rows if r["key"]["user"] == "alice"]
    assert buffered
    assert _sorted(doc["stores"]["right"]) == _sorted({"value": v} for v in buffered)


def _sorted(rows: Any) -> list[str]:
    """Rows as the JSON document has them, in one order."""
    return sorted(json.dumps(r, sort_keys=True, default=lambda v: v.isoformat()) for r in rows)


def test_a_missing_key_says_which_partition_was_searched(
    spark: Any, checkpoints: dict[str, str], capsys: Any
) -> None:
    code, out, err = inspect(capsys, checkpoints["aggregate"], "--key", "user=zoe")
    (row,) = spark.sql("select pmod(hash('zoe'), 2) as p").collect()
    assert code == 1
    assert out == ""
    assert err == (
        "sparkstate inspect: key user=zoe is not in the state of operator 0 (stateStoreSave) "
        f"after batch 2: searched partition {row['p']} (Spark's hash partition of the key)\n"
    )
    code, out, err = inspect(capsys, checkpoints["aggregate"], "--key", "zoe", "--json")
    assert code == 1
    assert json.loads(out)["found"] is False
    assert "is not in the state" in err


def test_where_no_hash_is_known_every_partition_is_searched(
    checkpoints: dict[str, str], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkstate.observe import key_lookup

    hashed = document(capsys, checkpoints["aggregate"], "--key", "alice")
    monkeypatch.setattr(key_lookup, "spark_partition", lambda values, n: None)
    doc = document(capsys, checkpoints["aggregate"], "--key", "alice")
    assert doc["partition_from"] == "scan"
    assert doc["partition"] == hashed["partition"]
    assert doc["searched"] == list(range(hashed["partition"] + 1))
    assert doc["stores"] == hashed["stores"]
    code, _, err = inspect(capsys, checkpoints["aggregate"], "--key", "zoe")
    assert code == 1
    assert "searched partitions 0, 1 (all: a key column's type has no hash here)" in err


#: Values of every type :mod:`sparkstate.observe.spark_hash` hashes, as Spark SQL and as Arrow.
HASHED = [
    ("'alice'", "alice", "string"),
    ("''", "", "string"),
    ("'ab'", "ab", "string"),
    ("'abc'", "abc", "string"),
    ("'héllo wörld, 日本'", "héllo wörld, 日本", "string"),
    ("cast(null as string)", None, "string"),
    ("cast(-5 as bigint)", -5, "int64"),
    ("cast(9000000000 as bigint)", 9_000_000_000, "int64"),
    ("cast(-7 as int)", -7, "int32"),
    ("cast(3 as smallint)", 3, "int16"),
    ("cast(-2 as tinyint)", -2, "int8"),
    ("true", True, "bool"),
    ("cast(1.5 as double)", 1.5, "float64"),
    ("cast(-0.0 as double)", -0.0, "float64"),
    ("cast(2.25 as float)", 2.25, "float32"),
    ("date'2024-01-02'", datetime.date(2024, 1, 2), "date32"),
    ("timestamp'2024-01-01 00:00:10'", T0 + datetime.timedelta(seconds=10), "timestamp"),
    ("cast(-1.50 as decimal(10,2))", "-1.50", "decimal(10,2)"),
    ("cast(-123456789012345678901.5 as decimal(30,1))", "-123456789012345678901.5",
     "decimal(30,1)"),
    ("x'00ff10'", b"\x00\xff\x10", "binary"),
]  # fmt: skip


def test_the_partition_of_a_key_is_spark_s_hash_of_it(spark: Any) -> None:
    import decimal

    import pyarrow as pa

    from sparkstate.observe.spark_hash import spark_hash, spark_partition

    def scalar(value: Any, typ: str) -> pa.Scalar:
        if typ == "timestamp":
            return pa.scalar(value, pa.timestamp("us", tz="UTC"))
        if typ.startswith("decimal"):
            p, s = map(int, typ[8:-1].split(","))
            return pa.scalar(decimal.Decimal(value), pa.decimal128(p, s))
        return pa.scalar(value, getattr(pa, {"bool": "bool_", "date32": "date32"}.get(typ, typ))())

    values = [scalar(v, t) for _, v, t in HASHED]
    sql = ", ".join(f"hash({e})" for e, _, _ in HASHED)
    together = ", ".join(e for e, _, _ in HASHED)
    row = spark.sql(f"select {sql}, hash({together}), pmod(hash({together}), 7)").collect()[0]
    assert [spark_hash([v]) for v in values] == list(row)[: len(HASHED)]
    assert spark_hash(values) == row[-2]
    assert spark_partition(values, 7) == row[-1]
    assert spark_partition([pa.scalar([1], pa.list_(pa.int64()))], 7) is None


def test_the_partitions_of_many_keys_are_those_of_each_key() -> None:
    """:func:`spark_partitions` (whole columns in numpy) agrees with :func:`spark_partition`
    (checked against Spark above) on every hashed type, nulls and extremes included."""
    import random

    import pyarrow as pa

    from sparkstate.observe.spark_hash import spark_partition, spark_partitions

    rng = random.Random(3)
    ints = [rng.randrange(-(2**31), 2**31) for _ in range(300)] + [0, -1, 2**31 - 1, None]
    longs = [rng.randrange(-(2**63), 2**63) for _ in range(300)] + [0, -1, 2**63 - 1, None]
    n = len(ints)
    columns = [
        pa.array(ints, pa.int32()),
        pa.array(longs, pa.int64()),
        pa.array([None if i % 7 == 0 else f"k{i}" * (i % 5) for i in range(n)], pa.string()),
        pa.array([i % 3 == 0 for i in range(n)], pa.bool_()),
        pa.array([i % 100 for i in range(n)], pa.int8()),
        pa.array([1_700_000_000_000_000 + i * 997 for i in range(n)], pa.timestamp("us", "UTC")),
        pa.array([i * 0.5 - 3 for i in range(n)], pa.float64()),
    ]
    for chosen in ([0], [1], [2], [1, 2, 3], list(range(len(columns)))):
        cols = [columns[c] for c in chosen]
        many = spark_partitions(cols, 7)
        assert many is not None
        each = [spark_partition([c[r] for c in cols], 7) for r in range(n)]
        assert many.tolist() == each, chosen
    assert spark_partitions([pa.array([[1]], pa.list_(pa.int64()))], 7) is None


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("aggregate", ["--operator", "3"], r"has no stateful operator 3; its operators: \[\(0, "),
        ("aggregate", ["--batch", "7"], "batch 7 of the checkpoint .* is not committed "
         r"\(committed batches: 0 to 2\)"),
        ("aggregate", ["--key", "alice", "--batch", "7"], "batch 7 .* is not committed"),
        ("aggregate", ["--key", "a", "--key", "b"],
         r"the key has 1 column \(user string\); got 2 values"),
        ("dedup", ["--key", "user=erin"], r"the key has columns user string, ts timestamp: "
         "give a value for ts"),
        ("dedup", ["--key", "erin", "--key", "yesterday"],
         "key column ts is a timestamp: 'yesterday' is not one"),
        ("aggregate", ["--key", "alice", "--store", "nope"], "has no store 'nope'"),
        ("aggregate", ["--store", "count"], "give a --key"),
        ("dedup", ["--key", "user=erin", "--key", "2024-01-01T00:00:42"],
         r"give every key column by name \(NAME=VALUE\), or every value in key order"),
        ("spark", [], r"ran without sparkstate; read its state with Spark's own reader: "
         r"spark.read.format\('statestore'\)"),
    ],
)  # fmt: skip
def test_errors_say_what_is_wrong(
    name: str, args: list[str], message: str, checkpoints: dict[str, str], capsys: Any
) -> None:
    code, out, err = inspect(capsys, checkpoints[name], *args)
    assert (code, out) == (1, "")
    assert err.startswith("sparkstate inspect: ")
    assert re.search(message, err), err
    assert err.count("\n") == 1


def test_a_directory_that_is_no_checkpoint(tmp_path: Path, capsys: Any) -> None:
    code, _, err = inspect(capsys, str(tmp_path))
    assert code == 1
    said = f"{tmp_path} is not a sparkstate checkpoint: it has no sparkstate/metadata.json"
    assert err == f"sparkstate inspect: {said}\n"
    code, _, err = inspect(capsys, str(tmp_path / "nowhere"))
    assert code == 1
    assert err == f"sparkstate inspect: {tmp_path / 'nowhere'} does not exist\n"


def test_one_operator_of_several_with_its_own_rows(spark: Any, tmp_path: Path, capsys: Any) -> None:
    """``--operator`` of a query of two operators (a deduplication, then a count per user)
    shows that operator, and the state rows of each last batch of it alone."""
    import sparkstate as ss
    from sparkstate.testing import FileFeed

    feed = FileFeed(tmp_path / "input")
    for rows in FILES:
        feed.add(_rows(rows))
    chk = str(tmp_path / "two")
    deduplicated = ss.stream(feed.stream(spark, SCHEMA)).dropDuplicates(["user", "ts"])
    (
        deduplicated.groupBy("user")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", chk)
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    logged = progress(chk)
    for op in (0, 1):
        code, out, err = inspect(capsys, chk, "--operator", str(op))
        assert code == 0, err
        doc = document(capsys, chk, "--operator", str(op))
        assert [o["id"] for o in doc["operators"]] == [op]
        shown = [b["state_rows"] for b in doc["progress"]["batches"]]
        reported = [[p["stateOperators"][op]["numRowsTotal"]] for p in logged[-len(shown) :]]
        assert shown == reported
        assert str(reported[-1][0]) in out.splitlines()[-1]  # the last batch's row of the table


# --- S3 ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A checkpoint location on a loopback S3 endpoint (``moto_server``), as a user writes it:
    ``s3://bucket/path``, the endpoint in the environment."""
    server = Path(sys.executable).with_name("moto_server")
    if not server.exists():
        pytest.skip(f"moto_server not installed next to {sys.executable}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=f, stderr=f
        )
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }.items():
            mp.setenv(k, v)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=1).close()
                    break
                except urllib.error.HTTPError:
                    break
                except OSError:
                    assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                    time.sleep(0.1)
            yield "s3://inspect/chk"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.mark.s3
def test_a_checkpoint_on_s3(s3_uri: str, checkpoints: dict[str, str], capsys: Any) -> None:
    from pyarrow import fs

    local = checkpoints["aggregate"]
    s3, path = fs.FileSystem.from_uri(s3_uri + "?allow_bucket_creation=true")
    s3.create_dir(path.split("/")[0])
    fs.copy_files(f"{local}/sparkstate", f"{path}/sparkstate", fs.LocalFileSystem(), s3)
    here, there = document(capsys, local), document(capsys, s3_uri)
    assert there["operators"] == here["operators"]
    assert there["progress"]["batches"] == here["progress"]["batches"]
    assert there["query"]["id"] == here["query"]["id"]
    doc = document(capsys, s3_uri, "--key", "alice")
    assert doc["stores"]["default"][0]["value"] == {"count": 6, "sum": 21}
