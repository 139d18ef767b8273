"""One task keeps every client connection alive, instead of a task each.

A sleeping trio task costs about 1.5 KiB (the task, its context and coroutine frames), and
an idle broker may hold many thousands of connections. The sweeper calls each connection's
``check_keepalive`` about four times per the shortest keepalive interval among them; a
connection that asks for a shorter interval than the sweeper's pace ``hurry``s it.
"""

from __future__ import annotations

import math
from typing import Any, Final

import trio

MIN_SWEEP: Final = 0.05  # seconds between sweeps, at least
MAX_SWEEP: Final = 1.0  # and at most


def _pace(interval: float) -> float:
    return min(max(interval / 4, MIN_SWEEP), MAX_SWEEP)


class KeepaliveSweeper:
    """Checks the keepalive of every connection in ``connections`` (objects with
    ``check_keepalive(now)`` and ``keepalive``; others are skipped)."""

    def __init__(self, connections: set[Any]) -> None:
        self.connections = connections
        self.pace = MAX_SWEEP
        self._scope: trio.CancelScope | None = None

    def hurry(self, interval: float) -> None:
        """A connection with keepalive ``interval`` came: sweep at least at its pace."""
        pace = _pace(interval)
        if pace < self.pace:
            self.pace = pace
            if self._scope is not None:
                self._scope.deadline = min(self._scope.deadline, trio.current_time() + pace)

    async def run(self) -> None:
        while True:
            with trio.CancelScope(deadline=trio.current_time() + self.pace) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            self.sweep(trio.current_time())

    def sweep(self, now: float) -> None:
        """Check every connection once; the next pace follows the shortest interval."""
        shortest = math.inf
        for connection in list(self.connections):
            check = getattr(connection, "check_keepalive", None)
            if check is not None:
                check(now)
                shortest = min(shortest, connection.keepalive)
        self.pace = _pace(shortest) if shortest != math.inf else MAX_SWEEP
