"""The link-state database of a mesh of brokers: who peers with whom, who wants what.

Every broker (an *origin*) owns one piece of state, its adjacency and its advertised
filters, numbered by ``(incarnation, seq)``. ``RouteTable`` holds the latest state of every
origin it has heard of, decides whether an update applies (newer and contiguous), and
answers the questions forwarding asks: which reachable origins want a topic, and which
next hop leads to each of them along a shortest path. No I/O; docs/peering.md has the
whole scheme.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from routing.filters import Filter
from routing.table import SubscriptionTable

#: Filter changes per update frame; a snapshot or a big delta is split into several.
ROUTE_BATCH = 250

Version = tuple[int, int]  # (incarnation, seq); compared as a tuple


@dataclass(frozen=True, slots=True)
class Update:
    """One origin's change (a delta) or its whole state (a snapshot, maybe in parts)."""

    origin: str
    incarnation: int
    seq: int
    snapshot: bool = False
    more: bool = False  # a snapshot part that is not the last
    neighbors: frozenset[str] | None = None  # the whole adjacency, when it changed
    add: tuple[Filter, ...] = ()
    remove: tuple[Filter, ...] = ()

    @property
    def version(self) -> Version:
        return (self.incarnation, self.seq)


class Outcome(Enum):
    APPLIED = "applied"  # new state: flood it on, acknowledge it
    STALE = "stale"  # already known (or older): stop here
    GAP = "gap"  # does not follow on from what we hold: ask for a snapshot
    PART = "part"  # a snapshot part, held until the last one arrives
    CLASH = "clash"  # claims to be us under a newer incarnation: another broker has our id


@dataclass(slots=True)
class OriginState:
    origin: str
    incarnation: int
    seq: int
    neighbors: frozenset[str] = frozenset()
    filters: set[Filter] = field(default_factory=set)

    @property
    def version(self) -> Version:
        return (self.incarnation, self.seq)


@dataclass(frozen=True, slots=True)
class Split:
    """Where copies of one event go: next hop -> destination ids, plus the lost ones."""

    by_hop: dict[str, tuple[str, ...]]
    unreachable: tuple[str, ...]


_NOWHERE = Split({}, ())


def _filter_order(flt: Filter) -> tuple[str, str]:
    return (flt.text, flt.dialect)


