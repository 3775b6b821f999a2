"""A checkpoint is held by one query: refused in this process and in another, free after."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkstate.exceptions import CheckpointInUseError
from sparkstate.files.file_lock import FileLock
from sparkstate.runtime.logs import LOCK_FILE, CheckpointLock

HOLD = """
import sys, time
from sparkstate.runtime.logs import CheckpointLock
CheckpointLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_one_query_per_checkpoint(tmp_path: Path) -> None:
    root = str(tmp_path / "chk")
    first = CheckpointLock(root)
    first.acquire()
    with pytest.raises(CheckpointInUseError, match="this process"):
        CheckpointLock(root).acquire()
    first.release()
    again = CheckpointLock(root)
    again.acquire()
    again.release()


def test_a_query_in_another_process_is_named_and_its_death_frees_the_checkpoint(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "chk")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, root], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointInUseError, match=f"pid {holder.pid}"):
            CheckpointLock(root).acquire()
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    lock = CheckpointLock(root)
    while True:
        try:
            lock.acquire()
            break
        except CheckpointInUseError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    lock.release()


def test_a_garbled_owner_line_is_shown_not_fatal(tmp_path: Path) -> None:
    """The owner line is only shown in the message: damage in it never fails the refusal."""
    root = tmp_path / "chk"
    root.mkdir()
    holder = FileLock(str(root / LOCK_FILE))
    assert holder.try_acquire()
    try:
        (root / LOCK_FILE).write_bytes(b"\xff\xfepid\x00 7\x1b[2J\nsecond line\n")
        with pytest.raises(CheckpointInUseError) as info:
            CheckpointLock(str(root)).acquire()
        assert "(\ufffd\ufffdpid\ufffd 7\ufffd[2J)" in str(info.value)
    finally:
        holder.release()
