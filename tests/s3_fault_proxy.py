"""An S3 endpoint that misbehaves as real ones do: a loopback HTTP proxy in front of the test
server that, by a seeded schedule, answers ``503 SlowDown`` or ``500 InternalError``, delays a
request, or resets the connection in the middle of an upload (half the request's body read) or of
a download (half the response's body sent). Every other request goes through unchanged.

One request per connection: the proxy forwards each request on a connection of its own to the
server, with ``Connection: close``, and closes the client's after the response.
"""

from __future__ import annotations

import collections
import random
import socket
import struct
import threading
import time
from collections.abc import Sequence

#: The kinds of faults, in the order the schedule draws them.
KINDS = ("503", "500", "delay", "reset-upload", "reset-download")

_ERRORS = {
    "503": ("503 Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error."),
}


class FaultProxy:
    """``rate``: the share of requests that meet a fault, drawn with ``seed``; each fault is the
    kind of ``kinds`` injected least so far (of those that fit the request). ``faults`` counts
    what was injected by kind, ``requests`` every request seen."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        seed: int = 0,
        rate: float = 0.0,
        kinds: Sequence[str] = KINDS,
        delay_s: float = 0.5,
    ) -> None:
        self.upstream = upstream
        self.rate = rate
        self.kinds = tuple(kinds)
        self.delay_s = delay_s
        self.faults: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="s3-fault-proxy", daemon=True).start()

    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _draw(self, has_body: bool) -> str | None:
        with self._lock:
            self.requests += 1
            if self._random.random() >= self.rate:
                return None
            # an upload is cut off, a download (a request without a body) answered in half
            kinds = [
                k for k in self.kinds if k != ("reset-download" if has_body else "reset-upload")
            ]
            if not kinds:
                return None
            kind = min(kinds, key=lambda k: self.faults[k])  # each kind as often as the others
            self.faults[kind] += 1
            return kind

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._one_request(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def _one_request(self, conn: socket.socket) -> None:
        head, rest = _read_head(conn)
        if head is None:
            return
        lines = head.split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        length = int(headers.get(b"content-length", b"0"))
        fault = self._draw(length > 0 or chunked)
        if headers.get(b"expect", b"").lower() == b"100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if fault == "reset-upload":
            if not chunked:
                _read_exactly(conn, rest, max(length // 2, 1))
            _reset(conn)
            return
        body = _read_chunked(conn, rest) if chunked else _read_exactly(conn, rest, length)
        if fault in _ERRORS:
            status, code, message = _ERRORS[fault]
            xml = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>"
            ).encode()
            conn.sendall(
                f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(xml)}\r\nConnection: close\r\n\r\n".encode()
                + xml
            )
            return
        if fault == "delay":
            time.sleep(self.delay_s)
        kept = [
            line
            for line in lines[1:]
            if line.split(b":")[0].strip().lower() not in (b"connection", b"expect")
        ]
        request = b"\r\n".join([lines[0], *kept, b"Connection: close", b"", b""]) + body
        response = _exchange(self.upstream, request)
        if fault == "reset-download":
            end = response.find(b"\r\n\r\n") + 4
            body_len = len(response) - end
            conn.sendall(response[: end + body_len // 2])
            _reset(conn)
            return
        conn.sendall(response)


def _read_head(conn: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _read_exactly(conn: socket.socket, rest: bytes, length: int) -> bytes:
    data = rest
    while len(data) < length:
        chunk = conn.recv(min(length - len(data), 1 << 20))
        if not chunk:
            break
        data += chunk
    return data[:length]


def _read_chunked(conn: socket.socket, rest: bytes) -> bytes:
    """A chunked body as sent (its chunks, the last one empty, and any trailers)."""
    data = rest
    pos = 0
    while True:
        while b"\r\n" not in data[pos:]:
            data += _recv(conn)
        line_end = data.index(b"\r\n", pos)
        size = int(data[pos:line_end].split(b";")[0], 16)
        pos = line_end + 2
        if size == 0:
            while not data[pos:].startswith(b"\r\n") and b"\r\n\r\n" not in data[pos - 2 :]:
                data += _recv(conn)
            end = data.index(b"\r\n\r\n", pos - 2) + 4
            return data[:end]
        while len(data) < pos + size + 2:
            data += _recv(conn)
        pos += size + 2


def _recv(conn: socket.socket) -> bytes:
    chunk = conn.recv(1 << 20)
    if not chunk:
        msg = "the client closed the connection in the middle of a request"
        raise ConnectionError(msg)
    return chunk


def _exchange(upstream: tuple[str, int], request: bytes) -> bytes:
    with socket.create_connection(upstream, timeout=30) as up:
        up.sendall(request)
        parts = []
        while True:
            chunk = up.recv(1 << 20)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)


def _reset(conn: socket.socket) -> None:
    """Close with a TCP reset (``SO_LINGER`` 0), as a dropped connection looks to the client."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
