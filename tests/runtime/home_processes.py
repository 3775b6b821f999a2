"""Real state homes for the security tests, each a process of its own started as a worker that
cannot fork starts one (``python -m sparkstate.runtime.home``), with this test process as its
executor; jobs for them; a recording TCP proxy; and the wire fuzzer.

    python -m tests.runtime.home_processes N   # the fuzz run of N malformed frames, timed
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from sparkstate.runtime import home_client
from sparkstate.runtime.home_channel import (
    HELLO,
    PROOF,
    Credentials,
    open_channel,
)
from sparkstate.runtime.home_secret import SECRET_ENV
from sparkstate.runtime.home_wire import AUTH, BATCH, END, JOB
from sparkstate.runtime.process_ref import ProcessRef

SECRET = "4f1c0ffee-test-secret-of-the-application"
#: What the tests' jobs keep in a home: key -> count (the home's "state").
STATE: dict[str, int] = {}


@dataclass
class RunningHome:
    process: subprocess.Popen[bytes]
    directory: str
    address: str
    log: str

    @property
    def token(self) -> str:
        return self.address.partition("/")[2]

    @property
    def port(self) -> int:
        return int(self.address.partition("/")[0].rpartition(":")[2])

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/task"))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def running_home(
    auth: bool, encrypt: bool, handshake_s: float = 1.0, secret: str = SECRET
) -> Iterator[RunningHome]:
    directory = tempfile.mkdtemp(prefix="homes-")  # short, for the socket
    path = os.path.join(directory, "h.sock")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "SPARKSTATE_HOME_HOST": "127.0.0.1",
    }
    env.pop(SECRET_ENV, None)
    if auth:
        env[SECRET_ENV] = secret
    log = os.path.join(directory, "h.log")
    me = ProcessRef.of(os.getpid())
    args = [sys.executable, "-m", "sparkstate.runtime.home", "--socket", path]
    args += ["--parent", str(me), "--idle-s", "600", "--handshake-s", str(handshake_s)]
    args += (["--auth"] if auth else []) + (["--encrypt"] if encrypt else [])
    with open(log, "ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=out, env=env)
    addr = path.removesuffix(".sock") + ".addr"
    deadline = time.monotonic() + 60
    while not os.path.exists(addr):
        if process.poll() is not None or time.monotonic() > deadline:
            with open(log) as f:
                raise RuntimeError("the home did not start: " + f.read()[-2000:])
        time.sleep(0.01)
    with open(addr) as f:
        home = RunningHome(process, directory, f.read().strip(), log)
    try:
        yield home
    finally:
        home.stop()


def count_keys(task: Any) -> Iterator[pa.RecordBatch]:
    """A job: adds each input key to the home's :data:`STATE`; outputs the keys it saw with
    their new counts, returns the whole state."""
    for batch in task.inputs:
        keys = batch.column("k").to_pylist()
        for k in keys:
            STATE[k] = STATE.get(k, 0) + 1
        yield pa.record_batch({"k": keys, "n": [STATE[k] for k in keys]})
    return dict(STATE)


def run_job(channel: Any, keys: list[str]) -> tuple[list[dict[str, Any]], Any]:
    batches = iter([pa.record_batch({"k": keys})])
    out = home_client.run_in_home(channel, cloudpickle.dumps(count_keys), batches, "test", 30.0)
    rows: list[dict[str, Any]] = []
    while True:
        try:
            rows.extend(next(out).to_pylist())
        except StopIteration as done:
            return rows, done.value


class RecordingProxy:
    """Forwards TCP connections to ``target`` and keeps every byte of both directions."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.recorded = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.recorded += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()


_HEADER = struct.Struct("!cQ")
_KINDS = [bytes([b]) for b in range(256)]


def _frame(kind: bytes, payload: bytes, length: int | None = None) -> bytes:
    return _HEADER.pack(kind, len(payload) if length is None else length) + payload


