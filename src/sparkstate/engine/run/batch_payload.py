"""What a batch's stateful tasks read of their batch in a classic session: the *payload*, a Spark
local property that the driver sets on the thread that runs the batch's job.

A stage's task function is made once per run of the query (:mod:`sparkstate.engine.run.batch_plan`),
so what changes from batch to batch (the batch id, the watermarks, each partition's lineage and
owner, whether it is a replay, where the reports go) cannot be in it. Spark hands a job's local
properties to each of its tasks, to PySpark's workers too (``TaskContext.getLocalProperty``);
the foreachBatch thread's py4j calls set them on the JVM thread that submits the job (PySpark's
pinned thread mode). A task without the payload, or with that of another run or batch than
Spark's own ``streaming.sql.batchId`` says, fails rather than guess.
"""

from __future__ import annotations

import json
from typing import Any

from sparkstate.exceptions import QueryError
from sparkstate.runtime.logs import ReportDir
from sparkstate.runtime.tasks import TaskSpec

__all__ = ["PAYLOAD_KEY", "SPARK_BATCH_KEY", "encode", "spec_in_batch"]

#: The local property holding the payload.
PAYLOAD_KEY = "sparkstate.batch"
#: The local property Spark's micro-batch execution sets to the batch it runs.
SPARK_BATCH_KEY = "streaming.sql.batchId"


def encode(run: str, batch_id: int, specs: dict[int, TaskSpec], reports: ReportDir) -> str:
    """The payload of batch ``batch_id`` of run ``run``: each operator's per-batch fields, and
    where every task leaves its report."""
    ops = {str(op): spec.batch_fields() for op, spec in specs.items()}
    body = {"run": run, "batch": batch_id, "reports": reports.uri, "ops": ops}
    return json.dumps(body, separators=(",", ":"))


def spec_in_batch(
    spec: TaskSpec, payload: str | None, spark_batch: str | None
) -> tuple[TaskSpec, ReportDir]:
    """``spec`` (its fixed part) in the batch of ``payload``, and the batch's report directory;
    ``spark_batch``: Spark's ``streaming.sql.batchId`` of the task, if it has one."""
    where = f"operator {spec.op_id}'s task"
    if payload is None:
        msg = (
            f"{where} found no {PAYLOAD_KEY!r} local property, which tells it its batch: the "
            "job that ran it was not started on the thread running the batch (the foreachBatch "
            "thread; a thread a foreachBatch function starts must be a "
            "pyspark.InheritableThread to pass it on)"
        )
        raise QueryError(msg)
    body: dict[str, Any] = json.loads(payload)
    fields = body["ops"].get(str(spec.op_id))
    if body["run"] != spec.run or fields is None:
        msg = f"{where} found the batch payload of another query or run ({body['run']})"
        raise QueryError(msg)
    if spark_batch is not None and int(spark_batch) != body["batch"]:
        msg = (
            f"{where} found the payload of batch {body['batch']} in a job of Spark's batch "
            f"{spark_batch}: a DataFrame of an earlier batch was run again"
        )
        raise QueryError(msg)
    return spec.for_batch(fields), ReportDir(body["reports"])
