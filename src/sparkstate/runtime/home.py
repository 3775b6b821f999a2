"""A state home: the long-lived process of an executor in which its state partitions live.

Spark runs a partition's task in whichever of its pooled Python workers is free, so state kept in
a worker moves between processes from one batch to the next. A home stays: the task's worker
streams its input to the home that owns the partition (:mod:`.home_client` finds or starts it) and
streams the output back, and the home runs the task's job (:func:`sparkstate.runtime.tasks.
run_task`, the user's functions included) against its provider cache, which holds the partition
open from one batch to the next. A home serves each connection on a thread of its own.

A home also listens on TCP for tasks that Spark ran on another executor, at an address with a
random token in it. Each job the home runs is told that address (:class:`HomeTask`): a task's
report names it, the batch's commit records it as the partition's owner, and the next batch's
task for the partition connects there wherever it runs, so that a
partition stays with its state across executors too.

A home ends with its executor (it watches the executor's JVM), when idle for ``idle_s`` seconds,
or on SIGTERM; before it ends it closes its providers. Its process is named ``sparkstate-home``
and its pid is in ``<socket>.pid`` (:func:`pid_file`) while it serves. A worker starts one by
forking itself (:func:`become`: every module is imported already), or, where it cannot fork
safely, as ``python -m sparkstate.runtime.home --socket PATH --parent PID:START --idle-s S``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import faulthandler
import gc
import hmac
import logging
import os
import pickle
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pyarrow as pa

from sparkstate.runtime.home_reads import READ, serve_reads
from sparkstate.runtime.home_wire import (
    AUTH,
    BATCH,
    CONSUMED,
    END,
    ERROR,
    FINISHED,
    HEARTBEAT,
    JOB,
    RESULT,
    HomeLost,
    decode_batch,
    encode_batch,
    pickled_error,
    read_frame,
    send_frame,
)
from sparkstate.runtime.providers import PROVIDERS

__all__ = [
    "PROCESS_NAME",
    "HomeJob",
    "ProcessRef",
    "address_file",
    "become",
    "pid_file",
    "release_free_memory",
    "serve",
]

log = logging.getLogger("sparkstate.home")

#: The longest frame a home reads (a task's input batch is one frame).
MAX_FRAME = 2**31

#: A home's process name (what ``ps`` and ``pgrep`` show; at most 15 characters).
PROCESS_NAME = "sparkstate-home"


@dataclasses.dataclass(frozen=True)
class HomeTask:
    """What a job run in a home is given: the task's input batches as they arrive, ``ready()``
    to call once the output is complete, before the commit (it returns when the worker has
    handed all of the output to Spark), and the home's own address, where the tasks of other
    executors reach it (a task's report names it as the partition's owner)."""

    inputs: Iterator[pa.RecordBatch]
    ready: Callable[[], None]
    address: str


#: A home's job: ``job(task)`` yields the output batches and returns the result.
HomeJob = Callable[[HomeTask], Iterator[pa.RecordBatch]]


@dataclasses.dataclass(frozen=True)
class ProcessRef:
    """One process for its whole life: its pid and its start time (a pid is reused)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        stat = proc_stat(pid)
        return None if stat is None else cls(pid, int(stat[19]))

    @classmethod
    def parse(cls, text: str) -> ProcessRef:
        pid, start = text.split(":")
        return cls(int(pid), int(start))

    def __str__(self) -> str:
        return f"{self.pid}:{self.start}"

    def alive(self) -> bool:
        """Whether the process runs (a zombie, killed and not yet reaped, does not)."""
        stat = proc_stat(self.pid)
        return stat is not None and int(stat[19]) == self.start and stat[0] not in ("Z", "X")


def proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command (the 4th field, ppid, is index 1)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def address_file(path: str) -> str:
    """Where the home on the Unix socket ``path`` writes its TCP address."""
    return path.removesuffix(".sock") + ".addr"


def pid_file(path: str) -> str:
    """Where the home on the Unix socket ``path`` writes its pid while it serves."""
    return path.removesuffix(".sock") + ".pid"


