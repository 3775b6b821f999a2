"""The memory of a local Spark read from ``/proc`` (a fake one where the test needs it)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from sparkstate.bench import rss


def test_ppid_is_read_after_the_command_name() -> None:
    assert rss.parse_stat("4242 (java) S 17 4242 1 0 -1 4194304 99") == (17, "java")
    # the command name may hold spaces and parentheses
    assert rss.parse_stat("77 (py (x) worker) R 4242 77 1 0") == (4242, "py (x) worker")


def test_vm_rss_in_kb() -> None:
    status = "Name:\tjava\nVmPeak:\t 9000 kB\nVmRSS:\t  123456 kB\nRssAnon:\t 1 kB\n"
    assert rss.parse_vm_rss_kb(status) == 123456
    assert rss.parse_vm_rss_kb("Name:\tkworker\nState:\tI (idle)\n") == 0


def test_python_workers_are_the_daemons_children() -> None:
    procs = {
        10: (1, "java"),  # the JVM
        11: (10, "python"),  # a pyspark daemon ...
        12: (11, "python"),  # ... and the workers it forked
        13: (11, "python"),
        14: (10, "python3.11"),  # a worker the JVM started itself
        15: (10, "sh"),  # a command of the JVM's own
        20: (1, "python"),  # someone else's
        21: (20, "python"),
    }
    assert rss.python_workers(procs, 10) == [12, 13, 14]
    assert rss.python_workers(procs, 99) == []


def _fake_proc(root: Path, procs: dict[int, tuple[int, int]]) -> None:
    """pid -> (ppid, VmRSS kB) as ``/proc`` shows them."""
    for pid, (ppid, kb) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        name = "java" if pid == 10 else "python3"
        (d / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} 1 0 -1\n")
        (d / "status").write_text(f"Name:\tpython3\nVmRSS:\t{kb} kB\n")
        (d / "smaps_rollup").write_text(f"Rss:\t{kb} kB\nPss:\t{kb // 2} kB\n")
    (root / "self").mkdir(exist_ok=True)  # not a pid: skipped


def test_sampler_adds_up_the_workers_and_keeps_peaks(tmp_path: Path) -> None:
    _fake_proc(tmp_path, {10: (1, 1024 * 900), 11: (10, 1024 * 40), 12: (11, 1024 * 300)})
    sampler = rss.RssSampler(10, proc=str(tmp_path))
    first = sampler.sample()
    assert (first.jvm_mb, first.workers_mb, first.workers) == (900, 300, 1)
    _fake_proc(tmp_path, {13: (11, 1024 * 500), 10: (1, 1024 * 700)})
    second = sampler.sample()
    assert (second.jvm_mb, second.workers_mb, second.workers) == (700, 800, 2)
    assert sampler.take_peaks() == (900, 800)
    # no sample since: the latest one stands for the window
    assert sampler.take_peaks() == (700, 800)
    assert (sampler.peak_jvm_mb, sampler.peak_workers_mb) == (900, 800)
    assert sampler.peak_workers_pss_mb == 400  # the fake smaps_rollup says half
    assert second.as_list()[1:] == [700.0, 800.0, 2]


def test_sampler_thread_samples_until_stopped() -> None:
    sampler = rss.RssSampler(os.getpid(), interval_s=0.01).start()
    deadline = time.monotonic() + 10
    try:
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sampler.stop()
    assert len(sampler.samples) >= 3
    assert sampler.peak_jvm_mb > 0  # this process stands in for the JVM
    count = len(sampler.samples)
    time.sleep(0.05)
    assert len(sampler.samples) == count


def test_sampler_counts_the_state_homes_of_the_jvm(tmp_path: Path) -> None:
    """A home is no child of the JVM: it is found by its pid file (``<jvm>-*.pid``)."""
    proc, homes = tmp_path / "proc", tmp_path / "homes"
    _fake_proc(proc, {10: (1, 1024 * 900), 11: (10, 1024 * 40), 12: (11, 1024 * 300)})
    _fake_proc(proc, {30: (1, 1024 * 400), 31: (1, 1024 * 50)})
    homes.mkdir()
    (homes / "10-123-abc-0.pid").write_text("30")
    (homes / "99-123-abc-0.pid").write_text("31")  # another executor's home
    (homes / "10-123-abc-1.pid").write_text("32")  # a home that has ended
    assert rss.state_homes(10, str(proc), str(homes)) == [30]


def test_pss_counts_the_pages_forked_processes_share_once() -> None:
    data = bytearray(os.urandom(64 * 2**20))  # 64 MB, touched
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        time.sleep(0.2)
        pids = (os.getpid(), child)
        rss_kb = sum(rss.process_rss_kb(p) for p in pids)
        pss_kb = sum(rss.process_pss_kb(p) for p in pids)
        assert rss_kb - pss_kb > 48 * 1024, (rss_kb, pss_kb)
        assert len(data) == 64 * 2**20
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert rss.process_pss_kb(child) == 0  # gone
