"""The chaos run: three stateful queries on a two-worker standalone cluster, once without faults
and once under a seeded schedule of faults, then both runs' output and state compared.

The faults, each at a random moment (``--gap`` seconds apart), the kind injected least so far
next:

- ``python-worker``: SIGKILL of a Python worker of an executor (a child of PySpark's daemon);
- ``state-home``: SIGKILL of a state home, the process that owns partitions' state;
- ``executor``: SIGKILL of an executor's JVM with every process under it (its Python daemon
  and workers); the cluster's worker starts a new executor;
- ``driver``: SIGKILL of the driver's process group (Python and its JVM); the queries are
  started again from their checkpoints, as a supervisor would;
- ``lazy-restore``: an executor's disk lost in the middle of a restore: its state homes
  SIGKILLed and its local copies deleted, so that its partitions restore from the checkpoint at
  their next task, lazily (every restore here is: ``lazy_restore_min_mb`` 0); then, once a new
  home runs there, that home SIGKILLed a moment later, in the middle of the lazy restore (its
  reads of the snapshot's files in place, or the download behind them).

A driver that ends with an error (a task that failed too often) is started again too. At the
end, every sink's rows (read through its manifest) and every query's state (read with the state
reader) must equal the run without faults: each row exactly once.

With ``--s3 RATE`` the queries' state is on a loopback S3 server (``stateLocation``), and in the
run with faults a proxy in front of it answers that share of the requests with S3's faults
(``tests/s3_fault_proxy.py``: 503 SlowDown, 500, delays, connections reset in the middle of an
upload or a download).

Usage: ``./scripts/chaos [--batches N] [--faults N] [--seed N] [--gap MIN MAX] [--s3 RATE]
[--work DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import s3_server  # noqa: E402
from tests.chaos.queries import QUERIES, restores, write_input  # noqa: E402
from tests.cluster.conftest import Cluster  # noqa: E402
from tests.s3_fault_proxy import FaultProxy  # noqa: E402

KINDS = ("python-worker", "state-home", "executor", "driver", "lazy-restore")
#: The executors' local copies (``stateStore.local_dir``, relative to an executor's directory).
LOCAL_DIR = "sparkstate-local"
#: The whole run's limit: a run that makes no progress fails rather than hangs.
TIMEOUT_S = 3600.0
#: How long the ``lazy-restore`` fault waits for a new home on the executor whose disk it lost.
LAZY_WAIT_S = 10.0
#: Options of every query: local copies per executor, maintenance after every batch.
OPTIONS = {
    "stateStore": "rocksdb",
    "stateStore.local_dir": LOCAL_DIR,
    "stateStore.maintenanceIntervalSeconds": "0",
    "stateStore.min_deltas_for_snapshot": "5",
    "stateStore.lazy_restore_min_mb": "0",
}


# --------------------------------------------------------------------------- processes


def _processes() -> dict[int, dict[str, Any]]:
    """Every process: its parent, name, command line and working directory (where readable)."""
    out: dict[int, dict[str, Any]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        out[pid] = {"ppid": ppid, "name": name, "cmdline": cmdline, "cwd": cwd}
    return out


def _descendants(procs: dict[int, dict[str, Any]], root: int) -> list[int]:
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, info in procs.items() if info["ppid"] == pid]
        found += children
        frontier += children
    return found


def _kill(pids: list[int]) -> bool:
    killed = False
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed = True
    return killed


class Driver:
    """The driver process of the run with faults; started again whenever it ends unfinished."""

    def __init__(self, work: Path, master: str) -> None:
        self.work = work
        self.master = master
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.work / f"driver-{self.starts}.log", "wb")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.queries", str(self.work), "faults", self.master],
            cwd=str(REPO),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the driver's JVM goes with it
        )

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def inject(kind: str, rnd: random.Random, cluster_root: Path, driver: Driver) -> bool:
    """Inject one fault of ``kind``; whether there was something to kill."""
    if kind == "driver":
        if driver.poll() is not None:
            return False
        driver.kill()
        return True
    procs = _processes()
    ours = {p: i for p, i in procs.items() if i["cwd"].startswith(str(cluster_root))}
    if kind == "executor":
        executors = [p for p, i in ours.items() if "CoarseGrainedExecutorBackend" in i["cmdline"]]
        if not executors:
            return False
        victim = rnd.choice(sorted(executors))
        return _kill([victim, *_descendants(procs, victim)])
    homes = [p for p, i in ours.items() if i["name"] == "sparkstate-home"]
    if kind == "state-home":
        return bool(homes) and _kill([rnd.choice(sorted(homes))])
    if kind == "lazy-restore":
        return bool(homes) and _lose_disk(ours[rnd.choice(sorted(homes))]["cwd"], rnd)
    daemons = {p for p, i in ours.items() if "pyspark.daemon" in i["cmdline"]}
    workers = [
        p for p, i in ours.items() if i["ppid"] in daemons and i["name"] != "sparkstate-home"
    ]
    return bool(workers) and _kill([rnd.choice(sorted(workers))])


def _homes_in(cwd: str) -> list[int]:
    procs = _processes()
    return sorted(p for p, i in procs.items() if i["name"] == "sparkstate-home" and i["cwd"] == cwd)


def _lose_disk(cwd: str, rnd: random.Random) -> bool:
    """The ``lazy-restore`` fault on the executor in ``cwd`` (see the module)."""
    _kill(_homes_in(cwd))
    shutil.rmtree(Path(cwd) / LOCAL_DIR, ignore_errors=True)
    deadline = time.monotonic() + LAZY_WAIT_S
    while time.monotonic() < deadline and not (again := _homes_in(cwd)):
        time.sleep(0.05)
    if again:
        time.sleep(rnd.uniform(0.05, 0.5))
        _kill(again)
    return True


# --------------------------------------------------------------------------- the run


def _batches_done(work: Path, run: str) -> int:
    """Batches the queries of ``run`` committed (the newest in Spark's commit logs, which keep
    the last 100), summed."""
    total = 0
    for query in QUERIES:
        commits = work / run / "chk" / query / "commits"
        if commits.is_dir():
            ids = [int(f.name) for f in commits.iterdir() if f.name.isdigit()]
            total += max(ids) + 1 if ids else 0
    return total


def _run_reference(work: Path, master: str) -> None:
    log = work / "reference.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.queries", str(work), "reference", master],
            cwd=str(REPO),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        started = time.monotonic()
        shown = started
        while proc.poll() is None and time.monotonic() < started + TIMEOUT_S:
            time.sleep(0.5)
            if time.monotonic() - shown > 15:
                shown = time.monotonic()
                print(f"  batches committed {_batches_done(work, 'reference')}", flush=True)
        if proc.poll() is None:
            proc.kill()
    if proc.wait() != 0:
        tail = log.read_text(errors="replace")[-3000:]
        msg = f"the run without faults failed ({proc.returncode}):\n{tail}"
        raise RuntimeError(msg)


def run_with_faults(
    work: Path, cluster: Cluster, faults: int, gap: tuple[float, float], seed: int
) -> tuple[Counter[str], Driver]:
    """The queries under faults until they finish; the faults injected, and the driver."""
    rnd = random.Random(seed)
    driver = Driver(work, cluster.master_url)
    driver.start()
    injected: Counter[str] = Counter()
    deadline = time.monotonic() + TIMEOUT_S
    next_fault: float | None = None  # once the queries committed their first batch
    last_shown = 0.0
    while time.monotonic() < deadline:
        code = driver.poll()
        if code == 0:
            return injected, driver
        if code is not None:  # killed, or a query failed: start it again from the checkpoints
            driver.start()
        if next_fault is None and _batches_done(work, "faults") > 0:
            next_fault = time.monotonic() + rnd.uniform(*gap)
        if next_fault is not None and time.monotonic() >= next_fault:
            least = min(injected[k] for k in KINDS)
            kinds = [k for k in KINDS if injected[k] == least]
            rnd.shuffle(kinds)
            for kind in kinds:
                if inject(kind, rnd, cluster.root, driver):
                    injected[kind] += 1
                    break
            next_fault = time.monotonic() + rnd.uniform(*gap)
            if sum(injected.values()) >= faults:
                next_fault = float("inf")
        if time.monotonic() - last_shown > 15:
            last_shown = time.monotonic()
            print(
                f"  faults {sum(injected.values())}/{faults}, driver starts {driver.starts}, "
                f"batches committed {_batches_done(work, 'faults')}",
                flush=True,
            )
        time.sleep(0.2)
    driver.kill()
    msg = f"the run with faults did not finish within {TIMEOUT_S:.0f} s"
    raise RuntimeError(msg)


def chaos(
    batches: int,
    faults: int,
    seed: int,
    gap: tuple[float, float],
    work: Path,
    s3_rate: float = 0.0,
    snapshot_deltas: int | None = None,
) -> dict[str, Any]:
    """The whole chaos run; its summary (printed as it goes). ``s3_rate``: the queries' state
    on a loopback S3 server, that share of the run with faults' requests answered with faults.
    ``snapshot_deltas``: a snapshot after that many versions (default: :data:`OPTIONS`')."""
    work.mkdir(parents=True, exist_ok=True)
    rows = write_input(work, seed, batches)
    print(f"chaos run: seed {seed}, {batches} batches of 3 queries, {rows} input rows", flush=True)
    options = dict(OPTIONS)
    if snapshot_deltas is not None:
        options["stateStore.min_deltas_for_snapshot"] = str(snapshot_deltas)
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(_state_on_s3(work, seed, s3_rate, options)) if s3_rate else None
        summary = _run(work, batches, faults, seed, gap, proxy, options)
    summary["input_rows"] = rows
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    print(describe(summary), flush=True)
    return summary


@contextlib.contextmanager
def _state_on_s3(
    work: Path, seed: int, rate: float, options: dict[str, str]
) -> Iterator[FaultProxy]:
    """A loopback S3 server for the queries' state (``stateLocation``): the run without faults
    reaches it directly, the run with faults through a proxy that answers a share ``rate`` of
    requests with S3's faults (503, 500, delays, connections reset mid-upload and mid-download)."""
    server = s3_server.moto_server()
    if server is None:
        msg = "--s3 needs moto_server next to this Python (pip install moto[server])"
        raise RuntimeError(msg)
    s3_server.client_env()  # the driver, the executors and their workers inherit it
    proc, endpoint = s3_server.start(server, work / "moto_server.log")
    proxy = FaultProxy((endpoint.host, endpoint.port), seed=seed, rate=rate)
    through_proxy = dataclasses.replace(endpoint, port=proxy.port)
    for run, via in (("reference", endpoint), ("faults", through_proxy)):
        on_s3 = {**options, "stateLocation": via.uri("state")}
        (work / f"options-{run}.json").write_text(json.dumps(on_s3))
    try:
        yield proxy
    finally:
        proxy.close()
        s3_server.stop(proc)


def _run(
    work: Path,
    batches: int,
    faults: int,
    seed: int,
    gap: tuple[float, float],
    proxy: FaultProxy | None,
    options: dict[str, str],
) -> dict[str, Any]:
    if proxy is None:
        for run in ("reference", "faults"):
            (work / f"options-{run}.json").write_text(json.dumps(options))
    cluster = Cluster(work / "cluster")
    cluster.start()
    try:
        started = time.monotonic()
        print("run without faults ...", flush=True)
        _run_reference(work, cluster.master_url)
        reference_s = time.monotonic() - started
        print(f"  done in {reference_s:.0f} s; run with faults ...", flush=True)
        started = time.monotonic()
        injected, driver = run_with_faults(work, cluster, faults, gap, seed)
        faults_s = time.monotonic() - started
    finally:
        cluster.stop()
    print(f"  done in {faults_s:.0f} s; comparing ...", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "tests.chaos.queries", str(work), "compare"],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0:
        msg = f"the comparison failed:\n{done.stderr[-3000:]}"
        raise RuntimeError(msg)
    compared = json.loads((work / "compare.json").read_text())
    return {
        "seed": seed,
        "batches": batches,
        "batches_committed": _batches_done(work, "faults"),
        "faults": dict(injected),
        "s3_faults": dict(proxy.faults) if proxy is not None else {},
        "s3_requests": proxy.requests if proxy is not None else 0,
        "driver_starts": driver.starts,
        "restores": restores(work, "faults"),
        "seconds": {"without_faults": round(reference_s), "with_faults": round(faults_s)},
        "compared": compared,
        "differences": sum(c["missing"] + c["extra"] for c in compared.values()),
    }


def describe(summary: dict[str, Any]) -> str:
    faults = summary["faults"]
    lines = [
        f"seed {summary['seed']}: {summary['batches']} input batches per query, "
        f"{summary['batches_committed']} batches committed by the 3 queries with faults",
        f"faults injected: {sum(faults.values())} ("
        + ", ".join(f"{k} {faults.get(k, 0)}" for k in KINDS)
        + ")",
        (
            f"S3 faults: {sum(summary['s3_faults'].values())} in {summary['s3_requests']} "
            "requests ("
            + ", ".join(f"{k} {n}" for k, n in sorted(summary["s3_faults"].items()))
            + ")"
            if summary["s3_requests"]
            else "state on the local disk (no S3 faults)"
        ),
        f"driver starts: {summary['driver_starts']} (restarts: {summary['driver_starts'] - 1})",
        f"restores from the checkpoint: {summary['restores']['restores']} "
        f"({summary['restores']['lazy']} lazy)",
        f"time: {summary['seconds']['without_faults']} s without faults, "
        f"{summary['seconds']['with_faults']} s with",
    ]
    for item, c in summary["compared"].items():
        lines.append(f"  {item}: {c['rows']} rows, missing {c['missing']}, extra {c['extra']}")
    lines.append(f"differences: {summary['differences']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200, help="input batches per query")
    parser.add_argument("--faults", type=int, default=60, help="faults to inject")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--gap", type=float, nargs=2, default=(2.0, 8.0), help="seconds between faults"
    )
    parser.add_argument(
        "--s3",
        type=float,
        default=0.0,
        metavar="RATE",
        help="the state on a loopback S3 server, RATE of the requests with faults answered so",
    )
    parser.add_argument("--work", type=Path, default=None, help="(default: a new temp dir)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="sparkstate-chaos-"))
    print(f"working in {work}", flush=True)
    summary = chaos(args.batches, args.faults, args.seed, tuple(args.gap), work, args.s3)
    return 0 if summary["differences"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
