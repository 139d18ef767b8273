"""A session's MQTT subscriptions: what the core does not know about them.

The core routes by (filter, dialect) and hands a session each message once, naming one
subscription. MQTT adds options per subscription: the maximum QoS granted, No Local,
Retain As Published and a Subscription Identifier. When a message matches several of a
session's subscriptions, MQTT wants one PUBLISH with the highest QoS among them and every
one of their identifiers (topiary's message economy: one copy per connection). So the
options live here, by filter, and a delivery looks up the subscriptions that match its
topic. That lookup is free in the common cases: a session with one subscription, or
whose subscriptions all have the same options (the core delivered the message, so one of
them matches, and which one does not change how it goes out). Otherwise a small
subscription table of the session's own filters answers it (cached by topic, like the
broker's), so a session holding thousands of filters pays for the answer, not for them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import msgpack

import routing


@dataclass(frozen=True, slots=True)
class Options:
    """One MQTT subscription's options, as granted."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    identifier: int | None = None

    def pack(self) -> bytes:
        """How the store keeps them (``filters.options``), for a session that outlives the
        broker process."""
        return msgpack.packb([self.qos, self.no_local, self.retain_as_published, self.identifier])

    @classmethod
    def unpack(cls, data: bytes | None) -> Options | None:
        """``pack``'s inverse; None for nothing stored or anything it did not write."""
        if not data:
            return None
        try:
            qos, no_local, rap, identifier = msgpack.unpackb(data)
        except (ValueError, TypeError, msgpack.UnpackException):
            return None
        if qos not in (0, 1, 2) or not (identifier is None or isinstance(identifier, int)):
            return None
        return cls(qos, bool(no_local), bool(rap), identifier)


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one message goes to one session: its QoS, whether the RETAIN flag stays, and the
    subscription identifiers to name; ``skip`` when No Local keeps it from its publisher."""

    qos: int
    retain_as_published: bool
    identifiers: tuple[int, ...]
    skip: bool = False


SKIP = Delivery(0, False, (), skip=True)


class Subscriptions:
    """The MQTT subscriptions of one session: filter text -> (core sub id, options, filter)."""

    __slots__ = ("_cache", "_counts", "_table", "_uniform", "by_filter")

    def __init__(self) -> None:
        self.by_filter: dict[str, tuple[int, Options, routing.Filter]] = {}
        self._cache: dict[tuple[str, bool], Delivery] = {}
        # (own, not own) deliveries when every subscription has the same options; None when
        # they differ (then _table, made when first needed, finds the matching ones)
        self._uniform: tuple[Delivery, Delivery, Options] | None = None
        self._table: routing.SubscriptionTable | None = None
        self._counts: Counter[Options] = Counter()  # subscriptions per distinct options

    def __len__(self) -> int:
        return len(self.by_filter)

    def add(self, flt: routing.Filter, sub_id: int, options: Options) -> int | None:
        """Record a subscription; returns the core sub id it replaces (MQTT: the same filter
        again replaces the subscription), or None."""
        old = self.by_filter.get(flt.text)
        self.by_filter[flt.text] = (sub_id, options, flt)
        if old is not None:
            self._forget(old[1])
        self._counts[options] += 1
        self._changed()
        return None if old is None else old[0]

    def remove(self, text: str) -> int | None:
        """Forget the subscription to ``text``; its core sub id, or None if there was none."""
        entry = self.by_filter.pop(text, None)
        if entry is None:
            return None
        self._forget(entry[1])
        self._changed()
        return entry[0]

    def _forget(self, options: Options) -> None:
        counts = self._counts
        counts[options] -= 1
        if not counts[options]:
            del counts[options]

    def _changed(self) -> None:
        """A subscription came or went: answers made before may be wrong (a few hundred
        nanoseconds however many subscriptions there are: a session may make thousands)."""
        if self._cache:
            self._cache.clear()
        self._table = None
        counts = self._counts
        if len(counts) == 1:
            (only,) = counts
            uniform = self._uniform
            if uniform is None or uniform[2] is not only:
                self._uniform = (_delivery([only], True), _delivery([only], False), only)
        else:
            self._uniform = None

    @property
    def uniform(self) -> Options | None:
        """The options every subscription has, when they all have the same (else None)."""
        uniform = self._uniform
        return None if uniform is None else uniform[2]

    def delivery(self, topic: str, own: bool) -> Delivery:
        """How a message on ``topic`` goes out (``own``: this session published it)."""
        uniform = self._uniform
        if uniform is not None:
            return uniform[0] if own else uniform[1]
        key = (topic, own)
        found = self._cache.get(key)
        if found is not None:
            return found
        found = _delivery(self._matching(topic), own)
        if len(self._cache) >= 4096:
            self._cache.clear()
        self._cache[key] = found
        return found

    def _matching(self, topic: str) -> list[Options]:
        """The options of every subscription whose filter matches ``topic``."""
        if len(self.by_filter) <= 8:
            return [options for _sid, options, flt in self.by_filter.values() if flt.matches(topic)]
        table = self._table
        if table is None:
            table = self._table = routing.SubscriptionTable(cache_size=1024)
            for text, (_sid, _options, flt) in self.by_filter.items():
                table.add(flt, text)
        return [self.by_filter[text][1] for text in table.match(topic)]


def _delivery(matching: list[Options], own: bool) -> Delivery:
    """One message's delivery, given the options of the subscriptions it matches."""
    wanted = [o for o in matching if not (own and o.no_local)]
    if not wanted:
        return SKIP
    return Delivery(
        qos=max(o.qos for o in wanted),
        retain_as_published=any(o.retain_as_published for o in wanted),
        identifiers=tuple(o.identifier for o in wanted if o.identifier is not None),
    )
