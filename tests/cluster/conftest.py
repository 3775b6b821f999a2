"""A Spark standalone cluster on loopback (a master and two 1-core workers) for the cluster tests.

The cluster runs from the installed ``pyspark`` package (``SPARK_HOME`` = its directory) as
subprocesses, each in its own process group, so that a test can SIGKILL a worker together with its
executor JVM and that executor's Python workers. Executors run in ``<worker>/work/<app>/<id>/``
and inherit the worker's environment, which sets a ``SPARKSTATE_LOCAL_DIR`` of the worker's own
(the engine ignores it today: see ``test_local_dir.py``). The streaming tests therefore give a
relative ``stateStore.local_dir``, which each executor resolves against its working directory:
every executor keeps its local RocksDB copies apart, as on separate machines, and a partition that
moves between executors has to restore from the durable state under the checkpoint.

The processes are session-scoped; the ``SparkSession`` on the cluster is package-scoped, so that it
is stopped before other test packages create their local sessions in the same pytest process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyspark  # noqa: E402
from pyspark import SparkContext  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
HOST = "127.0.0.1"
#: Cluster start (JVMs on a loaded 2-core machine) is slow; be generous.
START_TIMEOUT_S = 90.0
WORKER_CORES = 1
WORKER_MEMORY = "1g"
_REPO = str(Path(__file__).resolve().parents[2])
# ``tests.cluster.observed`` (a provider) must import in the driver and in the executors' workers.
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def java_missing() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return "Java is not installed (no JAVA_HOME, no java on PATH): a Spark cluster needs it"
    if not os.path.exists(os.path.join(SPARK_HOME, "bin", "spark-class")):
        return f"{SPARK_HOME}/bin/spark-class is missing: this pyspark cannot start a cluster"
    return None


def _kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal the process group of ``proc`` (it leads its own session) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclasses.dataclass
class Worker:
    """One worker: its directories, its current process (None while down) and its log."""

    name: str
    root: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    port: int = 0
    #: The address it binds and its executors advertise (loopback addresses other than
    #: ``HOST`` make workers that Spark takes for other machines, as speculation needs).
    host: str = HOST

    @property
    def local_dir(self) -> Path:
        """The ``SPARKSTATE_LOCAL_DIR`` of this worker's executors (kept across restarts)."""
        return self.root / "local"

    @property
    def work_dir(self) -> Path:
        """``--work-dir``: each executor runs (and its Python workers run) in
        ``<work_dir>/<app id>/<executor id>/``."""
        return self.root / "work"

    @property
    def log(self) -> Path:
        return self.root / f"worker-{self.starts}.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class Cluster:
    """A master and workers started with ``spark-class`` on loopback."""

    def __init__(
        self,
        root: Path,
        num_workers: int = 2,
        *,
        python_env: bool = True,
        hosts: list[str] | None = None,
    ) -> None:
        """``python_env=False``: the daemons (and so the executors) get neither this process's
        ``PYTHONPATH`` nor a ``PYSPARK_PYTHON``, as on nodes where nothing is installed.
        ``hosts``: each worker's loopback address (all ``HOST`` by default)."""
        self.root = root
        self.python_env = python_env
        self.port = free_port()
        self.web_port = free_port()
        self.master_url = f"spark://{HOST}:{self.port}"
        self.master: subprocess.Popen[bytes] | None = None
        hosts = hosts or [HOST] * num_workers
        self.workers = [Worker(f"w{i}", root / f"w{i}", host=hosts[i]) for i in range(num_workers)]

    # --- processes -------------------------------------------------------------------------------

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": SPARK_HOME,
                "SPARK_LOCAL_IP": HOST,
                "SPARK_DAEMON_MEMORY": "256m",
                # Short-lived daemons on a busy machine: C1 only, serial GC, no REST server.
                "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                "SPARK_CONF_DIR": str(self.root / "conf"),
            }
        )
        if self.python_env:
            env["PYSPARK_PYTHON"] = sys.executable
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (_REPO, os.environ.get("PYTHONPATH", "")) if p
            )
        else:
            for name in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"):
                env.pop(name, None)
        env.update(extra)
        return env

    def _spawn(self, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(self.root),
                start_new_session=True,  # its own process group: executors and Python workers too
            )

    def start(self) -> None:
        (self.root / "conf").mkdir(parents=True, exist_ok=True)
        self.master = self._spawn(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.web_port),
            ],
            self.root / "master.log",
            self._env({}),
        )
        # Workers start at once: one that finds the master not yet up retries within seconds.
        for w in self.workers:
            self.start_worker(w, wait=False)
        for w in self.workers:
            self.wait_for_worker(w)

    def start_worker(self, w: Worker, *, wait: bool = True) -> None:
        assert w.proc is None, f"{w.name} is running"
        w.local_dir.mkdir(parents=True, exist_ok=True)
        w.work_dir.mkdir(parents=True, exist_ok=True)
        w.starts += 1
        w.port = free_port()
        env = self._env({"SPARKSTATE_LOCAL_DIR": str(w.local_dir), "SPARK_LOCAL_IP": w.host})
        w.proc = self._spawn(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                w.host,
                "--port",
                str(w.port),
                "--webui-port",
                str(free_port()),
                "--cores",
                str(WORKER_CORES),
                "--memory",
                WORKER_MEMORY,
                "--work-dir",
                str(w.work_dir),
                self.master_url,
            ],
            w.log,
            env,
        )
        if wait:
            self.wait_for_worker(w)

    def kill_worker(self, w: Worker) -> None:
        """SIGKILL the worker's process group: the worker, its executor, the Python workers."""
        assert w.proc is not None, f"{w.name} is not running"
        _kill_group(w.proc)
        w.proc = None

    def executor_dirs(self, relative: str) -> dict[str, Path]:
        """``<worker>/<executor id>`` -> ``relative`` under that executor's working directory,
        for every executor any worker ran (``stateStore.local_dir`` relative to the executor)."""
        out: dict[str, Path] = {}
        for w in self.workers:
            for d in sorted(w.work_dir.glob(f"app-*/*/{relative}")):
                out[f"{w.name}/exec{d.parent.name}"] = d
        return out

    def alive_workers(self) -> list[dict[str, Any]]:
        state = self.state()
        return [x for x in state.get("workers", []) if x.get("state") == "ALIVE"]

    def wait_for_worker(self, w: Worker) -> None:
        def registered(state: dict[str, Any]) -> bool:
            return any(
                x.get("state") == "ALIVE" and f"{x.get('host')}:{x.get('port')}" == w.address
                for x in state.get("workers", [])
            )

        self._wait(registered, f"worker {w.name} ({w.address}) to register", w.log, w.proc)

    def state(self) -> dict[str, Any]:
        url = f"http://{HOST}:{self.web_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data

    def _wait(
        self,
        ready: Any,
        what: str,
        log: Path,
        proc: subprocess.Popen[bytes] | None = None,
    ) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for p, name in ((self.master, "master"), (proc, "worker")):
                if p is not None and p.poll() is not None:
                    msg = f"the {name} exited with {p.returncode} while waiting for {what}:\n"
                    raise RuntimeError(msg + _tail(log))
            try:
                if ready(self.state()):
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.3)
        msg = f"timed out after {START_TIMEOUT_S:.0f} s waiting for {what}:\n{_tail(log)}"
        raise RuntimeError(msg)

    def stop(self) -> None:
        for w in self.workers:
            if w.proc is not None:
                _kill_group(w.proc)
                w.proc = None
        if self.master is not None:
            _kill_group(self.master)
            self.master = None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running standalone cluster: a master and two workers (1 core, 1g each) on loopback."""
    reason = java_missing()
    if reason:
        pytest.skip(reason)
    active = SparkContext._active_spark_context
    if active is not None and not str(active.master).startswith(f"spark://{HOST}:"):
        pytest.skip(
            f"a SparkContext with master {active.master} is already running in this process "
            "(one per process): run tests/cluster in a pytest process of its own"
        )
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    # The driver's JVM starts while the cluster does (the SparkSession is created later).
    gateway = threading.Thread(target=SparkContext._ensure_initialized, daemon=True)
    gateway.start()
    try:
        c.start()
        gateway.join(START_TIMEOUT_S)
        yield c
    finally:
        c.stop()


def wait_for_executors(spark: SparkSession, n: int, timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until ``n`` executors are registered with the driver."""
    deadline = time.monotonic() + timeout_s
    sc = spark.sparkContext
    while time.monotonic() < deadline:
        count = len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1
        if count == n:
            return
        time.sleep(0.3)
    msg = f"timed out after {timeout_s:.0f} s waiting for {n} executors"
    raise RuntimeError(msg)


