"""Who may talk to a state home over TCP, and how: the opening handshake and the channel of
frames after it, for the home and for every client (a task on another executor, the driver, a
reader of live state).

Spark's settings decide, through :class:`Credentials`:

``spark.authenticate`` off (no secret)
    The client opens with the token of the home's address (``host:port/token``), the home
    answers ``AUTH`` and the frames go in the clear, as before. The token names the home; it is
    no secret from anyone who can read the checkpoint (the batch commits record the owners'
    addresses): whoever can read it and reach the executors can run jobs in the homes, as
    anyone who reaches Spark's own unauthenticated RPC can run code in its executors.

``spark.authenticate`` on (the application's secret)
    Each side proves that it knows the secret, which a checkpoint never holds::

        client -> home   HELLO  version | flags | client nonce (32 bytes) | token
        home -> client   HELLO  home nonce (32 bytes)
        client -> home   PROOF  HMAC-SHA256(secret, "client" 0 | transcript)
        home -> client   PROOF  HMAC-SHA256(secret, "home" 0 | transcript)

    where ``transcript`` is version | flags | client nonce | home nonce | token. The home
    proves itself only to a client that did; each proof covers both fresh nonces, so none can be
    replayed, and the flags, so that neither side can be talked out of encryption. Proofs are
    compared with :func:`hmac.compare_digest`.

``spark.network.crypto.enabled`` or ``spark.ssl.enabled`` on as well (encrypt)
    After the handshake every frame is sealed with AES-256-GCM: a key for each direction,
    derived with HKDF-SHA256 from the secret (salt: both nonces; info: the flags and the token),
    a nonce that counts the frames of its direction, the frame's kind as associated data. A
    frame keeps its kind and carries the ciphertext and its 16-byte tag; one changed, dropped,
    replayed or reordered on the way does not open, and the connection ends.

A home refuses a connection that does not follow its mode: a frame before the handshake that is
longer than :data:`HANDSHAKE_FRAME_MAX`, of another kind, with a wrong token or proof, or
nothing at all within its time. It says why in a ``REFUSED`` frame of plain text where it can
(a client reads no pickle before the home has proven itself) and closes the connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import secrets
import socket
import threading
from typing import Any, NoReturn

import pyarrow as pa

from sparkstate.runtime.home_wire import (
    AUTH,
    FRAME_HEADER,
    MAX_FRAME,
    FrameRefused,
    read_frame,
    send_frame,
    send_frames,
)

__all__ = [
    "HANDSHAKE_FRAME_MAX",
    "HELLO",
    "NO_CREDENTIALS",
    "PROOF",
    "REFUSED",
    "Channel",
    "Credentials",
    "HandshakeRefused",
    "accept",
    "open_channel",
]

#: The handshake's frames (with :data:`~.home_wire.AUTH`, the token's).
HELLO, PROOF, REFUSED = b"N", b"P", b"D"
#: The longest frame a home reads before the handshake is done.
HANDSHAKE_FRAME_MAX = 256
_VERSION = 1
_NONCE = 32
_TAG = 16
#: Bytes a channel read ahead reads a system call, at most.
_CHUNK = 256 << 10
_SECRET, _ENCRYPT = 1, 2


@dataclasses.dataclass(frozen=True)
class Credentials:
    """What a process shows a state home over TCP: the application's secret (None:
    ``spark.authenticate`` is off, the home's token alone), and whether the frames are
    encrypted. Never pickled (a job must not carry the secret), never shown in a repr."""

    secret: bytes | None = dataclasses.field(default=None, repr=False)
    encrypt: bool = False

    def __post_init__(self) -> None:
        if self.encrypt and not self.secret:
            msg = "an encrypted channel to a state home needs the application's secret"
            raise ValueError(msg)

    def __reduce__(self) -> Any:
        msg = "the credentials of a state home are never pickled (a job must not carry them)"
        raise TypeError(msg)

    @property
    def flags(self) -> int:
        return (_SECRET if self.secret else 0) | (_ENCRYPT if self.encrypt else 0)

    def tag(self) -> str:
        """A short name of these credentials for the names of homes (empty without a secret):
        homes started with another secret or mode are other homes. It tells nothing of the
        secret."""
        if not self.secret:
            return ""
        name = b"sparkstate-home name" + bytes([self.flags])
        return hmac.new(self.secret, name, hashlib.sha256).hexdigest()[:8]


#: Credentials of a process when ``spark.authenticate`` is off.
NO_CREDENTIALS = Credentials()


class HandshakeRefused(FrameRefused):
    """The other side did not take this side's handshake (or did not follow it)."""


