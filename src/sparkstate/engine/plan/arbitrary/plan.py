"""Planning arbitrary state: ``applyInPandasWithState``, ``flatMapGroupsWithState``,
``transformWithStateInPandas`` and ``transformWithState`` as a stage, checked as Spark checks
them."""

from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.sql.types import StructType

from sparkstate.engine.plan.arbitrary.initial_state import InitialState, plan_initial_state
from sparkstate.engine.plan.arbitrary.user_state import SPARK_GROUP_STATES
from sparkstate.engine.plan.stage import PlanContext, Planned, Stage, StatefulStep
from sparkstate.engine.spark.conf import arrow_batch_limits, state_encoding_format
from sparkstate.engine.spark.schema import (
    arrow_schema,
    output_shape,
    session_time_zone,
    struct_of,
    with_watermark_on,
)
from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.flat_map_groups import (
    ApplyInPandasWithState,
    FlatMapGroupsWithState,
)
from sparkstate.operators.arbitrary.schemas import PickledState
from sparkstate.operators.arbitrary.transform_with_state import TransformWithState
from sparkstate.operators.base import StatefulOperator

__all__ = ["ARBITRARY_FUNCTION_APIS", "PROCESSOR_APIS", "ArbitraryStep", "plan_arbitrary"]

#: The APIs of ``ArbitraryStep`` that run a ``StatefulProcessor``.
PROCESSOR_APIS = ("transformWithStateInPandas", "transformWithState")
#: The APIs of ``ArbitraryStep`` that run a function with a ``GroupState``.
ARBITRARY_FUNCTION_APIS = ("applyInPandasWithState", "flatMapGroupsWithState")


@dataclasses.dataclass(frozen=True)
class ArbitraryStep(StatefulStep):
    """``groupBy(*keys)`` then one of the arbitrary-state APIs.

    ``api`` is ``applyInPandasWithState``, ``flatMapGroupsWithState``,
    ``transformWithStateInPandas`` or ``transformWithState``; ``func`` is the user function or the
    ``StatefulProcessor``; ``timing`` the ``GroupStateTimeout`` or the ``timeMode``.
    """

    api: str
    keys: tuple[Any, ...]
    func: Any
    output_schema: Any
    state_schema: Any
    output_mode: str
    timing: str
    row_format: str = "tuple"
    #: ``initialState`` of the processor APIs.
    initial_state: InitialState | None = None
    #: ``eventTimeColumnName`` of the processor APIs ("" for none).
    output_event_time: str = ""

    def plan(self, at: PlanContext) -> Planned:
        return plan_arbitrary(self, at)

    @property
    def passes_watermark(self) -> bool:
        return self.api in PROCESSOR_APIS

    def check_next(self, step: StatefulStep, mode: str) -> None:
        """After applyInPandasWithState / flatMapGroupsWithState, an aggregation where the step
        is in append mode (Spark's rule; its output has no watermark, so the aggregation's state
        is kept), nothing else here; after transformWithState anything."""
        if self.passes_watermark:
            return
        if not (str(self.output_mode).lower() == "append" and step.is_aggregation):
            msg = (
                f"a stateful step after {self.api} is not supported yet (an aggregation "
                "after its append mode is); make the arbitrary-state step the last one"
            )
            raise ConfigurationError(msg)

    def check_after_aggregation(self, mode: str) -> None:
        if self.api in ARBITRARY_FUNCTION_APIS:
            how = "after" if mode == "append" else "with"
            msg = (
                f"{self.api} in {mode} mode is not supported {how} aggregation on a streaming "
                "DataFrame/Dataset (as in Spark)"
            )
            raise ConfigurationError(msg)

    def complete_mode_refusal(self) -> str | None:
        return f"{self.api} does not support complete output mode (as in Spark); use update"


