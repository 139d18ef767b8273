"""A broker's connection to the witness: the handshake, then one request and its answer at a
time. Timeouts are the caller's cancel scopes; a connection that failed or was cancelled
mid-request is not reused (open a new one). With ``tls`` the connection is mutual TLS, the
witness' certificate checked for the host dialled; a TLS failure during the handshakes is
a ``WitnessTlsError``, so that the broker counts it apart from a witness that is down."""

from __future__ import annotations

import os

import trio

from broker.ha.codec import (
    NONCE_BYTES,
    WitnessProtocolError,
    decode_answer,
    decode_welcome,
    encode_hello,
    encode_request,
    session_key,
)
from broker.ha.messages import Answer, Request
from broker.ha.stream import FrameStream
from broker.ha.tls import PairTls, TlsHandshakeFailed, tls_reason

__all__ = ["WitnessClient", "WitnessTlsError", "connect_witness"]

#: Seconds the TLS handshake with the witness may take (the caller's scope may be shorter).
TLS_HANDSHAKE_TIMEOUT = 10.0


class WitnessTlsError(WitnessProtocolError):
    """The TLS handshake with the witness failed, or the witness refused our certificate."""


class WitnessClient:
    """An authenticated connection to a witness; ``ask`` sends a request and awaits its answer."""

    def __init__(self, frames: FrameStream, key: bytes) -> None:
        self._frames = frames
        self._key = key
        self._seq = 0
        self._lock = trio.Lock()

    async def ask(self, request: Request) -> Answer:
        async with self._lock:
            self._seq += 1
            await self._frames.send(encode_request(self._key, self._seq, request))
            return decode_answer(self._key, await self._frames.receive(), self._seq)

    async def aclose(self) -> None:
        await self._frames.stream.aclose()


async def connect_witness(
    host: str, port: int, secret: bytes, tls: PairTls | None = None
) -> WitnessClient:
    """Connect and authenticate (WitnessProtocolError if the witness does not know the
    secret, WitnessTlsError if TLS failed)."""
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if tls is not None:
        try:
            stream = await tls.dial(stream, host, TLS_HANDSHAKE_TIMEOUT)
        except TlsHandshakeFailed as exc:
            raise WitnessTlsError(f"TLS: {exc}") from None
    try:
        frames = FrameStream(stream)
        nonce = os.urandom(NONCE_BYTES)
        await frames.send(encode_hello(nonce))
        witness_nonce = decode_welcome(await frames.receive())
        return WitnessClient(frames, session_key(secret, nonce, witness_nonce))
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        await trio.aclose_forcefully(stream)
        reason = tls_reason(exc)  # TLS 1.3: a refused certificate shows at the first read
        if reason is not None:
            raise WitnessTlsError(f"TLS: {reason}") from None
        raise
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
