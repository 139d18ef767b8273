"""A histogram as plain numbers: fixed bucket bounds, a count per bucket, the sum.

The core and the store observe into these, and the HTTP port's collector turns them into
Prometheus histograms at scrape time (``broker.http.metrics``). Plain numbers rather than
``prometheus_client.Histogram`` objects: the core and the store stay free of the exposition
library, each broker owns its own (tests run several brokers in one process, which the
library's default registry would mix up), and an observation is a bisect and three adds,
with no lock (every observer runs on the broker's trio thread).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

#: Seconds, for latencies from tens of microseconds to seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Histogram:
    """Observations counted in buckets with upper bounds ``bounds`` (inclusive, as in
    Prometheus), plus one for everything above the last bound."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"bucket bounds must increase strictly, got {bounds!r}")
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, ending with (inf, count)."""
        running = 0
        out = []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out
