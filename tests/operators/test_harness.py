"""The Spark-free harness: clocks, watermarks, inputs, inspection, resuming a directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.arbitrary.group_state import GroupState
from sparkstate.operators.arbitrary.processor import StatefulProcessor
from sparkstate.operators.arbitrary.timers import TimerValues
from sparkstate.testing.harness import group_state_harness, processor_harness

from .conftest import PROVIDERS


def total(key: Any, rows: list[Any], state: GroupState) -> list[Any]:
    n = (state.getOption or (0,))[0] + sum(r[1] for r in rows)
    state.update((n,))
    return [(key[0], n, state.getCurrentProcessingTimeMs(), state.getCurrentWatermarkMs())]


def make(**kw: Any) -> Any:
    return group_state_harness(
        total,
        key_columns=["k"],
        output_schema="k string, n long, now long, watermark long",
        state_schema="n long",
        watermark=True,
        **kw,
    )


def test_clock_and_watermark_are_the_tests_to_set() -> None:
    with make(processing_time_ms=1000) as h:
        assert h.run([{"k": "a", "v": 1}]).rows == [{"k": "a", "n": 1, "now": 1000, "watermark": 0}]
        h.advance(500)
        out = h.run([{"k": "a", "v": 2}], watermark_ms=700)
        assert out.rows == [{"k": "a", "n": 3, "now": 1500, "watermark": 700}]
        assert h.run([{"k": "a", "v": 1}]).rows[0]["watermark"] == 700  # it stays


def test_inputs_in_every_form_and_outputs() -> None:
    with make() as h:
        h.run(pd.DataFrame({"k": ["a", "b"], "v": [1, 2]}))
        h.run(pa.table({"k": ["b"], "v": [5]}))
        out = h.run(pa.RecordBatch.from_pylist([{"k": "a", "v": 1}, {"k": "b", "v": 1}]))
        assert out.sorted_rows("n") == [
            {"k": "a", "n": 2, "now": 0, "watermark": 0},
            {"k": "b", "n": 8, "now": 0, "watermark": 0},
        ]
        assert list(out.to_pandas()["n"]) == [2, 8]
        assert h.group_state("b") == (8,) and h.group_state("zz") is None
        with pytest.raises(ConfigurationError, match="list of dicts"):
            h.run("not rows")
        with pytest.raises(ConfigurationError, match="no value state"):
            h.value_state("n", "a")


def test_first_batch_needs_a_schema() -> None:
    with make() as h:
        with pytest.raises(ConfigurationError, match="input schema"):
            h.run()
        with pytest.raises(ConfigurationError, match="no store yet"):
            h.state_rows()


class Count(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0] + len(list(rows))
        self.count.update((n,))
        yield (key[0], n)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_new_harness_resumes_a_directory(provider: str, tmp_path: Path) -> None:
    def harness() -> Any:
        return processor_harness(
            Count(),
            key_columns=["k"],
            output_schema="k string, n long",
            input_schema="k string, v long",
            provider=provider,
            directory=tmp_path,
        )

    with harness() as h:
        h.run([{"k": "a", "v": 1}])
        h.run([{"k": "a", "v": 1}])
    with harness() as h:  # another worker, the same checkpoint: continues at version 2
        assert h.batch_id == 2
        assert h.run([{"k": "a", "v": 1}]).rows == [{"k": "a", "n": 3}]
    assert tmp_path.exists()  # a directory the test gave is not deleted


@pytest.mark.parametrize("kind", ["rows", "pandas", "processor"])
def test_output_larger_than_a_chunk_is_complete(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkstate.operators import grouping

    monkeypatch.setattr(grouping, "OUTPUT_CHUNK", 100)
    n = 600 if kind == "pandas" else 9000  # chunks are checked every 4096 keys

    def f(key: Any, rows: Any, state: GroupState) -> Iterator[Any]:
        if kind == "pandas":
            yield pd.DataFrame({"k": [key[0]], "n": [1]})
        else:
            yield (key[0], 1)

    schema = "k long, v long"
    if kind == "processor":
        h = processor_harness(
            Count(), key_columns=["k"], output_schema="k long, n long", input_schema=schema
        )
    else:
        h = group_state_harness(
            f,
            key_columns=["k"],
            output_schema="k long, n long",
            state_schema="n long",
            pandas=kind == "pandas",
            input_schema=schema,
        )
    with h:
        out = h.run(pa.table({"k": pa.array(range(n), pa.int64()), "v": [0] * n}))
        assert sorted(out.table.column("k").to_pylist()) == list(range(n))
        assert out.metrics.num_output_rows == n
