"""The clock source's decision: when the driver's ``clock.json`` asks for a no-data batch."""

from __future__ import annotations

from pathlib import Path

from sparkstate.engine.clock import ClockReader
from sparkstate.runtime.triggers import read_clock, wants_batch, write_clock
from sparkstate.store.files.durable import DurableDir


def test_a_watermark_request_wants_one_batch_after_it() -> None:
    request = {"requested_at_ms": 1_000, "due_ms": None}
    assert wants_batch(request, tick_ms=0, now_ms=1_001)  # the batch that moved the watermark
    assert not wants_batch(request, tick_ms=1_005, now_ms=2_000)  # a later tick served it


def test_a_processing_time_deadline_wants_a_batch_once_passed() -> None:
    request = {"requested_at_ms": None, "due_ms": 5_000}
    assert not wants_batch(request, tick_ms=0, now_ms=4_999)
    assert not wants_batch(request, tick_ms=0, now_ms=5_000)  # Spark: timeout < batch time
    assert wants_batch(request, tick_ms=0, now_ms=5_001)
    assert not wants_batch({}, tick_ms=0, now_ms=10**12)  # nothing asked: an idle query idles


def test_reader_ticks_only_when_asked(tmp_path: Path) -> None:
    directory = DurableDir(str(tmp_path))
    reader = ClockReader(str(tmp_path))
    start = reader.initialOffset()
    assert read_clock(directory) == {}
    assert reader.latestOffset(start, None) == start  # no clock.json yet
    write_clock(directory, {"requested_at_ms": 1, "due_ms": None})
    ticked = reader.latestOffset(start, None)
    assert ticked["tick"] > start["tick"]
    assert reader.latestOffset(ticked, None) == ticked  # served: no second batch
    assert list(reader.partitions(start, ticked)) == []
