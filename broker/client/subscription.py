"""A subscription (messages for one filter, read with ``async for``) and the ``Message``
it yields.

Each subscription has a bounded buffer: when it is full the client's reader waits, TCP
pushes back, and the broker's flow control for slow consumers takes over, so memory stays
bounded on both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol

import trio

from broker.client.errors import ConnectionLost
from broker.wire.frames import Frame, Unsub


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message: ack its ``seq`` (the session's sequence number) on a
    durable session; its ``id`` lets a consumer drop a duplicate; ``sub`` is the broker's id
    of one subscription it matched."""

    topic: str
    payload: bytes
    headers: dict[str, str] | None
    seq: int
    id: str
    sub: int
    #: messages for this client the broker dropped just before this one (its queue was
    #: full because the client read too slowly); 0 when none were
    discarded: int = 0
    #: True when the message comes from the broker's retained store (sent because this
    #: subscription was made), not because it was just published
    retained: bool = False
    #: the server id of the broker that sent it: ``seq`` counts in that broker's session
    #: (pass it to ``Client.ack`` so an ack never reaches another broker after a failover)
    server: str | None = None

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")


class Requester(Protocol):
    """What a subscription needs of its client: send a request, wait for the reply."""

    async def _request(self, make: Callable[[int], Frame]) -> Frame: ...


class Subscription:
    """Messages for one filter; iterate with ``async for``."""

    def __init__(
        self, client: Requester, filter: str, dialect: str, buffer: int, retained: bool = True
    ) -> None:
        self.client = client
        self.filter = filter
        self.dialect = dialect
        self.retained = retained  # asked for retained messages (again after a reconnect)
        self.sub_id: int | None = None
        self._send, self._receive = trio.open_memory_channel[Message | Exception](buffer)
        self.closed = False

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if isinstance(item, Exception):
            raise item
        return item

    async def get(self) -> Message:
        """The next message (raises ConnectionLost when the connection is gone)."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise ConnectionLost("subscription closed") from None

    async def unsubscribe(self) -> None:
        """End the subscription at the broker (for a durable session: for good)."""
        if self.sub_id is not None and not self.closed:
            sub_id = self.sub_id
            await self.client._request(lambda rid: Unsub(id=rid, sub=sub_id))
            self.sub_id = None

    async def _put(self, message: Message) -> None:
        if not self.closed:
            await self._send.send(message)

    def _end(self, error: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if error is not None:
            with suppress(trio.WouldBlock):
                self._send.send_nowait(error)
        self._send.close()
