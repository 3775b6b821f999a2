"""The worker's side of a state home: find the home of a partition, start it if need be, and run
a task's job there, streaming the input to it and the output back (:mod:`.home_wire`).

An executor has ``slots`` homes (its task slots), and partition ``p`` lives in home ``p % slots``,
so partitions that Spark runs at the same time usually run in different homes. A home is named by
its executor's JVM (pid and start time), the workers' environment, the credentials it takes over
TCP (:mod:`.home_channel`) and its slot: the workers of one executor find the same homes, and two
applications, or two executors of one machine, never share one.

Homes keep their sockets, addresses, pids, locks and logs in :func:`home_dir`, a directory of
their user's alone (mode 0700, its files 0600): the Unix socket needs no handshake, since only
that user, who could read the executor's secret anyway, can reach it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any

import pyarrow as pa

from sparkstate.exceptions import StateHomeError
from sparkstate.files.private import PrivateDirError, open_private, private_dir
from sparkstate.runtime import home_secret
from sparkstate.runtime.home import address_file, become
from sparkstate.runtime.home_channel import (
    NO_CREDENTIALS,
    Channel,
    Credentials,
    open_channel,
)
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
    HomeSilent,
    decode_batch,
    encode_batch,
)
from sparkstate.runtime.process_ref import ProcessRef, proc_stat
from sparkstate.runtime.providers import PROVIDERS
from sparkstate.store import rocksdb

__all__ = [
    "HOME_START_TIMEOUT_S",
    "connect",
    "connect_owner",
    "credentials",
    "executor_process",
    "home_path",
    "local_address",
    "run_in_home",
]

#: How long a worker waits for a home it started to accept connections.
HOME_START_TIMEOUT_S = 60.0
#: How long a task waits to reach a partition's owner on another executor before it takes the
#: partition over in its own.
OWNER_TIMEOUT_S = 5.0
#: How long a home with no task stays up.
HOME_IDLE_S = 600.0
#: Homes this worker started (reaped when they end, so none stays a zombie).
_STARTED: list[subprocess.Popen[bytes]] = []


#: The longest directory of homes that leaves room for a socket's name within the 107 bytes a
#: Unix socket's path may have (``<pid>-<start>-<env>-<slot>.sock`` takes at most 45).
_HOME_DIR_MAX = 60


def home_dir() -> str:
    """Where this user's homes keep their sockets: in the temp directory, or, where its path is
    too long for a socket's (a YARN container's, for one), in ``/tmp``."""
    name = f"sparkstate-homes-{os.getuid()}"
    preferred = os.path.join(tempfile.gettempdir(), name)
    if len(os.fsencode(preferred)) <= _HOME_DIR_MAX or not os.path.isdir("/tmp"):
        return preferred
    return os.path.join("/tmp", name)


def private_home_dir() -> str:
    """:func:`home_dir`, made if missing and checked to be this user's alone
    (:func:`sparkstate.files.private.private_dir`: narrowed to 0700 if others may only read it,
    refused if another user owns it or others may write to it)."""
    try:
        return private_dir(home_dir())
    except PrivateDirError as exc:
        msg = f"the state homes' directory cannot be used: {exc}"
        raise StateHomeError(msg) from exc


def credentials(auth: bool, encrypt: bool) -> Credentials:
    """What this process shows a home over TCP: Spark's ``spark.authenticate`` (``auth``) and
    network encryption (``encrypt``) as the query's store settings carry them, with the
    application's secret where this process finds it (:mod:`.home_secret`)."""
    if not auth:
        return NO_CREDENTIALS
    return home_secret.credentials(auth, encrypt, home_dir(), executor_process())


@functools.cache
def executor_process() -> ProcessRef | None:
    """The executor's JVM this worker serves (the nearest ``java`` ancestor), or None where
    there is none to find (then tasks run in the worker)."""
    pid = os.getppid()
    for _ in range(8):
        if pid <= 1:
            return None
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
                comm = f.read().strip()
        except OSError:
            return None
        if comm == "java":
            return ProcessRef.of(pid)
        stat = proc_stat(pid)
        if stat is None:
            return None
        pid = int(stat[1])
    return None


@functools.cache
def _environment() -> str:
    """A digest of the environment this worker process started with: PySpark keeps a pool of
    workers per environment (a UDF's ``SparkContext.environment``), and a home runs with the
    environment of the worker that starts it, so each environment gets homes of its own."""
    try:
        with open("/proc/self/environ", "rb") as f:
            env = f.read()
    except OSError:
        env = repr(sorted(os.environ.items())).encode()
    return hashlib.sha1(env, usedforsecurity=False).hexdigest()[:10]


