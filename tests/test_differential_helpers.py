"""``sparkstate.testing``'s differential-test helpers, without Spark."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sparkstate.testing import Collector, FileFeed, normalize


def test_a_feed_writes_one_whole_file_per_batch_and_starts_over(tmp_path: Path) -> None:
    feed = FileFeed(tmp_path / "input")
    feed.add([{"k": "a", "v": 1}, {"k": "b", "v": None}])
    feed.add([])
    names = sorted(p.name for p in feed.path.iterdir())
    assert names == ["part-00000.json", "part-00001.json"]  # no temporary file left
    lines = (feed.path / "part-00000.json").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"k": "a", "v": 1}, {"k": "b", "v": None}]
    feed.reset()
    assert list(feed.path.iterdir()) == [] and feed.count == 0
    feed.add([{"k": "c"}])
    assert [p.name for p in feed.path.iterdir()] == ["part-00000.json"]


def test_normalize_sorts_nulls_last_and_compares_nan_and_rounded_doubles() -> None:
    rows = [("b", 0.1 + 0.2), (None, float("nan")), ("a", 1.0)]
    assert normalize(rows) == [("a", 1.0), ("b", 0.3), (None, "NaN")]
    assert normalize([("x", 0.30000000000000004)]) == normalize([("x", 0.3)])


def test_collector_keeps_each_batch_and_a_replay_overwrites() -> None:
    def frame(rows: list[tuple[Any, ...]]) -> Any:
        return SimpleNamespace(schema="k string", collect=lambda: rows)

    sink = Collector()
    sink(frame([("b",), ("a",)]), 0)
    sink(frame([("c",)]), 1)
    sink(frame([("a",)]), 0)
    assert sink.batches == {0: [("a",)], 1: [("c",)]}
    assert sink.schema == "k string"
