"""The clock source's decision: when the driver's ``clock.json`` asks for a no-data batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkstate.engine.spark.clock import ClockReader
from sparkstate.files.durable import DurableDir
from sparkstate.runtime.triggers import read_clock, wants_batch, write_clock

#: In the compatibility suite (scripts/compat).
pytestmark = pytest.mark.versions


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
    reader = ClockReader(str(tmp_path), str(tmp_path / "spark"))
    start = reader.initialOffset()
    assert read_clock(directory) == {}
    assert reader.latestOffset(start, None) == start  # no clock.json yet
    write_clock(directory, {"requested_at_ms": 1, "due_ms": None})
    ticked = reader.latestOffset(start, None)
    assert ticked["tick"] > start["tick"]
    assert reader.latestOffset(ticked, None) == ticked  # served: no second batch
    assert list(reader.partitions(start, ticked)) == []


def test_without_a_start_the_reader_goes_on_from_sparks_offset_log(tmp_path: Path) -> None:
    """PySpark 4.0 and 4.1 ask for the latest offset without the start: a new reader (a
    restart) takes the clock's offset of Spark's newest batch, then the one it answered."""
    engine, spark = DurableDir(str(tmp_path / "engine")), tmp_path / "spark"
    assert ClockReader(engine.uri, str(spark)).latestOffset() == {"tick": 0}  # a new query
    (spark / "offsets").mkdir(parents=True)
    for batch, tick in ((6, 900), (7, 1_000)):
        header = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
        text = f'v1\n{header}\n{{"logOffset":{batch}}}\n{{"tick":{tick}}}'
        (spark / "offsets" / str(batch)).write_text(text)
    reader = ClockReader(engine.uri, str(spark))
    assert reader.latestOffset() == {"tick": 1_000}  # nothing asked: where Spark is
    write_clock(engine, {"requested_at_ms": 1_000, "due_ms": None})
    assert reader.latestOffset() == {"tick": 1_000}  # served by batch 7 already
    write_clock(engine, {"requested_at_ms": 1_001, "due_ms": None})
    ticked = reader.latestOffset()
    assert ticked["tick"] > 1_000
    assert reader.latestOffset() == ticked  # one batch per request