class Channel:
    """Frames over one connected socket, sealed if the handshake agreed on encryption.
    ``send`` may be called from several threads (one lock keeps frames whole and in order);
    ``read`` from one."""

    def __init__(self, sock: socket.socket, seal: _Seal | None = None) -> None:
        self.sock = sock
        self._seal = seal
        self._sending = threading.Lock()
        #: The socket read ahead (:meth:`read_ahead`), or None: read as each frame asks.
        self._ahead: ReadAhead | None = None

    def read_ahead(self) -> None:
        """Read the socket ahead from now on, a chunk a system call, so that frames sent
        together are read with one call and :meth:`holds_frame` sees them. Only for reads
        that wait as long as it takes (``read`` without a silence limit): bytes read ahead
        are not seen by a wait for the socket to be readable."""
        self._ahead = ReadAhead(self.sock)

    def holds_frame(self) -> bool:
        """Whether a whole frame has been read ahead (:meth:`read` returns it at once)."""
        return self._ahead is not None and self._ahead.holds_frame()

    @property
    def encrypted(self) -> bool:
        return self._seal is not None

    def send(self, kind: bytes, payload: bytes | bytearray | memoryview | pa.Buffer) -> None:
        with self._sending:
            if self._seal is None:
                send_frame(self.sock, kind, payload)
            else:
                sealed = self._seal.seal(kind, payload)
                send_frame(self.sock, kind, sealed, MAX_FRAME + _TAG)

    def send_many(self, frames: list[tuple[bytes, bytes]]) -> None:
        """Frames ``(kind, payload)`` sent together (:func:`~.home_wire.send_frames`); none
        if one is too long (:class:`ValueError`)."""
        with self._sending:
            if self._seal is None:
                send_frames(self.sock, frames)
            else:
                longest = max((len(p) for _, p in frames), default=0)
                if longest > MAX_FRAME:  # (before any is sealed: the frame count stays in step)
                    msg = f"a frame of {longest} bytes is longer than the {MAX_FRAME} a home takes"
                    raise ValueError(msg)
                sealed = [(kind, self._seal.seal(kind, p)) for kind, p in frames]
                send_frames(self.sock, sealed, MAX_FRAME + _TAG)

    def read(
        self, silence_s: float | None = None, max_size: int = MAX_FRAME
    ) -> tuple[bytes, bytes | bytearray]:
        """The next frame (:func:`~.home_wire.read_frame`), opened if sealed."""
        source: Any = self.sock
        if self._ahead is not None:
            if silence_s is not None:
                msg = "a channel read ahead waits for its frames as long as it takes"
                raise ValueError(msg)
            source = self._ahead
        if self._seal is None:
            return read_frame(source, silence_s, max_size)
        kind, sealed = read_frame(source, silence_s, max_size + _TAG)
        return kind, self._seal.open(kind, sealed)

    def shutdown(self) -> None:
        """End the connection both ways (a thread blocked on it returns)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReadAhead:
    """A socket's bytes read a chunk at a time, handed out as :func:`~.home_wire.read_frame`
    asks for them (a read longer than a chunk, with nothing held, goes to the socket)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._held = bytearray()

    def recv_into(self, view: memoryview, size: int) -> int:
        if not self._held:
            if size >= _CHUNK:
                return self._sock.recv_into(view, size)
            chunk = self._sock.recv(_CHUNK)
            if not chunk:
                return 0
            self._held += chunk
        n = min(size, len(self._held))
        view[:n] = self._held[:n]
        del self._held[:n]
        return n

    def holds_frame(self) -> bool:
        if len(self._held) < FRAME_HEADER.size:
            return False
        size: int = FRAME_HEADER.unpack_from(self._held)[1]
        return len(self._held) >= FRAME_HEADER.size + size