def advertised_host(executor: ProcessRef | None = None) -> str:
    """The host other executors reach this home at: ``SPARKSTATE_HOME_HOST``; else the host
    Spark gave the executor (the ``--hostname`` on its JVM's command line, which the driver and
    the other executors reach it at, on every cluster manager); else Spark's ``SPARK_LOCAL_IP``;
    else the address this machine's name resolves to."""
    host = (
        os.environ.get("SPARKSTATE_HOME_HOST")
        or _executor_hostname(executor)
        or os.environ.get("SPARK_LOCAL_IP")
    )
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _executor_hostname(executor: ProcessRef | None) -> str | None:
    if executor is None:
        return None
    try:
        with open(f"/proc/{executor.pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    if b"--hostname" not in args[:-1]:
        return None  # a local master: the driver's JVM
    return args[args.index(b"--hostname") + 1].decode() or None


class Home:
    """The server: accepts connections on ``path`` (and on TCP, with a token) until its
    executor or its idleness ends it."""

    def __init__(self, path: str, parent: ProcessRef | None, idle_s: float) -> None:
        self.path = path
        self.parent = parent
        self.idle_s = idle_s
        self._active = 0
        self._last_active = time.monotonic()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        #: Where the tasks of other executors reach this home (``host:port/token``), once it
        #: serves.
        self.address = ""

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> str:
        """Serve until the end; returns why it ended."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.path)
        server.listen(64)
        server.settimeout(1.0)
        host = advertised_host(self.parent)
        tcp = socket.create_server((host, 0), backlog=64)
        tcp.settimeout(1.0)
        token = secrets.token_hex(16)
        self.address = f"{host}:{tcp.getsockname()[1]}/{token}"
        _write_atomic(address_file(self.path), self.address)
        _write_atomic(pid_file(self.path), str(os.getpid()))
        threading.Thread(target=self._accept, args=(tcp, token), daemon=True).start()
        try:
            self._accept(server, None)
        finally:
            server.close()
            tcp.close()
            try:  # the local copies closed (RocksDB writes its memtables) before the home is gone
                PROVIDERS.close_all()
            finally:
                for leftover in (self.path, address_file(self.path), pid_file(self.path)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(leftover)
        return self._why_stop() or "asked to stop"

    def _accept(self, server: socket.socket, token: str | None) -> None:
        while self._why_stop() is None:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed as the home ends
                return
            conn.settimeout(None)
            if token is not None:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._guard:
                self._active += 1
            threading.Thread(target=self._serve, args=(conn, token), daemon=True).start()

    def _why_stop(self) -> str | None:
        if self._stop.is_set():
            return "asked to stop"
        if self.parent is not None and not self.parent.alive():
            return f"its executor (process {self.parent.pid}) ended"
        with self._guard:
            idle = self._active == 0 and time.monotonic() - self._last_active > self.idle_s
        return f"idle for {self.idle_s:.0f} s" if idle else None

    def _serve(self, conn: socket.socket, token: str | None) -> None:
        try:
            with conn:
                if token is not None and not _authenticated(conn, token):
                    return
                kind, payload = read_frame(conn, max_size=MAX_FRAME)
                if kind == READ:
                    serve_reads(conn, payload, MAX_FRAME)
                elif kind == JOB:
                    _run_job(conn, payload, f"state home {os.getpid()}", self.address)
            release_free_memory()  # the job's objects are gone now
        except (HomeLost, OSError) as exc:
            log.debug("state home %d: a connection ended: %s", os.getpid(), exc)
        finally:
            with self._guard:
                self._active -= 1
                self._last_active = time.monotonic()


def _authenticated(conn: socket.socket, token: str) -> bool:
    conn.settimeout(10.0)
    try:
        kind, payload = read_frame(conn)
    except (HomeLost, OSError):
        return False
    if kind != AUTH or not hmac.compare_digest(bytes(payload), token.encode()):
        return False
    conn.settimeout(None)
    send_frame(conn, AUTH, b"")
    return True


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


class _Inputs:
    """The task's input batches as they arrive, up to END."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.done = False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while not self.done:
            kind, payload = read_frame(self.conn)
            if kind == END:
                self.done = True
            elif kind == BATCH:
                yield decode_batch(payload)
            else:
                msg = f"unexpected frame {kind!r} in a task's input"
                raise HomeLost(msg)

    def drain(self) -> None:
        for _ in self:
            pass


class _Replies:
    """What the home sends on a task's connection: the job's frames, and a heartbeat every
    ``every_s`` seconds (None: none) from a thread of its own (one lock keeps frames whole)."""

    def __init__(self, conn: socket.socket, every_s: float | None) -> None:
        self.conn = conn
        self.every_s = every_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        if every_s is not None:
            threading.Thread(target=self._heartbeats, name="home-heartbeat", daemon=True).start()

    def send(self, kind: bytes, payload: bytes | pa.Buffer) -> None:
        with self._lock:
            send_frame(self.conn, kind, payload)

    def close(self) -> None:
        self._done.set()

    def _heartbeats(self) -> None:
        assert self.every_s is not None
        while not self._done.wait(self.every_s):
            try:
                self.send(HEARTBEAT, b"")
            except OSError:  # the worker went away: the job finds out too
                return


def _run_job(conn: socket.socket, payload: bytearray, where: str, address: str) -> None:
    paths, heartbeat_s, job_bytes = pickle.loads(payload)
    inputs = _Inputs(conn)
    replies = _Replies(conn, heartbeat_s)

    def ready() -> None:
        replies.send(FINISHED, b"")
        inputs.drain()
        if read_frame(conn)[0] != CONSUMED:
            msg = "the worker did not confirm the task's output"
            raise HomeLost(msg)

    output: Iterator[pa.RecordBatch] | None = None
    try:
        sys.path.extend(p for p in paths if p not in sys.path)
        job: HomeJob = pickle.loads(job_bytes)
        output = job(HomeTask(iter(inputs), ready, address))
        while True:
            try:
                batch = next(output)
            except StopIteration as stop:
                result: Any = stop.value
                break
            replies.send(BATCH, encode_batch(batch))
        replies.send(RESULT, pickle.dumps(result))
    except ConnectionError as exc:  # HomeLost, a reset or broken connection
        log.warning("%s: a task's worker went away: %s", where, exc)
    except BaseException as exc:  # noqa: BLE001 - the task's error goes back to its worker
        # (an OSError of the job's own, a full disk's, too: it is the task's error)
        with contextlib.suppress(OSError):
            replies.send(ERROR, pickled_error(exc, where))
    finally:
        replies.close()
        if output is not None and hasattr(output, "close"):
            output.close()  # an unfinished job aborts its version


def serve(path: str, parent: ProcessRef | None, idle_s: float) -> str:
    home = Home(path, parent, idle_s)
    signal.signal(signal.SIGTERM, lambda *_: home.stop())
    return home.run()


def _serve_and_leave_nothing(path: str, parent: ProcessRef | None, idle_s: float) -> None:
    _name_process(PROCESS_NAME)
    faulthandler.enable(file=sys.stderr)  # a crash's traceback goes to the home's log
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
        force=True,
    )
    why = serve(path, parent, idle_s)
    log.info("state home %d on %s ended: %s", os.getpid(), path, why)
    # A clean end leaves nothing behind; the log of a home that crashed stays for its reader.
    for leftover in (path + ".lock", path.removesuffix(".sock") + ".log"):
        with contextlib.suppress(OSError):
            os.unlink(leftover)


