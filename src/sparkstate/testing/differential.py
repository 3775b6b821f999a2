"""Helpers for differential tests: one input through Spark's built-in operator and through ours.

A :class:`FileFeed` is a directory of JSON-lines files that a streaming query reads one file per
micro-batch, so a test decides exactly what each batch holds; a :class:`Collector` is a
``foreachBatch`` function that keeps every batch's rows (normalized by :func:`normalize`, so
that two systems' outputs compare with ``==``) and schema. Nothing here imports pyspark: the
DataFrames and sessions passed in are used as they are.

    feed = FileFeed(tmp_path / "input")
    theirs, ours = Collector(), Collector()
    ...  # start both queries over feed.stream(spark, "k string, v long"), foreachBatch(...)
    feed.add([{"k": "a", "v": 1}])
    query.processAllAvailable()
    assert ours.batches == theirs.batches
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Batches", "Collector", "FileFeed", "normalize"]

#: Batch id -> the batch's rows, normalized.
Batches = dict[int, list[tuple[Any, ...]]]


class FileFeed:
    """A directory of JSON-lines files, one file per micro-batch, each added atomically.

    Spark's file source takes files in modification-time order, and files written within the
    same clock tick tie in an order of the listing's choosing; each file therefore gets a
    modification time one second after the previous one, so the batches are the files in the
    order they were added, in every query that reads the feed.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self._mtime = 0.0

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Write the next batch's rows (a rename, so a query never sees half a file)."""
        tmp = self.path / f".tmp-{self.count:05d}"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        self._mtime = max(float(int(time.time())), self._mtime + 1.0)
        os.utime(tmp, (self._mtime, self._mtime))
        tmp.rename(self.path / f"part-{self.count:05d}.json")
        self.count += 1

    def reset(self) -> None:
        """Remove every file, to feed the same batches to another query from the start."""
        for f in self.path.iterdir():
            f.unlink()
        self.count = 0

    def stream(self, spark: Any, schema: str) -> Any:
        """A streaming DataFrame over the feed, one file per micro-batch."""
        reader = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
        return reader.json(str(self.path))


def normalize(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Rows as tuples in one order (nulls last); NaN as a marker and doubles rounded to 9 places,
    so that equal results of two systems compare equal."""

    def cell(v: Any) -> Any:
        if isinstance(v, float):
            return "NaN" if math.isnan(v) else round(v, 9)
        return v

    out = [tuple(cell(v) for v in r) for r in rows]
    return sorted(out, key=lambda t: tuple((x is None, str(type(x)), str(x)) for x in t))


class Collector:
    """A ``foreachBatch`` function keeping each batch's normalized rows and the output schema
    (a replayed batch overwrites its earlier delivery)."""

    def __init__(self) -> None:
        self.batches: Batches = {}
        self.schema: Any = None

    def __call__(self, df: Any, batch_id: int) -> None:
        self.schema = df.schema
        self.batches[batch_id] = normalize(df.collect())
