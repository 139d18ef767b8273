"""A mesh of RouteExchange objects wired by in-memory queues: peering without sockets.

Messages sent on a link arrive in order (as over TCP); ``run()`` delivers until nothing is
in flight. Links can be cut and restored and brokers restarted, so convergence is tested
as deterministically as the exchange itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import routing
from routing.exchange import BROKER, RouteAck, RouteExchange, RouteRequest
from routing.linkstate import Update


class SimMesh:
    def __init__(self, ids: Iterable[str], *, hop_limit: int = 16) -> None:
        self.hop_limit = hop_limit
        self.nodes: dict[str, RouteExchange] = {}
        self.incarnations: dict[str, int] = {}
        self.queues: dict[tuple[str, str], deque[object]] = {}
        self.frames: dict[tuple[str, str], int] = {}  # FWD copies per directed link
        self.delivered: dict[str, list[tuple[int, str]]] = {}  # broker -> (event, topic)
        self.lost = 0
        for node in ids:
            self.start(node)

    def start(self, node: str) -> RouteExchange:
        incarnation = self.incarnations.get(node, 0) + 1
        self.incarnations[node] = incarnation
        exchange = RouteExchange(node, incarnation, hop_limit=self.hop_limit)
        self.nodes[node] = exchange
        self.delivered.setdefault(node, [])
        return exchange

    def connect(self, a: str, b: str) -> None:
        """Both ends finish the handshake: each sends the other what it lacks."""
        self.queues[a, b] = deque()
        self.queues[b, a] = deque()
        node_a, node_b = self.nodes[a], self.nodes[b]
        digest_a, digest_b = node_a.table.digest(), node_b.table.digest()
        self._send(a, node_a.link_up(b, BROKER, digest_b))
        self._send(b, node_b.link_up(a, BROKER, digest_a))
        self._flush(a)
        self._flush(b)

    def cut(self, a: str, b: str) -> None:
        self.queues.pop((a, b), None)
        self.queues.pop((b, a), None)
        for x, y in ((a, b), (b, a)):
            if x in self.nodes and y in self.nodes[x].links:
                self.nodes[x].link_down(y)
                self._flush(x)

    def kill(self, node: str) -> list[str]:
        """The broker dies: its links drop, the neighbours notice. Returns its neighbours."""
        neighbours = [b for (a, b) in list(self.queues) if a == node]
        for other in neighbours:
            self.cut(node, other)
        del self.nodes[node]
        return neighbours

    def subscribe(self, node: str, text: str, dialect: str = "native") -> None:
        self.nodes[node].local_add(routing.parse_filter(text, dialect))
        self._flush(node)

    def unsubscribe(self, node: str, text: str, dialect: str = "native") -> None:
        self.nodes[node].local_remove(routing.parse_filter(text, dialect))
        self._flush(node)

    def _flush(self, node: str) -> None:
        self._send(node, self.nodes[node].flush())

    def _send(self, sender: str, out: list[tuple[str, object]]) -> None:
        for peer, message in out:
            queue = self.queues.get((sender, peer))
            if queue is None:
                self.lost += 1
            else:
                queue.append(message)

    def run(self, limit: int = 1_000_000) -> int:
        """Deliver until quiet; returns how many messages moved."""
        moved = 0
        while moved < limit:
            busy = [key for key, queue in self.queues.items() if queue]
            if not busy:
                return moved
            for sender, receiver in busy:
                queue = self.queues.get((sender, receiver))
                if not queue:
                    continue
                message = queue.popleft()
                moved += 1
                self._receive(sender, receiver, message)
        raise AssertionError("the mesh did not go quiet")

    def _receive(self, sender: str, receiver: str, message: object) -> None:
        node = self.nodes[receiver]
        if isinstance(message, Update):
            self._send(receiver, node.receive_update(sender, message))
        elif isinstance(message, RouteAck):
            self._send(receiver, node.receive_ack(sender, message))
        elif isinstance(message, RouteRequest):
            self._send(receiver, node.receive_request(sender, message))
        elif isinstance(message, tuple):
            self._forwarded(sender, receiver, message)
        else:
            raise AssertionError(message)

    # -- events ------------------------------------------------------------------------------

    def publish(self, node: str, event: int, topic: str) -> None:
        """Route an event the way the broker does: match, split by next hop, send copies."""
        exchange = self.nodes[node]
        dests = exchange.table.wanting(topic)
        self._spread(node, event, topic, dests, self.hop_limit)

    def _spread(self, node: str, event: int, topic: str, dests: frozenset[str], hops: int) -> None:
        split = self.nodes[node].table.split(dests)
        self.lost += len(split.unreachable)
        for hop, share in split.by_hop.items():
            queue = self.queues.get((node, hop))
            if queue is None or hops <= 0:
                self.lost += len(share)
                continue
            self.frames[node, hop] = self.frames.get((node, hop), 0) + 1
            queue.append((event, topic, frozenset(share), hops - 1))

    def _forwarded(self, sender: str, receiver: str, message: tuple) -> None:  # type: ignore[type-arg]
        event, topic, dests, hops = message
        if receiver in dests:
            self.delivered[receiver].append((event, topic))
        rest = dests - {receiver}
        if rest:
            self._spread(receiver, event, topic, rest, hops)


def build(ids: list[str], edges: list[tuple[str, str]]) -> SimMesh:
    mesh = SimMesh(ids)
    for a, b in edges:
        mesh.connect(a, b)
    mesh.run()
    return mesh
