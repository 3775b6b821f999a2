"""Count per key over many distinct keys, twice, through each arbitrary-state API (no Spark).

The workload of ``sparkstate bench arbitrary`` at operator level: every key new in the first batch,
every key seen again in the second. Throughput is measured by the benchmark (against Spark's own
APIs, in the same run), not here; this checks the results and that a task reports where its time
went (``OperatorMetrics.phase_ms``, shown in the progress's ``customMetrics``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sparkstate.operators.arbitrary.group_state import GroupState, GroupStateTimeout
from sparkstate.operators.arbitrary.processor import StatefulProcessor
from sparkstate.operators.arbitrary.timers import TimerValues
from sparkstate.operators.base import OperatorMetrics, Phase, timed_phase
from sparkstate.testing.harness import OperatorHarness, group_state_harness, processor_harness

from .conftest import PROVIDERS

KEYS = 20_000


def count_rows(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
    found = state.getOption
    n = (found[0] if found else 0) + len(rows)
    state.update((n,))
    return [(key[0], n)]


def count_frames(key: Any, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[Any]:
    found = state.getOption
    n = (found[0] if found else 0) + sum(len(f) for f in frames)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "n": [n]})


class Count(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        found = self.count.get()
        n = (found[0] if found else 0) + sum(1 for _ in rows)
        self.count.update((n,))
        return iter([(key[0], n)])


def _systems(schema: pa.Schema, provider: str) -> dict[str, Callable[[], OperatorHarness]]:
    common: dict[str, Any] = {"key_columns": ["k"], "input_schema": schema, "provider": provider}
    return {
        "sparkstate-rows": lambda: group_state_harness(
            count_rows, output_schema="k long, n long", state_schema="n long", **common
        ),
        "sparkstate-aipws": lambda: group_state_harness(
            count_frames,
            output_schema="k long, n long",
            state_schema="n long",
            pandas=True,
            **common,
        ),
        "sparkstate-processor": lambda: processor_harness(
            Count(), output_schema="k long, n long", row_format="tuple", **common
        ),
    }


SYSTEMS = ("sparkstate-aipws", "sparkstate-processor", "sparkstate-rows")
#: Phases every system reports for a batch with input.
INPUT_PHASES = {
    Phase.INPUT_READ,
    Phase.GROUPING,
    Phase.STATE_READ,
    Phase.USER_FUNCTION,
    Phase.STATE_WRITE,
}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("system", SYSTEMS)
def test_count_per_key_over_many_keys(system: str, provider: str) -> None:
    keys = KEYS // 10 if system == "sparkstate-aipws" else KEYS  # a DataFrame per key is slow
    rng = np.random.default_rng(7)
    table = pa.table({"k": rng.permutation(keys).astype("int64"), "v": np.zeros(keys, "int64")})
    with _systems(table.schema, provider)[system]() as h:
        for batch in range(2):  # new keys, then every key again
            out = h.run(table)
            assert out.table.num_rows == keys
            assert sorted(out.table.column("k").to_pylist()) == list(range(keys))
            assert set(out.table.column("n").to_pylist()) == {batch + 1}
            assert set(out.metrics.phase_ms) >= INPUT_PHASES, out.metrics.phase_ms
            assert all(ms >= 0 for ms in out.metrics.phase_ms.values())
        h.restart()
        assert set(h.run(table).table.column("n").to_pylist()) == {3}


def slow_count(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
    time.sleep(0.02)
    return count_rows(key, rows, state)


def test_time_in_the_users_function_is_reported_as_its_phase() -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    with group_state_harness(
        slow_count,
        key_columns=["k"],
        input_schema=schema,
        output_schema="k long, n long",
        state_schema="n long",
        timeout=GroupStateTimeout.ProcessingTimeTimeout,
    ) as h:
        out = h.run([{"k": k, "v": 0} for k in (1, 2, 3)])
    phases = out.metrics.phase_ms
    assert phases[Phase.USER_FUNCTION] >= 60  # three calls of 20 ms
    assert Phase.TIMEOUTS in phases


def test_a_phase_excludes_the_time_its_consumer_takes() -> None:
    metrics = OperatorMetrics()
    for _ in timed_phase(iter(range(2)), metrics, "producing"):
        time.sleep(0.3)
    assert metrics.phase_ms["producing"] < 300  # the consumer took 600


def test_phases_add_up_over_partitions() -> None:
    a, b = OperatorMetrics(phase_ms={"x": 1.5}), OperatorMetrics(phase_ms={"x": 2.0, "y": 1.0})
    total = OperatorMetrics()
    total.merge(a)
    total.merge(b)
    assert total.phase_ms == {"x": 3.5, "y": 1.0}
    assert a.phase_ms == {"x": 1.5}
    assert OperatorMetrics.from_dict(b.to_dict()).phase_ms == b.phase_ms
