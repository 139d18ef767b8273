"""One open peer link: a bounded queue out, frames in, keepalive.

A link runs a writer and a keepalive task in a nursery of its own and reads
inline; everything it reads goes to its owner's ``handle`` (the broker's
``Peering``), and the owner forgets the link when ``run`` returns.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from broker.config import BrokerConfig
from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, State
from broker.wire.frames import Error, Frame, Ping, Route

log = get_logger("topiary.peering")

RECEIVE_SIZE = 256 * 1024
ERROR_FLUSH_SECONDS = 1.0


@dataclass(slots=True)
class PeerCounters:
    fwd_out: int = 0  # FWD frames sent (one per event per next hop)
    fwd_in: int = 0
    delivered_from_peers: int = 0  # events a FWD brought for local subscribers
    unreachable_dropped: int = 0  # (event, destination) pairs with no path
    link_dropped: int = 0  # FWD copies lost: link down or its queue full
    hop_limit_dropped: int = 0
    duplicates_dropped: int = 0
    quota_rejected: int = 0
    links_opened: int = 0
    links_refused: int = 0
    sync_waits: int = 0
    sync_timeouts: int = 0


class LinkOwner(Protocol):
    """What a link needs of whoever serves it (``Peering``)."""

    config: BrokerConfig
    counters: PeerCounters

    async def handle(self, link: PeerLink, frame: Frame) -> RemoteProtocolError | None: ...

    def link_closed(self, link: PeerLink) -> None: ...


class PeerLink:
    """One open peer link: a bounded queue out, frames in, keepalive."""

    def __init__(
        self,
        peering: LinkOwner,
        stream: trio.abc.Stream,
        proto: Connection,
        peer_id: str,
        role: str,
        incarnation: int,
        dialled_by: str,
        address: str,
        digest: dict[str, list[int]],
    ) -> None:
        self.peering = peering
        self.stream = stream
        self.proto = proto
        self.peer_id = peer_id
        self.role = role
        self.incarnation = incarnation
        self.dialled_by = dialled_by
        self.address = address
        self.digest = {origin: (int(v[0]), int(v[1])) for origin, v in digest.items()}
        self.opened = time.time()
        self.last_heard = self.last_sent = trio.current_time()
        self._queue: deque[tuple[bytes, int]] = deque()  # (frame, payload size; -1: control)
        self._events = 0  # FWD frames in the queue
        self._event_bytes = 0
        self._wake = trio.Event()
        self._reader_scope = trio.CancelScope()
        self._closing: RemoteProtocolError | None = None
        self._said_error = False
        self._broken = False
        self._writer_done = trio.Event()
        self.fwd_out = self.fwd_in = self.routes_out = self.routes_in = 0
        self.dropped = 0
        self.bytes_out = 0

    # -- sending ----------------------------------------------------------------------------

    def send_frame(self, frame: Frame) -> None:
        """Route state and control: never dropped (bounded by the size of the state)."""
        if self.proto.state is not State.PEER_OPEN or self._closing is not None:
            return  # closing: nothing more goes out (the peering forgets the link next)
        if isinstance(frame, Route):
            self.routes_out += 1
        self._queue.append((self.proto.send(frame), -1))
        self._wake.set()

    def send_event(self, data: bytes, size: int) -> bool:
        """Queue a FWD; False (dropped) when the queue is past its bounds."""
        config = self.peering.config
        if (
            self._closing is not None
            or self._events >= config.peer_queue_messages
            or (self._event_bytes + size > config.peer_queue_bytes and self._events)
        ):
            self.dropped += 1
            return False
        self._queue.append((data, size))
        self._events += 1
        self._event_bytes += size
        self.fwd_out += 1
        self._wake.set()
        return True

    async def _writer(self) -> None:
        queue = self._queue
        try:
            while True:
                if not queue:
                    if self._closing is not None and self._said_error:
                        return
                    self._wake = trio.Event()
                    await self._wake.wait()
                    continue
                chunks = []
                size = 0
                while queue and size < 1 << 20:
                    chunk, payload = queue.popleft()
                    chunks.append(chunk)
                    size += len(chunk)
                    if payload >= 0:
                        self._events -= 1
                        self._event_bytes -= payload
                data = b"".join(chunks)
                self.bytes_out += len(data)
                await self.stream.send_all(data)
                self.last_sent = trio.current_time()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._broken = True
            self._reader_scope.cancel()
        finally:
            self._writer_done.set()

    # -- reading ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the link until EOF, an error, or shutdown; the peering forgets it after."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                nursery.start_soon(self._keepalive)
                reason = None
                with self._reader_scope:
                    try:
                        reason = await self._reader()
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        self._broken = True
                if self._reader_scope.cancelled_caught:
                    reason = self._closing
                self.peering.link_closed(self)  # no new frames for it from here on
                if reason is not None and not self._broken and self._may_say_error():
                    log.info(
                        "peer link closing",
                        peer=self.peer_id,
                        code=str(reason.code),
                        why=reason.text,
                    )
                    self._closing = reason
                    self._queue.append((self.proto.send(Error.from_exception(reason)), -1))
                    self._said_error = True
                    self._wake.set()
                    with trio.move_on_after(ERROR_FLUSH_SECONDS):
                        await self._writer_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.peering.link_closed(self)
            self.peering.counters.link_dropped += self._events  # queued, never sent

    def _may_say_error(self) -> bool:
        """Not after the peer's own closing ERROR or EOF: then it is not listening."""
        return self.proto.state in (State.PEER_OPEN, State.ERROR)

    def close(self, reason: RemoteProtocolError) -> None:
        """Stop reading; what is queued is flushed, then ERROR ``reason`` (shutdown, a
        duplicate link, silence)."""
        if self._closing is None:
            self._closing = reason
            self._reader_scope.cancel()

    async def _reader(self) -> RemoteProtocolError | None:
        proto = self.proto
        peering = self.peering
        while True:
            while True:
                try:
                    event = proto.next_event()
                except RemoteProtocolError as exc:
                    return exc
                if event is NEED_DATA:
                    break
                if isinstance(event, ConnectionClosed):
                    return None
                if isinstance(event, Error) and event.closes_connection:
                    log.info(
                        "peer closed the link",
                        peer=self.peer_id,
                        code=event.code,
                        text=event.text,
                    )
                    return None  # it said why; nothing more to read or to answer
                problem = await peering.handle(self, event)  # type: ignore[arg-type]
                if problem is not None:
                    return problem
            data = await self.stream.receive_some(RECEIVE_SIZE)
            self.last_heard = trio.current_time()
            proto.receive_data(data)

    async def _keepalive(self) -> None:
        interval = self.peering.config.peer_keepalive
        while True:
            await trio.sleep(interval / 2)
            silent = trio.current_time() - self.last_heard
            if silent > interval * 3:
                log.warning("peer link silent, closing", peer=self.peer_id, seconds=silent)
                self.close(
                    RemoteProtocolError(ErrorCode.IDLE_TIMEOUT, f"nothing heard for {silent:.1f} s")
                )
                return
            # Also when we have sent nothing lately: a peer that only receives (one-way event
            # flow) would otherwise be heard only through PONGs queued behind its events.
            idle = trio.current_time() - self.last_sent
            if silent > interval or idle > interval / 2:
                self.send_frame(Ping(id=0))

    def describe(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "address": self.address,
            "dialled_by": self.dialled_by,
            "up_seconds": round(time.time() - self.opened, 3),
            "fwd_out": self.fwd_out,
            "fwd_in": self.fwd_in,
            "routes_out": self.routes_out,
            "routes_in": self.routes_in,
            "dropped": self.dropped,
            "queued": len(self._queue),
            "bytes_out": self.bytes_out,
        }
