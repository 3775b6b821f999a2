"""StatefulProcessor (transformWithState) semantics: state variables, timers, initial state."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.processor import StatefulProcessor
from sparkstate.operators.arbitrary.state_errors import (
    InvalidOutputError,
    InvalidStateValueError,
    StateVariableDeletedError,
    UnsupportedStateOperationError,
)
from sparkstate.operators.arbitrary.state_vars import ValueState
from sparkstate.operators.arbitrary.timers import ExpiredTimerInfo, TimerValues
from sparkstate.runtime.triggers import next_request
from sparkstate.testing.harness import processor_harness

from .conftest import PROVIDERS

INPUT = pa.schema([("k", pa.string()), ("v", pa.int64())])


def rows(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"k": k, "v": v} for k, v in pairs]


class Count(StatefulProcessor):
    """Running count per key in a ValueState."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0] + sum(1 for _ in rows)
        self.count.update((n,))
        yield (key[0], n)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_value_state_across_batches_and_restarts(provider: str) -> None:
    with processor_harness(
        Count(), key_columns=["k"], output_schema="k string, n long", provider=provider
    ) as h:
        out = h.run(rows(("b", 1), ("a", 1), ("a", 1)))
        assert out.rows == [{"k": "a", "n": 2}, {"k": "b", "n": 1}]
        assert out.metrics.num_rows_updated == 2 and out.metrics.num_output_rows == 2
        h.restart()
        assert h.run(rows(("a", 1))).rows == [{"k": "a", "n": 3}]
        assert h.value_state("count", ("a",)) == (3,) and h.value_state("count", "zz") is None
        # a batch that is aborted leaves no trace; its replay gives the same output
        assert h.run(rows(("b", 1)), commit=False).rows == [{"k": "b", "n": 2}]
        h.restart()
        assert h.run(rows(("b", 1))).rows == [{"k": "b", "n": 2}]


