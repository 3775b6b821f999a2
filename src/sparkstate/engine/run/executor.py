"""The Spark side of a stateful task: the ``mapInArrow`` function of one operator, made for one
batch or, in a classic session, for every batch of a run (the batch read from the job's payload).

Everything the task does is :func:`sparkstate.runtime.tasks.run_task`; this module only asks
Spark's ``TaskContext`` which partition and attempt it runs as, records why a task failed, and,
with ``state_home`` on, runs the task in the partition's state home instead of the worker
(:mod:`sparkstate.runtime.home_client`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import os
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pyarrow as pa
from pyspark import TaskContext, cloudpickle

from sparkstate.engine.plan.arbitrary.user_state import use_spark_errors
from sparkstate.engine.run.attempts import CountedAttempts
from sparkstate.engine.run.batch_payload import PAYLOAD_KEY, SPARK_BATCH_KEY, spec_in_batch
from sparkstate.exceptions import QueryError, StateHomeError
from sparkstate.runtime import home_client
from sparkstate.runtime.home import HomeTask, ProcessRef, executor_identity, release_free_memory
from sparkstate.runtime.home_channel import Channel, Credentials
from sparkstate.runtime.logs import ReportDir
from sparkstate.runtime.providers import PROVIDERS
from sparkstate.runtime.records import TaskFailure, TaskReport
from sparkstate.runtime.tasks import Attempt, TaskSpec, commit_untouched, run_task

__all__ = [
    "commit_untouched_task",
    "own_home",
    "run_in_owner",
    "snapshot_in_owner",
    "task_function",
    "task_function_of_run",
]

log = logging.getLogger("sparkstate.engine")

use_spark_errors()  # this module runs in the Python workers


def _task_identity() -> tuple[int, Attempt]:
    tc = TaskContext.get()
    if tc is None:  # called outside Spark (tests): partition 0
        return 0, Attempt()
    return tc.partitionId(), Attempt(tc.attemptNumber(), tc.taskAttemptId())


def task_function(
    spec: TaskSpec, reports: ReportDir, counted: CountedAttempts | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one operator in one batch. Its report goes to
    ``reports``, and so does its failure, which Spark brings back to the driver only as text;
    each attempt marks itself in ``counted``, which tells the driver the one Spark kept."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from _run(spec, reports, counted, batches)

    return run


def task_function_of_run(
    spec: TaskSpec, counted: CountedAttempts | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of one operator in every batch of a run (a classic session):
    ``spec``'s fixed part, the batch's own and where reports go read from the batch's payload
    (:mod:`sparkstate.engine.run.batch_payload`) when the task runs."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tc = TaskContext.get()
        payload = tc.getLocalProperty(PAYLOAD_KEY) if tc is not None else None
        spark_batch = tc.getLocalProperty(SPARK_BATCH_KEY) if tc is not None else None
        batch_spec, reports = spec_in_batch(spec, payload, spark_batch)
        yield from _run(batch_spec, reports, counted, batches)

    return run


def _run(
    spec: TaskSpec,
    reports: ReportDir,
    counted: CountedAttempts | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    _freeze_imports()
    partition, attempt = _task_identity()
    if counted is not None:
        counted.mark(spec.op_id, partition, attempt.task_attempt_id)
    if partition >= spec.num_partitions:  # a task of a union's stage, numbered across it
        msg = (
            f"operator {spec.op_id} ran as partition {partition} of {spec.num_partitions} "
            "state partitions: its input must be shuffled by its key right before it"
        )
        raise QueryError(msg)
    try:
        sock, home_here = _home(spec, partition)
        if sock is None:
            yield from run_task(spec, partition, batches, reports, attempt)
        else:
            if home_here is not None:
                attempt = dataclasses.replace(attempt, homes_seen=(home_here,))
            context = _task_context_fields()
            job = functools.partial(_task_in_home, spec, partition, reports, attempt, context)
            what = f"partition {partition} of operator {spec.op_id} in batch {spec.batch_id}"
            yield from home_client.run_in_home(
                sock, _dumps(job), batches, what, spec.store.conf.home_timeout_s
            )
            release_free_memory()  # the batches this worker passed on
    except Exception as exc:
        if not getattr(exc, "raised_in_home", False):  # the home recorded that one
            reports.failed(TaskFailure.of(exc, spec.op_id, partition))
        raise


_imports_frozen = False


def _freeze_imports() -> None:
    """Leave the objects this worker holds at its first stateful task (its imports: PySpark,
    pyarrow, pandas, sparkstate) out of every later garbage collection, once per process.

    PySpark's daemon runs a full ``gc.collect()`` in a reused worker after every task, and a
    full collection walks every object of the interpreter: about 50 ms of CPU a task with these
    imports, most of a small batch's Python CPU. Frozen (``gc.freeze``), they are skipped; the
    objects of later tasks are collected as before. What is garbage at the moment of freezing
    is collected first, so nothing the freeze keeps is garbage but the first task's own
    objects in reference cycles, once."""
    global _imports_frozen
    if _imports_frozen:
        return
    _imports_frozen = True
    gc.collect()
    gc.freeze()


def commit_untouched_task(spec: TaskSpec, partition: int) -> TaskReport:
    """:func:`~sparkstate.runtime.tasks.commit_untouched`, in the partition's home if it has one."""
    sock, _ = _home(spec, partition)
    if sock is None:
        return commit_untouched(spec, partition)
    job = functools.partial(_untouched_in_home, spec, partition)
    what = f"partition {partition} of operator {spec.op_id} (untouched) in batch {spec.batch_id}"
    report: TaskReport = _result_in_home(sock, job, what, spec.store.conf.home_timeout_s)
    return report


