"""``groupBy(...)`` of a stateful stream, awaiting its aggregates or its arbitrary-state function,
with PySpark's names and arguments."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, Protocol, Self, TypeVar

from pyspark.sql import DataFrame

from sparkstate.engine.plan.aggregate.plan import AggregateStep
from sparkstate.engine.plan.arbitrary.initial_state import initial_state_of
from sparkstate.engine.plan.arbitrary.plan import ARBITRARY_FUNCTION_APIS, ArbitraryStep
from sparkstate.engine.plan.stage import Step
from sparkstate.exceptions import ConfigurationError
from sparkstate.functions import AggregateExpression
from sparkstate.functions import count as count_

__all__ = ["GroupedStream", "column_name_of"]


class _Stream(Protocol):
    """What a grouped stream needs of the stream it groups."""

    @property
    def df(self) -> DataFrame: ...

    def _with_step(self, step: Step) -> Self: ...


S = TypeVar("S", bound=_Stream)


def column_name_of(df: DataFrame, key: Any) -> Any:
    """A grouping ``Column`` that is a plain reference to one of ``df``'s columns, as that
    column's name (as Spark resolves ``groupBy(df["k"])``); anything else as it is."""
    if isinstance(key, str):
        return key
    try:
        name = df.select(key).columns[0]
    except Exception:  # noqa: BLE001 - not a column of df: the planner explains
        return key
    return name if name in df.columns else key


