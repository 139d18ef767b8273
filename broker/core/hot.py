"""The busiest topics and filters, sampled: cheap enough to leave on, bounded in memory.

The router counts nothing per topic on its hot path. Instead, about one routed message in
``every`` (a random gap of 1 .. 2*every-1 messages, so a publisher that cycles through topics
in a fixed order cannot hide from the sampler) is handed to ``HotSpots.sample`` with the
subscription entries it matched; the router's only per-message cost is one comparison of its
``messages_in`` counter against ``next_at``.

Each table (``HotCounter``) keeps at most ``2 * capacity`` keys: when it outgrows that it
keeps the ``capacity`` largest counts and forgets the rest, so a flood of one-off topics
costs memory once, not forever. Every ``half_life`` seconds all counts are halved (those
that reach zero are dropped), so the figures describe the last half minute or so, not the
broker's whole life. The figures are therefore estimates (shares of the sampled messages),
good for "which topics are busy now", not for billing.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Hashable, Iterable
from random import random
from typing import Any, Generic, Protocol, TypeVar

SAMPLE_EVERY = 64
CAPACITY = 128
HALF_LIFE = 10.0

K = TypeVar("K", bound=Hashable)


class Matched(Protocol):
    """What the sampler reads of a subscription entry (a ``SubRef``)."""

    filter: str
    dialect: str


class HotCounter(Generic[K]):
    """Counts per key, bounded: at most ``2 * capacity`` keys, the smallest pruned first."""

    __slots__ = ("capacity", "counts", "total")

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.counts: dict[K, int] = {}
        self.total = 0  # every count added (after halving), pruned keys included

    def add(self, key: K) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        self.total += 1
        self.bound()

    def bound(self) -> None:
        """Keep the ``capacity`` largest counts once there are more than twice as many."""
        if len(self.counts) > 2 * self.capacity:
            kept = heapq.nlargest(self.capacity, self.counts.items(), key=lambda item: item[1])
            self.counts = dict(kept)

    def halve(self) -> None:
        self.counts = {key: count // 2 for key, count in self.counts.items() if count > 1}
        self.total //= 2

    def top(self, n: int) -> list[tuple[K, int]]:
        return heapq.nlargest(n, self.counts.items(), key=lambda item: item[1])


class HotSpots:
    """Sampled counts of the topics routed and of the filters they matched."""

    def __init__(
        self,
        every: int = SAMPLE_EVERY,
        capacity: int = CAPACITY,
        half_life: float = HALF_LIFE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = every
        self._span = 2 * every - 1  # gaps of 1 .. 2*every-1 messages, every on average
        self.half_life = half_life
        self.clock = clock
        self.topics: HotCounter[str] = HotCounter(capacity)
        self.filters: HotCounter[tuple[str, str]] = HotCounter(capacity)
        self.samples = 0  # sampled messages since start (never halved)
        self.next_at = 1  # the router samples once its messages_in reaches this
        self._next_halving = clock() + half_life

    def sample(self, topic: str, matched: Iterable[Matched], position: int) -> None:
        """Count one routed message (``position`` is the router's ``messages_in``)."""
        self.samples += 1
        self.next_at = position + 1 + int(random() * self._span)
        now = self.clock()
        if now >= self._next_halving:
            self.topics.halve()
            self.filters.halve()
            self._next_halving = now + self.half_life
        topics = self.topics
        topics.counts[topic] = topics.counts.get(topic, 0) + 1
        topics.total += 1
        topics.bound()
        filters = self.filters
        counts = filters.counts
        get = counts.get
        n = 0
        for ref in matched:
            key = (ref.filter, ref.dialect)
            counts[key] = get(key, 0) + 1
            n += 1
        filters.total += n
        filters.bound()

    def describe(self, n: int = 10) -> dict[str, Any]:
        """The ``n`` busiest topics and filters. ``per_message`` is a topic's share of the
        sampled messages, or a filter's deliveries per sampled message (a filter held by
        three sessions counts three); recent samples weigh more. Times the broker's publish
        rate it estimates messages (deliveries) per second."""
        messages = max(self.topics.total, 1)
        return {
            "sampled": True,
            "sample_every": self.every,
            "samples": self.samples,
            "half_life_seconds": self.half_life,
            "topics": [
                {"topic": topic, "per_message": count / messages}
                for topic, count in self.topics.top(n)
            ],
            "filters": [
                {"filter": text, "dialect": dialect, "per_message": count / messages}
                for (text, dialect), count in self.filters.top(n)
            ],
        }


__all__ = ["HotCounter", "HotSpots", "Matched"]
