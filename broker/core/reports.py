"""The last report each bridge published: a core subscriber that keeps, never queues.

A bridge publishes a small report of its figures to ``$SYS/bridges/<bridge id>`` every few
seconds (docs/bridge.md). ``Reports`` is the broker's own subscriber to ``$SYS/bridges/>``
(the router subscribes it at start, in the native dialect): like ``Group`` it is a
``Session`` as far as routing is concerned, but its ``deliver`` only keeps the message's
payload as the last one of its topic. So it never queues, never drops for being slow, and
holds at most ``capacity`` topics (the one that reported longest ago goes first) of at
most ``max_bytes`` each. The payload is kept as bytes: what a report says is the business
of whoever reads it (broker/http/api.py), not of the core.

It is not a client's session: it is in no registry (``sessions``, ``durable``,
``sessions_info``), so it counts in neither ``subscriptions`` nor ``queued``; the table does
hold its entry, so ``table`` figures count it (one entry, one filter, one subscriber), and
it is not mirrored to peers, so each broker keeps the reports of the bridges connected to it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from broker.core.counters import Counters
from broker.core.message import Message
from broker.core.session import OutboundLimits, Session

#: Where bridges report, and the filter the broker's own subscriber holds.
REPORTS_PREFIX = "$SYS/bridges/"
REPORTS_FILTER = f"{REPORTS_PREFIX}>"
#: Topics (bridges) kept at most; the one that reported longest ago is dropped first.
MAX_REPORTS = 64
#: A payload larger than this is not kept (only its size): a report is a few hundred bytes.
MAX_REPORT_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Report:
    """The last message on one report topic."""

    topic: str
    payload: bytes | None  # None: larger than ``max_bytes``, not kept
    size: int
    received: float  # wall-clock time (time.time()) the broker routed it


class Reports(Session):
    """The broker's subscriber to bridge reports: the last payload per topic, bounded."""

    def __init__(
        self,
        limits: OutboundLimits,
        counters: Counters,
        *,
        capacity: int = MAX_REPORTS,
        max_bytes: int = MAX_REPORT_BYTES,
    ) -> None:
        super().__init__("$reports", limits, counters)
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.last: OrderedDict[str, Report] = OrderedDict()  # oldest report first
        self.received = 0
        self.evicted = 0

    def deliver(self, message: Message, sub_id: int) -> bool:
        """Keep ``message`` as its topic's last report; never queued, never refused."""
        payload = message.payload
        size = len(payload)
        last = self.last
        last.pop(message.topic, None)
        last[message.topic] = Report(
            message.topic, bytes(payload) if size <= self.max_bytes else None, size, time.time()
        )
        self.received += 1
        while len(last) > self.capacity:
            last.popitem(last=False)
            self.evicted += 1
        return True

    def reports(self) -> list[Report]:
        """The reports kept, by topic."""
        return sorted(self.last.values(), key=lambda r: r.topic)
