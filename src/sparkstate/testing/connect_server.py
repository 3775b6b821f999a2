"""A Spark Connect server started from the PySpark wheel on loopback, for trying sparkstate over
Spark Connect and for its tests::

    server = ConnectServer(workdir)
    server.start()  # about 10-20 s
    spark = SparkSession.builder.remote(server.url).getOrCreate()
    ...
    server.stop()

Or from the shell: ``python -m sparkstate.testing.connect_server <workdir>`` (stop with Ctrl-C).
The server's Python workers, where sparkstate runs, use ``python`` (this interpreter by
default), which must have sparkstate installed. A process holds either a classic session or a
Connect client session, not both: clients of this server run in processes of their own.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ConnectServer"]

SERVER_CLASS = "SparkConnectServer"
_SERVER_MAIN = "org.apache.spark.sql.connect.service." + SERVER_CLASS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_home() -> str:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        msg = "the Spark Connect server starts from the pyspark package, which is not installed"
        raise RuntimeError(msg)
    return os.path.dirname(spec.origin)


class ConnectServer:
    """One Spark Connect server (``local[2]`` by default) with its pid and log files in
    ``workdir``; ``url`` is the client's ``sc://`` address once started."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        python: str = sys.executable,
        master: str = "local[2]",
        conf: dict[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.python = python
        self.master = master
        self.conf = dict(conf or {})
        self.port = 0
        self.spark_home = _spark_home()

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=self.spark_home,
            SPARK_PID_DIR=str(self.workdir / "pid"),  # start refuses while a live pid file is there
            SPARK_LOG_DIR=str(self.workdir / "log"),
            PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python,
            SPARK_CONNECT_MODE="0",  # as sbin/start-connect-server.sh (4.3) sets it
        )
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
            env.pop(name, None)
        return env

    def start(self, timeout_s: float = 180.0) -> float:
        """Start the server and wait until it answers a query; the seconds that took."""
        started = time.monotonic()
        self.port = _free_port()
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.pyspark.python": self.python,
            "spark.pyspark.driver.python": self.python,
            "spark.driver.host": "127.0.0.1",
            "spark.ui.enabled": "false",
            **self.conf,
        }
        # sbin/start-connect-server.sh is in the wheel from 4.3 only: what it runs, on 4.0+.
        args = [
            "bash", f"{self.spark_home}/sbin/spark-daemon.sh", "submit", _SERVER_MAIN, "1",
            "--name", "Spark Connect server", "--master", self.master,
        ]  # fmt: skip
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        cwd = self.workdir / "cwd"  # the server's working directory: on its workers' sys.path
        cwd.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            args,
            env=self._env(),
            cwd=cwd,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = started + timeout_s
        while not self._listening():
            if self._pid() is None:
                msg = f"the Spark Connect server ended while starting; see {self.log_file()}"
                raise RuntimeError(msg)
            if time.monotonic() > deadline:
                self.stop()
                msg = (
                    f"the Spark Connect server did not listen in {timeout_s:.0f} s; "
                    f"see {self.log_file()}"
                )
                raise TimeoutError(msg)
            time.sleep(0.2)
        probe = (
            "from pyspark.sql import SparkSession; "
            f"SparkSession.builder.remote({self.url!r}).getOrCreate().range(1).collect()"
        )
        subprocess.run(  # in another process: this one may hold a classic session
            [self.python, "-c", probe],
            check=True,
            timeout=max(5.0, deadline - time.monotonic()),
            env={k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"},
        )
        return time.monotonic() - started

    def _listening(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def _pid(self) -> int | None:
        files = glob.glob(str(self.workdir / "pid" / f"*{SERVER_CLASS}*.pid"))
        if not files:
            return None
        pid = int(Path(files[0]).read_text().strip())
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def log_file(self) -> str:
        """The server's log (its Python workers' output too)."""
        files = glob.glob(str(self.workdir / "log" / f"*{SERVER_CLASS}*.out"))
        return files[0] if files else str(self.workdir / "log")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server and its Python processes."""
        pid = self._pid()
        subprocess.run(
            ["bash", f"{self.spark_home}/sbin/spark-daemon.sh", "stop", _SERVER_MAIN, "1"],
            env=self._env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        deadline = time.monotonic() + timeout_s
        while pid is not None and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    workdir = sys.argv[1] if len(sys.argv) > 1 else "connect-server"
    server = ConnectServer(workdir)
    took = server.start()
    print(f"Spark Connect server at {server.url} (ready in {took:.0f} s; log {server.log_file()})")
    print("Ctrl-C stops it.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
