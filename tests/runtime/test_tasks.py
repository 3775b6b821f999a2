"""The task side without Spark: one partition's store, the report, the in-process lock."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.exceptions import StoreLockedError
from sparkstate.operators.arbitrary.flat_map_groups import FlatMapGroupsWithState
from sparkstate.operators.dedup import Deduplicate
from sparkstate.runtime.providers import PROVIDERS, StoreSettings
from sparkstate.runtime.records import TaskReport
from sparkstate.runtime.tasks import TaskSpec, commit_untouched, run_task
from sparkstate.store import StoreConf, provider_class

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
PROVIDER_NAMES = ["memory"]
try:
    provider_class("rocksdb")
    PROVIDER_NAMES.append("rocksdb")
except Exception:  # noqa: BLE001 - any import problem means "not available"
    pass


def spec(tmp_path: Path, provider: str, batch_id: int, lineage: dict[int, str | None]) -> TaskSpec:
    conf = StoreConf(local_dir=str(tmp_path / "local"), lock_timeout_s=0.2)
    return TaskSpec(
        op_id=0,
        operator=Deduplicate(SCHEMA, ["k"]),
        batch_id=batch_id,
        output_mode="append",
        watermark_ms=0,
        batch_timestamp_ms=0,
        num_partitions=1,
        store=StoreSettings(str(tmp_path / "state"), provider, conf, maintenance_interval_s=0),
        lineage=lineage,
    )


@pytest.mark.parametrize("provider", PROVIDER_NAMES)
def test_task_commits_reports_and_follows_the_lineage(tmp_path: Path, provider: str) -> None:
    rows = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}, {"k": "a", "v": 2}], schema=SCHEMA)
    report: list[TaskReport] = []
    out = list(run_task(spec(tmp_path, provider, 0, {}), 0, iter([rows]), report.append))
    assert sum(b.num_rows for b in out) == 1
    (first,) = report
    assert first.partition == 0 and first.version == 1 and first.checkpoint_id
    assert first.operator.num_rows_updated == 1 and first.store.num_keys == 1
    assert TaskReport.from_json(first.to_json()) == first  # travels as JSON unchanged
    lineage = {0: first.checkpoint_id}
    out = list(run_task(spec(tmp_path, provider, 1, lineage), 0, iter([rows]), report.append))
    assert sum(b.num_rows for b in out) == 0  # "a" was seen in batch 0
    assert report[-1].version == 2
    PROVIDERS.close_all()


def test_a_replay_reports_nothing_and_changes_nothing(tmp_path: Path) -> None:
    rows = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=SCHEMA)
    report: list[TaskReport] = []
    list(run_task(spec(tmp_path, "memory", 0, {}), 0, iter([rows]), report.append))
    replay = TaskSpec(**{**spec(tmp_path, "memory", 0, {}).__dict__, "replay": True})
    out = list(run_task(replay, 0, iter([rows]), report.append))
    assert sum(b.num_rows for b in out) == 1  # the same output again
    assert len(report) == 1
    provider = replay.provider(0)
    assert provider.latest_version() == 1
    PROVIDERS.close_all()


@pytest.mark.parametrize("provider", PROVIDER_NAMES)
def test_each_run_of_the_query_gets_providers_of_its_own(tmp_path: Path, provider: str) -> None:
    """A restart in the same process may bring new schemas: its tasks never get the provider
    the run before made (Spark's StateStoreProviderId carries the run id the same way)."""
    rows = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=SCHEMA)
    report: list[TaskReport] = []
    first = dataclasses.replace(spec(tmp_path, provider, 0, {}), run="run-1")
    list(run_task(first, 0, iter([rows]), report.append))
    with PROVIDERS.holding(first.key(0), 1.0):
        kept = first.provider(0)
        assert first.provider(0) is kept  # the same run: the same provider, state kept open
    lineage = {0: report[-1].checkpoint_id}
    second = dataclasses.replace(spec(tmp_path, provider, 1, lineage), run="run-2")
    out = list(run_task(second, 0, iter([rows]), report.append))
    with PROVIDERS.holding(second.key(0), 1.0):
        assert second.provider(0) is not kept
    assert sum(b.num_rows for b in out) == 0  # the new run's provider found "a" in state
    assert report[-1].version == 2
    PROVIDERS.close_all()


def test_a_busy_partition_times_out_with_a_clear_error(tmp_path: Path) -> None:
    s = spec(tmp_path, "memory", 0, {})
    with PROVIDERS.holding(s.key(0), 1.0), pytest.raises(StoreLockedError, match="stayed busy"):
        list(run_task(s, 0, iter([]), lambda r: None))
    PROVIDERS.close_all()


def _timeout_counter(key: tuple[Any, ...], rows: list[Any], state: Any) -> Any:
    if state.hasTimedOut:
        state.remove()
        return [(key[0], -1)]
    state.update((len(rows),))
    state.setTimeoutDuration(1000)
    return [(key[0], len(rows))]


@pytest.mark.parametrize("provider", PROVIDER_NAMES)
def test_catch_up_commit_runs_the_timeout_pass(tmp_path: Path, provider: str) -> None:
    """A partition Spark ran no task for still times its keys out (its output is dropped)."""
    op = FlatMapGroupsWithState(
        _timeout_counter, SCHEMA, ["k"], "k string, n long", "n long", timeout="ProcessingTime"
    )
    assert op.time_trigger() and not Deduplicate(SCHEMA, ["k"]).time_trigger()

    def at(batch_id: int, now_ms: int, lineage: dict[int, str | None]) -> TaskSpec:
        base = spec(tmp_path, provider, batch_id, lineage)
        return TaskSpec(**{**base.__dict__, "operator": op, "batch_timestamp_ms": now_ms})

    rows = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=SCHEMA)
    report: list[TaskReport] = []
    out = list(run_task(at(0, 10_000, {}), 0, iter([rows]), report.append))
    assert sum(b.num_rows for b in out) == 1
    filled = commit_untouched(at(1, 20_000, {0: report[-1].checkpoint_id}), 0)
    assert filled.version == 2 and filled.operator.num_rows_total == 0  # "a" timed out
    assert filled.num_output_rows_dropped == 1
    assert filled.operator.num_rows_removed == 1
    PROVIDERS.close_all()


@pytest.mark.parametrize("provider", PROVIDER_NAMES)
def test_catch_up_commit_of_an_untimed_operator_keeps_the_state(
    tmp_path: Path, provider: str
) -> None:
    rows = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=SCHEMA)
    report: list[TaskReport] = []
    list(run_task(spec(tmp_path, provider, 0, {}), 0, iter([rows]), report.append))
    filled = commit_untouched(spec(tmp_path, provider, 1, {0: report[-1].checkpoint_id}), 0)
    assert filled.version == 2 and filled.store.num_keys == 1
    assert filled.num_output_rows_dropped == 0
    PROVIDERS.close_all()
