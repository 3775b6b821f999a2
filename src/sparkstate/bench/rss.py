"""Resident memory of a local Spark: the JVM and its Python workers, read from ``/proc``.

PySpark's JVM starts one ``pyspark.daemon`` per interpreter, and the daemon forks the Python
workers that run the tasks; where the daemon is not used, the JVM starts the workers itself. So
the workers are the grandchildren of the JVM and, for a child of the JVM that has none, that
child; only Python processes count (the JVM also runs short commands of its own). Their
``VmRSS`` is added up (pages a forked worker still shares with the daemon are counted in each),
and so is their ``Pss`` (``/proc/<pid>/smaps_rollup``: each shared page divided among the
processes that share it, so the sum counts a page the workers and the state homes forked from
them share once). Linux only; nothing beyond the standard library.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterable, Mapping

from sparkstate.runtime.home_client import home_dir

__all__ = [
    "RssSample",
    "RssSampler",
    "parse_stat",
    "parse_vm_rss_kb",
    "process_pss_kb",
    "process_rss_kb",
    "processes",
    "python_workers",
    "state_homes",
]

PROC = "/proc"


def parse_stat(stat_text: str) -> tuple[int, str]:
    """The parent pid and the command name from the text of ``/proc/<pid>/stat``. The name
    (second field, in parentheses) may itself hold spaces and parentheses, so the fields after
    it are counted from the last ``)``: state, then ppid."""
    close = stat_text.rindex(")")
    name = stat_text[stat_text.index("(") + 1 : close]
    return int(stat_text[close + 1 :].split()[1]), name


def parse_vm_rss_kb(status_text: str) -> int:
    """``VmRSS`` in kB from the text of ``/proc/<pid>/status``; 0 when absent (a zombie, a
    kernel thread)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process exited between listing and reading
        return None


def processes(proc: str = PROC) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name) of every process visible in ``proc``."""
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        text = _read(os.path.join(proc, name, "stat"))
        if text is not None:
            out[int(name)] = parse_stat(text)
    return out


def process_rss_kb(pid: int, proc: str = PROC) -> int:
    """``VmRSS`` of ``pid`` in kB; 0 if it is gone."""
    text = _read(os.path.join(proc, str(pid), "status"))
    return 0 if text is None else parse_vm_rss_kb(text)


def process_pss_kb(pid: int, proc: str = PROC) -> int:
    """``Pss`` of ``pid`` in kB (its private pages plus its share of shared ones); 0 if it is
    gone or the kernel does not say."""
    text = _read(os.path.join(proc, str(pid), "smaps_rollup"))
    for line in (text or "").splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def python_workers(procs: Mapping[int, tuple[int, str]], jvm_pid: int) -> list[int]:
    """The Python workers of the JVM ``jvm_pid`` given every process's parent and name: the
    children of each of its children (a daemon), or the child itself where it has none; Python
    processes only."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _name) in procs.items():
        children.setdefault(parent, []).append(pid)
    workers: list[int] = []
    for child in sorted(children.get(jvm_pid, [])):
        forked = children.get(child, [])
        workers.extend(sorted(forked) if forked else [child])
    return [pid for pid in workers if procs[pid][1].startswith("python")]


def state_homes(jvm_pid: int, proc: str = PROC, homes: str | None = None) -> list[int]:
    """The running state homes of the executor whose JVM is ``jvm_pid``: the pids in the pid
    files of its homes (``<jvm pid>-*.pid`` in ``homes``, the homes' directory by default)."""
    homes = home_dir() if homes is None else homes
    try:
        names = os.listdir(homes)
    except OSError:
        return []
    found: list[int] = []
    for name in names:
        if not (name.startswith(f"{jvm_pid}-") and name.endswith(".pid")):
            continue
        try:
            with open(os.path.join(homes, name), encoding="utf-8") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):  # a home ending right now
            continue
        if os.path.exists(os.path.join(proc, str(pid))):
            found.append(pid)
    return sorted(found)


@dataclasses.dataclass(frozen=True)
class RssSample:
    """One reading: seconds since the sampler started, the JVM's and all workers' RSS in MB."""

    t_s: float
    jvm_mb: float
    workers_mb: float
    workers: int

    def as_list(self) -> list[float]:
        return [round(self.t_s, 1), round(self.jvm_mb, 1), round(self.workers_mb, 1), self.workers]


def _sum_mb(pids: Iterable[int], proc: str) -> float:
    return sum(process_rss_kb(pid, proc) for pid in pids) / 1024


class RssSampler:
    """Samples the JVM and its Python workers every ``interval_s`` in a daemon thread; keeps
    every sample, the peaks of the whole run, and the peaks since :meth:`take_peaks` last ran."""

    def __init__(self, jvm_pid: int, interval_s: float = 1.0, proc: str = PROC) -> None:
        self.jvm_pid = jvm_pid
        self.interval_s = interval_s
        self.proc = proc
        self.samples: list[RssSample] = []
        self.peak_jvm_mb = 0.0
        self.peak_workers_mb = 0.0
        #: The peak of the workers' and homes' summed PSS (shared pages counted once).
        self.peak_workers_pss_mb = 0.0
        self._window: tuple[float, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def sample(self) -> RssSample:
        """Read once, record it and fold it into the peaks."""
        workers = python_workers(processes(self.proc), self.jvm_pid)
        workers += state_homes(self.jvm_pid, self.proc)
        s = RssSample(
            time.monotonic() - self._started,
            process_rss_kb(self.jvm_pid, self.proc) / 1024,
            _sum_mb(workers, self.proc),
            len(workers),
        )
        pss_mb = sum(process_pss_kb(pid, self.proc) for pid in workers) / 1024
        with self._lock:
            self.peak_workers_pss_mb = max(self.peak_workers_pss_mb, pss_mb)
            self.samples.append(s)
            self.peak_jvm_mb = max(self.peak_jvm_mb, s.jvm_mb)
            self.peak_workers_mb = max(self.peak_workers_mb, s.workers_mb)
            old = self._window or (0.0, 0.0)
            self._window = (max(old[0], s.jvm_mb), max(old[1], s.workers_mb))
        return s

    def take_peaks(self) -> tuple[float, float]:
        """(JVM, workers) peaks in MB since the last call (the latest sample if none was taken
        since), and a new window from now on."""
        with self._lock:
            peaks, self._window = self._window, None
            if peaks is None:
                last = self.samples[-1] if self.samples else None
                peaks = (last.jvm_mb, last.workers_mb) if last else (0.0, 0.0)
        return peaks

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.interval_s)