#: The settings of every session on the cluster (these tests', the speculation job's, the chaos
#: run's): one 1-core executor per worker, the driver on loopback.
SESSION_CONF = {
    "spark.executor.memory": "1g",
    "spark.executor.cores": "1",
    # Small jobs on a busy 2-core machine: C1 only and serial GC start executors faster.
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.driver.host": HOST,
    "spark.driver.bindAddress": HOST,
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.pyspark.python": sys.executable,
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    # Place tasks where a core is free now: waiting for shuffle locality would pin partitions.
    "spark.locality.wait": "0s",
}


@pytest.fixture(scope="package")
def cluster_spark(cluster: Cluster) -> Iterator[SparkSession]:
    """A ``SparkSession`` whose master is the cluster; one executor per worker."""
    active = SparkContext._active_spark_context
    if active is not None and active.master != cluster.master_url:
        pytest.skip(
            f"a SparkContext with master {active.master} is already running in this process "
            "(one per process): run tests/cluster in a pytest process of its own"
        )
    session = (
        SparkSession.builder.master(cluster.master_url)
        .appName("sparkstate-cluster-tests")
        .config(map=SESSION_CONF)
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.schemaInference", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "90s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        wait_for_executors(session, len(cluster.workers))
        yield session
    finally:
        for q in session.streams.active:
            with contextlib.suppress(Exception):
                q.stop()
        session.stop()
