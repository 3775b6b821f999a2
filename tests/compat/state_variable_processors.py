"""The stateful processors of Spark's state variable and state repartition tests, re-stated.

Spark's ``helper_pandas_transform_with_state.py`` writes each processor twice, a pandas one
(``handleInputRows`` gets pandas DataFrames, yields DataFrames) and a row one (gets and yields
Rows). Here each is written once over both forms: ``pandas=True`` for
``transformWithStateInPandas``, ``False`` for row-mode ``transformWithState``. What a processor
stores, asserts and emits is Spark's, value types included (a pandas sum stays a numpy int).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import pandas as pd
from pyspark import cloudpickle
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

INT_VALUE = StructType([StructField("value", IntegerType(), True)])
TEMPERATURE = StructType([StructField("temperature", IntegerType(), True)])
TIME = StructType([StructField("time", TimestampType(), True)])


class Processor(StatefulProcessor):
    """A processor for either API: ``pandas`` says which form its rows come and go in."""

    def __init__(self, pandas: bool) -> None:
        self.pandas = pandas

    def chunks(self, rows: Iterable[Any]) -> Iterator[Any]:
        """The input as Spark hands it: a chunk per pandas DataFrame, or per Row (a list of
        one)."""
        for chunk in rows:
            yield chunk if self.pandas else [chunk]

    def count(self, chunk: Any) -> Any:
        """The rows of a chunk whose temperature is not null (pandas: ``pdf.count()``)."""
        if self.pandas:
            return chunk.count().get("temperature")
        return sum(1 for r in chunk if r.temperature is not None)

    def violations(self, chunk: Any) -> Any:
        """The rows of a chunk whose temperature is over 100."""
        if self.pandas:
            return chunk.loc[chunk["temperature"] > 100].count().get("temperature")
        return sum(1 for r in chunk if r.temperature is not None and r.temperature > 100)

    def temperatures(self, chunk: Any) -> Any:
        if self.pandas:
            return chunk["temperature"].astype(int).sum()
        return sum(r.temperature for r in chunk)

    def emit(self, **columns: Any) -> Any:
        """One output row: a one-row DataFrame, or a Row."""
        if self.pandas:
            return pd.DataFrame({k: [v] for k, v in columns.items()})
        return Row(**columns)

    def close(self) -> None:
        pass


# --- value state ---------------------------------------------------------------------------------


class SimpleStatefulProcessor(Processor):
    """Counts rows and temperatures over 100 per key; ``tempState`` deleted in ``init`` must be
    unusable. ``expected`` is the violation count per batch the processor asserts."""

    expected = {0: {"0": 1, "1": 2}, 1: {"0": 4, "1": 3}}
    ttl: int | None = None

    def init(self, handle: StatefulProcessorHandle) -> None:
        if self.ttl is None:
            self.num_violations = handle.getValueState("numViolations", "value int")
        else:
            self.num_violations = handle.getValueState("numViolations", INT_VALUE, self.ttl)
        self.temp_state = handle.getValueState("tempState", INT_VALUE)
        handle.deleteIfExists("tempState")
        self.batch = 0

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        try:
            self.temp_state.exists()
        except PySparkRuntimeError as e:
            assert "Error checking value state exists" in str(e), str(e)
        else:
            msg = "a deleted state variable answered exists()"
            raise AssertionError(msg)
        k = key[0]
        if self.num_violations.exists():
            existing = self.num_violations.get()[0]
            assert existing == self.expected[0][k]
            self.batch = 1
        else:
            existing = 0
        count = 0
        violations = 0
        for chunk in self.chunks(rows):
            count += self.count(chunk)
            violations += self.violations(chunk)
        updated = violations + existing
        assert updated == self.expected[self.batch][k]
        self.num_violations.update((updated,))
        yield self.emit(id=k, countAsString=str(count))


class SimpleTTLStatefulProcessor(SimpleStatefulProcessor):
    """The same with ``numViolations`` under a TTL long enough never to expire in a test."""

    ttl = 30000


class InvalidSimpleStatefulProcessor(Processor):
    """Reads a value state that was never set: absent, ``get()`` None, ``clear()`` harmless."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.num_violations = handle.getValueState("numViolations", INT_VALUE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        assert not self.num_violations.exists()
        assert self.num_violations.get() is None
        self.num_violations.clear()
        yield self.emit(id=key[0], countAsString="0")


# --- list state ----------------------------------------------------------------------------------


