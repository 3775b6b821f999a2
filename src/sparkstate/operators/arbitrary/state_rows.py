"""The rows of a processor's state as Spark counts them (``numRowsTotal``), kept without a scan.

Spark's RocksDB store counts the keys of a state variable's column family and none of its
internal families (timers, TTL indexes, a list's counts): a value state has a row per grouping
key, a list state one (its elements are merged into one value), a map state one per entry (its
key is the grouping key and the user key). sparkstate keeps a map in one value per grouping key
and its timers and indexes in families of their own, so its store's keys are not those rows.

``$rows_count`` holds a row per state variable, keyed by its name: its rows, changed at each
flush by the rows its writes add and remove (a variable knows them: it reads a key before it
writes it, or looks it up with the others it writes). A variable without the row (a version
written before the count was kept, or by a rescale, which does not move it) is counted once by a
scan of its family.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from sparkstate.store.base import StateStore

__all__ = [
    "ROWS_CF",
    "ROWS_KEY_SCHEMA",
    "ROWS_SCHEMA",
    "RowCount",
    "RowsOfValue",
    "counted_rows",
    "forget",
    "scanned_rows",
]

ROWS_CF = "$rows_count"
ROWS_KEY_SCHEMA = pa.schema([pa.field("variable", pa.string(), nullable=False)])
ROWS_SCHEMA = pa.schema([pa.field("rows", pa.int64(), nullable=False)])
#: The rows of one stored value of a family (None: each key is one row).
RowsOfValue = Callable[[bytes], int] | None


def scanned_rows(store: StateStore, name: str, rows_of: RowsOfValue = None) -> int:
    """The rows of variable ``name``'s family, by a scan of it."""
    chunks = store.range_scan_encoded_chunks(cf=name)
    if rows_of is None:
        return sum(len(keys) for keys, _ in chunks)
    return sum(sum(map(rows_of, values)) for _, values in chunks)


def counted_rows(store: StateStore, name: str, rows_of: RowsOfValue = None) -> tuple[int, bool]:
    """Variable ``name``'s rows, and whether ``$rows_count`` has them (else: a scan's)."""
    found = store.get((name,), ROWS_CF) if store.has_column_family(ROWS_CF) else None
    if found is not None:
        return int(found[0]), True
    return scanned_rows(store, name, rows_of), False


class RowCount:
    """One state variable's rows during a batch: read (or counted) when it is bound, written
    back whenever a flush changes them, or once where the version had no count."""

    def __init__(self, store: StateStore, name: str, rows_of: RowsOfValue = None) -> None:
        self._store = store
        self._name = name
        self._kept = store.has_column_family(ROWS_CF)
        self.rows, self._written = counted_rows(store, name, rows_of) if self._kept else (0, True)

    def add(self, delta: int) -> None:
        """The variable's flush added ``delta`` rows (removed, where negative)."""
        if not self._kept or (not delta and self._written):
            return
        self.rows += delta
        self._store.put((self._name,), (self.rows,), ROWS_CF)
        self._written = True


def forget(store: StateStore, name: str) -> None:
    """Variable ``name`` was deleted (``deleteIfExists``): no rows, and no count."""
    if store.has_column_family(ROWS_CF):
        store.remove((name,), ROWS_CF)
