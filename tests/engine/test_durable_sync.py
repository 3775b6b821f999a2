"""A power cut or an operating system crash after a write returned does not lose it: every file
sparkstate writes on a local file system is synced before its name appears, and its directory
after (``sparkstate.files.durable``).

Recorded, not assumed: a job of its own runs queries on both providers, with a file sink,
maintenance after every batch and a restart, with every Python process (the driver, the
workers, the streaming sources' runners) recording its ``fsync`` calls and its renames in order
(``tests/sync_recorder.py``). Then every rename must follow a sync of its file and precede a sync
of its directory, and every file sparkstate left in the checkpoints and the sink must have come
through such a rename (or, appended, been synced)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests import sync_recorder
from tests.conftest import PYTHON_START

from sparkstate.files.durable import TMP_PREFIX, DurableDir

JOB = Path(__file__).with_name("durable_sync_job.py")
REPO = str(Path(__file__).resolve().parents[2])
#: Files sparkstate writes that are not versions of anything: the query's lock (a process's
#: ``flock``; its content only names the holder).
NOT_DURABLE = {"_query.lock"}


def _sparkstates_files(work: Path) -> list[Path]:
    """Every file sparkstate wrote: its directories in the checkpoints, the sink's output."""
    found = [p for chk in work.glob("chk-*") for p in (chk / "sparkstate").rglob("*")]
    found += list((work / "out").rglob("*"))
    return [
        p
        for p in found
        if p.is_file()
        and not p.name.startswith((TMP_PREFIX, "."))  # Hadoop's checksums of Spark's part files
        and p.name not in NOT_DURABLE
    ]


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[int, list[tuple[str, str]]]]:
    work = tmp_path_factory.mktemp("durable-sync")
    logs = work / "logs"
    logs.mkdir()
    env = {
        **os.environ,
        sync_recorder.ENV: str(logs),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join((REPO, PYTHON_START)),
    }
    done = subprocess.run(
        [sys.executable, str(JOB), str(work)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Error in sitecustomize" not in done.stderr, done.stderr[-4000:]
    return work, dict(sync_recorder.events(logs))


def test_every_rename_is_synced_before_and_after(
    recorded: tuple[Path, dict[int, list[tuple[str, str]]]],
) -> None:
    _, logs = recorded
    bad = {pid: sync_recorder.unsynced(log) for pid, log in logs.items()}
    assert {pid: b for pid, b in bad.items() if b} == {}
    writers = [pid for pid, log in logs.items() if sync_recorder.renamed_to(log)]
    assert len(writers) >= 2, "the driver's and the workers' writes are both recorded"


def test_every_file_left_came_through_a_synced_write(
    recorded: tuple[Path, dict[int, list[tuple[str, str]]]],
) -> None:
    work, logs = recorded
    renamed = set().union(*(sync_recorder.renamed_to(log) for log in logs.values()))
    synced = {path for log in logs.values() for kind, path in log if kind == "fsync"}
    files = _sparkstates_files(work)
    kinds = {p.suffix or p.parent.name for p in files}
    # Each kind of file is there: changelogs and snapshots of both providers, SST files, the
    # engine's logs, the clock, the sink's part files and manifests.
    assert {
        ".delta",
        ".changelog",
        ".snapshot",
        ".sst",
        ".json",
        ".jsonl",
        "_spark_metadata",
    } <= kinds
    missing = [str(p.relative_to(work)) for p in files if str(p) not in renamed | synced]
    assert missing == []


def test_a_write_syncs_its_file_before_the_rename_and_its_directory_after(tmp_path: Path) -> None:
    """The same, in order, for each kind of write a ``DurableDir`` makes: into directories that
    do not exist yet (each new one is synced into its parent), an upload, a move, an append."""
    logs = tmp_path / "logs"
    logs.mkdir()
    real_fsync, real_init = os.fsync, DurableDir.__init__
    try:
        sync_recorder.install(str(logs))
        root = DurableDir(str(tmp_path / "chk"))
        state = root.child("state", "0", "1")
        state.write_atomic("1.delta", b"x" * 100)
        local = tmp_path / "local.sst"
        local.write_bytes(b"y" * 100)
        state.upload(str(local), "2.sst")
        root.child("staging").write_atomic("part-0", b"z")
        root.child("staging").move_to("part-0", root.child("out"))
        root.append("progress.jsonl", b"{}\n")
    finally:
        os.fsync = real_fsync
        DurableDir.__init__ = real_init  # type: ignore[method-assign]
    ((_, log),) = sync_recorder.events(logs)
    assert sync_recorder.unsynced(log) == []
    chk = str(tmp_path / "chk")
    renamed = sync_recorder.renamed_to(log)
    assert renamed == {
        f"{chk}/state/0/1/1.delta",
        f"{chk}/state/0/1/2.sst",
        f"{chk}/staging/part-0",
        f"{chk}/out/part-0",
    }
    synced = [path for kind, path in log if kind == "fsync"]
    # The new directories, each synced into its parent before anything is written in them.
    for parent in (str(tmp_path), chk, f"{chk}/state", f"{chk}/state/0"):
        assert parent in synced[: synced.index(f"{chk}/state/0/1")], parent
    assert f"{chk}/progress.jsonl" in synced