class ListStateProcessor(Processor):
    """Two list states written by put/appendValue/appendList per chunk, read back through
    interleaved iterators; the processing time plus a minute kept in a timestamp list."""

    ttl: int | None = None

    def init(self, handle: StatefulProcessorHandle) -> None:
        if self.ttl is None:
            self.list1 = handle.getListState("listState1", TEMPERATURE)
            self.list2 = handle.getListState("listState2", TEMPERATURE)
        else:
            self.list1 = handle.getListState("listState1", TEMPERATURE, self.ttl)
            self.list2 = handle.getListState("listState2", TEMPERATURE, self.ttl)
        self.times = handle.getListState("listStateTimestamp", TIME)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        count = 0
        stored_times = []
        for chunk in self.chunks(rows):
            pair = [(120,), (20,)]
            self.list1.put(pair)
            self.list2.put(pair)
            self.list1.appendValue((111,))
            self.list2.appendValue((222,))
            self.list1.appendList(pair)
            self.list2.appendList(pair)
            count += self.count(chunk)
            now = datetime.datetime.fromtimestamp(timerValues.getCurrentProcessingTimeInMs() / 1000)
            stored_times.append((now + datetime.timedelta(minutes=1),))
        first, second = self.list1.get(), self.list2.get()
        assert next(first)[0] == 120
        assert next(second)[0] == 120
        assert next(first)[0] == 20
        assert next(second)[0] == 20
        third = self.list1.get()  # a second iterator over the same list is independent
        assert next(third)[0] == 120
        assert next(third)[0] == 20
        assert next(first)[0] == 111
        assert next(second)[0] == 222
        assert next(third)[0] == 111
        for expected in (120, 20):
            assert next(first)[0] == expected
            assert next(second)[0] == expected
            assert next(third)[0] == expected
        if stored_times:
            self.times.put(stored_times)
        yield self.emit(id=key[0], countAsString=str(count))


class ListStateLargeTTLProcessor(ListStateProcessor):
    ttl = 30000


class ListStateLargeListProcessor(Processor):
    """A list of 100 (value, null) elements, then 90 more per batch: by ``put`` for key "0",
    by ``appendList`` for the others; the list's size kept in a value state and checked."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        element = StructType(
            [
                StructField("value", IntegerType(), True),
                StructField("valueNull", IntegerType(), True),
            ]
        )
        self.elements = handle.getListState("listState", element)
        self.size = handle.getValueState(
            "listSizeState", StructType([StructField("size", IntegerType(), True)])
        )

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        before = list(self.elements.get())
        if not before:
            assert self.size.get() is None
            fresh = [(i, None) for i in range(100)]
            if key == ("0",):
                self.elements.put(fresh)
            else:
                self.elements.appendList(fresh)
            self.size.update((len(fresh),))
        else:
            stored = self.size.get()
            assert stored is not None
            n = stored[0]
            assert n == len(before), f"size {n} != {len(before)} elements"
            assert before == [(i, None) for i in range(n)], f"got {before}"
            if key == ("0",):
                self.elements.put([(i, None) for i in range(n + 90)])
            else:
                self.elements.appendList([(i, None) for i in range(n, n + 90)])
            self.size.update((n + 90,))
        yield self.emit(
            id=key[0],
            prevElements=",".join(str(e[0]) for e in before),
            updatedElements=",".join(str(e[0]) for e in self.elements.get()),
        )


# --- map state -----------------------------------------------------------------------------------


class MapStateProcessor(Processor):
    """Counts into map keys "key1" and "key2", walks keys/values/iterator, removes and clears."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map_state = handle.getMapState("mapState", "name string", "count int")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        count = 0
        for chunk in self.chunks(rows):
            count += self.count(chunk)
        key1, key2 = ("key1",), ("key2",)
        value1 = value2 = count
        if self.map_state.exists():
            if self.map_state.containsKey(key1):
                value1 += self.map_state.getValue(key1)[0]
            if self.map_state.containsKey(key2):
                value2 += self.map_state.getValue(key2)[0]
        self.map_state.updateValue(key1, (value1,))
        self.map_state.updateValue(key2, (value2,))
        keys = self.map_state.keys()
        assert next(keys)[0] == "key1"
        assert next(keys)[0] == "key2"
        values = self.map_state.values()
        assert next(values)[0] == value1
        assert next(values)[0] == value2
        entries = self.map_state.iterator()
        assert next(entries)[0] == key1
        assert next(entries)[1] == (value2,)
        self.map_state.removeKey(key1)
        assert not self.map_state.containsKey(key1)
        assert self.map_state.exists()
        self.map_state.clear()
        assert not self.map_state.exists()
        yield self.emit(id=key[0], countAsString=str(count))