class _Seal:
    """AES-256-GCM over one connection: a key and a frame counter for each direction."""

    def __init__(self, send_key: bytes, open_key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._sender = AESGCM(send_key)
        self._opener = AESGCM(open_key)
        self._sent = 0
        self._opened = 0

    def seal(self, kind: bytes, payload: bytes | bytearray | memoryview | pa.Buffer) -> bytes:
        data = memoryview(payload).cast("B")  # an Arrow buffer's view is of signed bytes
        if data.nbytes > MAX_FRAME:
            msg = f"a frame of {data.nbytes} bytes is longer than the {MAX_FRAME} a home takes"
            raise ValueError(msg)
        nonce = self._sent.to_bytes(12, "big")
        self._sent += 1
        return self._sender.encrypt(nonce, data, kind)

    def open(self, kind: bytes, sealed: bytearray) -> bytes:
        from cryptography.exceptions import InvalidTag

        nonce = self._opened.to_bytes(12, "big")
        self._opened += 1
        try:
            return self._opener.decrypt(nonce, bytes(sealed), kind)
        except InvalidTag as exc:
            msg = f"a sealed frame {kind!r} did not open: changed, dropped or out of order"
            raise FrameRefused(msg) from exc


def _keys(secret: bytes, transcript: bytes, nonces: bytes) -> tuple[bytes, bytes]:
    """The client's sending key and the home's (HKDF-SHA256)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = b"sparkstate-home keys" + transcript
    keys = HKDF(hashes.SHA256(), 64, salt=nonces, info=info).derive(secret)
    return keys[:32], keys[32:]


def _proof(secret: bytes, role: bytes, transcript: bytes) -> bytes:
    return hmac.new(secret, role + b"\0" + transcript, hashlib.sha256).digest()


def open_channel(address: str, credentials: Credentials, timeout_s: float) -> Channel:
    """A channel to the home at ``address`` (``host:port/token``), the handshake done within
    ``timeout_s`` each step. Raises :class:`OSError` (unreachable), :class:`ValueError` (not an
    address), :class:`HandshakeRefused` (not this home, or not these credentials) or
    :class:`~.home_wire.HomeLost`."""
    where, _, token = address.partition("/")
    host, _, port = where.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel = _client_handshake(sock, credentials, token.encode())
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return channel


def _client_handshake(sock: socket.socket, credentials: Credentials, token: bytes) -> Channel:
    secret = credentials.secret
    if secret is None:
        send_frame(sock, AUTH, token)
        _expect(sock, AUTH)
        return Channel(sock)
    flags = bytes([_VERSION, credentials.flags])
    mine = secrets.token_bytes(_NONCE)
    send_frame(sock, HELLO, flags + mine + token)
    theirs = bytes(_expect(sock, HELLO))
    if len(theirs) != _NONCE:
        msg = "the home's HELLO is not a nonce"
        raise HandshakeRefused(msg)
    transcript = flags + mine + theirs + token
    send_frame(sock, PROOF, _proof(secret, b"client", transcript))
    proof = _expect(sock, PROOF)
    if not hmac.compare_digest(bytes(proof), _proof(secret, b"home", transcript)):
        msg = "the home did not prove that it knows the application's secret"
        raise HandshakeRefused(msg)
    if not credentials.encrypt:
        return Channel(sock)
    to_home, to_client = _keys(secret, transcript, mine + theirs)
    return Channel(sock, _Seal(to_home, to_client))


def _expect(sock: socket.socket, kind: bytes) -> bytearray:
    got, payload = read_frame(sock, max_size=HANDSHAKE_FRAME_MAX)
    if got == REFUSED:
        reason = bytes(payload).decode("utf-8", "replace")
        msg = f"the home refused the connection: {reason}"
        raise HandshakeRefused(msg)
    if got != kind:
        msg = f"expected {kind!r} in the handshake, got {got!r}"
        raise HandshakeRefused(msg)
    return payload


def accept(sock: socket.socket, credentials: Credentials, token: str) -> Channel:
    """The home's side of the handshake on a connection just accepted: its channel, or
    :class:`HandshakeRefused` / :class:`~.home_wire.HomeLost` / :class:`OSError` (the caller
    closes the connection and bounds the time it takes)."""
    kind, hello = read_frame(sock, max_size=HANDSHAKE_FRAME_MAX)
    secret = credentials.secret
    expected = token.encode()
    if secret is None:
        if kind != AUTH:
            _refuse(sock, "this home takes its token only (spark.authenticate is off here)")
        if not hmac.compare_digest(bytes(hello), expected):
            _refuse(sock, "not this home's token")
        send_frame(sock, AUTH, b"")
        return Channel(sock)
    if kind != HELLO:
        _refuse(sock, "this home takes the application's secret (spark.authenticate is on)")
    flags = bytes([_VERSION, credentials.flags])
    if len(hello) < 2 or bytes(hello[:2]) != flags:
        _refuse(sock, "another version or mode (encryption on one side only)")
    theirs = bytes(hello[2 : 2 + _NONCE])
    if len(theirs) != _NONCE or not hmac.compare_digest(bytes(hello[2 + _NONCE :]), expected):
        _refuse(sock, "not this home's token")
    mine = secrets.token_bytes(_NONCE)
    send_frame(sock, HELLO, mine)
    transcript = flags + theirs + mine + expected
    kind, proof = read_frame(sock, max_size=HANDSHAKE_FRAME_MAX)
    if kind != PROOF or not hmac.compare_digest(
        bytes(proof), _proof(secret, b"client", transcript)
    ):
        _refuse(sock, "wrong proof of the application's secret")
    send_frame(sock, PROOF, _proof(secret, b"home", transcript))
    if not credentials.encrypt:
        return Channel(sock)
    to_home, to_client = _keys(secret, transcript, theirs + mine)
    return Channel(sock, _Seal(to_client, to_home))


def _refuse(sock: socket.socket, reason: str) -> NoReturn:
    with contextlib.suppress(OSError):
        send_frame(sock, REFUSED, reason.encode())
    raise HandshakeRefused(reason)
