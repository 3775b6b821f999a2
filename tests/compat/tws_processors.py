"""The StatefulProcessors of Spark's transformWithState tests, re-stated for the compat suite.

Spark keeps them in ``python/pyspark/sql/tests/pandas/helper/helper_pandas_transform_with_state.py``
(a pandas and a row variant of each). Here one class serves both modes where only the shape
of rows and output differs (``pandas=True``: frames in, frames out; else Rows), with the same
state variables, schemas, TTLs, timers and in-processor assertions as Spark's.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, NamedTuple

import pandas as pd
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

INT_VALUE = StructType([StructField("value", IntegerType(), True)])
STRING_VALUE = StructType([StructField("value", StringType(), True)])


def _column(rows: list[Any], name: str, pandas: bool) -> list[Any]:
    """The values of one input column, over every frame (pandas) or Row."""
    if pandas:
        return [v for pdf in rows for v in pdf[name].tolist()]
    return [getattr(row, name) for row in rows]


def _non_null_count(rows: list[Any], name: str, pandas: bool) -> int:
    if pandas:
        return int(sum(pdf[name].count() for pdf in rows))
    return sum(1 for row in rows if getattr(row, name) is not None)


def _sum_temperature(rows: list[Any], pandas: bool) -> Any:
    """As Spark's processors sum: numpy integers in pandas mode (handed on to state as they are)."""
    if pandas:
        return sum(pdf["temperature"].astype(int).sum() for pdf in rows)
    return sum(int(row.temperature) for row in rows)


def _out(pandas: bool, **columns: Any) -> Any:
    """One output row: a one-row frame in pandas mode, a Row otherwise."""
    if pandas:
        return pd.DataFrame({k: [v] for k, v in columns.items()})
    return Row(**columns)


class Base(StatefulProcessor):
    def __init__(self, pandas: bool) -> None:
        self.pandas = pandas

    def close(self) -> None:
        pass


class ViolationsCount(Base):
    """Counts rows and temperatures over 100 per key; a second value state is deleted at init
    and must then refuse ``exists()`` (Spark's SimpleStatefulProcessor)."""

    expected = {0: {"0": 1, "1": 2}, 1: {"0": 4, "1": 3}}

    def init(self, handle: Any) -> None:
        self.violations = handle.getValueState("numViolations", "value int")
        self.temp_state = handle.getValueState("tempState", INT_VALUE)
        handle.deleteIfExists("tempState")
        self.seen_batch = 0

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        try:
            self.temp_state.exists()
        except PySparkRuntimeError as exc:
            assert re.search("Error checking value state exists", str(exc)), str(exc)
        else:
            msg = "exists() of a deleted state variable did not raise"
            raise AssertionError(msg)
        data = list(rows)
        before = 0
        if self.violations.exists():
            before = self.violations.get()[0]
            assert before == self.expected[0][key[0]]
            self.seen_batch = 1
        temps = [t for t in _column(data, "temperature", self.pandas) if t is not None]
        updated = before + sum(1 for t in temps if t > 100)
        assert updated == self.expected[self.seen_batch][key[0]]
        self.violations.update((updated,))
        yield _out(self.pandas, id=key[0], countAsString=str(len(temps)))