class RouteTable:
    """The database of every origin's state, shortest paths, and the remote filter table.

    ``self_id`` is this broker; its own state is kept here too (so it is flooded and
    snapshotted like anyone's) but its filters are not in ``remote``: local routing is the
    broker's own SubscriptionTable. ``root`` is where paths start: this broker, or for a
    read-only observer, the broker it is attached to.
    """

    def __init__(
        self,
        self_id: str,
        incarnation: int,
        *,
        root: str | None = None,
        cache_size: int = 4096,
    ) -> None:
        self.self_id = self_id
        self.root = root or self_id
        self.origins: dict[str, OriginState] = {}
        self.remote = SubscriptionTable(cache_size=cache_size)
        self._own = OriginState(self_id, incarnation, 0)
        self.origins[self_id] = self._own
        self._parts: dict[tuple[str, str], list[Update]] = {}
        self._paths: dict[str, tuple[str, int]] | None = None  # dest -> (next hop, distance)
        self._splits: dict[frozenset[str], Split] = {}
        self.clashes = 0

    # -- our own state -------------------------------------------------------------------

    @property
    def incarnation(self) -> int:
        return self._own.incarnation

    @property
    def version(self) -> Version:
        return self._own.version

    @property
    def neighbors(self) -> frozenset[str]:
        return self._own.neighbors

    def own_updates(
        self,
        add: Iterable[Filter] = (),
        remove: Iterable[Filter] = (),
        neighbors: frozenset[str] | None = None,
    ) -> list[Update]:
        """Our next deltas (one per ``ROUTE_BATCH`` filter changes), already applied here."""
        own = self._own
        adds, removes = list(add), list(remove)
        if neighbors is not None and neighbors == own.neighbors:
            neighbors = None
        if not adds and not removes and neighbors is None:
            return []
        updates = []
        while True:
            take_add = adds[:ROUTE_BATCH]
            take_remove = removes[: ROUTE_BATCH - len(take_add)]
            del adds[: len(take_add)]
            del removes[: len(take_remove)]
            own.seq += 1
            updates.append(
                Update(
                    own.origin,
                    own.incarnation,
                    own.seq,
                    neighbors=neighbors,
                    add=tuple(take_add),
                    remove=tuple(take_remove),
                )
            )
            own.filters.difference_update(take_remove)
            own.filters.update(take_add)
            neighbors_changed = neighbors is not None
            if neighbors is not None:
                own.neighbors = neighbors
                neighbors = None
            if neighbors_changed:
                self._topology_changed()
            if not adds and not removes:
                return updates

    # -- applying what peers send ----------------------------------------------------------

    def apply(self, update: Update, via: str) -> tuple[Outcome, list[Update]]:
        """Apply an update that arrived from peer ``via``.

        Returns the outcome and what to flood on: the update itself, or for a snapshot all
        of its parts (held until the last arrived, then applied as one).
        """
        origin = update.origin
        if origin == self.self_id:
            if update.incarnation > self._own.incarnation:
                self.clashes += 1
                return Outcome.CLASH, []
            return Outcome.STALE, []
        if update.snapshot:
            key = (via, origin)
            parts = self._parts.setdefault(key, [])
            if parts and parts[0].version != update.version:
                parts.clear()  # an abandoned snapshot (the link dropped mid-way): start over
            parts.append(update)
            if update.more:
                return Outcome.PART, []
            del self._parts[key]
            if parts[0].neighbors is None:
                return Outcome.GAP, []  # the first part went missing: ask again
            current = self.origins.get(origin)
            if current is not None and current.version >= update.version:
                return Outcome.STALE, []
            filters = {flt for part in parts for flt in part.add}
            self._replace(origin, update.incarnation, update.seq, parts[0].neighbors, filters)
            return Outcome.APPLIED, parts
        current = self.origins.get(origin)
        if current is None or update.incarnation > current.incarnation:
            return Outcome.GAP, []
        if update.incarnation < current.incarnation or update.seq <= current.seq:
            return Outcome.STALE, []
        if update.seq != current.seq + 1:
            return Outcome.GAP, []
        current.seq = update.seq
        remote = self.remote
        for flt in update.remove:
            if flt in current.filters:
                current.filters.discard(flt)
                remote.remove(flt, origin, flt.dialect)
        for flt in update.add:
            if flt not in current.filters:
                current.filters.add(flt)
                remote.add(flt, origin, flt.dialect)
        if update.neighbors is not None and update.neighbors != current.neighbors:
            current.neighbors = update.neighbors
            self._topology_changed()
        return Outcome.APPLIED, [update]

    def abandon_parts(self, via: str) -> None:
        """The link to ``via`` is gone: forget the snapshot parts it was sending."""
        for key in [key for key in self._parts if key[0] == via]:
            del self._parts[key]

    def _replace(
        self,
        origin: str,
        incarnation: int,
        seq: int,
        neighbors: frozenset[str],
        filters: set[Filter],
    ) -> None:
        current = self.origins.get(origin)
        old_filters: set[Filter] = set() if current is None else current.filters
        remote = self.remote
        for flt in old_filters - filters:
            remote.remove(flt, origin, flt.dialect)
        for flt in filters - old_filters:
            remote.add(flt, origin, flt.dialect)
        if current is None or current.neighbors != neighbors:
            self._topology_changed()
        self.origins[origin] = OriginState(origin, incarnation, seq, neighbors, filters)

    # -- what to tell a peer -----------------------------------------------------------------

    def digest(self) -> dict[str, Version]:
        return {origin: state.version for origin, state in self.origins.items()}

    def newer_than(self, digest: dict[str, Version]) -> list[str]:
        """Origins whose state here is newer than (or missing from) a peer's digest."""
        return [
            origin
            for origin, state in self.origins.items()
            if (known := digest.get(origin)) is None or tuple(known) < state.version
        ]

    def snapshot(self, origin: str) -> list[Update]:
        """The whole state of ``origin`` as snapshot parts of at most ROUTE_BATCH filters."""
        state = self.origins[origin]
        filters = sorted(state.filters, key=_filter_order)
        chunks = [
            tuple(filters[i : i + ROUTE_BATCH]) for i in range(0, len(filters), ROUTE_BATCH)
        ] or [()]
        return [
            Update(
                origin,
                state.incarnation,
                state.seq,
                snapshot=True,
                more=i < len(chunks) - 1,
                neighbors=state.neighbors if i == 0 else None,
                add=chunk,
            )
            for i, chunk in enumerate(chunks)
        ]

    # -- paths ---------------------------------------------------------------------------

    def _topology_changed(self) -> None:
        self._paths = None
        self._splits.clear()

    def _two_way(self, node: str) -> Iterator[str]:
        state = self.origins.get(node)
        if state is None:
            return
        for other in state.neighbors:
            peer = self.origins.get(other)
            if peer is not None and node in peer.neighbors:
                yield other

    def paths(self) -> dict[str, tuple[str, int]]:
        """Reachable origin -> (next hop, distance in links) from ``root``.

        Breadth-first over links both ends list. The next hop is the lowest id among the
        first hops of all shortest paths, so every broker picks the same one.
        """
        if self._paths is not None:
            return self._paths
        root = self.root
        paths: dict[str, tuple[str, int]] = {}
        layer = {root: ""}
        seen = {root}
        distance = 0
        while layer:
            distance += 1
            candidates: dict[str, str] = {}
            for node, first in layer.items():
                for other in self._two_way(node):
                    if other in seen:
                        continue
                    hop = first or other
                    best = candidates.get(other)
                    if best is None or hop < best:
                        candidates[other] = hop
            for node, hop in candidates.items():
                paths[node] = (hop, distance)
                seen.add(node)
            layer = candidates
        self._paths = paths
        return paths

    def reachable(self) -> set[str]:
        return set(self.paths())

    def next_hop(self, dest: str) -> str | None:
        path = self.paths().get(dest)
        return None if path is None else path[0]

    # -- forwarding ----------------------------------------------------------------------

    def wanting(self, topic: str) -> frozenset[str]:
        """Origins (other than us) whose advertised filters match ``topic``."""
        return self.remote.match(topic)

    def split(self, dests: frozenset[str]) -> Split:
        """Group destinations by next hop; ``root`` itself is never among the results."""
        if not dests:
            return _NOWHERE
        cached = self._splits.get(dests)
        if cached is not None:
            return cached
        paths = self.paths()
        by_hop: dict[str, list[str]] = {}
        unreachable = []
        for dest in sorted(dests):
            if dest == self.root:
                continue
            path = paths.get(dest)
            if path is None:
                unreachable.append(dest)
            else:
                by_hop.setdefault(path[0], []).append(dest)
        split = Split({hop: tuple(ds) for hop, ds in by_hop.items()}, tuple(unreachable))
        if len(self._splits) >= 4096:
            self._splits.clear()
        self._splits[dests] = split
        return split

    # -- operators -----------------------------------------------------------------------

    def describe(self, filter_limit: int = 1000) -> dict[str, object]:
        """The table as ``topiary routes`` prints it."""
        paths = self.paths()
        origins = {}
        for origin, state in sorted(self.origins.items()):
            path = paths.get(origin)
            texts = [
                [f.text, f.dialect]
                for f in heapq.nsmallest(filter_limit, state.filters, key=_filter_order)
            ]
            entry: dict[str, object] = {
                "incarnation": state.incarnation,
                "seq": state.seq,
                "neighbors": sorted(state.neighbors),
                "filters": texts[:filter_limit],
                "filter_count": len(state.filters),
                "reachable": origin == self.root or path is not None,
                "next_hop": None if path is None else path[0],
                "distance": 0 if origin == self.root else (None if path is None else path[1]),
            }
            origins[origin] = entry
        return {
            "broker_id": self.self_id,
            "incarnation": self.incarnation,
            "seq": self._own.seq,
            "origins": origins,
            "remote_filters": self.remote.statistics().filters,
            "id_clashes": self.clashes,
        }
