"""Which attempt's report counts when a partition committed more than once in a batch: the
attempt Spark kept (its accumulator says), else the newest. The run on a cluster with
speculation is ``tests/cluster/test_speculation.py``; this is the choice itself."""

from __future__ import annotations

from sparkstate.engine.run.attempts import winning_reports
from sparkstate.operators.base import OperatorMetrics
from sparkstate.runtime.records import StoreReport, TaskReport


def _report(partition: int, checkpoint_id: str, task_attempt_id: int) -> TaskReport:
    return TaskReport(
        op=0,
        partition=partition,
        checkpoint_id=checkpoint_id,
        version=3,
        operator=OperatorMetrics(),
        store=StoreReport(),
        task_attempt_id=task_attempt_id,
    )


def test_the_attempt_spark_kept_counts_even_when_another_committed_later() -> None:
    kept, later = _report(1, "18a", 7), _report(1, "18b", 9)
    chosen = winning_reports([later, kept], kept={(0, 1, 7)})
    assert chosen[(0, 1)] is kept


def test_without_word_from_spark_the_newest_counts() -> None:
    older, newer, alone = _report(1, "18a", 7), _report(1, "18b", 9), _report(2, "18c", 8)
    for kept in (None, set(), {(0, 2, 8)}):
        chosen = winning_reports([newer, older, alone], kept=kept)
        assert chosen == {(0, 1): newer, (0, 2): alone}


def test_of_several_attempts_spark_kept_the_newest_counts() -> None:
    # The tasks of a stage that feeds a shuffle: Spark merges every successful attempt's.
    a, b, dropped = _report(1, "18a", 7), _report(1, "18b", 9), _report(1, "18c", 11)
    chosen = winning_reports([a, dropped, b], kept={(0, 1, 7), (0, 1, 9)})
    assert chosen[(0, 1)] is b
