"""SIGKILL a process inside ``commit()`` and inside ``do_maintenance()``, then recover.

A child process (this file run as a script) commits versions of a deterministic history and runs
maintenance. Every call it makes to the durable file system (open an output stream, write, rename,
delete) and to a few local steps of the rocksdb provider is an *event*; a run of the child given
``kill_at=N`` SIGKILLs itself at event N: before a rename, after it, halfway through writing a
file, before or after a delete, before or after the local write batch.

A first run without a kill lists the events; the test then kills the child at every event of one
commit and of one maintenance pass that snapshots and deletes, and checks after each kill, with a
new provider instance (on the same local directory and on a fresh one):

* the last version the child reported committed is intact, and so is every retained version;
* the newest version is that one or, if the kill came after its file became durable, the next;
* nothing half-written is visible: every versioned file is complete (its frame checks out), and
  every SST file a visible rocksdb snapshot names is complete; temporary files are ignored;
* the next commit and the next maintenance work, and their result reloads.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from sparkstate.files.durable import TMP_PREFIX, DurableDir
from sparkstate.store.base import StateStoreProvider
from sparkstate.store.families import Row
from sparkstate.store.frames import HEADER_SIZE, decode_frame
from sparkstate.store.versions.layout import VersionRef
from sparkstate.testing.factory import ProviderFactory, apply_changes, durable_files, read_all

HAVE_ROCKSDB = importlib.util.find_spec("sparkstate.store.rocksdb.provider") is not None
PROVIDERS = [
    "memory",
    pytest.param(
        "rocksdb",
        marks=pytest.mark.skipif(
            not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb.provider not landed"
        ),
    ),
]
CONF = {"min_deltas_for_snapshot": 3, "min_versions_to_retain": 1}
#: Commits of the child; maintenance runs after each. The commit of version 6 and the maintenance
#: pass after it (a snapshot is due, and retention deletes versions 3 to 5) are where kills land.
VERSIONS = 6
#: Local steps of the rocksdb provider that are events too: ``module:Class.method``.
LOCAL_HOOKS = [
    "sparkstate.store.rocksdb.local:LocalDB.apply_batch",
    "sparkstate.store.rocksdb.local:LocalDB.create_checkpoint",
]


def changes(version: int) -> tuple[dict[Row, Row], list[Row]]:
    """The puts and removes that version ``version`` commits (from ``version - 1``)."""
    puts: dict[Row, Row] = {("k", version % 7): (version, "x" * (version % 3))}
    puts[("v", version)] = (version, None)
    return puts, [("k", (version + 3) % 7), ("v", version - 4)]


def history(n: int) -> list[dict[Row, Row]]:
    states: list[dict[Row, Row]] = [{}]
    for v in range(1, n + 1):
        states.append(apply_changes(states[-1], *changes(v)))
    return states


# --- the child ------------------------------------------------------------------------------------


class _Events:
    """Counts events; prints each one; SIGKILLs this process at event ``kill_at``."""

    def __init__(self, kill_at: int | None) -> None:
        self.n = 0
        self.kill_at = kill_at
        self.phase = "open"

    def __call__(self, kind: str, detail: str = "") -> bool:
        """Record an event; True if the caller should die halfway (a partial write)."""
        self.n += 1
        print(f"EVENT {self.n} {self.phase} {kind} {os.path.basename(detail)}", flush=True)
        if self.n != self.kill_at:
            return False
        if kind == "write":
            return True
        os.kill(os.getpid(), signal.SIGKILL)
        return False

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class _KillingStream:
    def __init__(self, inner: Any, path: str, events: _Events) -> None:
        self._inner, self._path, self._events = inner, path, events

    def write(self, data: Any) -> Any:
        if self._events("write", self._path):
            view = memoryview(data)
            self._inner.write(view[: len(view) // 2])
            self._inner.flush()
            self._events.die()
        return self._inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> _KillingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


class _KillingFS:
    """Wraps a ``pyarrow.fs`` file system; every mutating call is an event (before and after)."""

    def __init__(self, inner: Any, events: _Events) -> None:
        self.inner, self._events = inner, events

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def open_output_stream(self, path: str, *args: Any, **kwargs: Any) -> _KillingStream:
        self._events("create", path)
        stream = self.inner.open_output_stream(path, *args, **kwargs)
        return _KillingStream(stream, path, self._events)

    def move(self, src: str, dest: str) -> None:
        self._events("before-rename", dest)
        self.inner.move(src, dest)
        self._events("after-rename", dest)

    def delete_file(self, path: str) -> None:
        self._events("before-delete", path)
        self.inner.delete_file(path)
        self._events("after-delete", path)


def _instrument(events: _Events, hooks: list[str], subtree: bool) -> None:
    """Make file system calls and ``hooks`` events; ``subtree``: use a non-local FS with rename."""
    original_init = DurableDir.__init__

    def init(self: DurableDir, uri: str, *, _fs: Any = None, _path: str | None = None) -> None:
        inner = _fs.inner if isinstance(_fs, _KillingFS) else _fs
        if subtree and inner is None:  # like HDFS: not the local file system, but it renames
            inner, _path = pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()), os.path.abspath(uri)
        original_init(self, uri, _fs=inner, _path=_path)
        self.fs = _KillingFS(self.fs, events)  # type: ignore[assignment]

    DurableDir.__init__ = init  # type: ignore[method-assign]
    for hook in hooks:
        module_name, _, path = hook.partition(":")
        cls_name, _, method = path.partition(".")
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError):
            continue
        _wrap(cls, method, events)


def _wrap(cls: type, method: str, events: _Events) -> None:
    original: Callable[..., Any] = getattr(cls, method)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        events(f"before-{method}")
        out = original(*args, **kwargs)
        events(f"after-{method}")
        return out

    setattr(cls, method, wrapper)


def child_main(config: dict[str, Any]) -> None:
    events = _Events(config["kill_at"])
    _instrument(events, config["hooks"], config.get("subtree", False))
    factory = ProviderFactory(
        config["provider"], config["root"], config["local_dir"], conf=config["conf"]
    )
    provider = factory.open()
    version = provider.latest_version()
    print(f"COMMITTED {version} -", flush=True)
    for _ in range(config["versions"]):
        events.phase = f"commit-{version + 1}"
        store = provider.get_store(version)
        puts, removes = changes(version + 1)
        for k, v in puts.items():
            store.put(k, v)
        for k in removes:
            store.remove(k)
        version = store.commit()
        print(f"COMMITTED {version} {store.checkpoint_id}", flush=True)
        events.phase = f"maintenance-{version}"
        provider.do_maintenance()
    events.phase = "close"
    factory.close_all()
    print("DONE", flush=True)


# --- the parent -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    returncode: int
    committed: int
    events: list[tuple[int, str, str, str]]
    output: str


class Slot:
    """A directory where the first ``VERSIONS - 1`` versions are committed once, kept pristine.

    Each run starts from a fresh copy at the same path: the rocksdb provider finds its local
    database by the checkpoint path, so the child continues from a local copy, as a worker would.
    """

    def __init__(self, provider: str, path: Path) -> None:
        self.provider = provider
        self.path = path
        self.pristine = path.with_name(f"{path.name}-pristine")
        self.root, self.local_dir = str(path / "root"), str(path / "local")
        factory = ProviderFactory(provider, self.root, self.local_dir, conf=CONF)
        try:
            _commit_versions(factory.open(), VERSIONS - 1)
        finally:
            factory.close_all()
        shutil.move(str(path), str(self.pristine))

    def run(self, kill_at: int | None, *, subtree: bool = False) -> Run:
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.copytree(self.pristine, self.path, symlinks=True)
        config = {
            "provider": self.provider,
            "root": self.root,
            "local_dir": self.local_dir,
            "conf": CONF,
            "versions": 1,
            "kill_at": kill_at,
            "hooks": LOCAL_HOOKS,
            "subtree": subtree,
        }
        proc = subprocess.run(
            [sys.executable, __file__, json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return parse_run(proc.returncode, proc.stdout, proc.stderr)


def _commit_versions(provider: StateStoreProvider, n: int) -> None:
    for v in range(1, n + 1):
        store = provider.get_store(v - 1)
        puts, removes = changes(v)
        for k, value in puts.items():
            store.put(k, value)
        for k in removes:
            store.remove(k)
        store.commit()
        provider.do_maintenance()


def parse_run(returncode: int, stdout: str, stderr: str) -> Run:
    committed = 0
    events = []
    for line in stdout.splitlines():
        parts = line.split(" ")
        if parts[0] == "COMMITTED":
            committed = int(parts[1])
        elif parts[0] == "EVENT":
            events.append((int(parts[1]), parts[2], parts[3], " ".join(parts[4:])))
    return Run(returncode, committed, events, stdout[-3000:] + stderr[-3000:])


def kill_points(events: list[tuple[int, str, str, str]]) -> list[int]:
    """The events of the last commit and of the maintenance pass after it, one per kind of step.

    That pass snapshots and deletes. Repeats of a step on files of the same kind (the second SST
    upload, the third delete) are left out, but the last delete is kept.
    """
    phases = {f"commit-{VERSIONS}", f"maintenance-{VERSIONS}"}
    seen: set[tuple[str, str, str]] = set()
    points = []
    for n, phase, kind, detail in events:
        if phase not in phases:
            continue
        ext = detail.rsplit(".", 1)[-1]
        if (phase, kind, ext) not in seen:
            seen.add((phase, kind, ext))
            points.append(n)
    deletes = [n for n, phase, kind, _ in events if phase in phases and kind == "after-delete"]
    if deletes and deletes[-1] not in points:
        points.append(deletes[-1])
    return points


def check_files_complete(factory: ProviderFactory, provider: StateStoreProvider) -> None:
    """Every visible versioned file has a complete, valid frame; snapshots' SST files exist."""
    directory = DurableDir(factory.checkpoint_root).child(factory.store_id.relative_dir)
    for _, _, name in durable_files(factory.store_id):
        data = directory.read(name)
        kind = data[4:8] if len(data) >= HEADER_SIZE else b"????"
        decode_frame(kind, data, directory.where(name))
    if provider.name == "rocksdb":
        snapshot = importlib.import_module("sparkstate.store.rocksdb.snapshot")
        for v, ckpt, _ in durable_files(factory.store_id, "snapshot"):
            with tempfile.TemporaryDirectory() as tmp:
                snapshot.download_snapshot(directory, VersionRef(v, ckpt), f"{tmp}/d")


