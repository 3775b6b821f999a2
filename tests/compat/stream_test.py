"""Spark's Scala ``testStream`` scenarios, as a port runs them from Python.

Spark's Scala suites of stateful streaming (``StreamTest``) drive a query with a list of actions:
``AddData`` into a ``MemoryStream``, ``CheckAnswer`` / ``CheckLastBatch`` / ``CheckNewAnswer``
against a memory sink, ``StopStream`` / ``StartStream``, ``AssertOnQuery``, ``ExpectFailure``.
This module gives the same actions over what a PySpark user has: a ``MemoryStream`` is a
directory of JSON files read by Spark's file source (the rows of the ``AddData`` actions up to a
check become one file, so one micro-batch, as Spark's test runs them; the files of several inputs
are moved in while no query plans a batch, so they too make one), the sink is
``foreachBatch`` collecting each batch's rows on the driver (Spark's memory sink keeps the same:
every batch's rows, the last one's, those since the last check), and every check first runs
``processAllAvailable()``, which runs the no-data batches a moved watermark calls for, as the
Scala check does.

A ported scenario reads as its Scala original::

    inputData = st.memory_stream("value int")
    windowedAggregation = inputData.toDF().withColumn(...)...
    st.test_stream(windowedAggregation, "append",
        AddData(inputData, 10, 11, 12, 13, 14, 15),
        CheckNewAnswer(),
        AddData(inputData, 25),
        CheckNewAnswer((10, 5)),
        assertNumStateRows(total=1, updated=1),
    )

``inputData.toDF()`` is the query's input wrapped in ``ss.stream`` (Spark's own as it is, under
``SPARKSTATE_COMPAT_ORACLE=spark``): the one change a port makes to the query.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession

from .porting import ORACLE, wrap


class MemoryStream:
    """Spark's ``MemoryStream[T]``: rows added by the scenario, read by a file source.

    ``schema`` is the DDL of the stream's columns as Spark's encoder names them: ``"value int"``
    for ``MemoryStream[Int]``, ``"_1 string, _2 timestamp"`` for a tuple. A row added is one value
    (one column) or a tuple; a ``datetime`` is written as Spark reads a timestamp.
    ``partitions`` is Spark's ``MemoryStream[T](numPartitions)``: a batch's rows dealt round robin
    into that many files, each read as a partition of its own (it may change between two
    ``test_stream`` of a scenario, as Spark's test makes a new ``MemoryStream``)."""

    def __init__(self, spark: SparkSession, path: Path, schema: str, partitions: int = 1) -> None:
        self.spark = spark
        self.partitions = partitions
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.names = [part.split()[0] for part in _top_level(schema)]
        self.pending: list[Any] = []
        #: An ``AddData`` since the last check, even one of no rows (Spark's ``MemoryStream`` then
        #: still offers a new offset: a batch of no rows).
        self.batch_pending = False
        self._files = 0
        self._mtime = float(int(time.time())) - 10_000.0
        #: Files written and not yet in the directory: (temporary path, final path).
        self._staged: list[tuple[Path, Path]] = []

    def toDF(self) -> Any:  # noqa: N802 - Spark's name
        """The stream as the ported query takes it: wrapped."""
        return wrap(self.raw())

    def raw(self) -> DataFrame:
        """The stream unwrapped (for a side Spark's test builds on without a stateful step)."""
        return self.spark.readStream.schema(self.schema).json(str(self.path))

    def flush(self, *, publish: bool = True) -> None:
        """Write the rows added since the last check as one file (one micro-batch); an
        ``AddData`` of no rows writes an empty file, which the file source reads as a batch of no
        rows and no partitions, as Spark's ``MemoryStream`` gives it. ``publish=False``: the
        files wait for :meth:`publish` (the files of several inputs then appear together)."""
        self._stage()
        if publish:
            self.publish()

    def publish(self) -> None:
        """Move the files :meth:`flush` wrote into the directory the query reads."""
        for tmp, final in self._staged:
            tmp.rename(final)
        self._staged = []

    def _stage(self) -> None:
        if not self.pending and not self.batch_pending:
            return
        lines = [json.dumps(self._record(row), default=_json_value) for row in self.pending]
        self.pending = []
        self.batch_pending = False
        if not lines:
            self._write("")
            return
        for part in range(self.partitions):  # a partition without rows: a blank line
            self._write("".join(line + "\n" for line in lines[part :: self.partitions]) or "\n")

    def clear(self) -> None:
        """Forget every row: the files written and those waiting (a scenario run again)."""
        self.pending = []
        self.batch_pending = False
        self._staged = []
        for written in self.path.glob("*"):
            written.unlink()

    def _write(self, text: str) -> None:
        self._files += 1
        name = f"part-{self._files:05d}.json"
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(text)
        self._mtime += 1.0
        os.utime(tmp, (self._mtime, self._mtime))
        self._staged.append((tmp, self.path / name))

    @property
    def files_written(self) -> int:
        return self._files

    def _record(self, row: Any) -> dict[str, Any]:
        values = row if isinstance(row, tuple) else (row,)
        if len(values) != len(self.names):
            msg = f"a row of {self.names} needs {len(self.names)} values, got {row!r}"
            raise ValueError(msg)
        return dict(zip(self.names, values, strict=True))


def _top_level(ddl: str) -> list[str]:
    """The top-level ``name type`` parts of a DDL schema (commas inside ``<...>`` kept)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(ddl):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(ddl[start:i].strip())
            start = i + 1
    parts.append(ddl[start:].strip())
    return [p for p in parts if p]


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    msg = f"no JSON form for {value!r}"
    raise TypeError(msg)


# --- the run ------------------------------------------------------------------------------


@dataclass
class StreamRun:
    """One scenario's query across its starts and stops, and what its sink received."""

    spark: SparkSession
    df: Any
    output_mode: str
    checkpoint: str
    provider: str
    inputs: list[MemoryStream]
    query: Any = None
    batches: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    last_checked_batch: int = -1
    progress_seen: int = 0
    last_batch_seen: int = -1
    files_seen: int = 0
    unsure: bool = False
    split: str = ""
    confs: dict[str, str | None] = field(default_factory=dict)
    #: The scenario's runs on the other stores, which read the same input files.
    peers: list[StreamRun] = field(default_factory=list, repr=False)
    #: Added to the names of the scenario's checkpoints when it runs again (``StreamTest``).
    attempt_suffix: str = ""

    def start(self, trigger: dict[str, Any] | None = None, confs: dict[str, str] | None = None):
        """Start the query from its checkpoint. Rows added while it was stopped are there when
        it starts, as a ``MemoryStream``'s are (a ``Trigger.Once`` start reads them)."""
        self._publish()
        files = sum(stream.files_written for stream in self.inputs)
        # Files written while the query was stopped are read by its first batches, in as many
        # as the start makes of them: the next check does not count its batches.
        self.unsure, self.files_seen = files > self.files_seen, files
        for key, value in (confs or {}).items():
            self.confs.setdefault(key, self.spark.conf.get(key, None))
            self.spark.conf.set(key, value)
        batches = self.batches

        def collect(batch: DataFrame, batch_id: int) -> None:
            batches[batch_id] = [_plain(row) for row in batch.collect()]

        writer = (
            self.df.writeStream.outputMode(self.output_mode)
            .foreachBatch(collect)
            .option("checkpointLocation", self.checkpoint)
            .option("stateStore", self.provider)
        )
        if trigger:
            writer = writer.trigger(**trigger)
        self.query = writer.start()
        self.progress_seen = 0

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    def process(self) -> None:
        """Hand the rows added so far to the query and wait until it has run them all (a query
        that has ended by itself, as a ``Trigger.Once`` one does, is checked as it ended)."""
        self._publish()
        if self.query is None:
            msg = "the scenario checks a stopped stream (no StartStream since StopStream)"
            raise AssertionError(msg)
        if self.query.isActive:
            self.query.processAllAvailable()
        else:
            self.query.awaitTermination()  # raises the error a failed query ended with
        self._check_one_batch()

    def _publish(self) -> None:
        """Move the files of the rows added since the last check into the input directories,
        while no running query of the scenario plans a batch: each query reads them all in
        one batch, as Spark's ``MultiAddData`` makes its inputs' rows one batch."""
        for stream in self.inputs:
            stream.flush(publish=False)
        with _no_batch_planned([run.query for run in self.peers or [self]]):
            for stream in self.inputs:
                stream.publish()

    def _check_one_batch(self) -> None:
        """Note when the files written since the last check, more than one, reached the query in
        more than one batch, which Spark's ``MemoryStream`` never does (and
        :meth:`_publish` should not let happen). A scenario whose check then fails is run again
        (``StreamTest.test_stream``)."""
        files = sum(stream.files_written for stream in self.inputs)
        recent = progresses(self)
        new = [p for p in recent if p["batchId"] > self.last_batch_seen]
        if new:
            self.last_batch_seen = max(p["batchId"] for p in new)
        written, self.files_seen = files - self.files_seen, files
        if self.unsure:
            self.unsure = False
            return
        moved = [p for p in new if any(_moved(source) for source in p["sources"])]
        if written > 1 and len(moved) > 1:
            batches = [p["batchId"] for p in moved]
            msg = (
                f"{self.provider}: the {written} files of one check were read in batches {batches}"
            )
            self.split = msg

    def all_rows(self) -> list[tuple[Any, ...]]:
        """The memory sink's ``allData``: every batch's rows, the last batch's in complete mode."""
        if self.output_mode == "complete":
            return self.last_rows()
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id]]

    def last_rows(self) -> list[tuple[Any, ...]]:
        return self.batches[max(self.batches)] if self.batches else []

    def new_rows(self) -> list[tuple[Any, ...]]:
        rows = [
            row
            for batch_id in sorted(self.batches)
            if batch_id > self.last_checked_batch
            for row in self.batches[batch_id]
        ]
        return rows

    def checked(self) -> None:
        self.last_checked_batch = max(self.batches, default=-1)

    def restore_confs(self) -> None:
        for key, value in self.confs.items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)