class Collections(StatefulProcessor):
    """Exercises ListState and MapState; the input value says what to do."""

    def init(self, handle: Any) -> None:
        self.items = handle.getListState("items", "v long")
        self.counts = handle.getMapState("counts", "word string", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        for row in rows:
            v = row.v
            if v == 0:
                self.items.clear()
                self.counts.clear()
            elif v < 0:
                self.items.put([(-v,), (-v * 10,)])
                self.counts.removeKey(("w1",))
            else:
                self.items.appendValue((v,))
                self.items.appendList([(v + 1,)])
                word = f"w{v % 2}"
                self.counts.updateValue((word,), ((self.counts.getValue((word,)) or (0,))[0] + 1,))
        listed = [x for (x,) in self.items.get()]
        words = ",".join(f"{k}={n}" for (k,), (n,) in self.counts.iterator())
        words_in_order = [k for (k,) in self.counts.keys()]  # noqa: SIM118 - MapState.keys()
        assert words_in_order == sorted(words_in_order)
        assert self.counts.containsKey("w0") == ("w0=" in words)
        yield (key[0], str(listed), words, self.items.exists(), self.counts.exists())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_list_and_map_state(provider: str) -> None:
    h = processor_harness(
        Collections(),
        key_columns=["k"],
        output_schema="k string, items string, words string, has_items boolean, has_words boolean",
        provider=provider,
    )
    with h:
        out = h.run(rows(("a", 1), ("a", 2), ("b", 3)))
        assert out.sorted_rows() == [
            {"k": "a", "items": "[1, 2, 2, 3]", "words": "w0=1,w1=1", "has_items": True,
             "has_words": True},
            {"k": "b", "items": "[3, 4]", "words": "w1=1", "has_items": True, "has_words": True},
        ]  # fmt: skip
        h.restart()
        out = h.run(rows(("a", -5)))
        assert out.rows[0]["items"] == "[5, 50]" and out.rows[0]["words"] == "w0=1"
        assert h.list_state("items", "a") == [(5,), (50,)]
        assert h.map_state("counts", "a") == {("w0",): (1,)}
        out = h.run(rows(("a", 0)))
        assert out.rows == [
            {"k": "a", "items": "[]", "words": "", "has_items": False, "has_words": False}
        ]
        assert h.list_state("items", "a") == [] and h.map_state("counts", "a") == {}
        assert set(h.state_rows("items")) == {("b",)}


class Misuse(StatefulProcessor):
    def __init__(self, action: str) -> None:
        self.action = action

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.value = handle.getValueState("value", "n long")
        self.items = handle.getListState("items", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        a = self.action
        if a == "late state":
            self.handle.getValueState("other", "n long")
        elif a == "empty put":
            self.items.put([])
        elif a == "none append":
            self.items.appendValue(None)
        elif a == "bad value":
            self.value.update(5)
        elif a == "timer":
            self.handle.registerTimer(10)
        return iter(())


@pytest.mark.parametrize(
    ("action", "error", "match"),
    [
        ("late state", UnsupportedStateOperationError, "in init"),
        ("empty put", InvalidStateValueError, "must not be empty"),
        ("none append", InvalidStateValueError, "None"),
        ("bad value", InvalidStateValueError, "tuple"),
        ("timer", UnsupportedStateOperationError, "time mode 'None'"),
    ],
)
def test_misuse_is_refused(action: str, error: type[Exception], match: str) -> None:
    h = processor_harness(Misuse(action), key_columns=["k"], output_schema="k string")
    with h, pytest.raises(error, match=match):
        h.run(rows(("a", 1)))


def test_state_outside_a_key_and_init_that_changes_are_refused() -> None:
    class ReadsInInit(Count):
        def init(self, handle: Any) -> None:
            super().init(handle)
            self.count.get()

    with pytest.raises(UnsupportedStateOperationError, match="planned"):
        processor_harness(ReadsInInit(), key_columns=["k"], output_schema="k string, n long",
                          input_schema=INPUT)  # fmt: skip

    class Fickle(Count):
        calls = 0

        def init(self, handle: Any) -> None:
            Fickle.calls += 1
            schema = "n long" if Fickle.calls == 1 else "n string"
            self.count = handle.getValueState("count", schema)

    h = processor_harness(Fickle(), key_columns=["k"], output_schema="k string, n long")
    with h, pytest.raises(UnsupportedStateOperationError, match="same state variables"):
        h.run(rows(("a", 1)))

    class Twice(Count):
        def init(self, handle: Any) -> None:
            handle.getValueState("count", "n long")
            handle.getListState("count", "n long")

    with pytest.raises(UnsupportedStateOperationError, match="twice"):
        processor_harness(Twice(), key_columns=["k"], output_schema="k string", input_schema=INPUT)

    class CloseReads(Count):
        def close(self) -> None:
            if isinstance(getattr(self, "count", None), ValueState):
                self.count.get()

    h = processor_harness(CloseReads(), key_columns=["k"], output_schema="k string, n long")
    with h, pytest.raises(UnsupportedStateOperationError, match="implicit grouping key"):
        h.run(rows(("a", 1)))


class Reminder(StatefulProcessor):
    """Registers a timer per event (value = delay); on expiry reports and maybe re-arms."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.fired = handle.getValueState("fired", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        base = timerValues.getCurrentProcessingTimeInMs()
        for row in rows:
            if row.v < 0:
                self.handle.deleteTimer(-row.v)  # an absolute expiry
            else:
                self.handle.registerTimer(base + row.v)
        yield (key[0], "timers", str(list(self.handle.listTimers())))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        n = (self.fired.get() or (0,))[0] + 1
        self.fired.update((n,))
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        if n == 1:
            self.handle.registerTimer(expiry + 1)  # re-arm once: fires in a later batch
        now = timerValues.getCurrentProcessingTimeInMs()
        yield (key[0], f"fired {expiry} at {now}", str(list(self.handle.listTimers())))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_processing_time_timers(provider: str) -> None:
    h = processor_harness(
        Reminder(),
        key_columns=["k"],
        output_schema="k string, what string, timers string",
        time_mode="ProcessingTime",
        provider=provider,
    )
    with h:
        out = h.run(rows(("a", 100), ("a", 50), ("a", 50), ("b", 300)), processing_time_ms=1000)
        assert out.rows == [
            {"k": "a", "what": "timers", "timers": "[1050, 1100]"},  # a duplicate is ignored
            {"k": "b", "what": "timers", "timers": "[1300]"},
        ]
        assert h.timers("a") == [1050, 1100]
        assert h.run(processing_time_ms=1049).rows == []
        h.restart()
        # expiry <= processing time fires, earliest first; the fired timer is listed during
        # its own handler and deleted after it
        assert h.run(rows(("b", -1300), ("b", -7)), processing_time_ms=1100).rows == [
            {"k": "b", "what": "timers", "timers": "[]"},
            {"k": "a", "what": "fired 1050 at 1100", "timers": "[1050, 1051, 1100]"},
            {"k": "a", "what": "fired 1100 at 1100", "timers": "[1051, 1100]"},
        ]
        assert h.timers("a") == [1051] and h.timers("b") == []
        assert h.run(processing_time_ms=2000).rows == [
            {"k": "a", "what": "fired 1051 at 2000", "timers": "[1051]"}
        ]
        assert h.state_rows("$timer_index") == {} and h.state_rows("$timers") == {}


class EventCounter(StatefulProcessor):
    """Counts events per key; emits the count when the watermark passes last event + 10 s."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        rows = list(rows)
        n = (self.count.get() or (0,))[0] + len(rows)
        self.count.update((n,))
        latest = max(r.t for r in rows).replace(tzinfo=datetime.UTC)
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(int(latest.timestamp() * 1000) + 10_000)
        return iter(())

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, info: Any) -> Iterator[Any]:
        assert timerValues.getCurrentWatermarkInMs() >= info.getExpiryTimeInMs()
        yield (key[0], self.count.get()[0])
        self.count.clear()


def test_event_time_timers_and_late_rows() -> None:
    epoch = datetime.datetime(1970, 1, 1)

    def ev(k: str, s: int) -> dict[str, Any]:
        return {"k": k, "t": epoch + datetime.timedelta(seconds=s)}

    h = processor_harness(
        EventCounter(),
        key_columns=["k"],
        output_schema="k string, n long",
        time_mode="EventTime",
        event_time_column="t",
        watermark_delay_ms=5000,
    )
    with h:
        assert h.run([ev("a", 1), ev("a", 2), ev("b", 30)]).rows == []
        assert h.watermark_ms == 25_000
        out = h.run([ev("a", 4), ev("b", 31)])  # a@4 is late; a's timer (12 s) fires
        assert out.metrics.num_rows_dropped_by_watermark == 1
        assert out.rows == [{"k": "a", "n": 2}]
        assert h.value_state("count", "a") is None
        assert h.run(watermark_ms=41_000).rows == [{"k": "b", "n": 2}]  # expiry <= watermark
        with pytest.raises(ConfigurationError, match="watermark"):
            processor_harness(EventCounter(), key_columns=["k"], output_schema="k string",
                              time_mode="EventTime", input_schema=INPUT)  # fmt: skip


class Seeded(StatefulProcessor):
    """Initial state sets the count; input adds to it."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        if isinstance(initialState, pd.DataFrame):
            start = int(initialState["start"].sum())
        else:
            start = initialState.start
        self.count.update(((self.count.get() or (0,))[0] + start,))

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        items = list(rows)
        n = sum(len(x) if isinstance(x, pd.DataFrame) else 1 for x in items)
        total = (self.count.get() or (0,))[0] + n
        self.count.update((total,))
        if items and isinstance(items[0], pd.DataFrame):
            yield pd.DataFrame({"k": [key[0]], "n": [total]})
        else:
            yield (key[0], total)


@pytest.mark.parametrize("mode", ["rows", "pandas"])
def test_initial_state_in_the_first_batch_only(mode: str) -> None:
    initial = [{"k": "a", "start": 10}, {"k": "c", "start": 5}, {"k": "a", "start": 1}]
    h = processor_harness(
        Seeded(),
        key_columns=["k"],
        output_schema="k string, n long",
        mode=mode,
        input_schema=INPUT,
        initial_state=initial,
    )
    with h:
        assert h.run(rows(("a", 1), ("b", 1))).rows == [{"k": "a", "n": 12}, {"k": "b", "n": 1}]
        assert h.value_state("count", "c") == (5,)  # initial state without input
        assert h.run(rows(("a", 1))).rows == [{"k": "a", "n": 13}]


class PandasCount(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0]
        for frame in rows:
            n += int(frame["v"].sum())
        self.count.update((n,))
        yield pd.DataFrame({"n": [n], "k": [key[0]]})  # by name, any column order


def test_pandas_mode() -> None:
    h = processor_harness(
        PandasCount(), key_columns=["k"], output_schema="k string, n long", mode="pandas"
    )
    with h:
        frame = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
        assert h.run(frame).rows == [{"k": "a", "n": 4}, {"k": "b", "n": 2}]
        assert h.run(frame.iloc[:1]).to_pandas().to_dict("list") == {"k": ["a"], "n": [5]}


class FrameSizes(StatefulProcessor):
    """Emits the sizes of the frames ``handleInputRows`` got for the key, and checks each."""

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        sizes = []
        for frame in rows:
            assert list(frame.index) == list(range(len(frame)))
            assert (frame["k"] == key[0]).all()
            sizes.append(len(frame))
        yield pd.DataFrame({"k": [key[0]], "sizes": [",".join(map(str, sizes))]})


@pytest.mark.parametrize(
    ("limits", "sizes"),
    [
        ({}, {"a": "5", "b": "2"}),  # Spark's defaults: 10000 rows, no byte limit
        ({"max_records_per_batch": 2}, {"a": "2,2,1", "b": "2"}),
        ({"max_records_per_batch": 0}, {"a": "5", "b": "2"}),  # <= 0: no limit
        ({"max_bytes_per_batch": 2}, {"a": "1,1,1,1,1", "b": "1,1"}),  # a row is > 2 bytes
        ({"max_records_per_batch": 3, "max_bytes_per_batch": 100_000}, {"a": "3,2", "b": "2"}),
    ],
)
def test_pandas_mode_cuts_a_keys_rows_as_spark_does(
    limits: dict[str, int], sizes: dict[str, str]
) -> None:
    h = processor_harness(
        FrameSizes(),
        key_columns=["k"],
        output_schema="k string, sizes string",
        mode="pandas",
        **limits,  # type: ignore[arg-type]
    )
    frame = pd.DataFrame({"k": ["a", "b", "a", "a", "b", "a", "a"], "v": range(7)})
    with h:
        assert {r["k"]: r["sizes"] for r in h.run(frame).rows} == sizes


def test_pandas_mode_refuses_a_dataframe_for_an_iterator() -> None:
    class Bare(StatefulProcessor):
        def init(self, handle: Any) -> None:
            pass

        def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
            return pd.DataFrame({"k": [key[0]], "n": [1]})

    h = processor_harness(
        Bare(), key_columns=["k"], output_schema="k string, n long", mode="pandas"
    )
    with h, pytest.raises(InvalidOutputError, match="processor must return an iterator of Data"):
        h.run(pd.DataFrame({"k": ["a"], "v": [1]}))


def test_delete_if_exists_purges_a_variable() -> None:
    class Resetting(Count):
        reset = False

        def init(self, handle: Any) -> None:
            if Resetting.reset:
                handle.deleteIfExists("count")
            super().init(handle)

    h = processor_harness(Resetting(), key_columns=["k"], output_schema="k string, n long")
    with h:
        h.run(rows(("a", 1), ("b", 1)))
        Resetting.reset = True
        assert h.run(rows(("a", 1))).rows == [{"k": "a", "n": 1}]
        assert h.value_state("count", "b") is None


def test_pyspark_style_processor_and_struct_type_schemas() -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class Py(Count):
        def init(self, handle: Any) -> None:
            schema = StructType([StructField("n", LongType(), True)])
            self.count = handle.getValueState("count", schema)
            self.names = handle.getMapState(
                "names", StructType([StructField("name", StringType())]), "seen boolean"
            )

        def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
            for row in rows:
                self.names.updateValue(row["k"], (True,))
            return super().handleInputRows(key, iter(()), timerValues)

    h = processor_harness(Py(), key_columns=["k"], output_schema="k string, n long")
    with h:
        assert h.run(rows(("a", 1))).rows == [{"k": "a", "n": 0}]
        assert h.map_state("names", "a") == {("a",): (True,)}


def test_which_queries_need_batches_without_data() -> None:
    def make(time_mode: str) -> Any:
        return processor_harness(
            Count(),
            key_columns=["k"],
            output_schema="k string, n long",
            time_mode=time_mode,
            input_schema=INPUT,
            watermark=True,
        ).operator

    def requested(time_mode: str, watermark_moved: bool) -> bool:
        triggers = {0: make(time_mode).time_trigger()}
        return next_request({}, triggers, watermark_moved, [], now_ms=1)["requested_at_ms"] == 1

    # as Spark's: with a watermark in the query, a batch after it moved (time mode None too)
    assert make("None").time_trigger() == "event" and requested("None", True)
    assert not requested("None", False)
    assert make("ProcessingTime").time_trigger() == "processing"  # a batch when a timer is due
    assert requested("EventTime", True)
    assert not requested("EventTime", False)


def test_a_variable_obtained_before_delete_if_exists_fails_as_in_pyspark() -> None:
    class Stale(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "n long")
            self.seen = handle.getListState("seen", "v long")
            self.names = handle.getMapState("names", "name string", "n long")
            for name in ("count", "seen", "names"):
                handle.deleteIfExists(name)

        def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
            assert list(self.seen.get()) == []  # PySpark's iterators just end
            assert list(self.names.keys()) == []
            self.count.get()
            return iter(())

    h = processor_harness(Stale(), key_columns=["k"], output_schema="k string, n long")
    message = r"^Error getting value state: Value state count is not initialized\."
    with h, pytest.raises(StateVariableDeletedError, match=message) as info:
        h.run(rows(("a", 1)))
    assert isinstance(info.value, RuntimeError)  # PySpark raises PySparkRuntimeError


def test_each_use_of_a_deleted_variable_names_its_operation() -> None:
    calls = {
        "update": lambda p: p.count.update((1,)),
        "exists": lambda p: p.seen.exists(),
        "append": lambda p: p.seen.appendValue((1,)),
        "map-get": lambda p: p.names.getValue("x"),
        "map-clear": lambda p: p.names.clear(),
    }
    expected = {
        "update": "Error updating value state: Value state count is not initialized.",
        "exists": "Error checking value state exists: List state seen is not initialized.",
        "append": "Error updating value state: List state seen is not initialized.",
        "map-get": "Error getting value: Map state names is not initialized.",
        "map-clear": "Error clearing map state: Map state names is not initialized.",
    }
    for name, call in calls.items():

        class Stale(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.count = handle.getValueState("count", "n long")
                self.seen = handle.getListState("seen", "v long")
                self.names = handle.getMapState("names", "name string", "n long")
                for var in ("count", "seen", "names"):
                    handle.deleteIfExists(var)

            def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
                call(self)  # noqa: B023 - run within the loop's iteration
                return iter(())

        h = processor_harness(Stale(), key_columns=["k"], output_schema="k string, n long")
        with h, pytest.raises(StateVariableDeletedError) as info:
            h.run(rows(("a", 1)))
        assert str(info.value) == expected[name]


def test_a_variable_obtained_again_after_delete_if_exists_works() -> None:
    class Fresh(Count):
        def init(self, handle: Any) -> None:
            handle.getValueState("count", "n long")
            handle.deleteIfExists("count")
            super().init(handle)

    h = processor_harness(Fresh(), key_columns=["k"], output_schema="k string, n long")
    with h:
        assert h.run(rows(("a", 1), ("a", 2))).rows == [{"k": "a", "n": 2}]


def test_rows_are_matched_to_the_output_by_field_name_as_pyspark_does() -> None:
    from pyspark.sql import Row

    class Named(StatefulProcessor):
        def init(self, handle: Any) -> None:
            pass

        def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
            n = sum(1 for _ in rows)
            yield Row(n=n, k=key[0])  # not the output's order
            yield Row(k=key[0], extra="ignored")  # missing n: null; extra: dropped

    h = processor_harness(Named(), key_columns=["k"], output_schema="k string, n long")
    with h:
        assert h.run(rows(("a", 1), ("a", 2))).rows == [
            {"k": "a", "n": 2},
            {"k": "a", "n": None},
        ]
