"""What a Python worker and a state home say to each other over their Unix socket.

Every message is a frame: one kind byte, an 8-byte length, the payload. A task's conversation:

    worker -> home   [AUTH], JOB (the pickled job), BATCH* (its input), END, [CONSUMED]
    home -> worker   [AUTH], BATCH* (its output), [FINISHED], RESULT | ERROR

and, from the home, a HEARTBEAT as often as the JOB asks while the job runs (a quarter of the
worker's silence limit), so that the worker tells a slow task from a home that hangs (or a
machine gone without closing its connections): a worker that hears nothing for its silence
limit gives the home up (:class:`HomeSilent`).

The home sends FINISHED when the job's output is complete and its version is about to be
committed; it waits for CONSUMED, which the worker sends once Spark has taken every output batch,
so that a version is committed only after its output reached Spark (as a task in the worker does).
ERROR may come at any moment and ends the conversation. A batch travels as an Arrow IPC stream of
its own (schema and one record batch).
"""

from __future__ import annotations

import pickle
import select
import socket
import struct
import traceback
from typing import Any

import pyarrow as pa

__all__ = [
    "AUTH",
    "BATCH",
    "CONSUMED",
    "END",
    "ERROR",
    "FINISHED",
    "HEARTBEAT",
    "JOB",
    "RESULT",
    "HomeLost",
    "HomeSilent",
    "decode_batch",
    "encode_batch",
    "pickled_error",
    "read_frame",
    "send_frame",
]

JOB, BATCH, END, CONSUMED, FINISHED, RESULT, ERROR = b"J", b"B", b"E", b"C", b"F", b"R", b"X"
#: A connection over TCP (a task on another executor) opens with the home's token; the home
#: answers AUTH when it matches and closes the connection when it does not.
AUTH = b"A"
HEARTBEAT = b"H"
_HEADER = struct.Struct("!cQ")


class HomeLost(ConnectionError):
    """The other side of a task's conversation went away (its process ended or was killed)."""


class HomeSilent(HomeLost):
    """The other side said nothing, not even a heartbeat, for the reader's silence limit."""


def send_frame(sock: socket.socket, kind: bytes, payload: bytes | memoryview | pa.Buffer) -> None:
    view = memoryview(payload)  # pa.Buffer exposes the buffer protocol: no copy
    sock.sendall(_HEADER.pack(kind, view.nbytes))
    if view.nbytes:
        sock.sendall(view)


def read_frame(
    sock: socket.socket, silence_s: float | None = None, max_size: int | None = None
) -> tuple[bytes, bytearray]:
    """The next frame; :class:`HomeLost` if the peer closed the connection or announced a
    frame longer than ``max_size`` bytes, :class:`HomeSilent` if it sent nothing for
    ``silence_s`` seconds (None: wait as long as it takes)."""
    header = _read_exact(sock, _HEADER.size, silence_s)
    kind, size = _HEADER.unpack(header)
    if max_size is not None and size > max_size:
        msg = f"a frame of {size} bytes announced, more than the {max_size} allowed"
        raise HomeLost(msg)
    return kind, _read_exact(sock, size, silence_s)


def _read_exact(sock: socket.socket, size: int, silence_s: float | None = None) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        if silence_s is not None and not _readable(sock, silence_s):
            msg = f"nothing came for {silence_s:g} s"
            raise HomeSilent(msg)
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            msg = "the connection closed in the middle of a task"
            raise HomeLost(msg)
        got += n
    return buf


def _readable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether ``sock`` has bytes to read (or is closed) within ``timeout_s``; only reading
    waits, so a send on another thread is never cut short."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def encode_batch(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def decode_batch(payload: bytearray) -> pa.RecordBatch:
    with pa.ipc.open_stream(pa.py_buffer(payload)) as reader:
        return reader.read_next_batch()


def pickled_error(exc: BaseException, where: str) -> bytes:
    """``exc`` pickled with its traceback as a note (a traceback does not pickle), or, if it
    does not pickle, a :class:`RuntimeError` with its text."""
    note = f"raised in {where}:\n" + "".join(traceback.format_exception(exc)).rstrip()
    try:
        exc.add_note(note)
        return pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an exception that does not pickle still reaches the task
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}\n{note}"))


def unpickle(payload: bytearray) -> Any:
    return pickle.loads(payload)
