"""The replication link on the wire: a handshake, then MAC'd msgpack frames both ways.

Framing as the native protocol (4-byte length, then the body); a body is ``mac || msgpack``
where ``mac = HMAC-SHA256(key, direction + counter + msgpack)``: ``direction`` is ``b"s"``
(standby to primary) or ``b"p"``, ``counter`` the 8-byte count of frames already sent that
way. The key is derived as the witness protocol derives its (``broker.ha.codec``), from the
pair's ``[ha] secret`` and two fresh nonces, with the label ``topiary-replication-1``: a
recorded frame replays nowhere, a reordered or dropped one fails the next MAC, and neither
side accepts anything from a process that does not know the secret. With ``[ha] ca``,
``cert`` and ``key`` the stream under it is mutual TLS (``broker.ha.tls``): the MAC stays,
TLS adds privacy and proves the machines; without them the link is plain TCP and belongs on
the pair's own network.

Handshake: standby -> ``["HELLO", version, nonce]``; primary -> ``["WELCOME", nonce]``;
then, MAC'd, standby -> ``["POSITION", term, seq, digest]``. The primary then sends
``["SNAPSHOT", total_bytes]``, ``["CHUNK", bytes]``..., ``["SNAPSHOT_END"]`` when the
standby cannot continue from where it is, and ``["RECORD", body, digest, committed]`` for
each record after it, sent before the primary's own commit of it (``committed``: the newest
seq the primary had committed when it sent the frame); ``["COMMITTED", seq]`` when no record
followed a commit for a few ms; ``["WITHDRAW", seq]`` when record ``seq`` (sent, not
committed yet) failed to commit; ``["BEAT", term, n]`` every 0.1 s. The standby answers
``["ACK", seq, withdraws]`` (with the election ``["ACK", seq, withdraws, term, beat]``) once
records up to ``seq`` are durable, ``withdraws`` being the WITHDRAWs it had processed on this
connection. Either side may send ``["ERROR", text]`` before it closes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

import msgpack
import trio

from broker.errors import ProtocolError
from broker.ha.codec import NONCE_BYTES, session_key
from broker.ha.tls import tls_reason
from broker.wire.buffer import FrameBuffer

__all__ = [
    "MAX_LINK_FRAME",
    "LinkAuthError",
    "LinkError",
    "LinkStream",
    "LinkTlsError",
    "accept_link",
    "dial_link",
    "single_link_error",
]

#: 2: records carry an append's arguments in Append's order, the chain is SHA-256 (a
#: broker of version 1 is refused at the handshake, never fed records it would misread).
#: 3: records are sent before the primary's commit (RECORD carries the committed seq;
#: COMMITTED, WITHDRAW; ACK carries the withdraws): a broker of version 2 would apply a
#: record its primary then withdraws.
VERSION = 3
#: The largest frame: a batch of the store (at most 5,000 appends) or a snapshot chunk.
MAX_LINK_FRAME = 64 << 20
_LABEL = b"topiary-replication-1"
_MAC = 32
_HANDSHAKE_FRAME = 256


class LinkError(Exception):
    """The other side of the link sent something we cannot accept, or went away."""


class LinkAuthError(LinkError):
    """A frame's MAC is wrong: the other side does not have the pair's secret."""


class _Closed(LinkError):
    """The other side closed the connection (EOF between frames or inside one)."""


class LinkTlsError(LinkError):
    """TLS broke the connection: the other side refused our certificate (TLS 1.3 says so
    only after the handshake, at the first read), or an alert arrived."""


def _lost(exc: BaseException) -> LinkError:
    """The LinkError for a stream that broke under us (a TLS alert is a LinkTlsError)."""
    reason = tls_reason(exc)
    if reason is not None:
        return LinkTlsError(f"TLS: {reason}")
    return LinkError(f"connection lost ({exc})")


class LinkStream:
    """One authenticated replication connection; ``send``/``receive`` whole messages (lists)."""

    def __init__(
        self, stream: trio.abc.Stream, key: bytes, me: bytes, other: bytes, max_frame: int
    ) -> None:
        self.stream = stream
        self._key = key
        self._me, self._other = me, other
        self._sent = 0
        self._received = 0
        self._buffer = FrameBuffer(max_frame)
        self._send_lock = trio.StrictFIFOLock()
        self.bytes_sent = 0

    def _mac(self, direction: bytes, counter: int, body: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, direction + counter.to_bytes(8, "big"), hashlib.sha256)
        mac.update(body)  # (a record's body is not copied to be MAC'd)
        return mac.digest()

    async def send(self, message: list[Any]) -> None:
        body = msgpack.packb(message, use_bin_type=True)
        async with self._send_lock:
            mac = self._mac(self._me, self._sent, body)
            self._sent += 1
            data = b"".join(((len(body) + _MAC).to_bytes(4, "big"), mac, body))
            self.bytes_sent += len(data)
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise _lost(exc) from None

    async def receive(self) -> list[Any]:
        return self._open(await _receive_body(self.stream, self._buffer))

    def _open(self, frame: bytes) -> list[Any]:
        mac, body = frame[:_MAC], memoryview(frame)[_MAC:]  # (the body is not copied)
        if not hmac.compare_digest(mac, self._mac(self._other, self._received, body)):
            raise LinkAuthError("bad MAC: not signed with the pair's secret (or out of order)")
        self._received += 1
        message = _unpack(body)
        if message[0] == "ERROR":
            raise LinkError(f"the other side refused: {str(message[1:2])[:200]}")
        return message

    def receive_buffered(self) -> list[Any] | None:
        """The next message if it has arrived whole already, else None (no waiting)."""
        try:
            body = self._buffer.next_frame()
        except ProtocolError as exc:
            raise LinkError(str(exc)) from None
        if body is None:
            return None
        return self._open(body)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def _receive_body(stream: trio.abc.Stream, buffer: FrameBuffer) -> bytes:
    while True:
        try:
            body = buffer.next_frame()
        except ProtocolError as exc:
            raise LinkError(str(exc)) from None
        if body is not None:
            return body
        if buffer.at_eof:
            raise _Closed("connection closed")
        try:
            buffer.feed(await stream.receive_some(1 << 16))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise _lost(exc) from None


def _unpack(body: bytes | memoryview) -> list[Any]:
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad data
        raise LinkError(f"not a msgpack frame ({type(exc).__name__})") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise LinkError("a replication frame is a list starting with its kind")
    return message


async def _send_plain(stream: trio.abc.Stream, message: list[Any]) -> None:
    body = msgpack.packb(message, use_bin_type=True)
    try:
        await stream.send_all(len(body).to_bytes(4, "big") + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise _lost(exc) from None


def _nonce(message: list[Any], kind: str, at: int) -> bytes:
    if message[0] != kind or len(message) <= at:
        raise LinkError(f"expected {kind}, got {message[0]!r:.40}")
    nonce = message[at]
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise LinkError(f"{kind} needs a {NONCE_BYTES}-byte nonce")
    return nonce


async def dial_link(stream: trio.abc.Stream, secret: bytes) -> LinkStream:
    """The standby's side of the handshake on a connected ``stream``."""
    buffer = FrameBuffer(_HANDSHAKE_FRAME)
    nonce = os.urandom(NONCE_BYTES)
    await _send_plain(stream, ["HELLO", VERSION, nonce])
    try:
        welcome = _unpack(await _receive_body(stream, buffer))
    except _Closed:
        if isinstance(stream, trio.SSLStream):
            raise
        # A TLS primary closes on a plain HELLO (often without an alert): say what may be wrong.
        raise LinkError(
            "the primary closed the connection before WELCOME (does it want TLS: [ha] ca, "
            "cert, key?)"
        ) from None
    if welcome[0] == "ERROR":
        raise LinkError(f"the primary refused: {str(welcome[1:2])[:200]}")
    theirs = _nonce(welcome, "WELCOME", 1)
    # Nothing follows WELCOME before our POSITION: a fresh buffer loses no bytes.
    key = session_key(secret, nonce, theirs, _LABEL)
    return LinkStream(stream, key, b"s", b"p", MAX_LINK_FRAME)


async def accept_link(stream: trio.abc.Stream, secret: bytes) -> LinkStream:
    """The primary's side of the handshake on an accepted ``stream``."""
    buffer = FrameBuffer(_HANDSHAKE_FRAME)  # nobody unauthenticated makes us hold more
    hello = _unpack(await _receive_body(stream, buffer))
    theirs = _nonce(hello, "HELLO", 2)
    if hello[1] != VERSION:
        await _send_plain(stream, ["ERROR", f"unsupported replication version {hello[1]!r}"])
        raise LinkError(f"unsupported replication version {hello[1]!r:.20}")
    nonce = os.urandom(NONCE_BYTES)
    await _send_plain(stream, ["WELCOME", nonce])
    # The standby sends only small frames (POSITION, ACK), and nothing before WELCOME.
    return LinkStream(stream, session_key(secret, theirs, nonce, _LABEL), b"p", b"s", 4096)


def single_link_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a nursery of the link raised, as one exception: its LinkError when it has one
    (the other tasks were cancelled because of it), else the group itself."""
    found = group.subgroup(LinkError)
    while found is not None and isinstance(found.exceptions[0], BaseExceptionGroup):
        found = found.exceptions[0]
    return group if found is None else found.exceptions[0]
