"""Which attempt of a stateful task Spark kept, so that its state is the state that counts.

Spark can run one partition's task more than once in a batch: a retry after a failure, and, with
``spark.speculation`` on, a copy of a slow task beside the original. Every attempt that reaches
its commit writes the partition's next version under a checkpoint id of its own and reports it.
Both attempts loaded the same version and read the same rows, but not necessarily in the same
order (a shuffle fetches its blocks in whatever order they arrive), and a user's function need
not be deterministic: where the state depends on order (``first``, ``last``, ``collect_list``,
the row a deduplication keeps, list state), the two versions can differ. The version that counts
must then be the one of the attempt whose output Spark kept.

Spark keeps the output of the first attempt that finishes, and merges the accumulator updates of
that attempt only (for the tasks of the job's last stage, where the stateful tasks run with the
sink's writer). So each task adds its task attempt id to an accumulator as it starts
(:meth:`CountedAttempts.mark`), and the driver keeps, per partition, the report of the attempt
that accumulator holds (:func:`winning_reports`). Where it cannot tell (a Spark Connect session,
which has no accumulators; a stateful stage that feeds another one, whose every successful
attempt is merged), the newest report wins, as before.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark import Accumulator, AccumulatorParam

from sparkstate.engine.spark.session import is_connect
from sparkstate.runtime.records import TaskReport

__all__ = ["CountedAttempts", "winning_reports"]

log = logging.getLogger("sparkstate.engine")

#: (operator, partition, Spark's task attempt id) of one task attempt.
AttemptKey = tuple[int, int, int]


class _Union(AccumulatorParam):  # type: ignore[type-arg]
    """An accumulator of sets of attempts (the union of the tasks' sets)."""

    def zero(self, value: set[AttemptKey]) -> set[AttemptKey]:
        return set()

    def addInPlace(self, value1: set[AttemptKey], value2: set[AttemptKey]) -> set[AttemptKey]:  # noqa: N802 - PySpark's name
        value1 |= value2
        return value1


class CountedAttempts:
    """The task attempts whose results Spark kept in one batch's job (a classic session only).

    Pickles into the tasks as its accumulator; one per query, emptied before each batch.
    """

    def __init__(self, accumulator: Accumulator[set[AttemptKey]]) -> None:
        self._accumulator = accumulator

    @classmethod
    def of(cls, session: Any) -> CountedAttempts | None:
        """For the queries of ``session``; None for a Spark Connect session (no accumulators),
        which is warned about when speculation is on."""
        if not is_connect(session):
            return cls(session.sparkContext.accumulator(set(), _Union()))
        if session.conf.get("spark.speculation", "false").lower() == "true":
            log.warning(
                "spark.speculation is on: under Spark Connect, sparkstate cannot tell which "
                "attempt of a task Spark kept, and keeps the state of the attempt that "
                "committed last. State that depends on the order of rows (first, last, "
                "collect_list, the row a deduplication keeps) may then come from an attempt "
                "whose output Spark discarded."
            )
        return None

    def mark(self, op: int, partition: int, task_attempt_id: int) -> None:
        """In a task: this attempt runs ``partition`` of operator ``op``."""
        self._accumulator.add({(op, partition, task_attempt_id)})

    def start_batch(self) -> None:
        """On the driver, before a batch's job: forget the attempts of the last one."""
        self._accumulator.value = set()

    def kept(self) -> set[AttemptKey]:
        """On the driver, after the job: the attempts whose results Spark kept."""
        return set(self._accumulator.value)


def winning_reports(
    reports: list[TaskReport], kept: set[AttemptKey] | None = None
) -> dict[tuple[int, int], TaskReport]:
    """One report per (operator, partition): the attempt Spark kept (``kept``); where it kept
    none or several, the newest (:meth:`TaskReport.wins_over`)."""
    by_key: dict[tuple[int, int], list[TaskReport]] = {}
    for r in reports:
        by_key.setdefault((r.op, r.partition), []).append(r)
    out: dict[tuple[int, int], TaskReport] = {}
    for key, candidates in by_key.items():
        counted = [r for r in candidates if (r.op, r.partition, r.task_attempt_id) in (kept or ())]
        pool = counted or candidates
        best = pool[0]
        for r in pool[1:]:
            if r.wins_over(best):
                best = r
        if len(candidates) > 1:
            why = {0: "the newest", 1: "the one Spark kept"}.get(
                len(counted), "the newest of those Spark kept"
            )
            log.info(
                "operator %d partition %d: %d attempts committed; the state of task attempt %d "
                "counts (%s)",
                key[0],
                key[1],
                len(candidates),
                best.task_attempt_id,
                why,
            )
        out[key] = best
    return out