def run_in_owner(
    spec: TaskSpec, partition: int, batches: Iterator[pa.RecordBatch], reports: ReportDir
) -> Iterator[pa.RecordBatch] | None:
    """The task of ``partition`` run from the driver in the state home that holds the
    partition (``spec.owners``) over ``batches``: its output, or None if that home cannot be
    reached (:mod:`sparkstate.engine.run.direct_batch`)."""
    sock = home_client.connect_owner(spec.owners[partition], _credentials(spec))
    if sock is None:
        return None
    job = functools.partial(_task_in_home, spec, partition, reports, Attempt(), None)
    what = f"partition {partition} of operator {spec.op_id} in batch {spec.batch_id}"
    return home_client.run_in_home(sock, _dumps(job), batches, what, spec.store.conf.home_timeout_s)


def snapshot_in_owner(spec: TaskSpec, partition: int, owner: str) -> bool:
    """Snapshot the partition's newest version in ``owner``, the state home that holds it (a
    query that stops cleanly, from the driver); whether one was written. An owner that cannot
    be reached holds nothing to write."""
    sock = home_client.connect_owner(owner, _credentials(spec))
    if sock is None:
        return False
    job = functools.partial(_snapshot_in_home, spec, partition)
    what = f"the snapshot at stop of partition {partition} of operator {spec.op_id}"
    return bool(_result_in_home(sock, job, what, spec.store.conf.home_timeout_s))


def _result_in_home(sock: Channel, job: Callable[..., Any], what: str, silence_s: float) -> Any:
    """What a job without input or output returns, run in the home at the end of ``sock``."""
    output = home_client.run_in_home(sock, _dumps(job), iter(()), what, silence_s)
    while True:
        try:
            next(output)
        except StopIteration as done:
            return done.value


def _snapshot_in_home(
    spec: TaskSpec, partition: int, task: HomeTask
) -> Generator[pa.RecordBatch, None, bool]:
    return PROVIDERS.snapshot_now(spec.key(partition), spec.store.conf.lock_timeout_s)
    yield  # a generator: the home runs every job as one


def _dumps(job: Callable[..., Any]) -> bytes:
    return cloudpickle.dumps(job)  # type: ignore[no-any-return,no-untyped-call]


def _credentials(spec: TaskSpec) -> Credentials:
    """What this process shows the query's homes (:func:`~sparkstate.runtime.home_client.
    credentials`): the secret when Spark's ``spark.authenticate`` is on."""
    conf = spec.store.conf
    return home_client.credentials(conf.home_auth, conf.home_encrypt)


