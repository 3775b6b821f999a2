"""The rocksdb provider keeps a partition's local database open between tasks of one process, hands
it to another process that asks, and never serves a stale version."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sparkstate.store.base import StateStoreProvider
from sparkstate.testing.factory import ProviderFactory

#: A worker process of the same executor: commands on stdin, one JSON answer per line.
WORKER = """
    import json, sys
    from sparkstate.testing.factory import ProviderFactory
    factory = ProviderFactory("rocksdb", {root!r}, {local!r})
    provider = factory.open()
    store = None
    print(json.dumps({{"ready": True}}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "open":
            store = provider.get_store(cmd["version"], cmd["ckpt"])
            rows = {{k[0]: v[0] for k, v in store.iterator()}}
            print(json.dumps({{"rows": rows}}), flush=True)
        elif cmd["op"] == "put":
            for name, count in cmd["rows"].items():
                store.put((name, 0), (count, None))
            version = store.commit()
            print(json.dumps({{"version": version, "ckpt": store.checkpoint_id}}), flush=True)
        elif cmd["op"] == "held":
            print(json.dumps({{"held": provider.local.held}}), flush=True)
"""


class Worker:
    """A child process running a provider of the same store, driven one command at a time."""

    def __init__(self, root: str, local: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WORKER.format(root=root, local=local))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.read()

    def send(self, **cmd: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            _, err = self.proc.communicate(timeout=20)
            pytest.fail(f"worker exited: {err}")
        answer: dict[str, object] = json.loads(line)
        return answer

    def ask(self, **cmd: object) -> dict[str, object]:
        self.send(**cmd)
        return self.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=20)


def rows_of(provider: StateStoreProvider, version: int, ckpt: str | None) -> dict[str, int]:
    store = provider.get_read_store(version, ckpt)
    try:
        return {k[0]: v[0] for k, v in store.iterator()}
    finally:
        store.abort()


def write(
    provider: StateStoreProvider, version: int, ckpt: str | None, rows: dict[str, int]
) -> tuple[int, str | None]:
    store = provider.get_store(version, ckpt)
    for name, count in rows.items():
        store.put((name, 0), (count, None))
    return store.commit(), store.checkpoint_id


@pytest.fixture
def factory(rocksdb_factory: ProviderFactory) -> ProviderFactory:
    return rocksdb_factory


def test_the_next_task_in_the_same_process_finds_the_database_open(
    factory: ProviderFactory,
) -> None:
    provider = factory.open()
    ref = write(provider, 0, None, {"a": 1})
    assert provider.local.held  # kept for the next task
    for i in range(3):
        ref = write(provider, *ref, {f"k{i}": i})
    assert provider.custom_metrics()["localOpens"] == 0
    assert rows_of(provider, *ref) == {"a": 1, "k0": 0, "k1": 1, "k2": 2}

    closing = factory.open(keep_local_open=False, store_id=factory.store_id)
    ref = write(closing, *ref, {"b": 2})  # asks the first provider to let go
    assert not provider.local.held and not closing.local.held
    write(closing, *ref, {"c": 3})
    assert closing.custom_metrics()["localOpens"] == 2


def test_a_process_that_takes_the_partition_makes_the_holder_let_go(
    factory: ProviderFactory,
) -> None:
    provider = factory.open()
    ref = write(provider, 0, None, {"a": 1})
    worker = Worker(factory.checkpoint_root, factory.local_dir)
    try:
        started = time.monotonic()
        assert worker.ask(op="open", version=ref[0], ckpt=ref[1]) == {"rows": {"a": 1}}
        assert time.monotonic() - started < 5  # asked, not timed out (the timeout is 20 s)
        assert not provider.local.held
        got = worker.ask(op="put", rows={"a": 10, "b": 2})
        ref = (int(got["version"]), str(got["ckpt"]))
        assert worker.ask(op="held") == {"held": True}  # kept open in the worker

        # Back to the first process: the worker lets go, and the version read is the worker's.
        assert rows_of(provider, *ref) == {"a": 10, "b": 2}
        assert worker.ask(op="held") == {"held": False}
    finally:
        worker.kill()


def test_a_holder_in_the_middle_of_a_task_lets_go_when_it_commits(
    factory: ProviderFactory,
) -> None:
    provider = factory.open()
    ref = write(provider, 0, None, {"a": 1})
    worker = Worker(factory.checkpoint_root, factory.local_dir)
    try:
        assert worker.ask(op="open", version=ref[0], ckpt=ref[1]) == {"rows": {"a": 1}}
        # The worker's task is running: this process waits (its retries ask again) ...
        waiting = factory.open(lock_timeout_s=0.5)
        with pytest.raises(Exception, match="locked by pid"):
            write(waiting, *ref, {"x": 0})
        # ... until the task commits, and then takes over without a timeout.
        got = worker.ask(op="put", rows={"b": 2})
        ref = (int(got["version"]), str(got["ckpt"]))
        assert rows_of(provider, *ref) == {"a": 1, "b": 2}
        assert worker.ask(op="held") == {"held": False}
    finally:
        worker.kill()


def test_a_holder_killed_with_its_database_open_loses_nothing(factory: ProviderFactory) -> None:
    worker = Worker(factory.checkpoint_root, factory.local_dir)
    try:
        assert worker.ask(op="open", version=0, ckpt=None) == {"rows": {}}
        got = worker.ask(op="put", rows={str(i): i for i in range(1000)})
        ref = (int(got["version"]), str(got["ckpt"]))
    finally:
        worker.kill()  # its memtable (the WAL is off) dies with it
    provider = factory.open()
    assert rows_of(provider, *ref) == {str(i): i for i in range(1000)}


def test_a_database_kept_open_catches_up_on_versions_written_elsewhere(
    factory: ProviderFactory,
) -> None:
    """A partition that ran on another executor (another local directory) and came back: the
    copy kept open here is behind and catches up, whichever version is asked for."""
    here = factory.open()
    refs = [(0, None)]
    refs.append(write(here, *refs[-1], {"a": 1}))
    refs.append(write(here, *refs[-1], {"b": 2}))
    elsewhere = factory.open(local_dir=factory.fresh_local_dir())
    refs.append(write(elsewhere, *refs[-1], {"a": 3}))
    refs.append(write(elsewhere, *refs[-1], {"c": 4}))
    assert here.local.held  # nobody asked: another executor has its own directory

    replayed = here.custom_metrics()["changelogsReplayed"]
    assert rows_of(here, *refs[4]) == {"a": 3, "b": 2, "c": 4}
    assert here.custom_metrics()["changelogsReplayed"] == replayed + 2
    assert rows_of(here, *refs[3]) == {"a": 3, "b": 2}
    assert rows_of(here, *refs[2]) == {"a": 1, "b": 2}
    # A retried batch on the old executor: version 3 written again, another attempt.
    retried = write(here, *refs[2], {"d": 5})
    assert rows_of(elsewhere, *retried) == {"a": 1, "b": 2, "d": 5}


#: Writes a state that grows far past a 16 MB budget, printing per batch: the process's resident
#: memory, RocksDB's memory (block cache with the memtables charged to it) and its SST bytes.
GROW = """
    import json, os
    from sparkstate.testing.factory import ProviderFactory
    def rss_mb():
        with open("/proc/self/status") as f:
            line = next(l for l in f if l.startswith("VmRSS"))
        return int(line.split()[1]) / 1024
    factory = ProviderFactory(
        "rocksdb", {root!r}, {local!r}, conf={{"memory_budget_mb": 16, "python_workers": 1}}
    )
    provider = factory.open()
    version, ckpt = 0, None
    for batch in range(24):
        store = provider.get_store(version, ckpt)
        first = batch * 100_000
        keys = [("k%09d" % i, i) for i in range(first, first + 100_000)]
        store.put_many(keys, [(i, os.urandom(50).hex()) for i in range(first, first + 100_000)])
        version, ckpt = store.commit(), store.checkpoint_id
        custom = store.metrics().custom
        print(json.dumps([rss_mb(), custom["blockCacheBytes"] / 2**20, custom["sstBytes"] / 2**20]))
"""


def test_memory_stays_inside_a_small_budget_while_state_grows_past_it(tmp_path: Path) -> None:
    code = textwrap.dedent(GROW.format(root=str(tmp_path / "ckpt"), local=str(tmp_path / "l")))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True
    )
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    rss, rocksdb, sst = zip(*rows, strict=True)
    assert max(sst) > 8 * 16  # the state on disk is many times the budget (about ten)
    # RocksDB's memory: the budget, plus at most the memtable of one batch's write (a commit is
    # one write batch, which RocksDB takes whole before it flushes).
    assert max(rocksdb) <= 2.5 * 16
    assert max(rocksdb[-8:]) <= max(rocksdb[:8]) + 4  # flat while the state grows
    # The process grows by a fraction of what the state grows on disk.
    assert rss[-1] - rss[3] < 0.3 * (max(sst) - sst[3])
