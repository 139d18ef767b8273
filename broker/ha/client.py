"""A broker's connection to the witness: the handshake, then one request and its answer at a
time. Timeouts are the caller's cancel scopes; a connection that failed or was cancelled
mid-request is not reused (open a new one)."""

from __future__ import annotations

import os

import trio

from broker.ha.codec import (
    NONCE_BYTES,
    decode_answer,
    decode_welcome,
    encode_hello,
    encode_request,
    session_key,
)
from broker.ha.messages import Answer, Request
from broker.ha.stream import FrameStream

__all__ = ["WitnessClient", "connect_witness"]


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


async def connect_witness(host: str, port: int, secret: bytes) -> WitnessClient:
    """Connect and authenticate (WitnessProtocolError if the witness does not know the secret)."""
    stream = await trio.open_tcp_stream(host, port)
    try:
        frames = FrameStream(stream)
        nonce = os.urandom(NONCE_BYTES)
        await frames.send(encode_hello(nonce))
        witness_nonce = decode_welcome(await frames.receive())
        return WitnessClient(frames, session_key(secret, nonce, witness_nonce))
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
