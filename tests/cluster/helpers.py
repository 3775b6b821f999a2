"""What the cluster tests share: a file feed, a batch collector, input data, and where each
state partition ran (read from the local RocksDB copies under each worker's local directory)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from sparkstate.store.local_dir import LocalStoreDir
from sparkstate.testing.differential import Batches as Batches
from sparkstate.testing.differential import Collector as Collector
from sparkstate.testing.differential import FileFeed as FileFeed
from sparkstate.testing.differential import normalize as normalize

SCHEMA = "k string, g int, v long, s string"
#: ``stateStore.local_dir`` of the cluster queries: a relative path, so each executor keeps its
#: local RocksDB copies under its own working directory (``<worker dir>/<app>/<executor id>/``).
LOCAL_DIR = "sparkstate-local"


def make_batches(
    seed: int, num_batches: int, rows_per_batch: int, num_keys: int
) -> list[list[dict[str, Any]]]:
    """Deterministic input: string keys with a nullable int group, long values, some nulls."""
    rnd = random.Random(seed)
    out = []
    for _ in range(num_batches):
        rows = []
        for _ in range(rows_per_batch):
            n = rnd.randrange(num_keys)
            rows.append(
                {
                    "k": None if n == 0 else f"key-{n}",
                    "g": None if n % 7 == 0 else n % 3,
                    "v": None if rnd.random() < 0.05 else rnd.randrange(-1000, 10**6),
                    "s": rnd.choice(["a", "b", "c", None]),
                }
            )
        out.append(rows)
    return out


def final_state(batches: Batches) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The latest row per key (first two columns) over update-mode batches."""
    state: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for b in sorted(batches):
        for row in batches[b]:
            state[row[:2]] = row
    return state


# --------------------------------------------------------------------------- where partitions ran

MARKER_KEY = b"\xff\xffsparkstate.version"


def local_markers(local_dir: Path) -> list[tuple[int, int, dict[str, Any]]]:
    """(operator, partition, version marker) of every local RocksDB copy in ``local_dir`` (the
    copies of all queries that ran there).

    A worker keeps its copies open between batches; taking a copy's lock asks the worker to let
    go of it (its memtable is flushed at close), and then it opens from the test process.
    """
    import rocksdict

    out: list[tuple[int, int, dict[str, Any]]] = []
    if not local_dir.exists():
        return out
    for entry in sorted(os.listdir(local_dir)):
        parts = entry.split("-")
        if len(parts) < 3 or not parts[1].startswith("op") or not parts[2].startswith("p"):
            continue
        db_path = local_dir / entry / "db"
        if not (db_path / "CURRENT").exists():
            continue
        with LocalStoreDir(str(local_dir), entry) as store_dir:
            store_dir.acquire(30, owner="test reading the marker")
            db = rocksdict.Rdict(
                str(db_path),
                rocksdict.Options(raw_mode=True),
                access_type=rocksdict.AccessType.read_only(),
            )
            try:
                raw = db.get(MARKER_KEY)
            finally:
                db.close()
        if raw is not None:
            out.append((int(parts[1][2:]), int(parts[2][1:]), json.loads(raw)))
    return out


def read_commit(checkpoint: Path, batch_id: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (checkpoint / "sparkstate" / "commits" / f"{batch_id}.json").read_text()
    )
    return data


def placement(
    checkpoint: Path, batch_id: int, local_dirs: dict[str, Path], op: int = 0
) -> dict[int, str]:
    """Partition -> the executor (a key of ``local_dirs``) that ran the attempt batch
    ``batch_id`` committed: the local copy whose marker holds exactly that version and
    checkpoint id ("?" if none does). Call it right after the batch: a later batch moves the
    copies on."""
    winners = read_commit(checkpoint, batch_id)["operators"][str(op)]["checkpoint_ids"]
    markers = {name: local_markers(path) for name, path in local_dirs.items()}
    out: dict[int, str] = {}
    for part, ckpt in winners.items():
        holders = [
            name
            for name, found in markers.items()
            for o, p, m in found
            if (o, p) == (op, int(part))
            and m.get("version") == batch_id + 1
            and m.get("checkpoint_id") == ckpt
        ]
        assert len(holders) <= 1, (part, holders)
        out[int(part)] = holders[0] if holders else "?"
    return out


def read_observed(checkpoint: Path) -> list[dict[str, Any]]:
    """The loads ``tests.cluster.observed.ObservedRocksDB`` recorded under ``checkpoint``."""
    out: list[dict[str, Any]] = []
    for f in sorted((checkpoint / "observed").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written right now
                continue
    return out


def executor_of(cwd: str) -> str:
    """``<worker>/exec<id>`` from an executor's working directory
    ``<worker root>/work/<app id>/<executor id>`` (the names ``Cluster.executor_dirs`` uses)."""
    parts = Path(cwd).parts
    return f"{parts[-4]}/exec{parts[-1]}"


def read_progress(checkpoint: Path) -> dict[int, dict[str, Any]]:
    """The engine's progress per batch id, from ``<checkpoint>/sparkstate/progress.jsonl``
    (every run of the query appends to it; a later run's progress of a batch wins)."""
    out: dict[int, dict[str, Any]] = {}
    path = checkpoint / "sparkstate" / "progress.jsonl"
    for line in path.read_text().splitlines():
        if line.strip():
            p = json.loads(line)
            out[int(p["batchId"])] = p
    return out
