"""The task side without Spark: one partition's store, the report, the in-process lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.engine.executor import PROVIDERS, StoreSettings, TaskSpec, run_stateful_task
from sparkstate.exceptions import StoreLockedError
from sparkstate.operators.dedup import Deduplicate
from sparkstate.store import StoreConf

from .conftest import PROVIDERS as PROVIDER_NAMES

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


class Report(list[dict[str, Any]]):
    def add(self, items: list[dict[str, Any]]) -> None:
        self.extend(items)


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
    report = Report()
    out = list(run_stateful_task(spec(tmp_path, provider, 0, {}), iter([rows]), report))
    assert sum(b.num_rows for b in out) == 1
    (first,) = report
    assert first["partition"] == 0 and first["version"] == 1 and first["checkpoint_id"]
    assert first["operator"]["num_rows_updated"] == 1 and first["store"]["num_keys"] == 1
    lineage = {0: first["checkpoint_id"]}
    out = list(run_stateful_task(spec(tmp_path, provider, 1, lineage), iter([rows]), report))
    assert sum(b.num_rows for b in out) == 0  # "a" was seen in batch 0
    assert report[-1]["version"] == 2
    PROVIDERS.close_all()


def test_a_busy_partition_times_out_with_a_clear_error(tmp_path: Path) -> None:
    s = spec(tmp_path, "memory", 0, {})
    key = (s.store.state_root, 0, 0)
    with PROVIDERS.holding(key, 1.0), pytest.raises(StoreLockedError, match="stayed busy"):
        list(run_stateful_task(s, iter([]), Report()))
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
    from sparkstate.engine.executor import commit_empty, needs_every_batch
    from sparkstate.operators.flat_map_groups import FlatMapGroupsWithState

    op = FlatMapGroupsWithState(
        _timeout_counter, SCHEMA, ["k"], "k string, n long", "n long", timeout="ProcessingTime"
    )
    assert needs_every_batch(op) and not needs_every_batch(Deduplicate(SCHEMA, ["k"]))

    def at(batch_id: int, now_ms: int, lineage: dict[int, str | None]) -> TaskSpec:
        base = spec(tmp_path, provider, batch_id, lineage)
        return TaskSpec(**{**base.__dict__, "operator": op, "batch_timestamp_ms": now_ms})

    rows = pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=SCHEMA)
    report = Report()
    out = list(run_stateful_task(at(0, 10_000, {}), iter([rows]), report))
    assert sum(b.num_rows for b in out) == 1
    filled = commit_empty(at(1, 20_000, {0: report[-1]["checkpoint_id"]}), 0)
    assert filled["version"] == 2 and filled["store"]["num_keys"] == 0  # "a" timed out
    assert filled["operator"]["num_output_rows_dropped"] == 1
    assert filled["operator"]["num_rows_removed"] == 1
    PROVIDERS.close_all()
