"""The store layer's file lock: exclusion within and across processes, the owner line, release."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkstate.exceptions import StoreLockedError
from sparkstate.files.file_lock import FileLock


def child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_owner_line_exclusion_and_release_in_one_process(tmp_path: Path) -> None:
    path = str(tmp_path / "lock")
    first, second = FileLock(path), FileLock(path)
    assert first.owner() == "" and not first.held
    assert first.try_acquire()
    assert first.held and first.owner() == f"pid {os.getpid()}"
    assert (tmp_path / "lock").read_text() == f"pid {os.getpid()}\n"
    assert not second.try_acquire() and not second.held
    with pytest.raises(StoreLockedError, match=f"held by pid {os.getpid()}"):
        second.acquire()
    with pytest.raises(StoreLockedError, match="already held by this object"):
        first.try_acquire()
    first.release()
    assert (tmp_path / "lock").read_text() == "" and not first.held
    first.release()  # idempotent
    assert second.try_acquire("task 7 attempt 0")
    assert first.owner() == "task 7 attempt 0"
    second.release()


def test_context_manager(tmp_path: Path) -> None:
    path = str(tmp_path / "lock")
    with FileLock(path) as lock:
        assert lock.held
        with pytest.raises(StoreLockedError, match=str(tmp_path)), FileLock(path):
            pass
    assert not lock.held and FileLock(path).try_acquire()


def test_another_process_is_refused_and_a_killed_holder_releases(tmp_path: Path) -> None:
    path = str(tmp_path / "lock")
    holder = child(
        f"""
        import sys, time
        from sparkstate.files.file_lock import FileLock
        FileLock({path!r}).acquire()
        print("locked", flush=True)
        time.sleep(60)
        """
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        lock = FileLock(path)
        assert not lock.try_acquire()
        assert lock.owner() == f"pid {holder.pid}"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        assert lock.try_acquire()  # the kernel dropped the dead holder's lock
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate(timeout=20)


def test_a_forked_child_neither_holds_nor_releases_the_parents_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "lock")
    proc = child(  # forks in a fresh interpreter: a test process may run threads
        f"""
        import os
        from sparkstate.files.file_lock import FileLock
        lock = FileLock({path!r})
        lock.acquire("parent")
        pid = os.fork()
        if pid == 0:
            held = lock.held
            lock.release()
            os._exit(0 if not held else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), lock.held, FileLock({path!r}).try_acquire())
        print(FileLock({path!r}).owner())
        """
    )
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["0 True False", "parent"]