def _home(spec: TaskSpec, partition: int) -> tuple[Channel | None, tuple[str, str, int] | None]:
    """A connection to the partition's state home, or None: the task runs in this worker; and
    this executor's own home of the slot where the task runs in another executor's (started
    if need be, so that the driver hears of this executor: :mod:`.placement`).

    The home is the partition's owner (the home that committed its last version, maybe on
    another executor) while it can be reached, else this executor's home of its slot: the
    partition moves here, once.
    """
    if not spec.store.conf.state_home:
        return None, None
    executor = home_client.executor_process()
    if executor is None:
        return None, None
    slot = partition % max(1, spec.store.conf.python_workers)
    owner = spec.owners.get(partition)
    credentials = _credentials(spec)
    if owner is not None and owner != home_client.local_address(executor, slot, credentials):
        sock = home_client.connect_owner(owner, credentials)
        if sock is not None:
            return sock, own_home(executor, slot, credentials)
        log.warning(
            "partition %d of operator %d: its state home %s cannot be reached; the partition "
            "moves to this executor",
            partition,
            spec.op_id,
            owner.partition("/")[0],
        )
    return home_client.connect(executor, slot, credentials), None


def own_home(
    executor: ProcessRef, slot: int, credentials: Credentials
) -> tuple[str, str, int] | None:
    """This executor's home of ``slot`` (address, executor, cores), started if need be."""
    address = home_client.local_address(executor, slot, credentials)
    if address is None:
        with contextlib.suppress(StateHomeError, OSError):
            home_client.connect(executor, slot, credentials).close()
        address = home_client.local_address(executor, slot, credentials)
    if address is None:
        return None
    return (address, *executor_identity(executor))


#: The PySpark task context of the job that runs on each thread of a home.
_RUNNING = threading.local()
_PER_THREAD = threading.Lock()
_per_thread_installed = False


def _task_context_fields() -> dict[str, Any] | None:
    """The fields of this worker's PySpark ``TaskContext`` (None outside a task), to give the
    task's job in a home the same context (:func:`_running_task`)."""
    context = TaskContext.get()
    if context is None:
        return None
    return {k: v for k, v in vars(context).items() if k.startswith("_")}


@contextlib.contextmanager
def _running_task(fields: dict[str, Any] | None) -> Iterator[None]:
    """While a task's job runs on this thread of a home, ``TaskContext.get()`` answers the
    worker's context of that task (the partition, the attempt, the local properties...), as it
    does in a Python worker; a home runs the jobs of several tasks at once, one per thread."""
    _task_contexts_per_thread()
    context = None
    if fields is not None:
        context = object.__new__(TaskContext)  # not the process's singleton
        for name, value in fields.items():
            setattr(context, name, value)
    _RUNNING.context = context
    try:
        yield
    finally:
        _RUNNING.context = None


def _task_contexts_per_thread() -> None:
    """Make ``TaskContext.get()`` in this home answer the job running on the calling thread
    (a forked home also forgets the context of the task that started it); once per home."""
    global _per_thread_installed
    with _PER_THREAD:
        if _per_thread_installed:
            return
        TaskContext._setTaskContext(None)
        TaskContext.get = classmethod(  # type: ignore[method-assign,assignment]
            lambda cls: getattr(_RUNNING, "context", None)
        )
        _per_thread_installed = True


def _task_in_home(
    spec: TaskSpec,
    partition: int,
    reports: ReportDir,
    attempt: Attempt,
    context: dict[str, Any] | None,
    task: HomeTask,
) -> Iterator[pa.RecordBatch]:
    """The job a state home runs for a task (pickled by reference: the home imports this), in
    the worker's task context (``context``: what ``TaskContext.get()`` answers the user's
    functions)."""
    seen = ((task.address, task.executor, task.cores), *attempt.homes_seen)
    here = dataclasses.replace(  # reported
        attempt, pid=os.getpid(), home=task.address, homes_seen=seen
    )
    try:
        with _running_task(context):
            yield from run_task(
                spec, partition, task.inputs, reports, here, before_commit=task.ready
            )
    except Exception as exc:
        # Recorded here, where its traceback is whole (the driver raises the first recorded).
        reports.failed(TaskFailure.of(exc, spec.op_id, partition))
        raise


def _untouched_in_home(
    spec: TaskSpec, partition: int, task: HomeTask
) -> Generator[pa.RecordBatch, None, TaskReport]:
    report = commit_untouched(spec, partition)
    # (the home holds the partition's version now: its owner, as a task's report says)
    here = ((task.address, task.executor, task.cores),)
    return dataclasses.replace(report, home=task.address, homes_seen=here)
    yield  # a generator: the home runs every job as one
