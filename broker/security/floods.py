"""Limits against floods: how many connections, how fast new ones, how fast one connection
publishes, how many subscriptions one client holds.

Each limit is a clear refusal in the client's protocol, never silent loss
(docs/security.md, "Limits"): the front ends (broker/native, broker/mqtt) ask the
``FloodGuard`` and say no in their own words. Each refusal is counted per limit
(``Counters.limit_refused``: STATS ``limit_refused``, /metrics
``topiary_limit_refused_total{limit=...}``) and logged at most once per 10 s per limit.

The rates are token buckets on trio's clock (so a test can drive them with a MockClock): a
bucket holds at most ``burst`` tokens, starts full, and gains ``rate`` per second; each
connection or PUB takes one, and is refused when there is none. A burst of 0 in the config
means one second's worth (``rate``, at least 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from broker.log import get_logger
from broker.security.throttle import Throttle

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.core.counters import Counters

log = get_logger("topiary.limits")

#: The limits, as ``limit_refused`` and the ``limit`` label name them.
MAX_CONNECTIONS = "max_connections"
CONNECTION_RATE = "connection_rate"
PUBLISH_RATE = "publish_rate"
MAX_SUBSCRIPTIONS = "max_subscriptions"
LIMITS = (MAX_CONNECTIONS, CONNECTION_RATE, PUBLISH_RATE, MAX_SUBSCRIPTIONS)

#: How long a refused connection may take to send HELLO or CONNECT, so that it can be told
#: why in its own protocol, before it is simply closed: short, since it holds a socket.
REFUSED_HELLO_TIMEOUT = 2.0


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` held; starts full."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float) -> bool:
        """Take one token at time ``now``; False (nothing taken) when there is none."""
        tokens = self.tokens + (now - self.stamp) * self.rate
        if tokens > self.burst:
            tokens = self.burst
        self.stamp = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return True
        self.tokens = tokens
        return False


def burst_of(rate: float, burst: int) -> float:
    """The configured burst, or one second's worth of ``rate`` (at least one)."""
    return float(burst) if burst > 0 else max(1.0, math.floor(rate))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a new connection is not let in: which limit, and a text for the client."""

    limit: str
    text: str


class FloodGuard:
    """One broker's limits against floods, and the count of what they refused.

    ``admit`` at the start of every client connection (all front ends), ``leave`` at its
    end; ``publish_bucket`` for each connection's PUBs; ``subscriptions_full`` before each
    new subscription. Peer links are let through whatever the client limits say: they are
    few, configured, and authenticated by the peer rules (broker/trust.py)."""

    def __init__(self, config: BrokerConfig, counters: Counters) -> None:
        self.max_connections = config.max_connections
        self.connection_rate = float(config.connection_rate)
        self.connection_burst = burst_of(self.connection_rate, config.connection_burst)
        self.publish_rate = float(config.publish_rate)
        self.publish_burst = burst_of(self.publish_rate, config.publish_burst)
        self.max_subscriptions = config.max_subscriptions
        self.counters = counters
        self.connections = 0  # admitted client connections open now
        self._connects: TokenBucket | None = None  # made at the first connection (trio time)
        self._throttle = Throttle()

    def admit(self) -> Refusal | None:
        """A new connection: None when it may go on (then ``leave`` when it ends), else why
        not (counted; the front end tells the client and closes)."""
        if self.max_connections and self.connections >= self.max_connections:
            return self._refuse(
                MAX_CONNECTIONS,
                f"the broker has {self.connections} connections, its max_connections",
            )
        if self.connection_rate:
            now = trio.current_time()
            bucket = self._connects
            if bucket is None:
                bucket = self._connects = TokenBucket(
                    self.connection_rate, self.connection_burst, now
                )
            if not bucket.take(now):
                return self._refuse(
                    CONNECTION_RATE,
                    f"more than {self.connection_rate:g} new connections per second "
                    f"(connection_rate); try again later",
                )
        self.connections += 1
        return None

    def leave(self) -> None:
        """An admitted connection ended."""
        self.connections -= 1

    def publish_bucket(self) -> TokenBucket | None:
        """A new connection's publish rate (None: no limit)."""
        if not self.publish_rate:
            return None
        return TokenBucket(self.publish_rate, self.publish_burst, trio.current_time())

    def publish_refused(self, client: str | None) -> str:
        """Count a PUB past its connection's rate; the text for the client."""
        self.refused(PUBLISH_RATE, client)
        return f"more than {self.publish_rate:g} publishes per second on this connection"

    def subscriptions_full(self, held: int) -> bool:
        """Is a client holding ``held`` subscriptions at its limit (``refused`` it then)?"""
        return bool(self.max_subscriptions) and held >= self.max_subscriptions

    def subscriptions_refused(self, client: str | None) -> str:
        """Count a subscription past the client's limit; the text for the client."""
        self.refused(MAX_SUBSCRIPTIONS, client)
        return f"this client holds {self.max_subscriptions} subscriptions, max_subscriptions"

    def refused(self, limit: str, client: str | None = None) -> None:
        """Count a refusal by ``limit``, and log it (at most once per 10 s per limit)."""
        self.counters.limit_refused[limit] += 1
        count = self._throttle.due(limit)
        if count:
            log.warning("limit refused", limit=limit, refused=count, client=client)

    def _refuse(self, limit: str, text: str) -> Refusal:
        self.refused(limit)
        return Refusal(limit, text)