class MapStateLargeTTLProcessor(MapStateProcessor):
    """The same map under a year's TTL, and an unused list state beside it."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        name = StructType([StructField("name", StringType(), True)])
        count = StructType([StructField("count", IntegerType(), True)])
        self.map_state = handle.getMapState("mapState", name, count, 31536000000)
        self.list_state = handle.getListState("listState", name)


# --- initial state -------------------------------------------------------------------------------


class SimpleStatefulProcessorWithInitialState(Processor):
    """Sums temperatures into a value state that the initial state seeds (``initVal``)."""

    initial = {("0",): 789, ("3",): 987}  # the initial state DataFrame of Spark's test

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.value_state = handle.getValueState("value_state", INT_VALUE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        total = self.value_state.get()[0] if self.value_state.exists() else 0
        for chunk in self.chunks(rows):
            total += self.temperatures(chunk)
        self.value_state.update((total,))
        if len(key) > 1:
            yield self.emit(id1=key[0], id2=key[1], value=str(total))
        else:
            yield self.emit(id=key[0], value=str(total))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802, N803
        value = initialState.at[0, "initVal"] if self.pandas else initialState.initVal
        self.value_state.update((value,))
        if len(key) == 1:
            assert self.initial[key] == value


class StatefulProcessorWithInitialStateTimers(SimpleStatefulProcessorWithInitialState):
    """Registers an already expired processing-time timer for every initial state key."""

    def handleExpiredTimer(
        self, key: Any, timerValues: Any, expiredTimerInfo: Any
    ) -> Iterator[Any]:  # noqa: N802, N803
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        self.handle.deleteTimer(expiry)
        yield self.emit(id=f"{key[0]}-expired", value=str(expiry))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802, N803
        super().handleInitialState(key, initialState, timerValues)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)


class StatefulProcessorWithListStateInitialState(SimpleStatefulProcessorWithInitialState):
    """Appends every initial state row's ``initVal`` to a list state."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.list_state = handle.getListState("list_state", INT_VALUE)

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802, N803
        if self.pandas:
            for value in initialState["initVal"].tolist():
                self.list_state.appendValue((value,))
        else:
            self.list_state.appendValue((initialState.initVal,))


# --- composite types -----------------------------------------------------------------------------


class Address(NamedTuple):
    road_id: int
    city: str


class StatefulProcessorCompositeType(Processor):
    """Arrays, structs and maps in value, list and map state: ids grow by the batch's total
    temperature, the list gains it, the map remembers it under the key."""

    TAGS = [["dummy1", "dummy2"], ["dummy3"]]
    METADATA = [{"key": "env", "value": "prod"}, {"key": "region", "value": "us-west"}]
    ATTRIBUTES_MAP = {"key1": [1], "key2": [10]}
    CONFS_MAP = {"e1": {"e2": 5, "e3": 10}}
    ADDRESS = [Address(1, "Seattle"), Address(3, "SF")]

    def init(self, handle: StatefulProcessorHandle) -> None:
        pair = StructType([StructField("key", StringType()), StructField("value", StringType())])
        place = StructType(
            [StructField("road_id", IntegerType()), StructField("city", StringType())]
        )
        obj = StructType(
            [
                StructField("id", ArrayType(IntegerType())),
                StructField("tags", ArrayType(ArrayType(StringType()))),
                StructField("metadata", ArrayType(pair)),
                StructField("address", ArrayType(place)),
            ]
        )
        entry = StructType(
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
        self.map_state = handle.getMapState("map_state", "name string", entry)

    def _update_obj(self, total: Any) -> list[int]:
        if self.obj_state.exists():
            ids, tags, metadata, address = self.obj_state.get()
            assert tags == self.TAGS, f"tags {tags}"
            assert metadata == [Row(**m) for m in self.METADATA], f"metadata {metadata}"
            assert address == [Row(**a._asdict()) for a in self.ADDRESS], f"address {address}"
            ids = [int(x + total) for x in ids]
        else:
            ids = [0]
        self.obj_state.update((ids, self.TAGS, self.METADATA, self.ADDRESS))
        return ids

    def _update_list(self, total: Any, first: tuple[Any, ...]) -> list[Any]:
        updated = []
        for ids, tags, metadata, address in self.list_state.get():
            ids.append(total)
            updated.append((ids, tags, [m.asDict() for m in metadata], address))
        if not updated:
            updated.append(first)
        self.list_state.put(updated)
        return [i for ids, _, _, _ in updated for i in ids]

    def _update_map(self, key: str, total: Any) -> tuple[Any, Any]:
        if not self.map_state.containsKey(key):
            self.map_state.updateValue(key, (0, self.ATTRIBUTES_MAP, self.CONFS_MAP))
        else:
            id_val, attributes, confs = self.map_state.getValue(key)
            attributes[key] = [total]
            confs.setdefault("e1", {})[key] = total
            self.map_state.updateValue(key, (id_val, attributes, confs))
        stored = self.map_state.getValue(key)
        return stored[1], stored[2]

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        k = key[0]
        total = sum(self.temperatures(chunk) for chunk in self.chunks(rows))
        ids = self._update_obj(total)
        listed = self._update_list(total, (ids, self.TAGS, self.METADATA, self.ADDRESS))
        attributes, confs = self._update_map(k, total)
        yield self.emit(
            id=k,
            value_arr=",".join(map(str, ids)),
            list_state_arr=",".join(map(str, listed)),
            map_state_arr=json.dumps(attributes, default=int, sort_keys=True),
            nested_map_state_arr=json.dumps(confs, default=int, sort_keys=True),
        )
