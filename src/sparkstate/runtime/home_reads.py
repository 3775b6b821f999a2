"""Live reads: what a reader and a state home say to each other to read a running query's state.

A reader connects to a home as a task on another executor does (TCP, authenticated the same
way) and sends READ frames, each one request, on one connection for as long as it likes; the
home answers each with VALUES, or with REFUSED and why (it does not hold the partition, or not
that version, or the request is malformed). Nothing on this connection is pickled: a request is
a JSON header and a list of byte strings, so that a reader runs no code in the home and the
home parses nothing but lengths and JSON.

A request names the partition's store (state root, operator, partition) and the version to
read, the one after the last batch the query committed, with the attempt that batch's commit
names (a version's checkpoint id: a retried task writes the same version again). The home
answers from a version its provider pinned when it committed it
(:class:`~sparkstate.store.capabilities.ReadsLive`), never from one a task is writing, and
takes no partition lock for it. Each answer says which versions
the home holds, so that a reader sees a newer batch as soon as the query commits it.

    reader -> home   READ   {"op": "get", root, operator, partition, version} + physical keys
                     READ   {"op": "scan", ..., "page": n} + [start, end]
    home -> reader   VALUES {"checkpoint_id", "held"} + values (get) or keys and values (scan)
                     REFUSED {"why", "held"}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from collections.abc import Sequence
from typing import Any

from sparkstate.runtime.home_channel import Channel
from sparkstate.runtime.home_wire import HomeLost
from sparkstate.runtime.providers import PROVIDERS, ProviderCache
from sparkstate.store.capabilities import ReadsLive

__all__ = [
    "READ",
    "REFUSED",
    "VALUES",
    "BadRequest",
    "decode_message",
    "encode_message",
    "serve_reads",
]

log = logging.getLogger("sparkstate.home")

READ, VALUES, REFUSED = b"Q", b"V", b"N"
#: The most pairs one scan request answers with (a reader pages through the rest).
MAX_SCAN_LIMIT = 100_000
#: The most keys one get request may ask for.
MAX_KEYS = 100_000
_U32 = struct.Struct("!I")
_ABSENT = 0xFFFFFFFF


class BadRequest(ValueError):
    """A request that does not parse, or asks for something a home never serves."""


def encode_message(header: dict[str, Any], blobs: Sequence[bytes | None] = ()) -> bytes:
    """A header (JSON) and byte strings (None: absent) as one payload."""
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [_U32.pack(len(head)), head, _U32.pack(len(blobs))]
    for blob in blobs:
        if blob is None:
            parts.append(_U32.pack(_ABSENT))
        else:
            parts.append(_U32.pack(len(blob)))
            parts.append(blob)
    return b"".join(parts)


def decode_message(payload: bytes | bytearray) -> tuple[dict[str, Any], list[bytes | None]]:
    """The header and byte strings of :func:`encode_message`; :class:`BadRequest` for anything
    else (a truncated payload, lengths past its end, a header that is no JSON object)."""
    data = bytes(payload)  # (one copy: each byte string is then a slice of it)
    size = len(data)
    unpack = _U32.unpack_from
    try:
        (head_len,) = unpack(data, 0)
        pos = 4 + head_len
        if pos + 4 > size:
            msg = "the header runs past the end of the message"
            raise BadRequest(msg)
        header = json.loads(data[4:pos])
        (count,) = unpack(data, pos)
        pos += 4
        if count > (size - pos) // 4:
            msg = f"{count} values announced in {size - pos} bytes"
            raise BadRequest(msg)
        blobs: list[bytes | None] = []
        append = blobs.append
        for _ in range(count):
            (n,) = unpack(data, pos)
            pos += 4
            if n == _ABSENT:
                append(None)
                continue
            end = pos + n
            if end > size:
                msg = "a value runs past the end of the message"
                raise BadRequest(msg)
            append(data[pos:end])
            pos = end
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"the message does not parse: {exc}"
        raise BadRequest(msg) from exc
    if pos != size:
        msg = f"{size - pos} bytes follow the message"
        raise BadRequest(msg)
    if not isinstance(header, dict):
        msg = "the header is not a JSON object"
        raise BadRequest(msg)
    return header, blobs


def _int(header: dict[str, Any], name: str, low: int = 0, high: int = 2**62) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        msg = f"{name} must be an integer from {low} to {high}, got {value!r}"
        raise BadRequest(msg)
    return value


def answer(
    header: dict[str, Any], blobs: list[bytes | None], cache: ProviderCache = PROVIDERS
) -> tuple[bytes, bytes]:
    """The reply (kind and payload) to one request."""
    op = header.get("op")
    root = header.get("root")
    if op not in ("get", "scan") or not isinstance(root, str):
        msg = f"a request is a get or a scan of a state root, got {op!r} of {root!r}"
        raise BadRequest(msg)
    operator, partition = _int(header, "operator"), _int(header, "partition")
    version = _int(header, "version")
    attempt = header.get("checkpoint_id")
    if attempt is not None and not isinstance(attempt, str):
        msg = f"checkpoint_id must be a string, got {attempt!r}"
        raise BadRequest(msg)
    provider = cache.live(root, operator, partition)
    reads = None if provider is None else ReadsLive.of(provider)
    if reads is None:
        return REFUSED, encode_message({"why": "not held", "held": []})
    if any(b is None for b in blobs):
        msg = "a key is absent"
        raise BadRequest(msg)
    keys: list[bytes] = blobs  # type: ignore[assignment]
    if op == "get":
        if len(keys) > MAX_KEYS:
            msg = f"at most {MAX_KEYS} keys a request, got {len(keys)}"
            raise BadRequest(msg)
        got = reads.live_get(version, keys)
        if got is not None and attempt in (None, got[0]):
            held = reads.live_versions()
            return VALUES, encode_message({"checkpoint_id": got[0], "held": held}, got[1])
    else:
        if len(keys) != 2:
            msg = "a scan gives its start and end keys"
            raise BadRequest(msg)
        limit = _int(header, "page", 1, MAX_SCAN_LIMIT)
        found = reads.live_scan(version, keys[0], keys[1], limit)
        if found is not None and attempt in (None, found[0]):
            flat = [b for pair in found[1] for b in pair]
            held = reads.live_versions()
            return VALUES, encode_message({"checkpoint_id": found[0], "held": held}, flat)
    return REFUSED, encode_message({"why": "version not held", "held": reads.live_versions()})


def serve_reads(channel: Channel, payload: bytes | bytearray) -> None:
    """Answer the reader at the end of ``channel``, ``payload`` its first request, until it
    goes or sends anything but a request. A malformed request is refused; the connection
    stays.

    The requests a reader sent together are read with one system call and answered with one
    (the channel reads ahead): each call gives up the GIL, which the thread of a task running
    in this home may then hold for up to a switch interval, so that a call saved is a wait
    saved."""
    channel.read_ahead()
    kind = READ
    while kind == READ:
        replies = [_reply(payload)]
        try:
            while channel.holds_frame():
                kind, payload = channel.read()
                if kind != READ:
                    break
                replies.append(_reply(payload))
            channel.send_many(replies)
            if kind == READ:
                kind, payload = channel.read()
        except (HomeLost, OSError):
            return
    log.debug("state home %d: a reader sent a frame of kind %r: closed", os.getpid(), kind)


def _reply(payload: bytes | bytearray) -> tuple[bytes, bytes]:
    """The reply to one request (a malformed or failed one: refused, and why)."""
    try:
        header, blobs = decode_message(payload)
        return answer(header, blobs)
    except BadRequest as exc:
        return REFUSED, encode_message({"why": f"bad request: {exc}", "held": []})
    except Exception as exc:  # noqa: BLE001 - a read that failed (a store closing): refused
        log.warning("state home %d: a live read failed: %r", os.getpid(), exc)
        return REFUSED, encode_message({"why": f"failed: {exc!r}", "held": []})


class HomeReader:
    """A reader's connection to one home (:func:`~sparkstate.runtime.home_client.connect_owner`
    opens it, authenticated and encrypted as a task's): requests and their answers, one at a
    time."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        channel.read_ahead()  # (the answers to requests sent together come together)

    def request(
        self, header: dict[str, Any], blobs: Sequence[bytes | None]
    ) -> tuple[bool, dict[str, Any], list[bytes | None]]:
        """``(answered, header, blobs)``: the home's VALUES, or its REFUSED (``answered``
        False); :class:`HomeLost` if the connection fails."""
        self.send(header, blobs)
        return self.receive()

    def send(self, header: dict[str, Any], blobs: Sequence[bytes | None]) -> int:
        """Send a request without waiting for its answer (:meth:`receive` takes the answers in
        the order of their requests); the bytes sent."""
        message = encode_message(header, blobs)
        self.channel.send(READ, message)
        return len(message)

    def send_many(self, requests: Sequence[tuple[dict[str, Any], Sequence[bytes | None]]]) -> int:
        """Send requests together, without waiting for their answers (one system call); the
        bytes sent."""
        messages = [encode_message(header, blobs) for header, blobs in requests]
        self.channel.send_many([(READ, m) for m in messages])
        return sum(map(len, messages))

    def receive(self) -> tuple[bool, dict[str, Any], list[bytes | None]]:
        """The answer to the oldest request sent and not yet answered, as :meth:`request`."""
        kind, payload = self.channel.read()
        if kind not in (VALUES, REFUSED):
            msg = f"a state home answered a read with a frame of kind {kind!r}"
            raise HomeLost(msg)
        reply, values = decode_message(payload)
        return kind == VALUES, reply, values

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.channel.close()
