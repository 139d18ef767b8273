"""A session's MQTT subscriptions: what the core does not know about them.

The core routes by (filter, dialect) and hands a session each message once, naming one
subscription. MQTT adds options per subscription: the maximum QoS granted, No Local,
Retain As Published and a Subscription Identifier. When a message matches several of a
session's subscriptions, MQTT wants one PUBLISH with the highest QoS among them and every
one of their identifiers (topiary's message economy: one copy per connection). So the
options live here, by filter, and a delivery looks up the subscriptions that match its
topic: directly when the session has one subscription (nearly always), else by matching
the topic against each filter.
"""

from __future__ import annotations

from dataclasses import dataclass

import routing


@dataclass(frozen=True, slots=True)
class Options:
    """One MQTT subscription's options, as granted."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    identifier: int | None = None


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

    __slots__ = ("_cache", "by_filter")

    def __init__(self) -> None:
        self.by_filter: dict[str, tuple[int, Options, routing.Filter]] = {}
        self._cache: dict[tuple[str, bool], Delivery] = {}

    def __len__(self) -> int:
        return len(self.by_filter)

    def add(self, flt: routing.Filter, sub_id: int, options: Options) -> int | None:
        """Record a subscription; returns the core sub id it replaces (MQTT: the same filter
        again replaces the subscription), or None."""
        old = self.by_filter.get(flt.text)
        self.by_filter[flt.text] = (sub_id, options, flt)
        self._cache.clear()
        return None if old is None else old[0]

    def remove(self, text: str) -> int | None:
        """Forget the subscription to ``text``; its core sub id, or None if there was none."""
        entry = self.by_filter.pop(text, None)
        self._cache.clear()
        return None if entry is None else entry[0]

    def delivery(self, topic: str, own: bool) -> Delivery:
        """How a message on ``topic`` goes out (``own``: this session published it)."""
        key = (topic, own)
        found = self._cache.get(key)
        if found is not None:
            return found
        matching = [
            options
            for _sub_id, options, flt in self.by_filter.values()
            if (len(self.by_filter) == 1 or flt.matches(topic)) and not (own and options.no_local)
        ]
        if not matching:
            found = SKIP
        else:
            found = Delivery(
                qos=max(o.qos for o in matching),
                retain_as_published=any(o.retain_as_published for o in matching),
                identifiers=tuple(o.identifier for o in matching if o.identifier is not None),
            )
        if len(self._cache) >= 4096:
            self._cache.clear()
        self._cache[key] = found
        return found
