"""The route exchange between peer brokers, as a state machine without sockets.

``RouteExchange`` is what one broker knows and says: its links, the link-state database
(``RouteTable``), the summary of its own subscriptions, and who has acknowledged which
of its updates. Every input (a link came up, an update or an ack arrived, a local
subscription changed, the flush timer fired) returns the messages to send, as
``(peer id, message)`` pairs; the broker's trio shell turns them into frames. So the
whole exchange, flooding and resynchronisation included, is tested without a network.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from routing.filters import Filter
from routing.linkstate import Outcome, RouteTable, Update, Version
from routing.summary import Summarizer, SummaryChange

BROKER = "broker"
OBSERVER = "observer"


@dataclass(frozen=True, slots=True)
class RouteAck:
    """Broker ``by`` applied ``origin``'s state up to ``(incarnation, seq)``; ``hops`` is
    the number of links this ack will have crossed when it arrives."""

    origin: str
    incarnation: int
    seq: int
    by: str
    hops: int


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """Send me a snapshot of ``origin`` (a delta did not follow on from what I hold)."""

    origin: str


Message = Update | RouteAck | RouteRequest
Outgoing = list[tuple[str, Message]]


@dataclass(slots=True)
class ExchangeCounters:
    updates_sent: int = 0
    updates_applied: int = 0
    updates_stale: int = 0
    gaps: int = 0
    acks_dropped: int = 0
    id_clashes: int = 0


@dataclass(slots=True)
class SyncWait:
    """A ``sync`` subscribe waiting for acknowledgements of our version ``version``."""

    version: Version
    waiting: set[str] = field(default_factory=set)


class RouteExchange:
    def __init__(self, self_id: str, incarnation: int, *, hop_limit: int = 16) -> None:
        self.self_id = self_id
        self.hop_limit = hop_limit
        self.table = RouteTable(self_id, incarnation)
        self.summary = Summarizer()
        self.links: dict[str, str] = {}  # peer id -> BROKER or OBSERVER
        self.acked: dict[str, Version] = {}  # broker -> our latest version it applied
        self.counters = ExchangeCounters()
        self._add: dict[Filter, None] = {}
        self._remove: dict[Filter, None] = {}
        self._adjacency_changed = False

    # -- local subscriptions ---------------------------------------------------------------

    def local_add(self, flt: Filter) -> None:
        self._note(self.summary.add(flt))

    def local_remove(self, flt: Filter) -> None:
        self._note(self.summary.remove(flt))

    def _note(self, change: SummaryChange) -> None:
        # A change undone before the next flush cancels out instead of going twice.
        for flt in change.withdraw:
            if flt in self._add:
                del self._add[flt]
            else:
                self._remove[flt] = None
        for flt in change.advertise:
            if flt in self._remove:
                del self._remove[flt]
            else:
                self._add[flt] = None

    @property
    def dirty(self) -> bool:
        """Changes are waiting for ``flush`` (the shell runs it on a short timer)."""
        return bool(self._add or self._remove or self._adjacency_changed)

    def flush(self) -> Outgoing:
        """Our pending changes as numbered updates, flooded to every link."""
        if not self.dirty:
            return []
        neighbors = None
        if self._adjacency_changed:
            neighbors = frozenset(p for p, role in self.links.items() if role == BROKER)
        updates = self.table.own_updates(self._add, self._remove, neighbors)
        self._add, self._remove = {}, {}
        self._adjacency_changed = False
        out: Outgoing = [(peer, update) for update in updates for peer in self.links]
        self.counters.updates_sent += len(out)
        return out

    # -- links ---------------------------------------------------------------------------

    def link_up(self, peer: str, role: str, digest: dict[str, Version]) -> Outgoing:
        """A link finished its handshake: send the peer every state it lacks.

        Our adjacency changes too (for a broker): that goes out with the next ``flush``.
        """
        self.links[peer] = role
        if role == BROKER:
            self._adjacency_changed = True
        out: Outgoing = []
        for origin in self.table.newer_than(digest):
            out += [(peer, part) for part in self.table.snapshot(origin)]
        return out

    def link_down(self, peer: str) -> None:
        role = self.links.pop(peer, None)
        self.table.abandon_parts(peer)
        if role == BROKER:
            self._adjacency_changed = True

    # -- what peers send -------------------------------------------------------------------

    def receive_update(self, peer: str, update: Update) -> Outgoing:
        outcome, flood = self.table.apply(update, peer)
        counters = self.counters
        if outcome is Outcome.APPLIED:
            counters.updates_applied += 1
            out: Outgoing = [
                (other, part) for other in self.links if other != peer for part in flood
            ]
            counters.updates_sent += len(out)
            ack = RouteAck(update.origin, update.incarnation, update.seq, self.self_id, 1)
            hop = self.table.next_hop(update.origin) or peer
            out.append((hop, ack))
            return out
        if outcome is Outcome.GAP:
            counters.gaps += 1
            return [(peer, RouteRequest(update.origin))]
        if outcome is Outcome.CLASH:
            counters.id_clashes += 1
        elif outcome is Outcome.STALE:
            counters.updates_stale += 1
        return []

    def receive_request(self, peer: str, request: RouteRequest) -> Outgoing:
        if request.origin not in self.table.origins:
            return []
        return [(peer, part) for part in self.table.snapshot(request.origin)]

    def receive_ack(self, peer: str, ack: RouteAck) -> Outgoing:
        if ack.origin == self.self_id:
            if ack.incarnation == self.table.incarnation:
                version = (ack.incarnation, ack.seq)
                if version > self.acked.get(ack.by, (0, 0)):
                    self.acked[ack.by] = version
            return []
        hop = self.table.next_hop(ack.origin)
        if hop is None or ack.hops >= self.hop_limit or hop not in self.links:
            self.counters.acks_dropped += 1
            return []
        return [(hop, RouteAck(ack.origin, ack.incarnation, ack.seq, ack.by, ack.hops + 1))]

    # -- sync subscribes -------------------------------------------------------------------

    def sync_wait(self) -> SyncWait:
        """What a ``sync`` SUB made now must wait for (call after ``flush``)."""
        wait = SyncWait(self.table.version, self.table.reachable())
        self.sync_settled(wait)
        return wait

    def sync_settled(self, wait: SyncWait) -> bool:
        """True once every broker in ``wait`` acknowledged its version or left our reach."""
        reachable = self.table.reachable()
        wait.waiting = {
            broker
            for broker in wait.waiting
            if broker in reachable and self.acked.get(broker, (0, 0)) < wait.version
        }
        return not wait.waiting

    # -- forwarding ------------------------------------------------------------------------

    def brokers(self) -> Iterable[str]:
        return (peer for peer, role in self.links.items() if role == BROKER)

    def describe(self) -> dict[str, object]:
        info = self.table.describe()
        info["links"] = dict(sorted(self.links.items()))
        info["summary"] = self.summary.statistics()
        counters = self.counters
        info["exchange"] = {
            "updates_sent": counters.updates_sent,
            "updates_applied": counters.updates_applied,
            "updates_stale": counters.updates_stale,
            "gaps": counters.gaps,
            "acks_dropped": counters.acks_dropped,
            "id_clashes": counters.id_clashes,
        }
        return info
