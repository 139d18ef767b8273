"""Peer links: the trio shell around ``routing.exchange.RouteExchange``.

``Peering`` belongs to a Broker. It is inactive (and costs nothing per subscribe) until the
broker is configured with peers or a peer or observer dials in; then it mirrors the broker's
distinct filters into the exchange's summary, runs a flush timer that turns coalesced changes
into ROUTE deltas, dials the configured peers with backoff, and forwards events.

Tasks and owners: ``Peering.run`` owns a nursery with the flush loop and one dial loop per
configured peer; each dialled ``PeerLink`` runs inside its dial loop. A link dialled *to* us
arrives as an ordinary connection and runs inside that connection's task (the server's
connection nursery). Every link has a writer and a keepalive task in a nursery of its own,
and reads inline. Shutdown closes every link with ERROR SHUTTING_DOWN and cancels the nursery.

The dialler's handshake (handshake.py) and the link itself (link.py) are shared with the
Kafka bridge's route watcher; what a frame means to a broker is decided here, in ``handle``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

import routing
from broker.address import PEER_TLS_SCHEME, format_address
from broker.core import Broker, DurableWork, QuotaExceeded
from broker.core.message import Message
from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger
from broker.mesh.handshake import dial_handshake
from broker.mesh.link import Keepalive, PeerLink
from broker.mesh.translate import to_frame, update_from
from broker.net import Backoff, send_error
from broker.security import certificate_subject
from broker.security.throttle import Throttle
from broker.security.tls import ClientTls, PeerAddress, describe_failure, parse_peers
from broker.trust import Trust, TrustedPeer
from broker.wire.codec import encode_fwd
from broker.wire.connection import Connection, Role
from broker.wire.frames import (
    PROTOCOL_VERSION,
    Error,
    Frame,
    Fwd,
    PeerHello,
    PeerWelcome,
    Ping,
    Pong,
    Route,
    RouteAck,
    RouteRequest,
)
from routing.exchange import BROKER, OBSERVER, RouteExchange, SyncWait
from routing.exchange import RouteAck as AckMessage
from routing.exchange import RouteRequest as RequestMessage

log = get_logger("topiary.peering")

BACKOFF_MIN = 0.1


@dataclass(slots=True)
class PeerCounters:
    """What the mesh did with events and links, as ``stats`` and ``topiary routes`` show it."""

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
    auth_failures: int = 0  # of those, for their credentials (unknown id, bad secret or cert)
    sync_waits: int = 0
    sync_timeouts: int = 0
    tls_dial_failures: int = 0  # dials to tls:// peers whose handshake failed (bad cert, name)
    dials_not_primary: int = 0  # dials a pair's standby answered NOT_PRIMARY (then the next)


class Peering:
    """A broker's place in the mesh: its links, the route exchange, event forwarding.

    The router sees it as its ``Mesh``; ``broker.server`` creates it for every served
    broker and attaches it (``broker.peering``). Links it dialled and links dialled to it
    are kept in one registry, so that both ends of a pair keep the same one of two links
    and the exchange sees each neighbour once."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.self_id = broker.server_id
        self.incarnation = time.time_ns()
        self.exchange = RouteExchange(
            self.self_id, self.incarnation, hop_limit=self.config.hop_limit
        )
        self.table = self.exchange.table
        self.links: dict[str, PeerLink] = {}
        self.active = False
        self.counters = PeerCounters()
        self._flush_wanted = trio.Event()
        self._changed = trio.Event()
        self._dialled: dict[str, str] = {}  # configured address -> the peer id found there
        self._nursery: trio.Nursery | None = None
        # Who may link, and with what credentials (broker/trust.py)
        self.trust = Trust(
            (*self.config.trusted_peers, *self.config.trusted_observers), self.config.peer_secret
        )
        self._refusals_logged = Throttle()
        self.tls: ClientTls | None = None  # the context tls:// peers are dialled with
        # Every link, dialled or accepted, is paced and bounded by this broker's config.
        self._new_link = partial(
            PeerLink,
            self,
            keepalive=Keepalive.for_interval(self.config.peer_keepalive),
            max_events=self.config.peer_queue_messages,
            max_event_bytes=self.config.peer_queue_bytes,
        )
        if self.config.peers or self.trust.entries:  # (a listed peer or observer: a mesh)
            self.activate()

    # -- local subscriptions ---------------------------------------------------------------

    def activate(self) -> None:
        """Start mirroring local filters (once a mesh exists or is configured)."""
        if self.active:
            return
        self.active = True
        broker = self.broker
        sessions = {id(s): s for s in (*broker.sessions.values(), *broker.durable.values())}
        for session in sessions.values():
            for ref in session.refs.values():
                self.exchange.local_add(routing.parse_filter(ref.filter, ref.dialect))
        self._want_flush()

    def local_add(self, flt: routing.Filter) -> None:
        self.exchange.local_add(flt)
        self._want_flush()

    def local_remove(self, flt: routing.Filter) -> None:
        self.exchange.local_remove(flt)
        self._want_flush()

    def _want_flush(self) -> None:
        if self.exchange.dirty:
            self._flush_wanted.set()

    def flush_now(self) -> None:
        self.dispatch(self.exchange.flush())
        self._pulse()

    def _pulse(self) -> None:
        """Wake everyone waiting for an ack or a topology change."""
        self._changed.set()
        self._changed = trio.Event()

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            if self.config.peer_flush:
                await trio.sleep(self.config.peer_flush)
            self.flush_now()

    # -- sync subscribes ---------------------------------------------------------------------

    async def sync(self) -> bool:
        """Wait until every reachable broker has our routes as they are now."""
        self.flush_now()
        wait: SyncWait = self.exchange.sync_wait()
        self.counters.sync_waits += 1
        with trio.move_on_after(self.config.sync_timeout):
            while not self.exchange.sync_settled(wait):
                await self._changed.wait()
            return True
        self.counters.sync_timeouts += 1
        log.warning("sync subscribe timed out", waiting=sorted(wait.waiting))
        return False

    # -- messages out ------------------------------------------------------------------------

    def dispatch(self, out: list[tuple[str, Any]]) -> None:
        frames: dict[int, Frame] = {}
        for peer, message in out:
            link = self.links.get(peer)
            if link is None:
                continue
            frame = frames.get(id(message))
            if frame is None:
                frame = frames[id(message)] = to_frame(message)
            link.send_frame(frame)

    # -- events ------------------------------------------------------------------------------

    def wanting(self, topic: str) -> frozenset[str]:
        return self.table.wanting(topic)

    def forward(
        self,
        message: Message,
        dedup: bool,
        dests: frozenset[str],
        hops: int,
        source: str,
    ) -> None:
        """Send one copy per next hop, each carrying its share of ``dests``."""
        counters = self.counters
        split = self.table.split(dests)
        if split.unreachable:
            counters.unreachable_dropped += len(split.unreachable)
        if not split.by_hop:
            return
        if hops > self.config.hop_limit:
            counters.hop_limit_dropped += sum(len(d) for d in split.by_hop.values())
            return
        for hop, share in split.by_hop.items():
            link = self.links.get(hop)
            if link is None:
                counters.link_dropped += 1
                continue
            if link.send_event(encode_fwd(message, dedup, share, hops, source), message.size):
                counters.fwd_out += 1
            else:
                counters.link_dropped += 1

    def receive_event(self, link: PeerLink, fwd: Fwd) -> DurableWork | None:
        """A FWD arrived: deliver here if we are a destination, pass the rest on."""
        counters = self.counters
        counters.fwd_in += 1
        link.fwd_in += 1
        message = Message(fwd.topic, fwd.payload, fwd.headers, fwd.msg_id)
        work = None
        rest = fwd.dests
        if self.self_id in rest:
            rest = [d for d in rest if d != self.self_id]
            broker = self.broker
            if fwd.dedup and broker.seen_msg_id(fwd.msg_id):
                counters.duplicates_dropped += 1
            else:
                counters.delivered_from_peers += 1
                try:
                    work = broker.route_local(message, fwd.msg_id if fwd.dedup else None)
                except QuotaExceeded:
                    counters.quota_rejected += 1
        if rest:
            self.forward(message, fwd.dedup, frozenset(rest), fwd.hops + 1, fwd.source)
        return work

    # -- frames in ---------------------------------------------------------------------------

    async def handle(self, link: PeerLink, frame: Frame) -> RemoteProtocolError | None:
        cls = frame.__class__
        if cls is Fwd:
            assert isinstance(frame, Fwd)
            work = self.receive_event(link, frame)
            if work is not None:
                await self.broker.persist(work)
        elif cls is Route:
            assert isinstance(frame, Route)
            if link.role == OBSERVER:
                return RemoteProtocolError(ErrorCode.NOT_A_PEER, "an observer sends no ROUTE")
            link.routes_in += 1
            update = update_from(frame)
            before = self.table.paths()
            self.dispatch(self.exchange.receive_update(link.peer_id, update))
            if self.table.paths() is not before:
                self._pulse()  # reachability changed: sync waits may be settled
            # A storm arrives as many ROUTEs in one read; let clients be served between them.
            await trio.lowlevel.checkpoint()
        elif cls is RouteAck:
            assert isinstance(frame, RouteAck)
            ack = AckMessage(frame.origin, frame.incarnation, frame.seq, frame.by, frame.hops)
            self.dispatch(self.exchange.receive_ack(link.peer_id, ack))
            if frame.origin == self.self_id:
                self._pulse()
        elif cls is RouteRequest:
            assert isinstance(frame, RouteRequest)
            self.dispatch(self.exchange.receive_request(link.peer_id, RequestMessage(frame.origin)))
        elif cls is Ping:
            assert isinstance(frame, Ping)
            link.send_frame(Pong(id=frame.id))
        elif cls is Pong:
            pass
        elif cls is Error:
            assert isinstance(frame, Error)
            log.info("peer said", peer=link.peer_id, code=frame.code, text=frame.text)
            if frame.closes_connection:
                return None
        else:
            raise AssertionError(f"unhandled peer frame {frame!r}")
        return None

    # -- links -------------------------------------------------------------------------------

    def _check_hello(self, hello: PeerHello, cert: str | None) -> RemoteProtocolError | None:
        broker_id, incarnation = hello.broker_id, hello.incarnation
        if hello.version != PROTOCOL_VERSION:
            return RemoteProtocolError(
                ErrorCode.VERSION_MISMATCH,
                f"this broker speaks protocol version {PROTOCOL_VERSION}, not {hello.version}",
            )
        why = self.trust.refusal(broker_id, hello.role, hello.secret, cert)
        if why is not None:
            return RemoteProtocolError(ErrorCode.AUTH_FAILED, why)
        if broker_id == self.self_id:
            return RemoteProtocolError(
                ErrorCode.BROKER_ID_CLASH, f"{broker_id!r} is this broker's own id"
            )
        existing = self.links.get(broker_id)
        if existing is not None and existing.incarnation != incarnation:
            return RemoteProtocolError(
                ErrorCode.BROKER_ID_CLASH,
                f"a broker with id {broker_id!r} (another incarnation) is already linked",
            )
        return None

    def _register(self, link: PeerLink) -> bool:
        """Add a link after its handshake; of two links between the same pair, keep the one
        dialled by the lower id (both ends decide the same). False: drop ``link``."""
        existing = self.links.get(link.peer_id)
        if existing is not None:
            if existing.dialled_by == link.dialled_by or link.dialled_by < existing.dialled_by:
                existing.close(
                    RemoteProtocolError(ErrorCode.DUPLICATE_LINK, "replaced by another link")
                )
                self._forget(existing)
            else:
                return False
        self.links[link.peer_id] = link
        self.counters.links_opened += 1
        self.activate()
        self.dispatch(self.exchange.link_up(link.peer_id, link.role, link.digest))
        self._want_flush()
        log.info("peer link up", peer=link.peer_id, role=link.role, address=link.address)
        return True

    def _forget(self, link: PeerLink) -> None:
        if self.links.get(link.peer_id) is link:
            del self.links[link.peer_id]
            self.exchange.link_down(link.peer_id)
            self._want_flush()
            self._pulse()

    def link_closed(self, link: PeerLink) -> None:
        if self.links.get(link.peer_id) is link:
            log.info("peer link down", peer=link.peer_id)
        self._forget(link)

    def _welcome(self) -> PeerWelcome:
        return PeerWelcome(
            version=PROTOCOL_VERSION,
            broker_id=self.self_id,
            incarnation=self.incarnation,
            digest={o: list(v) for o, v in self.table.digest().items()},
            max_frame=self.config.max_frame,
            keepalive=self.config.peer_keepalive * 3,
        )

    async def accept(
        self, stream: trio.abc.Stream, proto: Connection, hello: PeerHello, address: str
    ) -> None:
        """A PEER_HELLO arrived on an ordinary connection: answer it and serve the link."""
        problem = self._check_hello(hello, certificate_subject(stream))
        if problem is not None:
            self.counters.links_refused += 1
            if problem.code == ErrorCode.AUTH_FAILED:
                self.counters.auth_failures += 1
            # A flood of bad PEER_HELLOs is counted in full but logged once per 10 s per id.
            count = self._refusals_logged.due(f"{hello.role}:{hello.broker_id}")
            if count:
                log.warning(
                    "peer refused",
                    peer=hello.broker_id,
                    role=hello.role,
                    address=address,
                    code=str(problem.code),
                    why=problem.text,
                    refused=count,
                )
            await send_error(stream, proto, problem)
            return
        # The digest in our welcome must already cover every local filter: an observer (the
        # Kafka bridge) takes "caught up with the digest" to mean "knows what we want".
        self.activate()
        if self.exchange.dirty:
            self.flush_now()
        await stream.send_all(proto.send(self._welcome()))
        link = self._new_link(
            stream, proto, hello.broker_id, hello.role, hello.incarnation,
            dialled_by=hello.broker_id, address=address, digest=hello.digest,
        )  # fmt: skip
        await self._serve_link(link)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._flush_loop)
            for address in self.config.peers:
                nursery.start_soon(self._dial_loop, address, None)
            for entry in self.trust.dialled():
                assert entry.address is not None
                nursery.start_soon(self._dial_loop, entry.address, entry)
            task_status.started()

    def shutdown(self) -> None:
        for link in list(self.links.values()):
            link.close(RemoteProtocolError(ErrorCode.SHUTTING_DOWN, "the broker is shutting down"))
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _dial_loop(self, address: str, expect: TrustedPeer | None) -> None:
        """Dial ``address`` for as long as the broker runs: a plain ``peers`` address
        (``expect`` None), or a listed peer, which must answer with its own id; a
        ``tls://`` address is dialled over TLS.

        ``address`` may list several (``"A,B"``: the two brokers of a hot-spare pair, one
        broker id). They are tried in turn: one that is down or refuses (a standby answers
        NOT_PRIMARY) passes to the next at once; after a round in which none opened a link
        comes the backoff. A link that opened and was lost starts the next round at the
        address after it: when a primary is gone its partner is the one to be promoted."""
        addresses = parse_peers(address)
        backoff = Backoff(BACKOFF_MIN, self.config.peer_backoff_max)
        first = 0
        while True:
            known = self._dialled.get(address)
            while known is not None and known in self.links:
                await self._changed.wait()  # linked already (they dialled us): wait for it to go
            opened = None
            for step in range(len(addresses)):
                index = (first + step) % len(addresses)
                if await self._dial_once(address, addresses[index], expect):
                    opened = index
                    break
            if opened is not None:
                backoff.reset()
                first = (opened + 1) % len(addresses)
            await backoff.wait()

    async def _dial_once(self, key: str, target: PeerAddress, expect: TrustedPeer | None) -> bool:
        """One dial of one of ``key``'s addresses, and the link while it lasts; True if a
        link opened."""
        host, port = target.host, target.port
        address = (PEER_TLS_SCHEME if target.tls else "") + format_address((host, port))
        try:
            stream = await trio.open_tcp_stream(host, port)
            if target.tls:
                stream = await self._secure(stream, host, address)
        except OSError as exc:
            log.debug("peer dial failed", address=address, error=str(exc))
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            self.counters.tls_dial_failures += 1
            log.error("peer tls handshake failed", address=address, error=describe_failure(exc))
        else:
            try:
                return await self._dial(stream, key, expect, address)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("peer link lost", address=address, error=str(exc))
                return False  # (a link that opened returns True: its losses end in link.run)
            finally:
                await trio.aclose_forcefully(stream)
        return False

    async def _secure(self, stream: trio.SocketStream, host: str, address: str) -> trio.abc.Stream:
        """TLS over a dialled ``stream``: the peer's certificate verified, for ``host``."""
        assert self.tls is not None  # the server makes one when a peer is tls://
        try:
            return await self.tls.connect(stream, host, self.config.hello_timeout)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def _dial(
        self,
        stream: trio.abc.Stream,
        key: str,
        expect: TrustedPeer | None = None,
        address: str | None = None,
    ) -> bool:
        """Handshake as the dialler and serve the link; True if the link opened. ``key``
        is the configured entry (which may list several addresses), ``address`` the one
        dialled (default: ``key``)."""
        address = address or key
        proto = Connection(Role.PEER, max_frame=self.config.max_frame)
        hello = PeerHello(
            version=PROTOCOL_VERSION,
            broker_id=self.self_id,
            incarnation=self.incarnation,
            role=BROKER,
            secret=self.trust.dial_secret(expect.id if expect is not None else None),
            digest={o: list(v) for o, v in self.table.digest().items()},
            keepalive=self.config.peer_keepalive,
        )
        try:
            frame = await dial_handshake(stream, proto, hello)
        except RemoteProtocolError as exc:  # its problem, not ours: say so, dial again later
            log.error("peer broke the protocol", address=address, code=str(exc.code), text=exc.text)
            await send_error(stream, proto, exc)
            return False
        if isinstance(frame, Error):
            if frame.code == ErrorCode.NOT_PRIMARY:  # a pair's standby: its partner serves
                self.counters.dials_not_primary += 1
                log.info("peer is a standby", address=address, text=frame.text)
            else:
                log.error("peer refused us", address=address, code=frame.code, text=frame.text)
            return False
        if frame is None:
            return False
        if expect is not None and frame.broker_id != expect.id:
            # A listed peer's address answered with another id: take no route from it.
            self.counters.auth_failures += 1
            log.error(
                "peer answered with another id", address=address, expected=expect.id,
                broker_id=frame.broker_id,
            )  # fmt: skip
            await send_error(
                stream,
                proto,
                RemoteProtocolError(
                    ErrorCode.AUTH_FAILED, f"dialled {expect.id!r}, not {frame.broker_id!r}"
                ),
            )
            return False
        self._dialled[key] = frame.broker_id
        if frame.broker_id == self.self_id:
            log.error("peer has our own id", address=address, broker_id=frame.broker_id)
            await send_error(
                stream,
                proto,
                RemoteProtocolError(ErrorCode.BROKER_ID_CLASH, "you have my broker id"),
            )
            return False
        link = self._new_link(
            stream, proto, frame.broker_id, BROKER, frame.incarnation,
            dialled_by=self.self_id, address=address, digest=frame.digest,
        )  # fmt: skip
        await self._serve_link(link)
        return True

    async def _serve_link(self, link: PeerLink) -> None:
        """Register a link whose handshake is done and serve it, or refuse a duplicate."""
        if not self._register(link):
            await send_error(
                link.stream,
                link.proto,
                RemoteProtocolError(ErrorCode.DUPLICATE_LINK, "a link between us already exists"),
            )
            return
        try:
            await link.run()
        finally:
            self.counters.link_dropped += link.unsent_events  # queued, never sent

    # -- operators ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        info = self.exchange.describe()
        info["active"] = self.active
        info["links"] = {peer: link.describe() for peer, link in sorted(self.links.items())}
        info["counters"] = {
            name: getattr(self.counters, name) for name in PeerCounters.__dataclass_fields__
        }
        return info

    def stats(self) -> dict[str, Any]:
        counters = {
            name: getattr(self.counters, name) for name in PeerCounters.__dataclass_fields__
        }
        counters["links"] = {peer: link.describe() for peer, link in sorted(self.links.items())}
        counters["reachable"] = len(self.table.reachable())
        counters["remote_filters"] = len(self.table.remote)
        return counters


__all__ = ["PeerCounters", "Peering"]
