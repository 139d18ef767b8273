"""A raw protocol client for bad-input tests: real sockets, hand-made bytes."""

from __future__ import annotations

import msgpack
import trio

from broker.wire.frames import PROTOCOL_VERSION


def frame(body: dict | bytes) -> bytes:
    data = body if isinstance(body, bytes) else msgpack.packb(body, use_bin_type=True)
    return len(data).to_bytes(4, "big") + data


HELLO = frame({"type": "HELLO", "version": PROTOCOL_VERSION})


class RawClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.closed = False

    @classmethod
    async def open(cls, address: tuple[str, int], hello: bool = True) -> RawClient:
        client = cls(await trio.open_tcp_stream(*address))
        if hello:
            await client.send(HELLO)
            welcome = await client.read_frame()
            assert welcome["type"] == "WELCOME", welcome
        return client

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_frame(self) -> dict:
        """The next frame as a dict; {"type": "EOF"} once the broker closed."""
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + size:
                    body = bytes(self.buffer[4 : 4 + size])
                    del self.buffer[: 4 + size]
                    return msgpack.unpackb(body, raw=False)
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self.closed = True
                return {"type": "EOF"}
            self.buffer += data

    async def read_until(self, frame_type: str) -> dict:
        while True:
            got = await self.read_frame()
            if got["type"] in (frame_type, "EOF"):
                return got

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)