@dataclasses.dataclass(frozen=True)
class GroupedStream(Generic[S]):
    """``groupBy(...)`` awaiting its aggregates."""

    parent: S
    keys: tuple[Any, ...]

    def agg(self, *exprs: AggregateExpression) -> S:
        if len(exprs) == 1 and isinstance(exprs[0], list | tuple):
            exprs = tuple(exprs[0])
        if not exprs:
            msg = "agg() needs at least one aggregate, e.g. SF.count('*')"
            raise ConfigurationError(msg)
        step = AggregateStep(self.keys, tuple(exprs))
        return self.parent._with_step(step)

    def count(self) -> S:
        """Rows per group, in a column named ``count`` (as ``GroupedData.count``)."""
        return self.agg(count_("*").alias("count"))

    # --- arbitrary state (PySpark's names and arguments) ----------------------------------------
    #
    # Grouping keys are column names; an applyInPandasWithState step is the last stateful step
    # (a dropDuplicates before it is fine); a *GroupsWithState operator's outputMode must equal
    # the query's ("append" or "update"), as Spark checks (a processor's is not checked).
    # Schemas are StructTypes or DDL strings.
    #
    # Time: as in Spark, a no-data batch runs after a batch that moved the watermark (event-time
    # timeouts and timers fire there) and when a processing-time timeout or timer comes due on an
    # idle stream (engine/spark/clock.py makes Spark run them). Unlike Spark, an idle query with
    # nothing due runs no batch at all, and a query restarted on its checkpoint fires a pending
    # processing-time timeout or timer when it comes due (Spark runs no no-data batch before the
    # restarted query's first data batch, so it fires them with the next data, unless the stop
    # interrupted a batch that the restart runs again). Every partition runs in every batch (one
    # Spark skipped is caught up by the driver, timeout pass included, its rows dropped).
    #
    # initialState (transformWithState / transformWithStateInPandas): as in Spark, the GroupedData
    # of a batch DataFrame (initial_df.groupBy("key")), grouped by as many columns as the stream,
    # of the same types (a narrower integer or float type is cast up; a streaming initial state,
    # which Spark takes, is refused). handleInitialState runs in the query's first batch only,
    # before the input, for every initial-state row (rows mode) or each key's frame (pandas),
    # keys without input included; a restart from a checkpoint does not apply it again. Spark
    # takes it with every timeMode, and so do we (engine/plan/arbitrary/initial_state.py).
    # eventTimeColumnName: as in Spark, the batch fails when the processor emits a row older than
    # the watermark in that column, and (as Spark 4) a stateful step after this one finds the
    # watermark there: a window() of it, or a dropDuplicates over it, closes by the watermark.
    # After applyInPandasWithState / flatMapGroupsWithState no stateful step is supported.

    def _arbitrary(self, step: ArbitraryStep) -> S:
        if not callable(step.func) and step.api in ARBITRARY_FUNCTION_APIS:
            msg = f"{step.api}: func must be callable, got {step.func!r}"
            raise ConfigurationError(msg)
        keys = tuple(column_name_of(self.parent.df, k) for k in step.keys)
        step = dataclasses.replace(step, keys=keys)
        return self.parent._with_step(step)

    def applyInPandasWithState(  # noqa: N802 - PySpark's names
        self,
        func: Callable[..., Any],
        outputStructType: Any,  # noqa: N803
        stateStructType: Any,  # noqa: N803
        outputMode: str,  # noqa: N803
        timeoutConf: str,  # noqa: N803
    ) -> S:
        """As ``GroupedData.applyInPandasWithState``: ``func(key, pdf_iter, state)`` returns an
        iterator of pandas DataFrames; ``state`` is a :class:`sparkstate.GroupState`."""
        return self._arbitrary(
            ArbitraryStep(
                "applyInPandasWithState",
                self.keys,
                func,
                outputStructType,
                stateStructType,
                outputMode,
                timeoutConf,
            )
        )

    def flatMapGroupsWithState(  # noqa: N802
        self,
        func: Callable[..., Any],
        outputStructType: Any,  # noqa: N803
        stateStructType: Any,  # noqa: N803
        outputMode: str,  # noqa: N803
        timeoutConf: str,  # noqa: N803
        rowFormat: str = "tuple",  # noqa: N803
    ) -> S:
        """The fast row-based variant: ``func(key, rows, state)`` gets the key's rows as a list
        (tuples, or ``rowFormat`` "dict" / "row") and returns an iterable of output rows (tuples,
        dicts or Rows). Same arguments and ``GroupState`` as ``applyInPandasWithState``."""
        return self._arbitrary(
            ArbitraryStep(
                "flatMapGroupsWithState",
                self.keys,
                func,
                outputStructType,
                stateStructType,
                outputMode,
                timeoutConf,
                rowFormat,
            )
        )

    def transformWithStateInPandas(  # noqa: N802
        self,
        statefulProcessor: Any,  # noqa: N803
        outputStructType: Any,  # noqa: N803
        outputMode: str,  # noqa: N803
        timeMode: str,  # noqa: N803
        initialState: Any = None,  # noqa: N803
        eventTimeColumnName: str = "",  # noqa: N803
    ) -> S:
        """As ``GroupedData.transformWithStateInPandas``: a ``StatefulProcessor`` whose
        ``handleInputRows`` gets an iterator of pandas DataFrames."""
        return self._processor(
            "transformWithStateInPandas",
            statefulProcessor,
            outputStructType,
            outputMode,
            timeMode,
            initialState,
            eventTimeColumnName,
            "row",
        )

    def transformWithState(  # noqa: N802
        self,
        statefulProcessor: Any,  # noqa: N803
        outputStructType: Any,  # noqa: N803
        outputMode: str,  # noqa: N803
        timeMode: str,  # noqa: N803
        initialState: Any = None,  # noqa: N803
        eventTimeColumnName: str = "",  # noqa: N803
        rowFormat: str = "row",  # noqa: N803
    ) -> S:
        """As ``GroupedData.transformWithState``: ``handleInputRows`` gets an iterator of Rows
        (``rowFormat="tuple"``: plain tuples, faster) and returns an iterable of rows."""
        return self._processor(
            "transformWithState",
            statefulProcessor,
            outputStructType,
            outputMode,
            timeMode,
            initialState,
            eventTimeColumnName,
            rowFormat,
        )

    def _processor(
        self,
        api: str,
        processor: Any,
        output: Any,
        mode: str,
        time_mode: str,
        initial_state: Any,
        event_time_column: str,
        row_format: str,
    ) -> S:
        if not hasattr(processor, "handleInputRows") or not hasattr(processor, "init"):
            msg = f"{api}: statefulProcessor must be a StatefulProcessor, got {processor!r}"
            raise ConfigurationError(msg)
        initial = None if initial_state is None else initial_state_of(api, initial_state)
        step = ArbitraryStep(
            api,
            self.keys,
            processor,
            output,
            None,
            mode,
            time_mode,
            row_format,
            initial,
            event_time_column,
        )
        return self._arbitrary(step)