def recover_and_check(slot: Slot, run: Run, fresh: str) -> None:
    states = history(VERSIONS + 1)
    latest = 0
    for local in (slot.local_dir, fresh):
        factory = ProviderFactory(slot.provider, slot.root, local, conf=CONF)
        try:
            provider = factory.open()
            latest = provider.latest_version()
            assert latest in (run.committed, run.committed + 1), (latest, run.committed)
            check_files_complete(factory, provider)
            for v in range(max(1, latest - CONF["min_versions_to_retain"] + 1), latest + 1):
                got = read_all(provider.get_read_store(v))["default"]
                assert got == states[v], f"version {v} after a kill, reopened on {local}"
        finally:
            factory.close_all()
    # The next commit and maintenance work on the same local directory.
    factory = ProviderFactory(slot.provider, slot.root, slot.local_dir, conf=CONF)
    try:
        _commit_next(factory.open(), latest)
        provider = factory.reopen(local_dir=f"{fresh}-after")
        check_files_complete(factory, provider)
        assert read_all(provider.get_read_store(latest + 1))["default"] == states[latest + 1]
    finally:
        factory.close_all()


def _commit_next(provider: StateStoreProvider, latest: int) -> None:
    store = provider.get_store(latest)
    puts, removes = changes(latest + 1)
    for k, v in puts.items():
        store.put(k, v)
    for k in removes:
        store.remove(k)
    assert store.commit() == latest + 1
    provider.do_maintenance()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_kill_anywhere_in_commit_and_maintenance(provider: str, tmp_path: Path) -> None:
    slots = [Slot(provider, tmp_path / f"slot{i}") for i in range(2)]
    dry = slots[0].run(None)
    assert dry.returncode == 0 and dry.committed == VERSIONS, dry.output
    points = kill_points(dry.events)
    kinds = {kind for n, _, kind, _ in dry.events if n in points}
    assert {"create", "write", "before-rename", "after-rename"} <= kinds, kinds
    assert {"before-delete", "after-delete"} <= kinds, "no deletion in the maintenance pass"
    events = {e[0]: e for e in dry.events}

    def kill_and_recover(slot: Slot, n: int) -> str | None:
        run = slot.run(n)
        if run.returncode != -signal.SIGKILL:
            return f"kill at {events[n]} did not kill: {run.output}"
        try:
            recover_and_check(slot, run, str(slot.path.with_name(f"fresh-{n}")))
        except Exception as exc:  # collect: one kill point failing says little alone
            return f"kill at {events[n]}: {type(exc).__name__}: {exc}"
        return None

    def worker(i: int) -> list[str | None]:
        return [kill_and_recover(slots[i], n) for n in points[i :: len(slots)]]

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots)) as pool:
        results = [r for rs in pool.map(worker, range(len(slots))) for r in rs]
    failures = [r for r in results if r is not None]
    assert not failures, "\n".join(failures)


