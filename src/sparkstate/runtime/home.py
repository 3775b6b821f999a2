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
partition stays with its state across executors too. A TCP connection opens with the handshake
of :mod:`.home_channel`: with ``spark.authenticate`` on, the client proves that it knows the
application's secret (the token alone, which the checkpoint records, no longer lets it in), and
with Spark's network encryption on its frames are sealed. The Unix socket, the addresses, pids,
locks and logs are in a directory only the home's user can enter (:mod:`sparkstate.files.
private`), and are that user's alone.

A home refuses what does not follow the protocol without harm to it or to its state: a frame
longer than it takes, of a kind it does not expect, a handshake that fails or does not come
within :data:`HANDSHAKE_TIMEOUT_S`; the connection ends, the others go on. Refusals are logged
at most once a minute, with their count.

A home ends with its executor (it watches the executor's JVM), when idle for ``idle_s`` seconds,
or on SIGTERM; before it ends it closes its providers. Its process is named ``sparkstate-home``
and its pid is in ``<socket>.pid`` (:func:`pid_file`) while it serves. A worker starts one by
forking itself (:func:`become`: every module is imported already), or, where it cannot fork
safely, as ``python -m sparkstate.runtime.home --socket PATH --parent PID:START --idle-s S``
(with ``--auth`` and ``--encrypt``, it finds the secret as a worker does,
:mod:`.home_secret`: never on its command line).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import faulthandler
import gc
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

from sparkstate.files.private import open_private, write_private
from sparkstate.runtime.home_channel import NO_CREDENTIALS, Channel, Credentials, accept
from sparkstate.runtime.home_reads import READ, serve_reads
from sparkstate.runtime.home_wire import (
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
)
from sparkstate.runtime.process_ref import ProcessRef
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

#: How often a thread holding the GIL in a home is asked to let it go (Python's default: 5 ms).
READ_SWITCH_S = 0.001
#: A home's process name (what ``ps`` and ``pgrep`` show; at most 15 characters).
PROCESS_NAME = "sparkstate-home"
#: How long a TCP connection has to complete its handshake.
HANDSHAKE_TIMEOUT_S = 10.0
#: How many TCP connections may be in their handshake at once; more are closed at once (each
#: takes a thread until it is done or its time is out).
MAX_HANDSHAKES = 64
#: How often, at most, a home logs the connections it refused.
_REFUSALS_LOG_S = 60.0


@dataclasses.dataclass(frozen=True)
class HomeTask:
    """What a job run in a home is given: the task's input batches as they arrive, ``ready()``
    to call once the output is complete, before the commit (it returns when the worker has
    handed all of the output to Spark), and the home's own address, where the tasks of other
    executors reach it (a task's report names it as the partition's owner)."""

    inputs: Iterator[pa.RecordBatch]
    ready: Callable[[], None]
    address: str
    #: The home's executor (``host/executor-id``) and its cores (:func:`executor_identity`).
    executor: str = ""
    cores: int = 0


#: A home's job: ``job(task)`` yields the output batches and returns the result.
HomeJob = Callable[[HomeTask], Iterator[pa.RecordBatch]]


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


def _executor_args(executor: ProcessRef | None) -> list[bytes]:
    if executor is None:
        return []
    try:
        with open(f"/proc/{executor.pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _arg(args: list[bytes], name: bytes) -> str | None:
    """The value of option ``name`` on an executor's command line (None: a local master's
    driver JVM has none)."""
    if name not in args[:-1]:
        return None
    return args[args.index(name) + 1].decode() or None


def _executor_hostname(executor: ProcessRef | None) -> str | None:
    return _arg(_executor_args(executor), b"--hostname")


def executor_identity(executor: ProcessRef | None) -> tuple[str, int]:
    """Which executor this is, as ``host/executor-id``, and its cores: the ``--hostname``,
    ``--executor-id`` and ``--cores`` Spark starts an executor's JVM with; ``driver`` and this
    machine's CPUs under a local master (whose one executor is the driver's JVM)."""
    args = _executor_args(executor)
    executor_id, cores = _arg(args, b"--executor-id"), _arg(args, b"--cores")
    if executor_id is None:
        return "driver", os.cpu_count() or 1
    host = _arg(args, b"--hostname") or "?"
    return f"{host}/{executor_id}", int(cores) if cores and cores.isdigit() else 1


class Home:
    """The server: accepts connections on ``path`` (and on TCP, with the handshake
    ``credentials`` ask for) until its executor or its idleness ends it."""

    def __init__(
        self,
        path: str,
        parent: ProcessRef | None,
        idle_s: float,
        credentials: Credentials = NO_CREDENTIALS,
        handshake_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self.path = path
        self.parent = parent
        self.idle_s = idle_s
        self.credentials = credentials
        self.handshake_s = handshake_s
        self._active = 0
        self._last_active = time.monotonic()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        #: TCP connections in their handshake, and when their time is out.
        self._handshakes: dict[socket.socket, float] = {}
        self._refusals = _Refusals()
        #: Where the tasks of other executors reach this home (``host:port/token``), once it
        #: serves, and its executor and the executor's cores (:func:`executor_identity`).
        self.address = ""
        self.executor, self.cores = "", 0

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> str:
        """Serve until the end; returns why it ended."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.path)
        os.chmod(self.path, 0o600)
        host = advertised_host(self.parent)
        tcp = socket.create_server((host, 0), backlog=64)
        tcp.settimeout(1.0)
        token = secrets.token_hex(16)
        self.address = f"{host}:{tcp.getsockname()[1]}/{token}"
        self.executor, self.cores = executor_identity(self.parent)
        _write_atomic(address_file(self.path), self.address)
        _write_atomic(pid_file(self.path), str(os.getpid()))
        # Listening last: a worker that reaches the socket finds the address written.
        server.listen(64)
        server.settimeout(1.0)
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
            finally:
                if token is not None:
                    self._end_late_handshakes()
            conn.settimeout(None)
            if token is not None:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self._guard:
                    crowded = len(self._handshakes) >= MAX_HANDSHAKES
                    if not crowded:
                        self._handshakes[conn] = time.monotonic() + self.handshake_s
                if crowded:
                    conn.close()
                    self._refusals.add("too many connections in their handshake")
                    continue
            with self._guard:
                self._active += 1
            threading.Thread(target=self._serve, args=(conn, token), daemon=True).start()

    def _end_late_handshakes(self) -> None:
        """Shut the connections whose handshake is out of time (their thread then ends): a
        per-read timeout alone would let a client that sends a byte now and then hold one."""
        now = time.monotonic()
        with self._guard:  # one that has just finished its handshake is left alone
            for conn, until in self._handshakes.items():
                if until <= now:
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)

    def _why_stop(self) -> str | None:
        if self._stop.is_set():
            return "asked to stop"
        if self.parent is not None and not self.parent.alive():
            return f"its executor (process {self.parent.pid}) ended"
        with self._guard:
            idle = self._active == 0 and time.monotonic() - self._last_active > self.idle_s
        return f"idle for {self.idle_s:.0f} s" if idle else None

    def _serve(self, conn: socket.socket, token: str | None) -> None:
        served = False
        try:
            with conn:
                channel = Channel(conn) if token is None else self._handshake(conn, token)
                if channel is None:
                    return
                served = True
                _run_job(channel, f"state home {os.getpid()}", self)
            release_free_memory()  # the job's objects are gone now
        finally:
            with self._guard:
                self._active -= 1
                if served:  # a refused connection does not keep the home from its idle end
                    self._last_active = time.monotonic()

    def _handshake(self, conn: socket.socket, token: str) -> Channel | None:
        """The connection's channel once its handshake is done, or None: refused."""
        conn.settimeout(self.handshake_s)
        try:
            return accept(conn, self.credentials, token)
        except (HomeLost, OSError) as exc:  # a refusal, a timeout, a reset
            self._refusals.add(str(exc) or type(exc).__name__)
            return None
        finally:
            with self._guard:
                self._handshakes.pop(conn, None)
            conn.settimeout(None)


class _Refusals:
    """Connections a home refused, logged at most once a minute with their count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._logged = -_REFUSALS_LOG_S

    def add(self, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._count += 1
            if now - self._logged < _REFUSALS_LOG_S:
                return
            count, self._count, self._logged = self._count, 0, now
        log.warning(
            "refused %d TCP connection(s) since the last report, the last: %s",
            count,
            reason,
        )


def _write_atomic(path: str, text: str) -> None:
    write_private(path, text)


class _Inputs:
    """The task's input batches as they arrive, up to END."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.done = False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while not self.done:
            kind, payload = self.channel.read()
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

    def __init__(self, channel: Channel, every_s: float | None) -> None:
        self.channel = channel
        self.every_s = every_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        if every_s is not None:
            threading.Thread(target=self._heartbeats, name="home-heartbeat", daemon=True).start()

    def send(self, kind: bytes, payload: bytes | pa.Buffer) -> None:
        with self._lock:
            self.channel.send(kind, payload)

    def close(self) -> None:
        self._done.set()

    def _heartbeats(self) -> None:
        assert self.every_s is not None
        while not self._done.wait(self.every_s):
            try:
                self.send(HEARTBEAT, b"")
            except OSError:  # the worker went away: the job finds out too
                return


def _run_job(channel: Channel, where: str, home: Home) -> None:
    try:
        kind, payload = channel.read()
        if kind == READ:  # a live reader's requests (no job, nothing pickled)
            serve_reads(channel, payload)
            return
        if kind != JOB:
            msg = f"a conversation opened with the frame {kind!r}, not a job"
            raise HomeLost(msg)
        paths, heartbeat_s, job_bytes = pickle.loads(payload)
        if not (
            isinstance(paths, list)
            and all(isinstance(p, str) for p in paths)
            and isinstance(job_bytes, bytes | bytearray)
        ):
            msg = "a job frame that is not a job"
            raise HomeLost(msg)
        if heartbeat_s is not None:
            heartbeat_s = max(0.01, float(heartbeat_s))
    except ConnectionError as exc:  # HomeLost, a reset: the connection was not a task's
        log.info("%s: refused a conversation: %s", where, exc)
        return
    except Exception as exc:  # noqa: BLE001 - a payload that does not unpickle as a job
        log.info("%s: refused a job that does not unpickle: %r", where, exc)
        return
    inputs = _Inputs(channel)
    replies = _Replies(channel, heartbeat_s)

    def ready() -> None:
        replies.send(FINISHED, b"")
        inputs.drain()
        if channel.read()[0] != CONSUMED:
            msg = "the worker did not confirm the task's output"
            raise HomeLost(msg)

    output: Iterator[pa.RecordBatch] | None = None
    try:
        sys.path.extend(p for p in paths if p not in sys.path)
        job: HomeJob = pickle.loads(job_bytes)
        output = job(HomeTask(iter(inputs), ready, home.address, home.executor, home.cores))
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


def serve(
    path: str,
    parent: ProcessRef | None,
    idle_s: float,
    credentials: Credentials = NO_CREDENTIALS,
    handshake_s: float = HANDSHAKE_TIMEOUT_S,
) -> str:
    # A live read waits for the GIL a task's thread holds: ask the holder to let go every
    # millisecond instead of every 5 (Python's default), so that a read waits at most that.
    sys.setswitchinterval(READ_SWITCH_S)
    home = Home(path, parent, idle_s, credentials, handshake_s)
    signal.signal(signal.SIGTERM, lambda *_: home.stop())
    return home.run()


def _serve_and_leave_nothing(
    path: str,
    parent: ProcessRef | None,
    idle_s: float,
    credentials: Credentials,
    handshake_s: float = HANDSHAKE_TIMEOUT_S,
) -> None:
    _name_process(PROCESS_NAME)
    faulthandler.enable(file=sys.stderr)  # a crash's traceback goes to the home's log
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
        force=True,
    )
    why = serve(path, parent, idle_s, credentials, handshake_s)
    log.info("state home %d on %s ended: %s", os.getpid(), path, why)
    # A clean end leaves nothing behind; the log of a home that crashed stays for its reader.
    for leftover in (path + ".lock", path.removesuffix(".sock") + ".log"):
        with contextlib.suppress(OSError):
            os.unlink(leftover)


def become(
    path: str,
    parent: ProcessRef | None,
    idle_s: float,
    log_path: str,
    credentials: Credentials = NO_CREDENTIALS,
) -> NoReturn:
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
        out = open_private(log_path, os.O_WRONLY | os.O_APPEND)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        faulthandler.cancel_dump_traceback_later()  # the worker's, on a closed descriptor
        _serve_and_leave_nothing(path, parent, idle_s, credentials)
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
    parser.add_argument("--auth", action="store_true", help="spark.authenticate is on")
    parser.add_argument("--encrypt", action="store_true", help="and the frames are sealed")
    parser.add_argument("--handshake-s", type=float, default=HANDSHAKE_TIMEOUT_S)
    args = parser.parse_args(argv)
    from sparkstate.runtime.home_secret import credentials

    found = credentials(args.auth, args.encrypt, os.path.dirname(args.socket), args.parent)
    _serve_and_leave_nothing(args.socket, args.parent, args.idle_s, found, args.handshake_s)


if __name__ == "__main__":
    # Serve from the module under its own name, whose classes the tasks' jobs are given
    # (``-m`` runs this file a second time, as ``__main__``).
    from sparkstate.runtime.home import main as serve_home

    serve_home()
