"""A WebSocket client for tests: wsproto's client side over a real trio TCP stream.

It speaks only when told to, so a test can say exactly what goes on the wire: a message in
many fragments, a ping, a text frame, a close frame, or raw bytes that are not WebSocket at all.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    Event,
    RejectConnection,
    RejectData,
    Request,
)

RECEIVE_SIZE = 64 * 1024
WAIT = 10.0  # seconds any one read may wait for the server


class WsClient:
    """One client connection; every read fails with TooSlowError after ``WAIT`` seconds."""

    def __init__(self, stream: trio.abc.Stream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.rejection_body = b""
        self._events: deque[Event] = deque()

    async def handshake(
        self, path: str = "/mqtt", subprotocols: Sequence[str] = ("mqtt",)
    ) -> AcceptConnection | RejectConnection:
        """Send the upgrade request; the server's answer (a refusal's body: rejection_body)."""
        request = Request(host=self.host, target=path, subprotocols=list(subprotocols))
        await self.stream.send_all(self.ws.send(request))
        answer = await self.next_event()
        assert isinstance(answer, AcceptConnection | RejectConnection), answer
        if isinstance(answer, RejectConnection) and answer.has_body:
            while True:  # bounded by the body the server declared
                part = await self.next_event()
                assert isinstance(part, RejectData), part
                self.rejection_body += part.data
                if part.body_finished:
                    break
        return answer

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next_event(self) -> Event | None:
        """The server's next WebSocket event; None when the TCP connection ends."""
        while not self._events:  # each pass reads the socket: bounded by the server's bytes
            with trio.fail_after(WAIT):
                data = await self.stream.receive_some(RECEIVE_SIZE)
            if not data:
                return None
            self.ws.receive_data(data)
            self._events.extend(self.ws.events())
        return self._events.popleft()

    async def receive_bytes(self, count: int) -> bytes:
        """Exactly ``count`` payload bytes from binary messages, whatever their framing."""
        got = bytearray()
        while len(got) < count:  # each event brings at least one byte, or fails
            event = await self.next_event()
            assert isinstance(event, BytesMessage), event
            got += event.data
        assert len(got) == count, f"{len(got) - count} bytes more than expected"
        return bytes(got)

    async def read_all_raw(self) -> bytes:
        """Everything the server sends until it closes: for answers that are not WebSocket."""
        got = bytearray()
        with trio.fail_after(WAIT):
            while data := await self.stream.receive_some(RECEIVE_SIZE):
                got += data
        return bytes(got)


@contextlib.asynccontextmanager
async def ws_connection(address: tuple[str, int]) -> AsyncIterator[WsClient]:
    """A TCP connection to ``address`` with a WsClient on it (no handshake yet)."""
    host, port = address
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        yield WsClient(stream, f"{host}:{port}")
