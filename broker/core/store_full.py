"""Writes the disk refused (``StoreFull``): counted, and logged at most once per interval.

A full disk refuses every batch, hundreds a second under load; a line for each would
flood the log (and fill what is left of a disk shared with it). The first refusal is
logged at once, later ones with how many there were since; the first success after them
says the store writes again.
"""

from __future__ import annotations

import time

from broker.core.counters import Counters
from broker.log import get_logger

__all__ = ["STORE_FULL_LOG_INTERVAL", "StoreFullLog"]

#: Seconds between two log lines about refused writes.
STORE_FULL_LOG_INTERVAL = 10.0

log = get_logger("topiary.store")


class StoreFullLog:
    """Counts each refused write in ``counters.store_full``; logs them rate-limited."""

    __slots__ = ("_counters", "_due", "_told", "active")

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self._due = 0.0  # monotonic time of the next line allowed
        self._told = 0  # store_full when the last line was written
        #: Writes were refused and none succeeded since.
        self.active = False

    def refused(self, error: BaseException) -> None:
        counters = self._counters
        counters.store_full += 1
        self.active = True
        now = time.monotonic()
        if now >= self._due:
            self._due = now + STORE_FULL_LOG_INTERVAL
            log.error(
                "store full: writes refused, their confirmed publishes too",
                refused=counters.store_full - self._told,
                refused_total=counters.store_full,
                error=str(error),
            )
            self._told = counters.store_full

    def succeeded(self) -> None:
        """A write was stored after refusals (call only while ``active``)."""
        self.active = False
        self._due = 0.0
        log.warning(
            "store writes again",
            refused=self._counters.store_full - self._told,
            refused_total=self._counters.store_full,
        )
        self._told = self._counters.store_full