@contextmanager
def _no_batch_planned(queries: Iterable[Any]) -> Iterator[None]:
    """Hold every running query of ``queries`` (ours or Spark's) before its next batch, as
    Spark's ``StreamProgressLockedActions`` does: each one's ``awaitProgressLock``, which Spark
    holds while it asks every source for its latest offset. A query reading several inputs, one
    file source each, lists their directories one after the other; files moved in meanwhile
    would reach it in two batches."""
    locks = []
    try:
        for query in queries:
            jsq = getattr(query, "_jsq", None)
            if jsq is None or not query.isActive:
                continue
            lock = jsq.streamingQuery().awaitProgressLock()
            lock.lock()  # a py4j call of this thread, which the unlock below is too
            locks.append(lock)
        yield
    finally:
        for lock in reversed(locks):
            lock.unlock()


class SplitBatch(Exception):  # noqa: N818 - what happened, not an error of the query
    """A check failed after the rows of one check reached the query in two batches (see
    ``StreamRun.process``)."""


def _moved(source: dict[str, Any]) -> bool:
    """Whether a progress's source read anything (its offset moved) in the batch."""
    return bool(source.get("startOffset") != source.get("endOffset"))


def _plain(value: Any) -> Any:
    """A collected row as a tuple (nested structs as tuples), as the expected rows are written."""
    if isinstance(value, Row):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _row(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def _same_rows(
    kind: str,
    expected: Iterable[Any],
    actual: Sequence[Any],
    run: StreamRun,
    is_sorted: bool = False,
) -> None:
    want = [_row(r) for r in expected]
    got = list(actual)
    if not is_sorted:
        want, got = sorted(want, key=repr), sorted(got, key=repr)
    if want != got:
        msg = f"{kind}: expected {want}\n got {got}\n batches: {dict(sorted(run.batches.items()))}"
        raise AssertionError(msg)


# --- actions ------------------------------------------------------------------------------


class Action:
    #: An action on the inputs (run once for all the scenario's queries), not on a query.
    on_inputs = False

    def run(self, run: StreamRun) -> None:
        raise NotImplementedError


class AddData(Action):
    """Spark's ``AddData(input, rows*)``: the rows reach the query at the next check."""

    on_inputs = True

    def __init__(self, stream: MemoryStream, *rows: Any) -> None:
        self.stream, self.rows = stream, rows

    def run(self, run: StreamRun) -> None:
        self.stream.pending.extend(self.rows)
        self.stream.batch_pending = True


class MultiAddData(Action):
    """Spark's ``MultiAddData``: rows into several inputs, read in one batch. Each input is
    its own file source, listed one after the other when a batch is planned; the inputs' files
    are moved into their directories while no query plans a batch (``StreamRun._publish``), as
    Spark's test adds the rows under the query's progress lock."""

    on_inputs = True

    def __init__(self, *adds: AddData) -> None:
        self.adds = adds

    def run(self, run: StreamRun) -> None:
        for add in self.adds:
            add.run(run)


class CheckAnswer(Action):
    """Spark's ``CheckAnswer(rows*)``: every row the sink has (complete mode: the last batch).
    ``isSorted=True`` (Spark's ``CheckAnswer(isSorted = true, rows*)``) checks their order too."""

    def __init__(self, *rows: Any, isSorted: bool = False) -> None:  # noqa: N803 - Spark's name
        self.rows, self.is_sorted = rows, isSorted

    def run(self, run: StreamRun) -> None:
        run.process()
        _same_rows("CheckAnswer", self.rows, run.all_rows(), run, self.is_sorted)
        run.checked()


class CheckLastBatch(CheckAnswer):
    """Spark's ``CheckLastBatch(rows*)``: the rows of the last batch the sink received."""

    def run(self, run: StreamRun) -> None:
        run.process()
        _same_rows("CheckLastBatch", self.rows, run.last_rows(), run, self.is_sorted)
        run.checked()


class CheckNewAnswer(CheckAnswer):
    """Spark's ``CheckNewAnswer(rows*)``: the rows of the batches since the last check."""

    def run(self, run: StreamRun) -> None:
        run.process()
        _same_rows("CheckNewAnswer", self.rows, run.new_rows(), run, self.is_sorted)
        run.checked()


class ProcessAllAvailable(Action):
    def run(self, run: StreamRun) -> None:
        run.process()


class _StopStream(Action):
    def run(self, run: StreamRun) -> None:
        run.stop()


#: Spark's ``StopStream``.
StopStream = _StopStream()


class StartStream(Action):
    """Spark's ``StartStream(trigger, additionalConfs, checkpointLocation)``: a new start from
    the checkpoint. ``checkpoint`` names a checkpoint of the scenario's own (one per store) that
    several of its ``test_stream`` calls share, as a Scala test passes one directory to each."""

    def __init__(
        self,
        trigger: dict[str, Any] | None = None,
        confs: dict[str, str] | None = None,
        checkpoint: str | None = None,
        checkpointLocation: str | None = None,  # noqa: N803 - Spark's name
    ) -> None:
        self.trigger, self.confs = trigger, confs
        self.checkpoint = checkpoint or checkpointLocation

    def run(self, run: StreamRun) -> None:
        if self.checkpoint is not None:
            name = f"{self.checkpoint}{run.attempt_suffix}-{run.provider}"
            run.checkpoint = str(Path(run.checkpoint).parent / name)
        run.start(self.trigger, self.confs)


class AwaitTermination(Action):
    """Spark's ``q.awaitTermination()``: wait for a query that ends by itself (a
    ``Trigger.Once`` or ``availableNow`` start) to end."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s

    def run(self, run: StreamRun) -> None:
        if run.query is None:
            msg = "awaitTermination on a stopped stream"
            raise AssertionError(msg)
        if not run.query.awaitTermination(self.timeout_s):
            msg = f"the query did not end within {self.timeout_s} s"
            raise AssertionError(msg)


class AssertOnQuery(Action):
    """Spark's ``AssertOnQuery(q => ...)``: ``check(run)`` holds (or raises itself)."""

    def __init__(self, check: Callable[[StreamRun], Any], message: str = "") -> None:
        self.check, self.message = check, message

    def run(self, run: StreamRun) -> None:
        result = self.check(run)
        if result is False:
            raise AssertionError(self.message or "AssertOnQuery failed")


class Execute(AssertOnQuery):
    """Spark's ``Execute { q => ... }``."""


class ExpectFailure(Action):
    """Spark's ``ExpectFailure[...]``: the query fails with an error naming ``match`` (and
    each of ``also``)."""

    def __init__(self, match: str = "", *also: str) -> None:
        self.match, self.also = match, also

    def run(self, run: StreamRun) -> None:
        try:
            run.process()
        except StreamingQueryException as e:
            missing = [m for m in (self.match, *self.also) if m and m not in str(e)]
            if missing:
                msg = f"the query failed, not with {missing!r}: {e}"
                raise AssertionError(msg) from e
        else:
            msg = "the query did not fail"
            raise AssertionError(msg)
        finally:
            run.stop()


def progresses(run: StreamRun) -> list[Any]:
    return list(run.query.recentProgress) if run.query is not None else []


def _per_operator(value: int | Sequence[int] | None) -> list[int] | None:
    return None if value is None else [value] if isinstance(value, int) else list(value)


def _since_last_check(run: StreamRun) -> list[Any]:
    """The progresses with state operators since the last check of state metrics (Spark's
    ``retrieveProgressesSinceLastCheck``), which this check then marks as checked."""
    recent = progresses(run)
    since = [p for p in recent[run.progress_seen :] if p["stateOperators"]]
    run.progress_seen = len(recent)
    return since


def assertNumStateRows(  # noqa: N802 - Spark's name
    total: int | Sequence[int],
    updated: int | Sequence[int] | None = None,
    droppedByWatermark: int | Sequence[int] | None = None,  # noqa: N803 - Spark's name
    removed: int | Sequence[int] | None = None,
) -> Action:
    """Spark's ``assertNumStateRows``: the last progress's total rows in each state operator,
    and (each when given) the rows updated, dropped by the watermark and removed by the batches
    since the last such check, summed."""
    totals = _per_operator(total)
    sums = {
        "numRowsUpdated": _per_operator(updated),
        "numRowsDroppedByWatermark": _per_operator(droppedByWatermark),
        "numRowsRemoved": _per_operator(removed),
    }

    def check(run: StreamRun) -> None:
        run.process()
        last = [p for p in progresses(run) if p["stateOperators"]][-1]
        since = _since_last_check(run)
        got_total = [op["numRowsTotal"] for op in last["stateOperators"]]
        got = {
            metric: [
                sum(p["stateOperators"][i][metric] for p in since) for i in range(len(got_total))
            ]
            for metric in sums
        }
        wrong = got_total != totals or any(
            want is not None and got[metric] != want for metric, want in sums.items()
        )
        if wrong:
            expected = {k: v for k, v in sums.items() if v is not None}
            msg = f"state rows: expected total {totals} {expected}, got total {got_total} {got}"
            raise AssertionError(msg)

    return AssertOnQuery(check)


def assertStateOperatorProgressMetric(  # noqa: N802 - Spark's name
    operatorName: str,  # noqa: N803 - Spark's names
    numShufflePartitions: int,  # noqa: N803
    numStateStoreInstances: int,  # noqa: N803
    operatorIndex: int = 0,  # noqa: N803
) -> Action:
    """Spark's ``assertStateOperatorProgressMetric``: the state operator's name, shuffle
    partitions and state store instances in the last progress (as ``assertNumStateRows``, it
    starts the next check's batches after this one)."""
    want = (operatorName, numShufflePartitions, numStateStoreInstances)

    def check(run: StreamRun) -> None:
        run.process()
        recent = progresses(run)
        last = [p for p in recent if p["stateOperators"]][-1]["stateOperators"][operatorIndex]
        got = (last["operatorName"], last["numShufflePartitions"], last["numStateStoreInstances"])
        run.progress_seen = len(recent)
        if got != want:
            msg = f"state operator progress: expected {want}, got {got}"
            raise AssertionError(msg)

    return AssertOnQuery(check)


def assertNumRowsDroppedByWatermark(  # noqa: N802 - Spark's name
    dropped: int | Sequence[int],
) -> Action:
    """The suites' ``assertNumRowsDroppedByWatermark``: each state operator's rows dropped as
    late in the last batch that read input rows."""
    want = list(dropped) if isinstance(dropped, Sequence) else [dropped]

    def check(run: StreamRun) -> None:
        run.process()
        with_input = [p for p in progresses(run) if p["numInputRows"] > 0]
        got = [op["numRowsDroppedByWatermark"] for op in with_input[-1]["stateOperators"]]
        if got != want:
            msg = f"rows dropped by watermark: expected {want}, got {got}"
            raise AssertionError(msg)

    return AssertOnQuery(check)


def format_timestamp(seconds: float) -> str:
    """A time as Spark's progress writes one (``2024-01-02T03:04:05.000Z``)."""
    when = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def assertEventStats(  # noqa: N802 - the suite's name
    check: Callable[[dict[str, str]], Any] | None = None,
    *,
    min: int | None = None,
    max: int | None = None,
    avg: float | None = None,
    wtrmark: int | None = None,
) -> Action:
    """``EventTimeWatermarkSuite``'s ``assertEventStats``: the event-time statistics (``min``,
    ``max``, ``avg``, ``watermark``, in seconds) of the last batch that read input rows, or
    ``check`` run on them."""

    def stats(run: StreamRun) -> None:
        with_input = [p for p in progresses(run) if p["numInputRows"] > 0]
        event_time = dict(with_input[-1]["eventTime"] or {})
        if check is not None:
            check(event_time)
            return
        want = {"min": min, "max": max, "avg": avg, "watermark": wtrmark}
        expected = {k: format_timestamp(int(v)) for k, v in want.items() if v is not None}
        got = {k: event_time.get(k) for k in expected}
        if got != expected:
            msg = f"event time: expected {expected}, got {event_time}"
            raise AssertionError(msg)

    return AssertOnQuery(stats)


def assertStateOperatorCustomMetric(  # noqa: N802 - Spark's name
    metric: str,
    expected: int,
    operatorIndex: int = 0,  # noqa: N803 - Spark's name
) -> Action:
    """Spark's ``assertStateOperatorCustomMetric``: one state operator's custom metric, summed
    over the batches since the last metrics check (which this check marks as checked)."""

    def check(run: StreamRun) -> None:
        run.process()
        since = _since_last_check(run)
        got = sum(p["stateOperators"][operatorIndex]["customMetrics"][metric] for p in since)
        if got != expected:
            msg = f"custom metric {metric}: expected {expected}, got {got}"
            raise AssertionError(msg)

    return AssertOnQuery(check)


def watermark_ms(run: StreamRun) -> int:
    """The event-time watermark the last batch ran with, in epoch milliseconds (Spark's
    ``q.lastExecution.offsetSeqMetadata.batchWatermarkMs``; 0 before one is set)."""
    for progress in reversed(progresses(run)):
        mark = (progress["eventTime"] or {}).get("watermark")
        if mark is not None:
            when = dt.datetime.fromisoformat(mark.replace("Z", "+00:00"))
            return int(when.timestamp() * 1000)
    return 0


def assertWatermark(ms: int) -> Action:  # noqa: N802
    def check(run: StreamRun) -> None:
        run.process()
        got = watermark_ms(run)
        if got != ms:
            msg = f"watermark: expected {ms} ms, got {got} ms"
            raise AssertionError(msg)

    return AssertOnQuery(check)


#: How many times a scenario runs when its inputs reach a query split (``SplitBatch``).
_ATTEMPTS = 3


class StreamTest:
    """What a scenario runs with: the session, a directory of its own, and the state stores.

    Each scenario runs on every store at once: one query per store over the same input files,
    started together and checked action by action (a failure names the store). Spark's own
    operator, under ``SPARKSTATE_COMPAT_ORACLE=spark``, runs alone."""

    def __init__(self, spark: SparkSession, path: Path, providers: Sequence[str]) -> None:
        self.spark, self.path = spark, path
        self.providers = ["spark"] if ORACLE else list(providers)
        self.inputs: list[MemoryStream] = []
        #: The scenario's ``test_stream`` calls so far, run again in order after a split.
        self._calls: list[tuple[Any, str, Sequence[Action], str | None]] = []
        #: How many times the scenario ran again from its start.
        self._attempt = 0

    def memory_stream(
        self, schema: str = "value int", partitions: int = 1, over: MemoryStream | None = None
    ) -> MemoryStream:
        """A new input; ``over`` an earlier one, the same input read with another schema from
        the next start on (Spark's test makes a new ``MemoryStream`` of the new type holding
        the earlier batches again, which a file source has already: the earlier files, their
        missing columns read as null)."""
        path = over.path if over else self.path / f"input-{len(self.inputs)}"
        stream = MemoryStream(self.spark, path, schema, partitions)
        if over:
            stream._files, stream._mtime = over._files, over._mtime
        self.inputs.append(stream)
        return stream

    def test_stream(
        self, df: Any, output_mode: str, *actions: Action, checkpoint: str | None = None
    ) -> None:
        """Spark's ``testStream(df, outputMode)(actions*)``: the query starts, the actions run in
        order, the query is stopped at the end whatever happened. ``checkpoint`` names a
        checkpoint (one per store) that another ``test_stream`` of the scenario starts from
        again, as Spark's ``StartStream(checkpointLocation = dir)`` in two ``testStream``."""
        self._calls.append((df, output_mode, actions, checkpoint))
        first = len(self._calls) - 1  # the new call; after a split, every call from the first
        while True:
            try:
                for number in range(first, len(self._calls)):
                    df_, mode, actions_, checkpoint_ = self._calls[number]
                    self._run_once(df_, mode, actions_, self._name(number, checkpoint_))
                return
            except SplitBatch:
                # Spark's test would have read the rows of a check in one batch, and a check
                # failed after they came in two: run the scenario again from its start, its
                # earlier ``test_stream`` calls too (a later one's inputs and checkpoint hold
                # what an earlier one left), with the inputs as they are now.
                self._attempt += 1
                if self._attempt >= _ATTEMPTS:
                    raise
                for stream in self.inputs:
                    stream.clear()
                first = 0

    def _name(self, number: int, checkpoint: str | None) -> str:
        """The checkpoint's name of the scenario's call ``number`` in this attempt."""
        name = f"named-{checkpoint}" if checkpoint else str(number + 1)
        return f"{name}{self._suffix}"

    @property
    def _suffix(self) -> str:
        """What the names of this attempt's checkpoints end with: a new attempt starts from
        checkpoints of its own, the named ones of ``StartStream(checkpoint=...)`` too."""
        return "" if self._attempt == 0 else f"-{self._attempt}"

    def _run_once(self, df: Any, output_mode: str, actions: Sequence[Action], name: str) -> None:
        runs = [
            StreamRun(
                self.spark,
                df,
                output_mode,
                str(self.path / f"checkpoint-{name}-{provider}"),
                provider,
                self.inputs,
                files_seen=sum(stream.files_written for stream in self.inputs),
                attempt_suffix=self._suffix,
            )
            for provider in self.providers
        ]
        for run in runs:
            run.peers = runs
        steps = list(actions)
        if not steps or not isinstance(steps[0], StartStream):
            steps.insert(0, StartStream())
        try:
            for number, step in enumerate(steps):
                for run in runs[:1] if step.on_inputs else runs:
                    try:
                        step.run(run)
                    except AssertionError as e:
                        msg = f"{run.provider}, action {number} ({type(step).__name__}): {e}"
                        split = [r.split for r in runs if r.split]
                        if split:
                            msg = f"{msg}\n after {split[0]}"
                            raise SplitBatch(msg) from e
                        raise AssertionError(msg) from e
        finally:
            for run in runs:
                run.stop()
            runs[0].restore_confs()