def home_path(executor: ProcessRef, slot: int, credentials: Credentials = NO_CREDENTIALS) -> str:
    environment = _environment()
    if tag := credentials.tag():  # homes of another secret or mode are others
        environment = hashlib.sha1(
            f"{environment}-{tag}".encode(), usedforsecurity=False
        ).hexdigest()[:10]
    name = f"{executor.pid}-{executor.start}-{environment}-{slot}.sock"
    return os.path.join(home_dir(), name)


def connect(executor: ProcessRef, slot: int, credentials: Credentials = NO_CREDENTIALS) -> Channel:
    """A connection to the home of ``slot`` on this executor, started if there is none; the
    home takes ``credentials`` over TCP."""
    path = home_path(executor, slot, credentials)
    sock = _try_connect(path)
    if sock is not None:
        return Channel(sock)
    private_home_dir()
    with os.fdopen(open_private(path + ".lock", os.O_RDWR), "r+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts it; the others then connect
        sock = _try_connect(path)
        if sock is None:
            sock = _start(path, executor, credentials)
    return Channel(sock)


def local_address(
    executor: ProcessRef, slot: int, credentials: Credentials = NO_CREDENTIALS
) -> str | None:
    """The TCP address of this executor's home of ``slot``, if it runs."""
    try:
        with open(address_file(home_path(executor, slot, credentials)), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def connect_owner(address: str, credentials: Credentials = NO_CREDENTIALS) -> Channel | None:
    """A connection to the home at ``address`` (``host:port/token``, most likely on another
    executor) with ``credentials`` (:mod:`.home_channel`), or None if it cannot be reached, is
    not that home any more or does not take them."""
    try:
        return open_channel(address, credentials, OWNER_TIMEOUT_S)
    except (OSError, ValueError, HomeLost):
        return None


def _try_connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def _start(path: str, executor: ProcessRef, credentials: Credentials) -> socket.socket:
    _reap()
    log_path = path[: -len(".sock")] + ".log"
    if _can_fork():
        home = _fork(path, executor, log_path, credentials)
        pid = home.pid if home is not None else None
        alive = home.alive if home is not None else lambda: False
    else:
        process = _spawn(path, executor, log_path, credentials)
        pid = process.pid
        alive = lambda: process.poll() is None  # noqa: E731
    deadline = time.monotonic() + HOME_START_TIMEOUT_S
    while time.monotonic() < deadline:
        sock = _try_connect(path)
        if sock is not None:
            return sock
        if not alive():
            msg = f"the state home for {path} ended as it started; its log {log_path} ends: "
            raise StateHomeError(msg + _tail(log_path))
        time.sleep(0.005)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    msg = f"the state home for {path} did not start in {HOME_START_TIMEOUT_S:.0f} s"
    raise StateHomeError(msg)


def _can_fork() -> bool:
    """Whether this worker can start a home by forking itself: no other thread runs (one could
    hold a lock the child would wait for forever), it holds no store open (the child would
    share it), and it never opened a RocksDB database (the child would lack RocksDB's
    background threads: a take-over's task reads Spark's RocksDB files in the worker)."""
    return (
        hasattr(os, "fork")
        and threading.active_count() == 1
        and PROVIDERS.empty()
        and not rocksdb.opened_in_process()
    )


def _fork(
    path: str, executor: ProcessRef, log_path: str, credentials: Credentials
) -> ProcessRef | None:
    """Start the home by forking twice (so that it is nobody's child to reap, in a session of
    its own); the home's process, or None if it was gone before it could be named."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the intermediate process: start the home, say its pid, leave
        code = 1
        try:
            os.close(read_end)
            os.setsid()
            home = os.fork()
            if home == 0:
                os.close(write_end)
                become(path, executor, HOME_IDLE_S, log_path, credentials)
            os.write(write_end, str(home).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            pid = pipe.read()
    finally:
        os.waitpid(child, 0)
    return ProcessRef.of(int(pid)) if pid else None


def _spawn(
    path: str, executor: ProcessRef, log_path: str, credentials: Credentials
) -> subprocess.Popen[bytes]:
    """Start the home as a new interpreter (which finds the secret as this worker did: it is
    never on a command line)."""
    security = (["--auth"] if credentials.secret else []) + (
        ["--encrypt"] if credentials.encrypt else []
    )
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sparkstate.runtime.home",
                "--socket",
                path,
                "--parent",
                str(executor),
                "--idle-s",
                str(HOME_IDLE_S),
                *security,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
    _STARTED.append(process)
    return process


def _wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until process ``pid``, just killed, has ended (gone or a zombie, its sockets closed):
    until then its socket still takes connections, and the retry of its task, connecting at once,
    would reach the dying home instead of starting a new one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            return  # gone (or no /proc to ask: then nothing to wait for)
        if text[text.rindex(")") + 2 :].startswith(("Z", "X")):
            return
        time.sleep(0.01)


def _reap() -> None:
    _STARTED[:] = [p for p in _STARTED if p.poll() is None]


def _tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace").strip() or "(empty)"
    except OSError as exc:
        return f"(unreadable: {exc})"


def _peer(sock: socket.socket) -> tuple[str, int | None]:
    """The home at the other end, for messages (its process, or its TCP address), and its pid
    where it runs on this machine."""
    if sock.family != socket.AF_UNIX:
        host, port = sock.getpeername()[:2]
        return f"at {host}:{port}", None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", creds)[0]
    return f"process {pid}", pid


def run_in_home(
    channel: Channel,
    job: bytes,
    batches: Iterator[pa.RecordBatch],
    what: str,
    silence_s: float | None = None,
) -> Generator[pa.RecordBatch, None, Any]:
    """Run ``job`` (a pickled :data:`~sparkstate.runtime.home.HomeJob`) in the home at the
    other end of ``channel`` over ``batches``; yields its output and returns its result.

    The input goes on a thread of its own while the output comes back, so neither side waits
    for the other's buffers. ``what`` names the task in errors. The home sends a heartbeat
    every ``silence_s / 4`` seconds; one that sends nothing, not even that, for ``silence_s``
    hangs: the task fails, and a home of this machine is killed, so that the retry starts a
    new one.
    """
    home, pid = _peer(channel.sock)
    sent: list[BaseException] = []

    def send_inputs() -> None:
        try:
            for batch in batches:
                channel.send(BATCH, encode_batch(batch))
            channel.send(END, b"")
        except BaseException as exc:  # noqa: BLE001 - raised by the task's thread below
            sent.append(exc)
            channel.shutdown()

    def failed(exc: BaseException) -> BaseException:
        if isinstance(exc, HomeSilent):
            return hung()
        sender.join()
        if sent and not isinstance(sent[0], OSError):
            return sent[0]  # reading the task's input failed: that is the task's error
        msg = (
            f"the state home ({home}) running {what} ended in the middle of the "
            f"task ({exc}); Spark retries the task, and a new home restores the state from "
            f"the checkpoint. The home's log is beside its socket in {home_dir()}"
        )
        return StateHomeError(msg)

    def hung() -> BaseException:
        channel.shutdown()  # frees the input's thread
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
        msg = (
            f"the state home ({home}) running {what} sent nothing for {silence_s:g} s, not even "
            f"its heartbeat: it hangs"
            + (" and was killed" if pid is not None else "")
            + "; Spark retries the task, and a new home restores the state from the checkpoint."
            f" The home's log is beside its socket in {home_dir()}"
        )
        return StateHomeError(msg)

    heartbeat_s = None if silence_s is None else silence_s / 4
    channel.send(JOB, pickle.dumps(([p for p in sys.path if p], heartbeat_s, job)))
    sender = threading.Thread(target=send_inputs, name="sparkstate-home-input", daemon=True)
    sender.start()
    try:
        while True:
            try:
                kind, payload = channel.read(silence_s)
            except (HomeLost, OSError) as exc:
                raise failed(exc) from exc
            if kind == HEARTBEAT:
                continue
            if kind == BATCH:
                yield decode_batch(payload)
            elif kind == FINISHED:
                sender.join()
                if sent:
                    raise failed(sent[0])
                channel.send(CONSUMED, b"")
            elif kind == RESULT:
                sender.join()
                result: Any = pickle.loads(payload)
                return result
            elif kind == ERROR:
                error: BaseException = pickle.loads(payload)
                with contextlib.suppress(AttributeError, TypeError):
                    error.raised_in_home = True  # type: ignore[attr-defined]
                raise error
            else:
                raise failed(HomeLost(f"unexpected frame {kind!r}"))
    finally:
        channel.shutdown()
        channel.close()
        sender.join(timeout=5.0)