def test_temporary_files_are_ignored(tmp_path: Path) -> None:
    """A writer killed between writing a temporary file and renaming it leaves no version."""
    root, local = str(tmp_path / "root"), str(tmp_path / "local")
    factory = ProviderFactory("memory", root, local, conf=CONF)
    provider = factory.open()
    store = provider.get_store(0)
    store.put(("a", 1), (1, None))
    store.commit()
    directory = DurableDir(root).child(factory.store_id.relative_dir)
    real = durable_files(factory.store_id)[0][2]
    directory.write_atomic(f"{TMP_PREFIX}deadbeef-2_{'0' * 24}.delta", b"partial")
    directory.write_atomic(f"{TMP_PREFIX}cafe-{real}", directory.read(real)[:10])
    provider = factory.reopen()
    assert provider.latest_version() == 1
    assert read_all(provider.get_read_store(1))["default"] == {("a", 1): (1, None)}
    provider.do_maintenance()  # young temporary files are left to their (maybe live) writer
    assert len(directory.list(include_tmp=True)) == len(directory.list()) + 2
    factory.close_all()


@pytest.mark.skipif(not HAVE_ROCKSDB, reason="sparkstate.store.rocksdb.provider not landed")
def test_maintenance_by_another_worker_during_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker process of the executor runs maintenance while this one commits.

    The other worker is a second provider instance on the same local directory (maintenance
    does not take the store's lock); it runs at the worst moment, right after RocksDB wrote the
    checkpoint of a version whose snapshot is due.
    """
    local = importlib.import_module("sparkstate.store.rocksdb.local")
    conf = {"min_deltas_for_snapshot": 1}
    factory = ProviderFactory("rocksdb", str(tmp_path / "root"), str(tmp_path / "local"), conf=conf)
    committer, other = factory.open(), factory.open()
    real_checkpoint = local.rocksdict.Checkpoint

    class InterleavedCheckpoint:
        def __init__(self, db: Any) -> None:
            self._checkpoint = real_checkpoint(db)

        def create_checkpoint(self, path: str) -> None:
            self._checkpoint.create_checkpoint(path)
            other.do_maintenance()

    monkeypatch.setattr(local.rocksdict, "Checkpoint", InterleavedCheckpoint)
    states = history(3)
    try:
        for v in range(1, 4):
            store = committer.get_store(v - 1)
            puts, removes = changes(v)
            for k, value in puts.items():
                store.put(k, value)
            for k in removes:
                store.remove(k)
            assert store.commit() == v
            committer.do_maintenance()
        provider = factory.reopen(local_dir=factory.fresh_local_dir())
        check_files_complete(factory, provider)
        for v in range(1, 4):
            assert read_all(provider.get_read_store(v))["default"] == states[v]
    finally:
        factory.close_all()


def test_kill_mid_write_on_a_file_system_with_rename(tmp_path: Path) -> None:
    """Not the local file system, but one with rename (like HDFS): writes still go temp + rename."""
    slot = Slot("memory", tmp_path / "slot")
    dry = slot.run(None, subtree=True)
    assert dry.returncode == 0, dry.output
    (write,) = [n for n, phase, kind, _ in dry.events if (phase, kind) == ("commit-6", "write")]
    run = slot.run(write, subtree=True)
    assert run.returncode == -signal.SIGKILL, run.output
    recover_and_check(slot, run, str(tmp_path / "fresh"))


if __name__ == "__main__":
    child_main(json.loads(sys.argv[1]))