class SumWithInitialState(Base):
    """Sums temperatures per key on top of an initial value (Spark's
    SimpleStatefulProcessorWithInitialState); keys may have one or two columns."""

    initial = {("0",): 789, ("3",): 987}

    def init(self, handle: Any) -> None:
        self.value_state = handle.getValueState("value_state", INT_VALUE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        total = self.value_state.get()[0] if self.value_state.exists() else 0
        total += _sum_temperature(list(rows), self.pandas)
        self.value_state.update((total,))
        if len(key) > 1:
            yield _out(self.pandas, id1=key[0], id2=key[1], value=str(total))
        else:
            yield _out(self.pandas, id=key[0], value=str(total))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802,N803
        start = initialState.at[0, "initVal"] if self.pandas else initialState.initVal
        self.value_state.update((start,))
        if len(key) == 1:
            assert self.initial[key] == start


class MaxEventTime(Base):
    """Emits the max event time seen (seconds), registers a timer at the watermark and clears
    the max when it fires (Spark's EventTimeStatefulProcessor)."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.max_state = handle.getValueState("max_state", STRING_VALUE)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:  # noqa: N802,N803
        self.max_state.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield _out(
            self.pandas, id=f"{key[0]}-expired", timestamp=str(expiredTimerInfo.getExpiryTimeInMs())
        )

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        seconds = _event_seconds(list(rows), self.pandas)
        current = int(self.max_state.get()[0]) if self.max_state.exists() else 0
        latest = str(max(current, max(seconds)))
        self.max_state.update((latest,))
        self.handle.registerTimer(timerValues.getCurrentWatermarkInMs())
        yield _out(self.pandas, id=key[0], timestamp=latest)


class MinEventTime(Base):
    """Emits the min event time seen, in seconds (Spark's MinEventTimeStatefulProcessor)."""

    def init(self, handle: Any) -> None:
        self.min_state = handle.getValueState("min_state", STRING_VALUE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        seconds = _event_seconds(list(rows), self.pandas)
        current = int(self.min_state.get()[0]) if self.min_state.exists() else sys.maxsize
        earliest = str(min(current, min(seconds)))
        self.min_state.update((earliest,))
        yield _out(self.pandas, id=key[0], timestamp=earliest)


def _event_seconds(rows: list[Any], pandas: bool) -> list[int]:
    if pandas:  # PySpark hands datetime64[ns]: nanoseconds since the epoch
        return [v for pdf in rows for v in (pdf["eventTime"].astype("int64") // 10**9).tolist()]
    return [int(row.eventTime.timestamp()) for row in rows]


class CountWithProcessingTimer(Base):
    """Counts rows per key; key "0" registers a timer 1 ms ahead in every batch, and an
    expired timer clears the count and emits -1 (Spark's ProcTimeStatefulProcessor)."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count_state = handle.getValueState("count_state", STRING_VALUE)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:  # noqa: N802,N803
        first = list(self.handle.listTimers())
        second = list(self.handle.listTimers())
        assert first == second  # two iterators over one key's timers agree
        if first:
            assert len(first) == 2
        self.count_state.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield _out(
            self.pandas,
            id=key[0],
            countAsString="-1",
            timeValues=str(expiredTimerInfo.getExpiryTimeInMs()),
        )

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        count = int(self.count_state.get()[0]) if self.count_state.exists() else 0
        if key == ("0",):
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        data = list(rows)
        count += sum(len(pdf) for pdf in data) if self.pandas else len(data)
        self.count_state.update((str(count),))
        yield _out(
            self.pandas,
            id=key[0],
            countAsString=str(count),
            timeValues=str(timerValues.getCurrentProcessingTimeInMs()),
        )


class FirstEventTime(Base):
    """Emits the key's first event time of the batch, stateless (Spark's
    StatefulProcessorChainingOps)."""

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        data = list(rows)
        # pandas: the first value of the last frame, as Spark's processor takes it
        first = data[-1]["eventTime"].tolist()[0] if self.pandas else data[0].eventTime
        yield _out(self.pandas, id=key[0], outputTimestamp=first)


class CompositeState(Base):
    """Value, list and map state of arrays, structs and maps (Spark's
    StatefulProcessorCompositeType)."""

    class Address(NamedTuple):
        road_id: int
        city: str

    TAGS = [["dummy1", "dummy2"], ["dummy3"]]
    METADATA = [{"key": "env", "value": "prod"}, {"key": "region", "value": "us-west"}]
    ATTRIBUTES = {"key1": [1], "key2": [10]}
    CONFS = {"e1": {"e2": 5, "e3": 10}}
    ADDRESS = [Address(1, "Seattle"), Address(3, "SF")]

    def init(self, handle: Any) -> None:
        pair = StructType([StructField("key", StringType()), StructField("value", StringType())])
        address = StructType(
            [StructField("road_id", IntegerType()), StructField("city", StringType())]
        )
        obj = StructType(
            [
                StructField("id", ArrayType(IntegerType())),
                StructField("tags", ArrayType(ArrayType(StringType()))),
                StructField("metadata", ArrayType(pair)),
                StructField("address", ArrayType(address)),
            ]
        )
        map_value = StructType(
            [
                StructField("id", IntegerType(), True),
                StructField("attributes", MapType(StringType(), ArrayType(IntegerType())), True),
                StructField(
                    "confs", MapType(StringType(), MapType(StringType(), IntegerType()), True), True
                ),
            ]
        )
        self.obj_state = handle.getValueState("obj_state", obj)
        self.list_state = handle.getListState("list_state", obj)
        self.map_state = handle.getMapState("map_state", "name string", map_value)

    def _obj(self, total: int) -> list[int]:
        if self.obj_state.exists():
            ids, tags, metadata, address = self.obj_state.get()
            assert tags == self.TAGS, f"tags: {tags}"
            assert metadata == [Row(**m) for m in self.METADATA], f"metadata: {metadata}"
            assert address == [Row(**a._asdict()) for a in self.ADDRESS], f"address: {address}"
            ids = [int(x + total) for x in ids]
        else:
            ids = [0]
        self.obj_state.update((ids, self.TAGS, self.METADATA, self.ADDRESS))
        return ids

    def _list(self, total: int, first: tuple[Any, ...]) -> list[int]:
        updated = []
        for ids, tags, metadata, address in self.list_state.get():
            ids.append(total)
            updated.append((ids, tags, [m.asDict() for m in metadata], address))
        if not updated:
            updated.append(first)
        self.list_state.put(updated)
        return [i for ids, _, _, _ in updated for i in ids]

    def _map(self, key: str, total: int) -> tuple[Any, Any]:
        if not self.map_state.containsKey(key):
            self.map_state.updateValue(key, (0, self.ATTRIBUTES, self.CONFS))
        else:
            id_val, attributes, confs = self.map_state.getValue(key)
            attributes[key] = [total]
            confs.setdefault("e1", {})[key] = total
            self.map_state.updateValue(key, (id_val, attributes, confs))
        value = self.map_state.getValue(key)
        return value[1], value[2]

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        k = key[0]
        total = _sum_temperature(list(rows), self.pandas)
        ids = self._obj(total)
        flat = self._list(total, (ids, self.TAGS, self.METADATA, self.ADDRESS))
        attributes, confs = self._map(k, total)
        yield _out(
            self.pandas,
            id=k,
            value_arr=",".join(map(str, ids)),
            list_state_arr=",".join(map(str, flat)),
            map_state_arr=json.dumps(attributes, default=int, sort_keys=True),
            nested_map_state_arr=json.dumps(confs, default=int, sort_keys=True),
        )


class ChunkCount(Base):
    """Emits how many frames ``handleInputRows`` got for the key (pandas only); with
    ``initial=True`` it also keeps an initial value (Spark's ChunkCount processors)."""

    def __init__(self, pandas: bool, initial: bool = False) -> None:
        super().__init__(pandas)
        self.initial = initial

    def init(self, handle: Any) -> None:
        if self.initial:
            self.value_state = handle.getValueState("value_state", INT_VALUE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        yield pd.DataFrame({"id": [key[0]], "chunkCount": [sum(1 for _ in rows)]})

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802,N803
        self.value_state.update((initialState.at[0, "initVal"],))


class CompositeOutput(Base):
    """A running count per key, emitted as arrays, maps and structs (Spark's
    CompositeOutputProcessor)."""

    def init(self, handle: Any) -> None:
        self.count_state = handle.getValueState("count_state", INT_VALUE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        count = self.count_state.get()[0] if self.count_state.exists() else 0
        data = list(rows)
        count += sum(len(pdf) for pdf in data) if self.pandas else len(data)
        self.count_state.update((count,))
        struct = dict if self.pandas else Row

        def inner(i: int, int_value: int, double_value: float) -> Any:
            return struct(
                intValue=int_value,
                doubleValue=double_value,
                arrayValue=[f"elem_{i}_{j}" for j in range(i + 1)],
                mapValue={f"map_{i}_{j}": f"val_{i}_{j}" for j in range(i + 1)},
            )

        yield _out(
            self.pandas,
            primitiveValue=f"key_{key[0]}_count_{count}",
            listOfPrimitive=[f"item_{i}" for i in range(count)],
            mapOfPrimitive={f"key{i}": f"value{i}" for i in range(count)},
            listOfComposite=[inner(i, i, float(i * 1.5)) for i in range(count)],
            mapOfComposite={
                f"nested_key{i}": inner(i, i * 10, float(i * 2.5)) for i in range(count)
            },
        )


class LargeValues(Base):
    """Value, list and map state each holding 512 KB strings (Spark's
    LargeValueStatefulProcessor)."""

    def init(self, handle: Any) -> None:
        self.value_state = handle.getValueState("valueState", STRING_VALUE)
        self.list_state = handle.getListState("listState", STRING_VALUE)
        self.map_state = handle.getMapState("mapState", "key string", "value string")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        large = "a" * (512 * 1024)
        self.value_state.update((large,))
        value = self.value_state.get()[0]
        self.list_state.put([(large,), (large + "b",), (large + "c",)])
        listed = ",".join(e[0] for e in self.list_state.get())
        map_key = ("large_string_key",)
        self.map_state.updateValue(map_key, (large,))
        mapped = f"{map_key[0]}:{self.map_state.getValue(map_key)[0]}"
        yield _out(
            self.pandas,
            id=key[0],
            valueStateResult=value,
            listStateResult=listed,
            mapStateResult=mapped,
        )


# The schema-evolution processors: one value state "state" whose schema changes between runs.

ID_NAME = StructType(
    [StructField("id", IntegerType(), True), StructField("name", StringType(), True)]
)
ID_NAME_NOT_NULL = StructType(
    [StructField("id", IntegerType(), False), StructField("name", StringType(), False)]
)
ADDED = StructType(
    [
        StructField("id", IntegerType(), True),
        StructField("name", StringType(), True),
        StructField("count", IntegerType(), True),
        StructField("active", BooleanType(), True),
        StructField("score", FloatType(), True),
    ]
)
REORDERED = StructType(
    [
        StructField("name", StringType(), True),
        StructField("id", IntegerType(), True),
        StructField("score", FloatType(), True),
        StructField("count", IntegerType(), True),
        StructField("active", BooleanType(), True),
    ]
)
UPCAST = StructType([StructField("id", LongType(), True), StructField("name", StringType(), True)])


class _Evolving(Base):
    state_schema = ID_NAME

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("state", self.state_schema)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        for _ in rows:
            pass
        value = self.next_value(int(key[0]))
        yield _out(self.pandas, id=key[0], value=value)

    def next_value(self, id_val: int) -> dict[str, Any]:
        raise NotImplementedError


class BasicState(_Evolving):
    """Writes (id, "name-<id>") (Spark's BasicProcessor)."""

    def next_value(self, id_val: int) -> dict[str, Any]:
        self.state.update((id_val, f"name-{id_val}"))
        return {"id": id_val, "name": f"name-{id_val}"}


class BasicStateNotNullable(BasicState):
    """BasicState with a schema of non-nullable fields (Spark's BasicProcessorNotNullable)."""

    state_schema = ID_NAME_NOT_NULL


class AddedFieldsState(_Evolving):
    """Three more fields; emits what it read, appends "0" to the name (Spark's
    AddFieldsProcessor)."""

    state_schema = ADDED

    def next_value(self, id_val: int) -> dict[str, Any]:
        if self.state.exists():
            value = dict(
                zip(["id", "name", "count", "active", "score"], self.state.get(), strict=True)
            )
        else:
            value = {"id": id_val, "name": f"name-{id_val}", "count": 100, "active": True}
            value["score"] = 99.9
        self.state.update(
            (value["id"], value["name"] + "0", value["count"], value["active"], value["score"])
        )
        return value


class RemovedFieldsState(_Evolving):
    """Back to (id, name), keeping a stored name (Spark's RemoveFieldsProcessor)."""

    def next_value(self, id_val: int) -> dict[str, Any]:
        name = self.state.get()[1] if self.state.exists() else f"name-{id_val}"
        self.state.update((id_val, name))
        return {"id": id_val, "name": name}


class ReorderedFieldsState(_Evolving):
    """The added fields in another order (Spark's ReorderedFieldsProcessor)."""

    state_schema = REORDERED

    def next_value(self, id_val: int) -> dict[str, Any]:
        names = ["name", "id", "score", "count", "active"]
        if self.state.exists():
            value = dict(zip(names, self.state.get(), strict=True))
        else:
            value = {"name": f"name-{id_val}", "id": id_val, "score": 99.9, "count": 100}
            value["active"] = True
        self.state.update(tuple(value[n] for n in names))
        return value


class UpcastState(_Evolving):
    """id widened from int to long; adds the stored id plus one (Spark's UpcastProcessor)."""

    state_schema = UPCAST

    def next_value(self, id_val: int) -> dict[str, Any]:
        name = f"name-{id_val}"
        if self.state.exists():
            id_val += self.state.get()[0] + 1
        self.state.update((id_val, name))
        return {"id": id_val, "name": name}
