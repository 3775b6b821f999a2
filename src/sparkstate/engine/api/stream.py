"""The user API: ``ss.stream(df)...writeStream...start()``, mirroring PySpark's names."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from pyspark.errors import PySparkAttributeError, PySparkTypeError
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sparkstate.engine.api.grouped import GroupedStream
from sparkstate.engine.api.writer import DataStreamWriter
from sparkstate.engine.plan.carried_time import EVENT_TIME_CARRIER
from sparkstate.engine.plan.chain import output_of, plan_chain
from sparkstate.engine.plan.dedup import DedupStep
from sparkstate.engine.plan.input_times import input_time_column, null_time, with_input_times
from sparkstate.engine.plan.join.plan import JoinInput, JoinStep, plan_join, plan_join_after
from sparkstate.engine.plan.limit import LimitStep
from sparkstate.engine.plan.stage import StatelessStep, Step
from sparkstate.engine.plan.union import UnionInput, UnionStep, union_after, union_of_batch
from sparkstate.engine.spark.schema import quote
from sparkstate.engine.spark.state_source import register_once
from sparkstate.exceptions import (
    ConfigurationError,
)
from sparkstate.runtime.watermark import WATERMARK_DELAY_KEY, WatermarkSpec, parse_delay_ms

__all__ = ["GroupedStream", "StatefulStream", "stream"]

#: ``replace(to_replace)`` without a value (a dict), told from ``value=None``.
_NO_VALUE: Any = object()


def stream(df: DataFrame) -> StatefulStream:
    """Wrap a streaming DataFrame so its stateful steps run with state in the Python workers."""
    if not isinstance(df, DataFrame):
        msg = f"ss.stream() takes a streaming pyspark DataFrame, got {type(df).__name__}"
        raise TypeError(msg)
    if not df.isStreaming:
        msg = "ss.stream() needs a streaming DataFrame (spark.readStream...), not a batch one"
        raise ConfigurationError(msg)
    register_once(df.sparkSession)  # the state reader, for the session that runs the query
    return StatefulStream(df, watermarks=declared_watermarks(df))


def declared_watermarks(df: DataFrame) -> tuple[WatermarkSpec, ...]:
    """The watermark declared on ``df`` itself (``df.withWatermark(...)`` before wrapping).

    Spark keeps the delay on the event-time column's metadata, and only on the column of the
    latest ``withWatermark``, so there is at most one.
    """
    out = []
    for field in df.schema.fields:
        delay = (field.metadata or {}).get(WATERMARK_DELAY_KEY)
        if delay is not None:
            out.append(WatermarkSpec(field.name, f"{int(delay)} milliseconds"))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class StatefulStream:
    """A streaming DataFrame plus the stateful steps to apply to it, in order."""

    df: DataFrame
    steps: tuple[Step, ...] = ()
    #: Every ``withWatermark`` of the input, in order: the one declared on the wrapped DataFrame,
    #: then those called on the stream. Spark tracks each and combines them with
    #: ``spark.sql.streaming.multipleWatermarkPolicy``; the event-time column is the last one's.
    watermarks: tuple[WatermarkSpec, ...] = ()
    #: ``df`` with the event time carried along in :data:`EVENT_TIME_CARRIER`, where a step
    #: before the first stateful one dropped the watermark's column (``select(window(...))``):
    #: Spark's watermark is the largest event time of the rows it reads, before any projection.
    timed: DataFrame | None = None
    #: Whether each watermark reads event times of its own (engine/plan/input_times.py): a union
    #: of streams with a watermark (each input's on its own rows), or watermarks on two
    #: columns.
    own_times: bool = False
    #: Where :attr:`own_times`: ``df`` with one more column per watermark, the event time it
    #: reads (null on the rows of the union's other inputs), :func:`input_time_column`; None
    #: where a step since could not carry them.
    input_times: DataFrame | None = None
    #: Which of :attr:`watermarks` is on the event-time column: the last declared, or after a
    #: union the first input's (Spark's union gives the rows its first input's columns).
    event_time_at: int = -1

    @property
    def watermark(self) -> WatermarkSpec | None:
        """The watermark whose column is the event time (the last declared)."""
        return self.watermarks[self.event_time_at] if self.watermarks else None

    # --- what the stream's rows look like (PySpark's DataFrame names) -----------------------------
    #
    # The rows the sink would get: the input's, or after stateful steps the output Spark's
    # analyzer gives those steps (planned once per stream object, in an output mode they run in).

    @functools.cached_property
    def _output(self) -> DataFrame:
        """A DataFrame standing for the stream's rows as the sink gets them."""
        if not self.steps:
            return self.df
        wm = self.watermark
        return output_of(
            self.df, self.steps, wm.column if wm else None, wm.delay_ms if wm else None
        )

    @property
    def schema(self) -> StructType:
        return self._output.schema

    @property
    def columns(self) -> list[str]:
        return self._output.columns

    @property
    def dtypes(self) -> list[tuple[str, str]]:
        return self._output.dtypes

    @property
    def isStreaming(self) -> bool:  # noqa: N802 - PySpark's name
        """True: a stream (``ss.stream()`` takes streaming DataFrames only)."""
        return True

    def printSchema(self, level: int | None = None) -> None:  # noqa: N802 - PySpark's name
        """Print the schema as Spark's tree, as ``DataFrame.printSchema``."""
        self._output.printSchema(level)

    def __getitem__(self, item: Any) -> Any:
        """As ``DataFrame.__getitem__``: a name or an index gives the column, a Column filters,
        a list or tuple selects. Before the stateful steps the column is the input's own (it
        tells the two sides of a join apart); after them, the output's column by name, which
        the steps after them apply to each batch's output."""
        if isinstance(item, Column):
            return self.where(item)
        if isinstance(item, list | tuple):
            return self.select(*item)
        if isinstance(item, int):
            item = self.columns[item]
        if not isinstance(item, str):
            raise PySparkTypeError(
                errorClass="NOT_EXPECTED_TYPE",
                messageParameters={
                    "expected_type": "Column, float, integer, list or string",
                    "arg_name": "item",
                    "arg_type": type(item).__name__,
                },
            )
        column = self._output[item]  # an unknown name fails here, with Spark's error
        return column if not self.steps else F.col(item)

    def __getattr__(self, name: str) -> Column:
        """``stream.value``: the column ``value``, as PySpark's ``DataFrame.value``. Names that
        start with ``_`` are never columns here, so that Python's own lookups (copying,
        pickling, the dataclass's fields before they are set) fail as they should."""
        if name.startswith("_") or "steps" not in vars(self):
            raise AttributeError(name)
        if name in SPARK_REFUSES:
            return self._refused(name)  # type: ignore[no-any-return]
        if name not in self.columns:
            raise PySparkAttributeError(
                errorClass="ATTRIBUTE_NOT_SUPPORTED", messageParameters={"attr_name": name}
            )
        column: Column = self[name]
        return column

    def _refused(self, name: str) -> Any:
        """``name`` of Spark's streaming DataFrame for the stream's rows: Spark refuses it on a
        stream, and raises its own error (calling it, or, for ``rdd`` and ``write``, reading
        it)."""
        output = self._output
        assert output.isStreaming  # so what Spark refuses on a stream never runs a batch job
        return getattr(output, name)

    def explain(self, extended: Any = None, mode: str | None = None) -> None:
        """Print Spark's plans (as ``DataFrame.explain``) of the query as written so far: the
        input's, or after stateful steps Spark's own plan of those steps over the input (the
        query Spark would run unwrapped, with its state operators). sparkstate runs it
        otherwise: the input in Spark's ``foreachBatch``, the state operators in Python
        workers."""
        self._output.explain(extended, mode)

    @property
    def na(self) -> NaFunctions:
        """``stream.na.drop()`` / ``.fill()`` / ``.replace()``, as ``DataFrame.na``."""
        return NaFunctions(self)

    def transform(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> StatefulStream:
        """``func(self, *args, **kwargs)``, which returns a stream, as ``DataFrame.transform``."""
        result = func(self, *args, **kwargs)
        assert isinstance(result, StatefulStream), (
            f"Func returned an instance of type [{type(result)}], should have been a stream."
        )
        return result

    def distinct(self) -> StatefulStream:
        """The distinct rows: ``dropDuplicates()``, as Spark plans ``distinct()`` on a stream."""
        return self.dropDuplicates()

    def union(self, other: Any) -> StatefulStream:
        """The rows of both streams (by position), as ``DataFrame.union``. Each input's
        watermark is its own, as in Spark: the largest event time of that input's rows minus
        its delay, the query's the min (or max) of them.

        Either stream may be the output of stateful steps (an aggregation, a deduplication),
        as in Spark: each input's steps run on its rows of the batch, the last of them in the
        query's output mode (an aggregation's updated keys in update mode, its whole result
        in complete mode), and the batch's rows are the union of both outputs, typed as
        Spark's union types them. Stateful steps may follow it where Spark takes them (after a
        deduplication or an aggregation in append mode)."""
        return self._union("union", other)

    unionAll = union  # noqa: N815 - PySpark's name

    def unionByName(self, other: Any, allowMissingColumns: bool = False) -> StatefulStream:  # noqa: N802,N803
        """The rows of both streams by column name, as ``DataFrame.unionByName`` (see union)."""
        return self._union("unionByName", other, allowMissingColumns=allowMissingColumns)

    def _union(self, method: str, other: Any, **kwargs: Any) -> StatefulStream:
        right = other if isinstance(other, StatefulStream) else None
        other_df = right.df if right is not None else other
        if self.steps or (right is not None and right.steps):
            return self._union_after(method, other, kwargs)
        out = getattr(self.df, method)(other_df, **kwargs)
        if right is None and isinstance(other_df, DataFrame) and other_df.isStreaming:
            right = stream(other_df)
        if right is None or not (self.watermarks or right.watermarks or self.own_times):
            return dataclasses.replace(self, df=out, timed=None)
        count = len(self.watermarks) + len(right.watermarks)
        left_times = self._times_in_union(0, count)
        right_times = right._times_in_union(len(self.watermarks), count)
        times = None
        if left_times is not None and right_times is not None:
            times = getattr(left_times, method)(right_times, **kwargs)
        return StatefulStream(
            out,
            watermarks=(*self.watermarks, *right.watermarks),
            own_times=True,
            input_times=times,
            event_time_at=len(self.watermarks) - 1 if self.watermarks else -1,
        )

    def _union_after(self, method: str, other: Any, kwargs: dict[str, Any]) -> StatefulStream:
        """A union of which an input has stateful steps: each input's steps run on its rows,
        in the same batch, and the batch's rows are the union of both outputs
        (engine/plan/union.py)."""
        if isinstance(other, DataFrame):
            refused = union_of_batch(self._output, other)
            if refused is not None:
                raise refused
            other = stream(other)
        if not isinstance(other, StatefulStream):
            _ = getattr(self._output, method)(other, **kwargs)  # PySpark's error of the type
        inputs = []
        for name, side in (("left", self), ("right", other)):
            if side.own_times or len(side.watermarks) > 1:
                msg = (
                    f"{method}(): the {name} input has several watermarks (a union of streams "
                    "with a watermark, or watermarks on two columns); a union of it after "
                    "stateful steps is not supported yet"
                )
                raise ConfigurationError(msg)
            inputs.append(UnionInput(side._with_watermarks(), side.steps, side.watermark))
        # Spark's analysis of the union (the number of columns, their types and names): its
        # errors here, where Spark raises them
        _ = getattr(self._output, method)(other._output, **kwargs).schema
        plan, source, watermarks, timed = union_after(inputs[0], inputs[1], method, kwargs)
        return StatefulStream(
            source,
            (UnionStep(plan),),
            watermarks,
            own_times=timed is not None,
            input_times=timed,
        )

    def _times_in_union(self, first: int, count: int) -> DataFrame | None:
        """The stream's rows as an input of a union of ``count`` watermarks, its own numbered
        from ``first``: ``df`` with the column of each (:func:`input_time_column`), the others'
        null; None where its event time cannot be carried."""
        own = range(first, first + len(self.watermarks))
        if self.own_times:
            if self.input_times is None:
                return None
            times = self.input_times
            for i in reversed(range(len(self.watermarks))):  # no name taken before it is freed
                times = times.withColumnRenamed(input_time_column(i), input_time_column(first + i))
        elif self.watermark is not None:
            found = with_input_times(
                self.df, self.watermark.column, own, self.timed, EVENT_TIME_CARRIER
            )
            if found is None:
                return None
            times = found
        else:
            times = self.df
        others = {input_time_column(i): null_time() for i in range(count) if i not in own}
        times = times.withColumns(others)
        names = [*self.df.columns, *(input_time_column(i) for i in range(count))]
        return times.select(*[quote(name) for name in names])

    def withWatermark(self, eventTime: str, delayThreshold: str) -> StatefulStream:  # noqa: N802,N803
        """Track ``eventTime``'s watermark: its largest value seen minus ``delayThreshold``.

        The input gets Spark's own ``withWatermark`` here, where the query declares it (as a
        watermark declared before wrapping): a later projection of the column into a
        ``window()`` keeps it on the window, which is how Spark's join finds a side's watermark
        on a window key."""
        if self.steps:
            msg = "call withWatermark() before groupBy()/dropDuplicates(), on the input stream"
            raise ConfigurationError(msg)
        eventTime = _column_named(self.df, eventTime)  # noqa: N806 - PySpark's name
        if eventTime not in self.df.columns:
            msg = f"withWatermark: no column {eventTime!r}; the stream has {self.df.columns}"
            raise ConfigurationError(msg)
        parse_delay_ms(delayThreshold)
        spec = WatermarkSpec(eventTime, delayThreshold)
        marked = self.df.withWatermark(eventTime, delayThreshold)
        times = self.input_times
        own = self.own_times or any(w.column != eventTime for w in self.watermarks)
        if own and not self.own_times and self.watermark is not None:  # a second column
            times = with_input_times(
                self.df,
                self.watermark.column,
                range(len(self.watermarks)),
                self.timed,
                EVENT_TIME_CARRIER,
            )
        if times is not None:  # this watermark reads every row of the stream
            times = times.withWatermark(eventTime, delayThreshold).withColumn(
                input_time_column(len(self.watermarks)), quote(eventTime)
            )
        return dataclasses.replace(
            self,
            df=marked,
            watermarks=(*self.watermarks, spec),
            own_times=own,
            input_times=times,
            timed=None if own else self.timed,
            event_time_at=-1,
        )

    def groupBy(self, *cols: Any) -> GroupedStream[StatefulStream]:  # noqa: N802 - PySpark's name
        """Group by column names or ``Column`` expressions, then ``.agg(...)``."""
        if len(cols) == 1 and isinstance(cols[0], list | tuple):
            cols = tuple(cols[0])
        return GroupedStream(self, tuple(cols))

    groupby = groupBy

    def agg(self, *exprs: Any) -> StatefulStream:
        """An aggregation of the whole stream, as ``DataFrame.agg``: ``groupBy().agg(*exprs)``."""
        return self.groupBy().agg(*exprs)

    def dropDuplicates(self, subset: list[str] | None = None) -> StatefulStream:  # noqa: N802
        """Keep the first row of every distinct ``subset`` (all columns if None)."""
        cols = tuple(subset) if subset else None
        return dataclasses.replace(self, steps=(*self.steps, DedupStep(cols)))

    drop_duplicates = dropDuplicates

    def dropDuplicatesWithinWatermark(  # noqa: N802 - PySpark's name
        self, subset: list[str] | None = None
    ) -> StatefulStream:
        """Keep the first row of every distinct ``subset`` (all columns if None), and drop the
        key's later rows until the watermark passes that row's event time plus the delay."""
        cols = tuple(subset) if subset else None
        return dataclasses.replace(self, steps=(*self.steps, DedupStep(cols, True)))

    drop_duplicates_within_watermark = dropDuplicatesWithinWatermark

    def join(self, other: Any, on: Any = None, how: str | None = None) -> StatefulStream:
        """A stream-stream join, as PySpark's ``DataFrame.join``: ``other`` a stream or a
        streaming DataFrame, ``on`` a Column condition, a SQL string or column names, ``how``
        any of PySpark's spellings of inner, left/right/full outer and left semi. Both sides'
        rows wait in state until their watermarks (Spark's state watermarks, from the
        condition's time range) say they can no longer match.

        Either side may be the output of stateful steps (a deduplication, an aggregation in
        append mode), as in Spark 4: wrap that side's input in ``ss.stream()`` too.

        ``other`` a static (batch) DataFrame: a stream-static join, which Spark evaluates,
        before the stateful steps on the input, after them on each batch's output."""
        if isinstance(other, DataFrame) and not other.isStreaming:
            return self._stateless("join", other, on, how)
        if self.own_times or (isinstance(other, StatefulStream) and other.own_times):
            msg = (
                "join: a side whose watermarks read event times of their own (a union of "
                "streams with a watermark, or watermarks on two columns) is not supported yet"
            )
            raise ConfigurationError(msg)
        if self.steps or (isinstance(other, StatefulStream) and other.steps):
            return self._join_after(other, on, how)
        right = other._with_watermarks() if isinstance(other, StatefulStream) else other
        plan = plan_join(self._with_watermarks(), right, on, how)
        watermarks = tuple(
            WatermarkSpec(column, f"{delay} milliseconds") for _, column, delay in plan.watermarks
        )
        return StatefulStream(plan.union, (JoinStep(plan),), watermarks)

    def _join_after(self, other: Any, on: Any, how: str | None) -> StatefulStream:
        """A join of which a side has stateful steps: each side's steps run first, on its
        rows, in the same batch (engine/plan/join/plan.py, ``plan_join_after``)."""
        right = other if isinstance(other, StatefulStream) else stream(other)
        sides = []
        for name, side in (("left", self), ("right", right)):
            if len(side.watermarks) > 1:
                msg = (
                    f"join: the {name} side has several withWatermark() calls; before a "
                    "stateful step of a join's side, Spark 4 takes one (redefining a watermark "
                    "is disallowed with several stateful operators)"
                )
                raise ConfigurationError(msg)
            sides.append(JoinInput(side._with_watermarks(), side.steps, side.watermark))
        plan, source, watermarks = plan_join_after(sides[0], sides[1], on, how, plan_chain)
        return StatefulStream(source, (JoinStep(plan),), watermarks)

    def _with_watermarks(self) -> DataFrame:
        """The input with this stream's watermarks on it as Spark records them: those declared
        on the DataFrame or on the stream are there already (a column projected away since
        passed its watermark on to what was made of it)."""
        df = self.df
        if self.own_times:  # each input's are on its own rows, under the union
            return df
        for spec in self.watermarks:
            if spec.column in df.columns and WATERMARK_DELAY_KEY not in (
                df.schema[spec.column].metadata or {}
            ):
                df = df.withWatermark(spec.column, spec.delay)
        return df

    def limit(self, num: int) -> StatefulStream:
        """At most ``num`` rows, as Spark's streaming limit: in append mode over the whole life
        of the query (the count kept in state, so a restart goes on from it); right after an
        aggregation in complete mode, the first ``num`` rows of each batch's result."""
        return dataclasses.replace(self, steps=(*self.steps, LimitStep(num)))

    # --- stateless steps (PySpark's DataFrame methods) --------------------------------------------
    #
    # Before the first stateful step they go to the input DataFrame as they are; after one, to its
    # output in every batch, before the next stateful step or the sink (engine/plan/chain.py).

    def _stateless(self, method: str, *args: Any, **kwargs: Any) -> StatefulStream:
        if not self.steps:
            out = getattr(self.df, method)(*args, **kwargs)
            if self.own_times:
                times = self._times_after(method, args, kwargs)
                return dataclasses.replace(self, df=out, input_times=times, timed=None)
            timed = self._timed_after(out, method, args, kwargs)
            return dataclasses.replace(self, df=out, timed=timed)
        step = StatelessStep(method, args, tuple(kwargs.items()))
        return dataclasses.replace(self, steps=(*self.steps, step))

    def _times_after(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> DataFrame | None:
        """:attr:`input_times` after ``method``: each input's event time carried through it
        (a projection gets their columns too); None where they cannot be carried."""
        if self.input_times is None:
            return None
        columns = [input_time_column(i) for i in range(len(self.watermarks))]
        try:
            times = getattr(self.input_times, method)(*args, **kwargs)
            if method in ("select", "selectExpr") and not set(columns) <= set(times.columns):
                cols = args[0] if len(args) == 1 and isinstance(args[0], list) else args
                times = getattr(self.input_times, method)(*cols, *columns)
        except Exception:  # noqa: BLE001 - a step that cannot take the columns
            return None
        return times if set(columns) <= set(times.columns) else None

    def _timed_after(
        self, out: DataFrame, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> DataFrame | None:
        """:attr:`timed` after ``method`` (``out`` being ``df`` after it): the event time carried
        through a projection that drops the watermark's column; None where nothing dropped it,
        or where it cannot be carried."""
        wm = self.watermark
        base = self.timed
        if base is None:
            if wm is None or wm.column not in self.df.columns or _kept(wm.column, self.df, out):
                return None
            base = self.df.withColumn(EVENT_TIME_CARRIER, quote(wm.column))
        try:
            timed = getattr(base, method)(*args, **kwargs)
            if EVENT_TIME_CARRIER not in timed.columns and method in ("select", "selectExpr"):
                cols = args[0] if len(args) == 1 and isinstance(args[0], list) else args
                timed = getattr(base, method)(*cols, EVENT_TIME_CARRIER)
        except Exception:  # noqa: BLE001 - a step that cannot take the column (a union)
            return None
        return timed if EVENT_TIME_CARRIER in timed.columns else None

    def select(self, *cols: Any) -> StatefulStream:
        return self._stateless("select", *cols)

    def selectExpr(self, *expr: str) -> StatefulStream:  # noqa: N802 - PySpark's name
        return self._stateless("selectExpr", *expr)

    def where(self, condition: Any) -> StatefulStream:
        return self._stateless("where", condition)

    filter = where

    def withColumn(self, colName: str, col: Any) -> StatefulStream:  # noqa: N802,N803
        return self._stateless("withColumn", colName, col)

    def withColumns(self, *colsMap: Any) -> StatefulStream:  # noqa: N802,N803
        return self._stateless("withColumns", *colsMap)

    def withColumnRenamed(self, existing: str, new: str) -> StatefulStream:  # noqa: N802
        return self._stateless("withColumnRenamed", existing, new)

    def withColumnsRenamed(self, colsMap: dict[str, str]) -> StatefulStream:  # noqa: N802,N803
        return self._stateless("withColumnsRenamed", colsMap)

    def drop(self, *cols: Any) -> StatefulStream:
        return self._stateless("drop", *cols)

    def orderBy(self, *cols: Any, **kwargs: Any) -> StatefulStream:  # noqa: N802
        """Sorting, as in Spark, only after an aggregation in complete output mode."""
        return self._stateless("orderBy", *cols, **kwargs)

    sort = orderBy

    def alias(self, alias: str) -> StatefulStream:
        return self._stateless("alias", alias)

    def toDF(self, *cols: str) -> StatefulStream:  # noqa: N802 - PySpark's name
        return self._stateless("toDF", *cols)

    def hint(self, name: str, *parameters: Any) -> StatefulStream:
        return self._stateless("hint", name, *parameters)

    def dropna(
        self, how: str = "any", thresh: int | None = None, subset: Any = None
    ) -> StatefulStream:
        return self._stateless("dropna", how=how, thresh=thresh, subset=subset)

    def fillna(self, value: Any, subset: Any = None) -> StatefulStream:
        return self._stateless("fillna", value, subset)

    def replace(
        self, to_replace: Any, value: Any = _NO_VALUE, subset: Any = None
    ) -> StatefulStream:
        if value is _NO_VALUE:
            return self._stateless("replace", to_replace, subset=subset)
        return self._stateless("replace", to_replace, value, subset)

    def crossJoin(self, other: DataFrame) -> StatefulStream:  # noqa: N802 - PySpark's name
        """A cross join with a static DataFrame (see :meth:`join`)."""
        return self._stateless("crossJoin", other)

    def withMetadata(self, columnName: str, metadata: dict[str, Any]) -> StatefulStream:  # noqa: N802,N803
        return self._stateless("withMetadata", columnName, metadata)

    def sample(self, *args: Any, **kwargs: Any) -> StatefulStream:
        return self._stateless("sample", *args, **kwargs)

    def repartition(self, numPartitions: Any, *cols: Any) -> StatefulStream:  # noqa: N803
        """Before stateful steps, the input's partitioning (the state's is sparkstate's own:
        ``numPartitions`` and the keys); after them, each batch's output's."""
        return self._stateless("repartition", numPartitions, *cols)

    def repartitionByRange(self, numPartitions: Any, *cols: Any) -> StatefulStream:  # noqa: N802,N803
        return self._stateless("repartitionByRange", numPartitions, *cols)

    def coalesce(self, numPartitions: int) -> StatefulStream:  # noqa: N803
        return self._stateless("coalesce", numPartitions)

    def sortWithinPartitions(self, *cols: Any, **kwargs: Any) -> StatefulStream:  # noqa: N802
        return self._stateless("sortWithinPartitions", *cols, **kwargs)

    def _with_step(self, step: Step) -> StatefulStream:
        """This stream with ``step`` after its steps."""
        return dataclasses.replace(self, steps=(*self.steps, step))

    @property
    def writeStream(self) -> DataStreamWriter:  # noqa: N802 - PySpark's name
        return DataStreamWriter(self)


@dataclasses.dataclass(frozen=True)
class NaFunctions:
    """``stream.na``: PySpark's ``DataFrameNaFunctions`` over a stream."""

    stream: StatefulStream

    def drop(
        self, how: str = "any", thresh: int | None = None, subset: Any = None
    ) -> StatefulStream:
        return self.stream.dropna(how, thresh, subset)

    def fill(self, value: Any, subset: Any = None) -> StatefulStream:
        return self.stream.fillna(value, subset)

    def replace(
        self, to_replace: Any, value: Any = _NO_VALUE, subset: Any = None
    ) -> StatefulStream:
        return self.stream.replace(to_replace, value, subset)


#: What Spark refuses on a streaming DataFrame ("Queries with streaming sources must be executed
#: with writeStream.start()"; ``write``: CALL_ON_STREAMING_DATASET_UNSUPPORTED): the wrapped
#: stream hands them to Spark's streaming DataFrame of its rows, which raises Spark's own error.
SPARK_REFUSES = frozenset(
    {
        "cache",
        "checkpoint",
        "collect",
        "count",
        "first",
        "foreach",
        "foreachPartition",
        "head",
        "inputFiles",
        "isEmpty",
        "localCheckpoint",
        "persist",
        "rdd",
        "show",
        "tail",
        "take",
        "toArrow",
        "toLocalIterator",
        "toPandas",
        "write",
    }
)


def _kept(column: str, before: DataFrame, after: DataFrame) -> bool:
    """Whether ``after`` still has ``before``'s ``column`` (not another column of its name)."""
    if column not in after.columns:
        return False
    return bool(after.schema[column].dataType == before.schema[column].dataType)


def _column_named(df: DataFrame, name: str) -> str:
    """The column of ``df`` that Spark's resolver finds for ``name`` (case aside, unless
    ``spark.sql.caseSensitive``), spelt as ``df`` spells it; ``name`` if it finds none."""
    if name in df.columns:
        return name
    if str(df.sparkSession.conf.get("spark.sql.caseSensitive", "false")).lower() == "true":
        return name
    found = [c for c in df.columns if c.lower() == name.lower()]
    return found[0] if len(found) == 1 else name
