"""The bridge's view of who wants what, anywhere behind the broker it publishes to.

``RouteWatcher`` joins the broker's route exchange as a read-only peer (PEER_HELLO with
role "observer": it receives every origin's advertised filters and adjacency, sends no
ROUTE and is never a hop). It keeps a ``routing.linkstate.RouteTable`` rooted at that
broker, so ``wants(topic)`` is true exactly when some broker the attached one can reach has
a filter matching the topic: the events it says no to would be dropped by the mesh anyway,
so the bridge drops them before they cost a publish.

Each connection builds a fresh table and swaps it in only once it has caught up with the
digest in the broker's PEER_WELCOME (which covers every filter the broker had when it
answered). Until the first table is complete ``ready`` is unset and the bridge publishes
nothing; while a later connection catches up, the previous table keeps answering.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import trio

from broker.address import parse_host_port
from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Role
from broker.wire.frames import (
    PROTOCOL_VERSION,
    Error,
    PeerHello,
    PeerWelcome,
    Ping,
    Pong,
    Route,
    RouteRequest,
)
from routing.exchange import OBSERVER
from routing.linkstate import Outcome, RouteTable, Update

log = get_logger("topiary.bridge.routes")

RECEIVE_SIZE = 256 * 1024
HANDSHAKE_TIMEOUT = 10.0
BACKOFF_MIN = 0.1
#: Refusals that will not go away by trying again soon: back off to the maximum at once.
_LASTING_REFUSALS = {ErrorCode.AUTH_FAILED, ErrorCode.VERSION_MISMATCH, ErrorCode.BROKER_ID_CLASH}


@dataclass(slots=True)
class RouteCounters:
    links_opened: int = 0
    links_lost: int = 0
    refused: int = 0
    updates_applied: int = 0
    snapshot_requests: int = 0


class RouteWatcher:
    def __init__(
        self,
        server: str,
        *,
        observer_id: str,
        secret: str | None = None,
        keepalive: float = 2.0,
        backoff_max: float = 5.0,
    ) -> None:
        address = parse_host_port(server)
        if address is None:
            raise ValueError(f"server must be HOST:PORT, got {server!r}")
        self.address = address
        self.observer_id = observer_id
        self.secret = secret
        self.keepalive = keepalive
        self.backoff_max = backoff_max
        self.incarnation = time.time_ns()
        self.table: RouteTable | None = None
        self.ready = trio.Event()
        self.connected = False
        self.counters = RouteCounters()

    # -- the question the bridge asks -------------------------------------------------------

    def wants(self, topic: str) -> bool:
        """True if a broker reachable from the attached one subscribes to ``topic``."""
        table = self.table
        if table is None:
            return False
        dests = table.wanting(topic)
        if not dests:
            return False
        root = table.root
        paths = table.paths()  # cached by the table until the topology changes
        return any(dest == root or dest in paths for dest in dests)

    def describe(self) -> dict[str, Any]:
        table = self.table
        return {
            "connected": self.connected,
            "ready": self.ready.is_set(),
            "broker": None if table is None else table.root,
            "origins": 0 if table is None else len(table.origins) - 1,
            "filters": 0 if table is None else len(table.remote),
            **{name: getattr(self.counters, name) for name in RouteCounters.__dataclass_fields__},
        }

    # -- the link ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Stay attached to the broker for as long as this runs, redialling with backoff."""
        task_status.started()
        host, port = self.address
        backoff = BACKOFF_MIN
        while True:
            opened = False
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                log.info("route link dial failed", server=f"{host}:{port}", error=str(exc))
            else:
                try:
                    opened = await self._session(stream)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    log.info("route link lost", error=str(exc))
                except RemoteProtocolError as exc:
                    log.warning("route link broken", code=str(exc.code), error=str(exc))
                finally:
                    if self.connected:
                        self.counters.links_lost += 1
                    self.connected = False
                    await trio.aclose_forcefully(stream)
            if opened:
                backoff = BACKOFF_MIN
            await trio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self.backoff_max)

    async def _session(self, stream: trio.SocketStream) -> bool:
        """Handshake and follow the broker's routes until the link ends; True if it opened."""
        proto = Connection(Role.PEER)
        hello = PeerHello(
            version=PROTOCOL_VERSION,
            broker_id=self.observer_id,
            incarnation=self.incarnation,
            role=OBSERVER,
            secret=self.secret,
            digest={},
            keepalive=self.keepalive,
        )
        send = _Sender(stream, proto)
        await send(hello)
        welcome = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            welcome = await _next_frame(stream, proto)
        if isinstance(welcome, Error):
            self.counters.refused += 1
            log.error("broker refused the route link", code=welcome.code, text=welcome.text)
            if welcome.code in _LASTING_REFUSALS:
                await trio.sleep(self.backoff_max)
            return False
        if not isinstance(welcome, PeerWelcome):
            return False
        self.connected = True
        self.counters.links_opened += 1
        log.info("route link up", broker=welcome.broker_id, origins=len(welcome.digest))
        table = RouteTable(self.observer_id, self.incarnation, root=welcome.broker_id)
        target = {origin: (int(v[0]), int(v[1])) for origin, v in welcome.digest.items()}
        if _caught_up(table, target):
            self._install(table)
        state = _LinkState(self.keepalive, welcome.keepalive)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keepalive, send, state, nursery.cancel_scope)
            while True:
                frame = await _next_frame(stream, proto)
                state.last_heard = trio.current_time()
                if frame is None:
                    break
                if isinstance(frame, Route):
                    await self._apply(send, table, frame)
                    if self.table is not table and _caught_up(table, target):
                        self._install(table)
                elif isinstance(frame, Ping):
                    await send(Pong(id=frame.id))
                elif isinstance(frame, Error):
                    log.info("broker said", code=frame.code, text=frame.text)
                    if frame.closes_connection:
                        break
                # PONG, ROUTE_ACK: hearing them is what keeps the link alive
            nursery.cancel_scope.cancel()
        return True

    async def _apply(self, send: _Sender, table: RouteTable, frame: Route) -> None:
        update = Update(
            frame.origin,
            frame.incarnation,
            frame.seq,
            snapshot=frame.snapshot,
            more=frame.more,
            neighbors=None if frame.neighbors is None else frozenset(frame.neighbors),
            add=frame.added,
            remove=frame.removed,
        )
        outcome, _flood = table.apply(update, via=table.root)
        if outcome is Outcome.APPLIED:
            self.counters.updates_applied += 1
        elif outcome is Outcome.GAP:
            self.counters.snapshot_requests += 1
            await send(RouteRequest(origin=frame.origin))

    def _install(self, table: RouteTable) -> None:
        first = self.table is None
        self.table = table
        self.ready.set()
        log.info(
            "route table ready" if first else "route table renewed",
            broker=table.root,
            origins=len(table.origins) - 1,
            filters=len(table.remote),
        )

    async def _keepalive(self, send: _Sender, state: _LinkState, scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(state.ping_every)
            if trio.current_time() - state.last_heard > state.dead_after:
                log.warning("route link silent; closing it", seconds=state.dead_after)
                scope.cancel()
                return
            await send(Ping(id=0))


class _Sender:
    """One writer at a time: the reader answers PINGs while the keepalive task sends its
    own, and two ``send_all`` calls on one stream at once are an error in trio."""

    def __init__(self, stream: trio.SocketStream, proto: Connection) -> None:
        self._stream = stream
        self._proto = proto
        self._lock = trio.StrictFIFOLock()

    async def __call__(self, frame: Any) -> None:
        async with self._lock:
            await self._stream.send_all(self._proto.send(frame))


@dataclass(slots=True)
class _LinkState:
    ping_every: float
    dead_after: float
    last_heard: float

    def __init__(self, keepalive: float, broker_closes_after: float) -> None:
        # PING often enough that the broker never finds us silent, and give up on a broker
        # that has said nothing (not even a PONG) for three of our intervals.
        limit = broker_closes_after / 3 if broker_closes_after > 0 else keepalive
        self.ping_every = min(keepalive, limit)
        self.dead_after = 3 * self.ping_every + 1.0
        self.last_heard = trio.current_time()


def _caught_up(table: RouteTable, target: dict[str, tuple[int, int]]) -> bool:
    origins = table.origins
    for origin, version in target.items():
        state = origins.get(origin)
        if state is None or state.version < version:
            return False
    return True


async def _next_frame(stream: trio.SocketStream, proto: Connection) -> Any:
    """The next frame, or None when the broker closed the stream."""
    while True:
        event = proto.next_event()
        if event is NEED_DATA:
            data = await stream.receive_some(RECEIVE_SIZE)
            proto.receive_data(data)
            continue
        if isinstance(event, ConnectionClosed):
            return None
        return event
