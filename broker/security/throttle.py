"""Log lines that a flood cannot multiply: at most one per interval per key.

A refusal that an attacker can cause by the thousand (a bad peer secret, a connection past
a limit) is counted every time, but logged at most once per ``interval`` per key, with how
many there were since the last line; the counters are what an operator graphs.
"""

from __future__ import annotations

import time


class Throttle:
    """``due(key)`` says whether to log now, and how many events the line stands for."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, key: str) -> int:
        """Count one event of ``key``; the number of events to report (this one and those
        held back since the last line), or 0 when the line is not due yet."""
        held = self._held.get(key, 0) + 1
        now = time.monotonic()
        if now < self._next.get(key, 0.0):
            self._held[key] = held
            return 0
        self._next[key] = now + self.interval
        self._held[key] = 0
        return held
