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

Over TCP a conversation opens with a handshake and its frames may be sealed
(:mod:`.home_channel`). A reader refuses what it cannot take (:class:`FrameRefused`): a frame
longer than its limit (a few hundred bytes before a connection is authenticated,
:data:`MAX_FRAME` after) or, sealed, one that does not open; memory for a long frame is taken as
its bytes arrive, not at its announced length.
"""

from __future__ import annotations

import pickle
import select
import socket
import struct
import traceback
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

__all__ = [
    "AUTH",
    "BATCH",
    "CONSUMED",
    "END",
    "ERROR",
    "FRAME_HEADER",
    "MAX_FRAME",
    "FINISHED",
    "HEARTBEAT",
    "JOB",
    "RESULT",
    "FrameRefused",
    "HomeLost",
    "HomeSilent",
    "decode_batch",
    "encode_batch",
    "pickled_error",
    "read_frame",
    "send_frame",
    "send_frames",
]

JOB, BATCH, END, CONSUMED, FINISHED, RESULT, ERROR = b"J", b"B", b"E", b"C", b"F", b"R", b"X"
#: A connection over TCP (a task on another executor) opens with the home's token; the home
#: answers AUTH when it matches and closes the connection when it does not
#: (:mod:`.home_channel`, where the application's secret is asked for too).
AUTH = b"A"
HEARTBEAT = b"H"
FRAME_HEADER = struct.Struct("!cQ")
#: The longest frame a reader takes (2 GiB less the 16 bytes of a sealed frame's tag: the most
#: AES-GCM seals in one call, and Spark's own bound on an Arrow batch).
MAX_FRAME = 2**31 - 1 - 16
#: Frames up to this size are read into a buffer of their announced size; a longer one grows
#: as its bytes arrive, so that a length that lies costs no memory.
_PREALLOCATE = 64 << 20
#: Frames up to this size go out with their header in one send (a copy that costs less than a
#: second system call); a longer one is sent from where it lies.
_ONE_SEND = 64 << 10


class HomeLost(ConnectionError):
    """The other side of a task's conversation went away (its process ended or was killed)."""


class HomeSilent(HomeLost):
    """The other side said nothing, not even a heartbeat, for the reader's silence limit."""


class FrameRefused(HomeLost):
    """A frame the reader does not take: longer than its limit, or sealed and not opening (a
    wrong key, a frame changed, dropped or replayed on the way)."""


def send_frame(
    sock: socket.socket,
    kind: bytes,
    payload: bytes | bytearray | memoryview | pa.Buffer,
    max_size: int = MAX_FRAME,
) -> None:
    """Send one frame; :class:`ValueError` (nothing sent) if its payload is longer than
    ``max_size``, which the reader would refuse."""
    view = memoryview(payload)  # pa.Buffer exposes the buffer protocol: no copy
    if view.nbytes > max_size:
        msg = (
            f"a frame of {view.nbytes} bytes is longer than the {max_size} a state home takes "
            "(an Arrow batch that large: lower spark.sql.execution.arrow.maxRecordsPerBatch)"
        )
        raise ValueError(msg)
    header = FRAME_HEADER.pack(kind, view.nbytes)
    if view.nbytes <= _ONE_SEND:  # one system call, one wake-up of the reader
        sock.sendall(header + view)
    else:
        sock.sendall(header)
        sock.sendall(view)


def send_frames(
    sock: socket.socket,
    frames: Sequence[tuple[bytes, bytes | bytearray | memoryview]],
    max_size: int = MAX_FRAME,
) -> None:
    """Send several frames with one system call (one wake-up of the reader, where a send
    each would wake it, and may hand it this core, once a frame); :class:`ValueError` (nothing
    sent) if a payload is longer than ``max_size``."""
    parts: list[bytes | bytearray | memoryview] = []
    for kind, payload in frames:
        size = memoryview(payload).nbytes
        if size > max_size:
            msg = f"a frame of {size} bytes is longer than the {max_size} a state home takes"
            raise ValueError(msg)
        parts += (FRAME_HEADER.pack(kind, size), payload)
    sock.sendall(b"".join(parts))


def read_frame(
    sock: socket.socket, silence_s: float | None = None, max_size: int = MAX_FRAME
) -> tuple[bytes, bytearray]:
    """The next frame; :class:`HomeLost` if the peer closed the connection, :class:`HomeSilent`
    if it sent nothing for ``silence_s`` seconds (None: wait as long as it takes),
    :class:`FrameRefused` if its length is more than ``max_size`` (its payload left unread)."""
    header = _read_exact(sock, FRAME_HEADER.size, silence_s)
    kind, size = FRAME_HEADER.unpack(header)
    if size > max_size:
        msg = f"a frame {kind!r} of {size} bytes, more than the {max_size} taken here"
        raise FrameRefused(msg)
    return kind, _read_exact(sock, size, silence_s)


def _read_exact(sock: socket.socket, size: int, silence_s: float | None = None) -> bytearray:
    if size <= _PREALLOCATE:
        return _read_into(sock, bytearray(size), silence_s)
    buf = bytearray()
    while len(buf) < size:
        buf += _read_into(sock, bytearray(min(_PREALLOCATE, size - len(buf))), silence_s)
    return buf


def _read_into(sock: socket.socket, buf: bytearray, silence_s: float | None) -> bytearray:
    size = len(buf)
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


def decode_batch(payload: bytes | bytearray) -> pa.RecordBatch:
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


def unpickle(payload: bytes | bytearray) -> Any:
    return pickle.loads(payload)
