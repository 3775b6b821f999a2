"""The Spark side of a stateful task: the ``mapInArrow`` function of one operator and batch.

Everything the task does is :func:`sparkstate.runtime.tasks.run_task`; this module only asks
Spark's ``TaskContext`` which partition and attempt it runs as, and records why a task failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark import TaskContext

from sparkstate.engine.user_state import use_spark_errors
from sparkstate.exceptions import QueryError
from sparkstate.runtime.logs import ReportDir
from sparkstate.runtime.records import TaskFailure
from sparkstate.runtime.tasks import Attempt, TaskSpec, run_task

__all__ = ["task_function"]

use_spark_errors()  # this module runs in the Python workers


def _task_identity() -> tuple[int, Attempt]:
    tc = TaskContext.get()
    if tc is None:  # called outside Spark (tests): partition 0
        return 0, Attempt()
    return tc.partitionId(), Attempt(tc.attemptNumber(), tc.taskAttemptId())


def task_function(
    spec: TaskSpec, reports: ReportDir
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one operator in one batch. Its report goes to
    ``reports``, and so does its failure, which Spark brings back to the driver only as text."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition, attempt = _task_identity()
        if partition >= spec.num_partitions:  # a task of a union's stage, numbered across it
            msg = (
                f"operator {spec.op_id} ran as partition {partition} of {spec.num_partitions} "
                "state partitions: its input must be shuffled by its key right before it"
            )
            raise QueryError(msg)
        try:
            yield from run_task(spec, partition, batches, reports, attempt)
        except Exception as exc:
            reports.failed(TaskFailure.of(exc, spec.op_id, partition))
            raise

    return run
