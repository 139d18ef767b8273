"""One open peer link: a bounded queue out, frames in, keepalive.

A link runs a writer and a keepalive task in a nursery of its own and reads inline;
everything it reads goes to its owner's ``handle`` (a broker's ``Peering`` for each of its
links, the Kafka bridge's ``RouteWatcher`` for its link to its broker), and the owner
forgets the link when ``run`` returns. The owner also chooses the link's pace
(``Keepalive``) and how many events its queue holds.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger
from broker.net import receive_frame
from broker.wire.connection import Connection, State
from broker.wire.frames import Error, Frame, Ping, Route

log = get_logger("topiary.peering")

ERROR_FLUSH_SECONDS = 1.0
TURN_TIME = 0.0005  # seconds of a peer's frames handled before the link yields to others


@dataclass(frozen=True, slots=True)
class Keepalive:
    """When a link PINGs, and when it gives up on a far end it no longer hears.

    Every ``tick`` seconds the link PINGs if it has heard nothing for more than
    ``ping_if_silent`` seconds or sent nothing for more than ``ping_if_idle`` (0.0: on
    every tick), and closes with IDLE_TIMEOUT once it has heard nothing for more than
    ``dead_after``."""

    tick: float
    ping_if_silent: float
    ping_if_idle: float
    dead_after: float

    @classmethod
    def for_interval(cls, interval: float) -> Keepalive:
        """A broker's rule for its ``peer_keepalive``: look twice per interval, close after
        three silent ones."""
        # PING also when we have sent nothing lately: a peer that only receives (one-way
        # event flow) would otherwise be heard only through PONGs queued behind its events.
        return cls(
            tick=interval / 2,
            ping_if_silent=interval,
            ping_if_idle=interval / 2,
            dead_after=interval * 3,
        )


class LinkOwner(Protocol):
    """What a link needs of whoever serves it (``Peering``, the bridge's ``RouteWatcher``)."""

    async def handle(self, link: PeerLink, frame: Frame) -> RemoteProtocolError | None:
        """Act on one frame; a returned error closes the link with that ERROR."""
        ...

    def link_closed(self, link: PeerLink) -> None:
        """The link takes no more frames (called once it stops reading, and again at the end)."""
        ...


class PeerLink:
    """One open peer link: a bounded queue out, frames in, keepalive.

    Everything goes out through one writer task, so a PONG, a PING and a FWD never race for
    the stream. Route state and control frames are never dropped (they are bounded by the
    size of the state); events are dropped and counted once the queue is past its bounds, so
    a slow peer cannot hold a broker's memory. On a protocol error, silence or ``close``,
    the link flushes what is queued and says ERROR (unless the far end hung up or said its
    own closing ERROR first), and ``run`` returns."""

    def __init__(
        self,
        owner: LinkOwner,
        stream: trio.abc.Stream,
        proto: Connection,
        peer_id: str,
        role: str,
        incarnation: int,
        *,
        dialled_by: str,
        address: str,
        digest: dict[str, list[int]],
        keepalive: Keepalive,
        max_events: int = 0,
        max_event_bytes: int = 0,
    ) -> None:
        self.owner = owner
        self.stream = stream
        self.proto = proto
        self.peer_id = peer_id
        self.role = role
        self.incarnation = incarnation
        self.dialled_by = dialled_by
        self.address = address
        self.digest = {origin: (int(v[0]), int(v[1])) for origin, v in digest.items()}
        self.keepalive = keepalive
        self.max_events = max_events  # FWD frames queued at most (0: the link carries none)
        self.max_event_bytes = max_event_bytes
        self.opened = time.time()
        self.last_heard = self.last_sent = trio.current_time()
        self._turn_began = self.last_heard
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
            return  # closing: nothing more goes out (the owner forgets the link next)
        if isinstance(frame, Route):
            self.routes_out += 1
        self._queue.append((self.proto.send(frame), -1))
        self._wake.set()

    def send_event(self, data: bytes, size: int) -> bool:
        """Queue a FWD; False (dropped) when the queue is past its bounds."""
        if (
            self._closing is not None
            or self._events >= self.max_events
            or (self._event_bytes + size > self.max_event_bytes and self._events)
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
        """Serve the link until EOF, an error, or shutdown; the owner forgets it after.
        What is still queued then is never sent (``unsent_events``)."""
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
                self.owner.link_closed(self)  # no new frames for it from here on
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
            self.owner.link_closed(self)

    @property
    def unsent_events(self) -> int:
        """FWD frames still queued: after ``run``, the ones that never went out."""
        return self._events

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
        """Handle the peer's frames in order; like a client connection (broker/native), a
        link whose turn is up (``TURN_TIME`` of work since its last read or yield) gives way
        to the others, so a peer's burst of FWDs never holds the loop."""
        while True:
            try:
                frame = await receive_frame(self.proto, self._receive)
            except RemoteProtocolError as exc:
                return exc
            if frame is None:
                return None
            if isinstance(frame, Error) and frame.closes_connection:
                log.info(
                    "peer closed the link", peer=self.peer_id, code=frame.code, text=frame.text
                )
                return None  # it said why; nothing more to read or to answer
            problem = await self.owner.handle(self, frame)
            if problem is not None:
                return problem
            if trio.current_time() - self._turn_began >= TURN_TIME:
                await trio.lowlevel.checkpoint()
                self._turn_began = trio.current_time()

    async def _receive(self, max_bytes: int) -> bytes:
        data = await self.stream.receive_some(max_bytes)
        self.last_heard = self._turn_began = trio.current_time()  # (a read yields)
        return data

    async def _keepalive(self) -> None:
        pace = self.keepalive
        while True:
            await trio.sleep(pace.tick)
            silent = trio.current_time() - self.last_heard
            if silent > pace.dead_after:
                log.warning("peer link silent, closing", peer=self.peer_id, seconds=silent)
                self.close(
                    RemoteProtocolError(ErrorCode.IDLE_TIMEOUT, f"nothing heard for {silent:.1f} s")
                )
                return
            idle = trio.current_time() - self.last_sent
            if silent > pace.ping_if_silent or idle > pace.ping_if_idle:
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