def plan_arbitrary(step: ArbitraryStep, at: PlanContext) -> Planned:
    """An arbitrary-state step's stage, shuffled by its grouping columns; its output has the
    schema the user gave (the watermark on ``eventTimeColumnName``'s column)."""
    df, event_time, query_mode = at.df, at.event_time, at.output_mode
    api = step.api
    keys = [k for k in step.keys if isinstance(k, str)]
    if len(keys) != len(step.keys) or not keys:
        msg = f"{api}: group by column names (strings), got {list(step.keys)}"
        raise ConfigurationError(msg)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        msg = f"{api}: no grouping column(s) {missing}; the stream has {df.columns}"
        raise ConfigurationError(msg)
    mode = str(step.output_mode).lower()
    if mode not in ("append", "update"):
        msg = f"{api}: outputMode is 'append' or 'update' (as in Spark), not {step.output_mode!r}"
        raise ConfigurationError(msg)
    if at.aggregation_follows and api in ARBITRARY_FUNCTION_APIS:
        # Spark checks the *GroupsWithState operators' mode against the aggregation after them
        # (append only), and the query's mode is the aggregation's.
        if mode != "append":
            msg = (
                f"{api} in {mode} mode is not supported with aggregation on a streaming "
                "DataFrame/Dataset (as in Spark): use outputMode 'append' in it"
            )
            raise ConfigurationError(msg)
    elif query_mode != mode and api in ARBITRARY_FUNCTION_APIS:
        # Spark checks the *GroupsWithState operators' mode against the query's; a
        # transformWithState's outputMode is not checked (any pairing runs).
        msg = (
            f"{api} in {mode} mode is not supported with {query_mode} output mode on a "
            f"streaming DataFrame (as in Spark): use .writeStream.outputMode({mode!r})"
        )
        raise ConfigurationError(msg)
    out_struct = struct_of(step.output_schema, f"{api} outputStructType")
    if step.output_event_time and step.output_event_time in out_struct.names:
        out_struct = with_watermark_on(out_struct, step.output_event_time, at.watermark_delay_ms)
    input_schema = arrow_schema(df.schema)
    event_col = event_time if at.has_event_time else None
    operator: StatefulOperator
    initial = None
    if step.initial_state is not None:
        initial = plan_initial_state(api, df.schema, keys, step.initial_state)
    if api in PROCESSOR_APIS:
        max_records, max_bytes = arrow_batch_limits(df.sparkSession)
        operator = TransformWithState(
            step.func,
            input_schema,
            keys,
            out_struct,
            mode,
            step.timing,
            mode="pandas" if api == "transformWithStateInPandas" else "rows",
            row_format=step.row_format,
            watermark_present=at.watermark_present,
            event_time_column=event_col,
            initial_state_schema=None if initial is None else arrow_schema(initial.struct),
            initial_state_key_columns=None if initial is None else initial.keys,
            initial_state_columns=None if initial is None else initial.columns,
            output_event_time_column=step.output_event_time or None,
            time_zone=session_time_zone(df),
            state_encoding=state_encoding_format(df.sparkSession),
            max_records_per_batch=max_records,
            max_bytes_per_batch=max_bytes,
        )
    else:
        state_struct = step.state_schema
        if not isinstance(state_struct, PickledState):  # sparkstate.PICKLED goes through as is
            state_struct = struct_of(step.state_schema, f"{api} stateStructType")
        cls = ApplyInPandasWithState if api == "applyInPandasWithState" else FlatMapGroupsWithState
        extra = {} if cls is ApplyInPandasWithState else {"row_format": step.row_format}
        operator = cls(
            step.func,
            input_schema,
            keys,
            out_struct,
            state_struct,
            mode,
            step.timing,
            watermark_present=at.watermark_present,
            event_time_column=event_col,
            time_zone=session_time_zone(df),
            state_classes=SPARK_GROUP_STATES,
            **extra,
        )
    add_initial = None if initial is None else initial.add_to
    stage = Stage(at.op_id, operator, out_struct, keys, lambda batch: batch, add_initial)
    stage.key_struct = StructType([df.schema[k] for k in keys])
    return Planned(stage, output_shape(df, out_struct))