def become(path: str, parent: ProcessRef | None, idle_s: float, log_path: str) -> NoReturn:
    """Turn this process, just forked from a Python worker, into the home on ``path``; never
    returns (the worker's frames below it are never unwound).

    What the worker had open stays behind: every inherited file descriptor is closed (the
    worker's connection to the JVM, the lock the worker holds while it starts the home), and
    the worker's objects are frozen out of the garbage collector, so that none of them is
    finalized later and closes a descriptor number the home has reused.
    """
    code = 1
    try:
        gc.freeze()
        for sig, handler in (
            (signal.SIGINT, signal.default_int_handler),
            (signal.SIGHUP, signal.SIG_DFL),
            (signal.SIGCHLD, signal.SIG_DFL),
            (signal.SIGTERM, signal.SIG_DFL),
        ):
            signal.signal(sig, handler)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        faulthandler.cancel_dump_traceback_later()  # the worker's, on a closed descriptor
        _serve_and_leave_nothing(path, parent, idle_s)
        code = 0
    except BaseException:  # the log is the home's only reader
        with contextlib.suppress(BaseException):
            log.exception("state home %d on %s failed", os.getpid(), path)
    finally:
        with contextlib.suppress(BaseException):
            logging.shutdown()
        os._exit(code)


def release_free_memory() -> None:
    """Give the memory a finished task freed back to the system (glibc's ``malloc_trim`` and
    Arrow's pool): a long-lived process otherwise keeps the high-water mark of its largest
    task's Python objects and buffers for good."""
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _name_process(name: str) -> None:
    """Name this process (Linux ``prctl(PR_SET_NAME)``; nothing elsewhere)."""
    pr_set_name = 15
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_name, name.encode()[:15], 0, 0, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sparkstate.runtime.home")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--parent", type=ProcessRef.parse, default=None)
    parser.add_argument("--idle-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    _serve_and_leave_nothing(args.socket, args.parent, args.idle_s)


if __name__ == "__main__":
    # Serve from the module under its own name, whose classes the tasks' jobs are given
    # (``-m`` runs this file a second time, as ``__main__``).
    from sparkstate.runtime.home import main as serve_home

    serve_home()