def fuzz(home: RunningHome, credentials: Credentials, frames: int, seed: int = 7) -> Counter[str]:
    """Send ``frames`` malformed frames to ``home`` (one refused frame a connection, as the
    protocol ends a connection at its first wrong frame), on four threads; the cases sent."""
    cases: Counter[str] = Counter()
    lock = threading.Lock()
    per_thread = frames // 4

    def work(n: int, rng: random.Random) -> None:
        mine: Counter[str] = Counter()
        for _ in range(n):
            mine[_one(home, credentials, rng)] += 1
        with lock:
            cases.update(mine)

    threads = [
        threading.Thread(
            target=work, args=(per_thread + (frames % 4 if i == 0 else 0), random.Random(seed + i))
        )
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return cases


def _one(home: RunningHome, credentials: Credentials, rng: random.Random) -> str:
    """One malformed frame on a connection of its own; the name of its case."""
    roll = rng.random()
    if roll < 0.03:  # after a good handshake: the channel's frames, wrong
        return _after_handshake(home, credentials, rng)
    sock = socket.create_connection(("127.0.0.1", home.port))
    try:
        if roll < 0.25:
            case, data = "random kind", _frame(rng.choice(_KINDS), rng.randbytes(rng.randrange(64)))
        elif roll < 0.40:
            case, data = "huge length", _HEADER.pack(rng.choice(_KINDS), rng.randrange(257, 2**64))
        elif roll < 0.55:
            whole = _frame(rng.choice([AUTH, HELLO, PROOF]), rng.randbytes(rng.randrange(1, 100)))
            case, data = "truncated", whole[: rng.randrange(1, len(whole))]
        elif roll < 0.70:
            case, data = "garbage", rng.randbytes(rng.randrange(1, 200))
        elif roll < 0.80:
            case, data = "token only", _frame(AUTH, home.token.encode())
        elif roll < 0.90:
            flags = bytes([1, rng.randrange(4)])
            token = home.token.encode() if rng.random() < 0.5 else rng.randbytes(32)
            case, data = (
                "bad hello",
                _frame(HELLO, flags + rng.randbytes(rng.randrange(40)) + token),
            )
        else:
            case = "wrong proof"
            hello = bytes([1, credentials.flags]) + rng.randbytes(32) + home.token.encode()
            with contextlib.suppress(OSError):
                sock.sendall(_frame(HELLO, hello))
                sock.recv(4096)  # the home's nonce
            data = _frame(PROOF, rng.randbytes(32))
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(10)
            while sock.recv(4096):  # until the home closes it
                pass
    finally:
        sock.close()
    return case


def _after_handshake(home: RunningHome, credentials: Credentials, rng: random.Random) -> str:
    channel = open_channel(home.address, credentials, 10.0)
    roll = rng.random()
    try:
        with contextlib.suppress(OSError):  # the home may close it before all is sent
            if roll < 0.3:
                case = "after handshake: random kind"
                channel.send(rng.choice([k for k in _KINDS if k != JOB]), rng.randbytes(50))
            elif roll < 0.5:
                case = "after handshake: job that is no pickle"
                channel.send(JOB, rng.randbytes(rng.randrange(200)))
            elif roll < 0.7:
                case = "after handshake: garbage input"
                job = cloudpickle.dumps(count_keys)
                channel.send(JOB, pickle.dumps(([], None, job)))
                channel.send(BATCH, rng.randbytes(100))
                channel.send(END, b"")
            else:
                case = "after handshake: raw bytes"
                header = _HEADER.pack(rng.choice(_KINDS), rng.randrange(2**64))
                channel.sock.sendall(header + rng.randbytes(40))
            channel.sock.shutdown(socket.SHUT_WR)
            channel.sock.settimeout(10)
            while channel.sock.recv(4096):
                pass
    finally:
        channel.close()
    return case


def main() -> None:
    frames = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with running_home(auth=True, encrypt=True) as home:
        credentials = Credentials(SECRET.encode(), encrypt=True)
        started = time.monotonic()
        cases = fuzz(home, credentials, frames)
        took = time.monotonic() - started
        channel = home_client.connect_owner(home.address, credentials)
        assert channel is not None
        print(run_job(channel, ["after"]), "threads", home.threads())
    print(f"{frames} malformed frames in {took:.1f} s ({frames / took:.0f}/s): {dict(cases)}")


if __name__ == "__main__":
    main()
