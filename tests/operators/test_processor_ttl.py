"""TTL of StatefulProcessor state: expiry on the batch's processing time, invisibility, cleanup."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.operators.arbitrary.processor import StatefulProcessor
from sparkstate.operators.arbitrary.state_errors import (
    InvalidStateValueError,
    UnsupportedStateOperationError,
)
from sparkstate.operators.arbitrary.timers import TimerValues
from sparkstate.testing.harness import processor_harness

from .conftest import PROVIDERS

INPUT = pa.schema([("k", pa.string()), ("v", pa.int64())])
OUTPUT = "k string, last long, events string, words string, flags string"


class Expiring(StatefulProcessor):
    """v > 0 writes everything, v == 0 only reads, v < 0 writes the value without reading it."""

    def init(self, handle: Any) -> None:
        self.last = handle.getValueState("last", "v long", ttlDurationMs=1000)
        self.events = handle.getListState("events", "v long", ttlDurationMs=1000)
        self.words = handle.getMapState("words", "w string", "v long", ttlDurationMs=1000)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        for row in rows:
            if row.v > 0:
                self.last.update((row.v,))
                self.events.appendValue((row.v,))
                self.words.updateValue((f"w{row.v % 2}",), (row.v,))
            elif row.v < 0:
                self.last.update((row.v,))
                return
        last = self.last.get()
        flags = f"{self.last.exists()} {self.events.exists()} {self.words.exists()}"
        yield (
            key[0],
            None if last is None else last[0],
            str([v for (v,) in self.events.get()]),
            str({w: v for (w,), (v,) in self.words.iterator()}),
            flags,
        )


def _run(h: Any, k: str, v: int, now: int) -> dict[str, Any]:
    out = h.run([{"k": k, "v": v}], processing_time_ms=now).rows
    assert len(out) == 1
    row: dict[str, Any] = out[0]
    return row


@pytest.mark.parametrize("provider", PROVIDERS)
def test_values_expire_on_processing_time_and_are_cleaned_up(provider: str) -> None:
    h = processor_harness(
        Expiring(),
        key_columns=["k"],
        output_schema=OUTPUT,
        time_mode="ProcessingTime",
        input_schema=INPUT,
        provider=provider,
    )
    with h:
        h.run([{"k": "a", "v": 1}, {"k": "b", "v": 1}], processing_time_ms=0)
        row = _run(h, "a", 2, 500)
        assert row == {"k": "a", "last": 2, "events": "[1, 2]", "words": "{'w0': 2, 'w1': 1}",
                       "flags": "True True True"}  # fmt: skip
        h.restart()
        # at 1000 everything written at 0 (expiring at 1000) is gone: invisible, then cleaned up
        row = _run(h, "a", 0, 1000)
        assert row == {"k": "a", "last": 2, "events": "[2]", "words": "{'w0': 2}",
                       "flags": "True True True"}  # fmt: skip
        assert h.list_state("events", "a") == [(2,)]
        assert h.map_state("words", "a") == {("w0",): (2,)}
        assert h.value_state("last", "b") is None  # b had no input: cleaned up all the same
        assert set(h.state_rows("events")) == {("a",)}
        assert h.state_rows("$ttl_last") == {(1500, "a"): (True,)}
        row = _run(h, "a", 0, 1500)
        assert row == {"k": "a", "last": None, "events": "[]", "words": "{}",
                       "flags": "False False False"}  # fmt: skip
        for cf in ("last", "events", "words", "$ttl_last", "$ttl_events", "$ttl_words"):
            assert h.state_rows(cf) == {}, cf


def test_an_update_restarts_the_clock_even_without_a_read() -> None:
    h = processor_harness(
        Expiring(),
        key_columns=["k"],
        output_schema=OUTPUT,
        time_mode="ProcessingTime",
        input_schema=INPUT,
    )
    with h:
        h.run([{"k": "c", "v": 1}], processing_time_ms=0)
        assert h.run([{"k": "c", "v": -5}], processing_time_ms=800).rows == []
        assert h.state_rows("$ttl_last") == {(1800, "c"): (True,)}
        assert _run(h, "c", 0, 1200)["last"] == -5
        assert h.value_state("last", "c") == (-5,)


@pytest.mark.parametrize(
    ("time_mode", "ttl", "error"),
    [
        ("None", 1000, UnsupportedStateOperationError),
        ("EventTime", 1000, UnsupportedStateOperationError),
        ("ProcessingTime", -1, InvalidStateValueError),
    ],
)
def test_ttl_needs_processing_time_and_a_positive_duration(
    time_mode: str, ttl: int, error: type[Exception]
) -> None:
    class P(Expiring):
        def init(self, handle: Any) -> None:
            handle.getValueState("last", "v long", ttlDurationMs=ttl)

    with pytest.raises(error, match="TTL"):
        processor_harness(
            P(),
            key_columns=["k"],
            output_schema=OUTPUT,
            time_mode=time_mode,
            input_schema=INPUT,
            watermark=True,
        )


def test_zero_ttl_means_no_ttl() -> None:
    class P(Expiring):
        def init(self, handle: Any) -> None:
            self.last = handle.getValueState("last", "v long", ttlDurationMs=0)

        def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Any:
            self.last.update((1,))
            return iter(())

    h = processor_harness(
        P(), key_columns=["k"], output_schema=OUTPUT, time_mode="ProcessingTime", input_schema=INPUT
    )
    with h:
        h.run([{"k": "a", "v": 1}], processing_time_ms=0)
        h.run(processing_time_ms=10**12)
        assert h.value_state("last", "a") == (1,)
        assert "$ttl_last" not in h.operator.column_families()  # type: ignore[union-attr]
