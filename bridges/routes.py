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

The link itself is the broker's own: opened with the mesh's dial handshake and served by a
``PeerLink`` (broker/mesh/link.py) whose owner is the watcher, so PINGs, PONGs and a
closing ERROR go out through the link's one writer, as between brokers.

With a TLS context the watcher dials the broker's native TLS port and verifies that the
broker's certificate names the host dialled; a client certificate in the context lets a
broker that lists the observer by ``cert`` know it without a secret. A failed handshake
(the broker's certificate does not verify or does not name the host) is counted in
``tls_failures`` and dialled again with backoff. A broker refusing *our* certificate is
seen here only as a hang-up before PEER_WELCOME (with TLS 1.3 the client's half of the
handshake ends first); the broker counts that one (``tls_handshake_failures``).
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from typing import Any

import trio

from bridges.config import parse_broker_servers
from broker.address import format_address
from broker.errors import ErrorCode, RemoteProtocolError, refused_for_good
from broker.log import get_logger
from broker.mesh import Keepalive, PeerLink, dial_handshake, update_from
from broker.net import Backoff
from broker.security.tls import describe_failure
from broker.wire.connection import Connection, Role
from broker.wire.frames import (
    PROTOCOL_VERSION,
    Error,
    Frame,
    PeerHello,
    Ping,
    Pong,
    Route,
    RouteRequest,
)
from routing.exchange import BROKER, OBSERVER
from routing.linkstate import Outcome, RouteTable

log = get_logger("topiary.bridge.routes")

BACKOFF_MIN = 0.1


@dataclass(slots=True)
class RouteCounters:
    links_opened: int = 0
    links_lost: int = 0
    refused: int = 0
    updates_applied: int = 0
    snapshot_requests: int = 0
    tls_failures: int = 0  # handshakes failed: the broker's certificate did not verify
    not_primary: int = 0  # dials a hot-spare pair's standby refused (NOT_PRIMARY): the next


class RouteWatcher:
    """The bridge's read-only peer of one broker, answering ``wants(topic)``.

    It is the ``LinkOwner`` of its link: ``handle`` applies the broker's ROUTEs to the table
    this connection fills and answers PINGs; the dial loop in ``run`` reconnects."""

    def __init__(
        self,
        server: str,
        *,
        observer_id: str,
        secret: str | None = None,
        keepalive: float = 2.0,
        backoff_max: float = 5.0,
        tls: ssl.SSLContext | None = None,
        handshake_timeout: float = 10.0,
    ) -> None:
        self.addresses = parse_broker_servers(server)
        self.address = self.addresses[0]  # the one dialled last (or to be dialled first)
        self.observer_id = observer_id
        self.secret = secret
        self.keepalive = keepalive
        self.backoff_max = backoff_max
        self.tls = tls
        self.handshake_timeout = handshake_timeout
        self.incarnation = time.time_ns()
        self.table: RouteTable | None = None
        self.ready = trio.Event()
        self.connected = False
        self.counters = RouteCounters()
        # The table the current connection fills (the installed one once it caught up with
        # ``_target``, the digest of the broker's PEER_WELCOME).
        self._link_table: RouteTable | None = None
        self._target: dict[str, tuple[int, int]] = {}

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
        """Stay attached to the broker for as long as this runs, redialling with backoff.

        With a server list (a hot-spare pair, ``"A,B"``) the servers are tried in turn: one
        that is down or refuses (a standby answers NOT_PRIMARY) passes to the next at once;
        the backoff comes after a round in which none opened a link, and a link that opened
        and was lost starts the next round at the server after it (its partner)."""
        task_status.started()
        backoff = Backoff(BACKOFF_MIN, self.backoff_max)
        first = 0
        while True:
            opened = None
            for step in range(len(self.addresses)):
                index = (first + step) % len(self.addresses)
                self.address = self.addresses[index]
                if await self._attach(*self.address):
                    opened = index
                    break
            if opened is not None:
                backoff.reset()
                first = (opened + 1) % len(self.addresses)
            await backoff.wait()

    async def _attach(self, host: str, port: int) -> bool:
        """One dial of ``host:port`` and the link while it lasts; True if it opened."""
        opened = False
        try:
            stream = await self._dial(host, port)
        except OSError as exc:
            log.info("route link dial failed", server=f"{host}:{port}", error=str(exc))
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            self._tls_failed(exc)
        else:
            try:
                opened = await self._session(stream)
            except trio.BrokenResourceError as exc:
                log.info("route link lost", error=describe_failure(exc))
            except (trio.ClosedResourceError, OSError) as exc:
                log.info("route link lost", error=str(exc))
            except RemoteProtocolError as exc:
                log.warning("route link broken", code=str(exc.code), error=str(exc))
            finally:
                if self.connected:
                    self.counters.links_lost += 1
                    opened = True
                self.connected = False
                await trio.aclose_forcefully(stream)
        return opened

    async def _dial(self, host: str, port: int) -> trio.abc.Stream:
        """A TCP stream to the broker, or with a context a TLS one, handshaken and the
        broker's certificate checked for ``host`` (a name or an IP address)."""
        stream = await trio.open_tcp_stream(host, port)
        if self.tls is None:
            return stream
        secure = trio.SSLStream(stream, self.tls, server_hostname=host, https_compatible=True)
        try:
            with trio.fail_after(self.handshake_timeout):
                await secure.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return secure

    def _tls_failed(self, exc: BaseException) -> None:
        self.counters.tls_failures += 1
        host, port = self.address
        reason = (
            f"no TLS handshake within {self.handshake_timeout:g} s"
            if isinstance(exc, trio.TooSlowError)
            else describe_failure(exc)
        )
        log.error("route link tls failed", server=f"{host}:{port}", error=reason)

    async def _session(self, stream: trio.abc.Stream) -> bool:
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
        welcome = await dial_handshake(stream, proto, hello)
        if isinstance(welcome, Error) and welcome.code == ErrorCode.NOT_PRIMARY:
            self.counters.not_primary += 1  # a pair's standby: its partner serves
            log.info("broker is a standby", server=format_address(self.address), text=welcome.text)
            return False
        if isinstance(welcome, Error):
            self.counters.refused += 1
            log.error("broker refused the route link", code=welcome.code, text=welcome.text)
            # Back off to the maximum at once when calling again soon will not help: besides
            # the refusals every client gives up on, BROKER_ID_CLASH, since the process that
            # holds our observer id (another bridge, or the broker itself) will still hold it.
            if refused_for_good(welcome.code) or welcome.code == ErrorCode.BROKER_ID_CLASH:
                await trio.sleep(self.backoff_max)
            return False
        if welcome is None:
            # Over TLS 1.3 this is also how a broker refusing our client certificate looks
            # from here: our half of the handshake ended before the broker checked it.
            host, port = self.address
            hint = {"hint": "our client certificate refused? see the broker's log"}
            log.warning("route link got no welcome", server=f"{host}:{port}",
                        **(hint if self.tls is not None else {}))  # fmt: skip
            return False
        self.connected = True
        self.counters.links_opened += 1
        log.info("route link up", broker=welcome.broker_id, origins=len(welcome.digest))
        host, port = self.address
        link = PeerLink(
            self, stream, proto, welcome.broker_id, BROKER, welcome.incarnation,
            dialled_by=self.observer_id, address=f"{host}:{port}", digest=welcome.digest,
            keepalive=_observer_keepalive(self.keepalive, welcome.keepalive),
        )  # fmt: skip
        table = RouteTable(self.observer_id, self.incarnation, root=welcome.broker_id)
        self._link_table = table
        self._target = link.digest
        if _caught_up(table, self._target):
            self._install(table)
        await link.run()
        return True

    async def handle(self, link: PeerLink, frame: Frame) -> RemoteProtocolError | None:
        """One frame from the broker: ROUTEs fill this connection's table, PINGs are answered
        (a closing ERROR never arrives here: the link ends on it)."""
        if isinstance(frame, Route):
            table = self._link_table
            assert table is not None  # set before the link runs
            self._apply(link, table, frame)
            if self.table is not table and _caught_up(table, self._target):
                self._install(table)
        elif isinstance(frame, Ping):
            link.send_frame(Pong(id=frame.id))
        elif isinstance(frame, Error):
            log.info("broker said", code=frame.code, text=frame.text)
        # PONG, ROUTE_ACK: hearing them is what keeps the link alive
        return None

    def link_closed(self, link: PeerLink) -> None:
        """Nothing to forget: ``run`` counts the loss and dials again when the link ends."""

    def _apply(self, link: PeerLink, table: RouteTable, frame: Route) -> None:
        update = update_from(frame)
        outcome, _flood = table.apply(update, via=table.root)
        if outcome is Outcome.APPLIED:
            self.counters.updates_applied += 1
        elif outcome is Outcome.GAP:
            self.counters.snapshot_requests += 1
            link.send_frame(RouteRequest(origin=frame.origin))

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


def _observer_keepalive(keepalive: float, broker_closes_after: float) -> Keepalive:
    """PING on every tick, often enough that the broker never finds us silent, and give up
    on a broker that has said nothing (not even a PONG) for three ticks and a second."""
    limit = broker_closes_after / 3 if broker_closes_after > 0 else keepalive
    tick = min(keepalive, limit)
    return Keepalive(tick=tick, ping_if_silent=0.0, ping_if_idle=0.0, dead_after=3 * tick + 1.0)


def _caught_up(table: RouteTable, target: dict[str, tuple[int, int]]) -> bool:
    origins = table.origins
    for origin, version in target.items():
        state = origins.get(origin)
        if state is None or state.version < version:
            return False
    return True
