"""Planning a deduplication: ``dropDuplicates(columns)`` and
``dropDuplicatesWithinWatermark(columns)`` as a stage, shuffled by the columns compared."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from pyspark.sql.types import StructType

from sparkstate.engine.plan.stage import PlanContext, Planned, Stage, StatefulStep
from sparkstate.engine.spark.errors import SparkAnalysisError
from sparkstate.engine.spark.schema import arrow_schema, with_watermark
from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.dedup import Deduplicate, DeduplicateWithinWatermark

__all__ = ["DedupStep", "plan_dedup"]


@dataclasses.dataclass(frozen=True)
class DedupStep(StatefulStep):
    """``dropDuplicates(columns)`` or ``dropDuplicatesWithinWatermark(columns)``; None means
    every column."""

    columns: tuple[str, ...] | None
    within_watermark: bool = False
    carried_watermark_in: ClassVar[bool] = True
    one_event_time: ClassVar[bool] = True

    @property
    def api(self) -> str:
        return "dropDuplicatesWithinWatermark" if self.within_watermark else "dropDuplicates"

    def plan(self, at: PlanContext) -> Planned:
        return plan_dedup(self, at)


def plan_dedup(step: DedupStep, at: PlanContext) -> Planned:
    """The deduplication's stage; its output is its input's rows, so its shape is the input's
    (with the query's watermark, where the steps after it find the event time)."""
    df, event_time, delay_ms = at.df, at.event_time, at.watermark_delay_ms
    columns = list(step.columns) if step.columns else list(df.columns)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        msg = f"{step.api}: no column(s) {missing}; the stream has {df.columns}"
        raise ConfigurationError(msg)
    _ = df.dropDuplicates(columns).schema  # what Spark's analyzer refuses (a map) fails as there
    schema = arrow_schema(df.schema)
    operator: Deduplicate
    if step.within_watermark:
        if event_time is None or not at.has_event_time or delay_ms is None:
            text = (
                "dropDuplicatesWithinWatermark is not supported on streaming DataFrames/DataSets "
                "without watermark"
            )
            msg = f"{text} (as in Spark): call withWatermark() on the input first"
            raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_3102", {"msg": text})
        operator = DeduplicateWithinWatermark(
            schema, columns, event_time=event_time, delay_ms=delay_ms
        )
    else:
        operator = Deduplicate(
            schema,
            columns,
            event_time=event_time if at.has_event_time else None,
            no_data_batches=at.watermark_present,
        )
    # Downstream steps find the event time as Spark's analyzer does, by the column's metadata.
    planned = with_watermark(df, event_time, delay_ms)
    stage = Stage(at.op_id, operator, df.schema, columns, lambda batch: batch)
    stage.key_struct = StructType([df.schema[c] for c in columns])
    return Planned(stage, planned)
