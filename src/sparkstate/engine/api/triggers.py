"""The writer's trigger: its arguments checked by PySpark's own ``trigger``, and the triggers a
wrapped query cannot run, refused at ``start()`` before the checkpoint is touched.

A wrapped query runs micro-batches (``processingTime``, ``once``, ``availableNow``, as Spark
runs them). Spark's continuous processing refuses every stateful operation, so a wrapped query
with a ``continuous`` trigger is refused with Spark's own error: ``foreachBatch``'s, or its
analyzer's for the query as written (``_LEGACY_ERROR_TEMP_3102``, which names the first
operation it refuses). Spark's real-time mode (``realTime``, PySpark 4.3) runs long-lived tasks
sparkstate's micro-batches do not have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame

from sparkstate.engine.run.sinks import FOREACH_BATCH
from sparkstate.engine.spark.errors import SparkAnalysisError
from sparkstate.engine.spark.session import is_connect
from sparkstate.exceptions import ConfigurationError

__all__ = ["check_trigger", "checked_trigger"]

_INSTEAD = "sparkstate runs micro-batches: use processingTime, once or availableNow"


def checked_trigger(df: DataFrame, **trigger: Any) -> dict[str, Any]:
    """The trigger's arguments given (not None), after PySpark's checks and Spark's parsing of
    them on a writer of ``df`` (one trigger, a valid interval), with their errors."""
    given = {k: v for k, v in trigger.items() if v is not None}
    df.writeStream.trigger(**given)
    return given


def check_trigger(
    trigger: dict[str, Any], fmt: str, query: Callable[[], DataFrame], mode: str
) -> None:
    """Refuse a trigger the wrapped query cannot run; ``query()`` gives Spark's plan of the
    query as written (asked for only then), ``fmt`` is the sink's format."""
    if "continuous" in trigger:
        _refuse_continuous(fmt, query(), mode)
    if "realTime" in trigger:
        msg = (
            "trigger(realTime=...): Spark's real-time mode keeps its tasks running between "
            f"batches, and runs its own state operators; {_INSTEAD}"
        )
        raise ConfigurationError(msg)


def _refuse_continuous(fmt: str, query: DataFrame, mode: str) -> None:
    if fmt == FOREACH_BATCH:
        text = "'foreachBatch' is not supported with continuous trigger."
        msg = f"{text} (As in Spark; {_INSTEAD})"
        raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_1195", {"source": FOREACH_BATCH})
    text = "Continuous processing does not support stateful operations."
    if not is_connect(query):
        try:  # Spark's own check of the query, which names the first operation it refuses
            jvm: Any = query.sparkSession._jvm  # noqa: SLF001
            output_mode = jvm.org.apache.spark.sql.catalyst.streaming.InternalOutputModes.apply(
                mode
            )
            checker = jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker
            checker.checkForContinuous(query._jdf.queryExecution().analyzed(), output_mode)  # noqa: SLF001
        except AnalysisException as exc:
            text = str((exc.getMessageParameters() or {}).get("msg", text))
    msg = f"{text} (As in Spark: its continuous processing takes no stateful operation; {_INSTEAD})"
    raise SparkAnalysisError(msg, "_LEGACY_ERROR_TEMP_3102", {"msg": text})
