"""The deduplication operators: first row per key, across batches, null keys included; with a
watermark, late rows dropped and keys expired by range scans that read only what expires."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.operators.dedup import EXPIRY_CF, Deduplicate, DeduplicateWithinWatermark
from sparkstate.store.families import cf_prefix
from sparkstate.store.versions.versioned import VersionedProvider

from .conftest import OperatorRunner, at, ms

SCHEMA = pa.schema([("k", pa.string()), ("j", pa.int64()), ("v", pa.float64())])
Runner = Callable[[Deduplicate], OperatorRunner]
TIMED = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("v", pa.string())])
KEPT = 5_000  # keys the watermark leaves alone: a full scan would read all of them
EXPIRED = 7


def timed(ids: range, seconds: float | None, v: str = "") -> list[dict[str, Any]]:
    return [{"id": i, "ts": None if seconds is None else at(seconds), "v": v} for i in ids]


def test_first_row_per_key_across_batches(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(SCHEMA, ["k", "j"]))
    out, m = runner.run(
        [
            {"k": "a", "j": 1, "v": 1.0},
            {"k": "a", "j": 1, "v": 2.0},
            {"k": None, "j": 1, "v": 3.0},
            {"k": None, "j": 1, "v": 4.0},
            {"k": "a", "j": None, "v": 5.0},
        ],
        "append",
    )
    assert [r["v"] for r in out.to_pylist()] == [1.0, 3.0, 5.0]
    assert m.num_input_rows == 5 and m.num_rows_updated == 3 and m.num_output_rows == 3
    out, m = runner.run(
        [
            {"k": "a", "j": 1, "v": 9.0},
            {"k": "b", "j": 1, "v": 6.0},
            {"k": None, "j": None, "v": 7.0},
        ],
        "append",
    )
    assert [r["v"] for r in out.to_pylist()] == [6.0, 7.0]
    out, _ = runner.run([], "append")
    assert out.num_rows == 0


def test_all_columns_when_none_given(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(SCHEMA, []))
    rows = [
        {"k": "a", "j": 1, "v": 1.0},
        {"k": "a", "j": 1, "v": 1.0},
        {"k": "a", "j": 1, "v": 2.0},
    ]
    out, _ = runner.run(rows, "update")
    assert out.num_rows == 2


def test_unknown_column_and_complete_mode_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="no column"):
        Deduplicate(SCHEMA, ["nope"])
    with pytest.raises(ConfigurationError, match="complete"):
        Deduplicate(SCHEMA, ["k"]).check_output_mode("complete")


def test_first_rows_of_interleaved_keys_in_input_order(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(SCHEMA, ["j"]))
    js = [3, 1, 3, 2, 1, 4, 2, 5]
    out, m = runner.run([{"k": "x", "j": j, "v": float(i)} for i, j in enumerate(js)], "append")
    assert [(r["j"], r["v"]) for r in out.to_pylist()] == [
        (3, 0.0),
        (1, 1.0),
        (2, 3.0),
        (4, 5.0),
        (5, 7.0),
    ]
    assert m.num_rows_updated == 5
    out, m = runner.run([{"k": "y", "j": j, "v": -1.0} for j in (5, 6, 6, 1, 7)], "append")
    assert [(r["j"], r["v"]) for r in out.to_pylist()] == [(6, -1.0), (7, -1.0)]
    assert m.num_rows_updated == 2


def test_keys_with_their_event_time_expire_by_watermark(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(TIMED, ["id", "ts"], event_time="ts"))
    assert runner.op.key_schema.names[0] == "ts"  # the event time leads the state key
    first = timed(range(KEPT), 100, "a") + timed(range(EXPIRED), 20, "a") + timed(range(2), None)
    out, _ = runner.run(first, "append")
    assert out.num_rows == KEPT + EXPIRED + 2
    again = timed(range(3), 20, "dup") + timed(range(3), 100, "dup") + timed(range(2), None, "n")
    out, m = runner.run(again, "append", watermark_ms=ms(50))
    # At 20 s the rows are late (dropped before the state is read); the keys at 100 s and the
    # null times are duplicates; then the keys at 20 s expire, as one range deletion: the
    # version's changelog holds the range and no delete of a key.
    assert out.num_rows == 0
    assert m.num_rows_dropped_by_watermark == 3
    assert m.num_rows_removed == EXPIRED
    assert m.max_event_time_ms == ms(100)  # late rows count toward the watermark
    log = changelog(runner, 2)
    assert len(log.delete_ranges) == 1
    assert not [v for _, values in log.chunks() for v in values if v is None]
    out, _ = runner.run(timed(range(2), 100, "dup") + timed(range(2), 60, "b"), "append")
    assert [(r["id"], r["v"]) for r in out.to_pylist()] == [(0, "b"), (1, "b")]


def test_keys_without_event_time_are_kept_but_late_rows_dropped(make_runner: Runner) -> None:
    runner = make_runner(Deduplicate(TIMED, ["id"], event_time="ts"))
    runner.run(timed(range(3), 10, "a"), "append")
    out, m = runner.run(
        timed(range(2), 5, "late") + timed(range(2, 4), 60, "b"), "append", watermark_ms=ms(30)
    )
    assert [(r["id"], r["v"]) for r in out.to_pylist()] == [(3, "b")]
    assert m.num_rows_dropped_by_watermark == 2 and m.num_rows_removed == 0


def test_within_watermark_drops_a_key_until_its_first_row_expires(
    make_runner: Runner, scanned: list[int]
) -> None:
    op = DeduplicateWithinWatermark(TIMED, ["id"], event_time="ts", delay_ms=10_000)
    runner = make_runner(op)
    out, m = runner.run(
        timed(range(KEPT), 100, "a") + timed(range(KEPT, KEPT + EXPIRED), 20, "a"), "append"
    )
    assert out.num_rows == KEPT + EXPIRED and m.num_rows_updated == KEPT + EXPIRED
    # Watermark 30 s: the keys first seen at 20 s expire at 30 s (20 s + the delay); their
    # duplicates in this batch are still dropped, as Spark evicts after the input.
    scanned[0] = 0
    dups = timed(range(KEPT, KEPT + 2), 29, "dup") + timed(range(2), 120, "dup")
    out, m = runner.run(dups, "append", watermark_ms=ms(30))
    assert out.num_rows == 0
    assert m.num_rows_removed == EXPIRED
    assert scanned[0] == EXPIRED
    out, m = runner.run(
        timed(range(KEPT, KEPT + 2), 31, "again") + timed(range(1), 31, "dup"),
        "append",
        watermark_ms=ms(30),
    )
    assert [(r["id"], r["v"]) for r in out.to_pylist()] == [(KEPT, "again"), (KEPT + 1, "again")]
    out, m = runner.run(timed(range(1), 25, "late"), "append", watermark_ms=ms(30))
    assert out.num_rows == 0 and m.num_rows_dropped_by_watermark == 1


def test_expiry_removes_the_index_entries_as_one_range(make_runner: Runner) -> None:
    """The keys' entries in the index by expiry go in one range deletion: the version's
    changelog holds one range for the index and no row of it, and the keys left are kept."""
    op = DeduplicateWithinWatermark(TIMED, ["id"], event_time="ts", delay_ms=10_000)
    runner = make_runner(op)
    runner.run(timed(range(50), 100, "a") + timed(range(50, 80), 20, "a"), "append")
    _, m = runner.run([], "append", watermark_ms=ms(30))
    assert m.num_rows_removed == 30
    log = changelog(runner, 2)
    expiry = cf_prefix(EXPIRY_CF)
    assert [lo for lo, _ in log.delete_ranges] == [expiry]
    assert not [k for chunk, _ in log.chunks() for k in chunk if k.startswith(expiry)]
    out, m = runner.run(timed(range(45, 55), 101, "b"), "append", watermark_ms=ms(30))
    assert sorted(r["id"] for r in out.to_pylist()) == list(range(50, 55))  # expired: new again
    assert m.num_rows_total == 55


def changelog(runner: OperatorRunner, version: int) -> Any:
    """The changes of ``version`` as the provider recorded them."""
    provider = runner.provider
    assert isinstance(provider, VersionedProvider)
    return provider.read_changelog(
        provider.index().resolve(version, None, provider.delta_ext, "test")
    )
