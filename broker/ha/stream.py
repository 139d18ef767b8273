"""Reading and writing witness frames on a trio stream (shared by the witness and its client)."""

from __future__ import annotations

import trio

from broker.errors import ProtocolError
from broker.ha.codec import MAX_FRAME, WitnessConnectionClosed, WitnessProtocolError
from broker.wire.buffer import FrameBuffer

__all__ = ["FrameStream"]


class FrameStream:
    """One stream cut into witness frame bodies (at most ``MAX_FRAME`` bytes each)."""

    __slots__ = ("buffer", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = FrameBuffer(MAX_FRAME)

    async def receive(self) -> bytes:
        """The next frame body; EOF or a bad length is a ``WitnessProtocolError``."""
        while True:
            try:
                body = self.buffer.next_frame()
            except ProtocolError as exc:
                raise WitnessProtocolError(str(exc)) from None
            if body is not None:
                return body
            if self.buffer.at_eof:
                raise WitnessConnectionClosed("connection closed")
            self.buffer.feed(await self.stream.receive_some(MAX_FRAME))

    async def send(self, frame: bytes) -> None:
        await self.stream.send_all(frame)
