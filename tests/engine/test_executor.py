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
