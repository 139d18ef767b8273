"""Why and how a client connection ends, as one piece of state.

Several tasks can end a connection (the reader at EOF or on bad input, the keepalive,
the session failing, another connection taking the session over, a broken write, the
broker shutting down), and what the client is told, how long its queue may flush and
whether we linger afterwards all follow from who came first. ``Ending`` keeps that in
one place, and it only ever moves towards the end.
"""

from __future__ import annotations

from enum import IntEnum

from broker.errors import ErrorCode, RemoteProtocolError


class Phase(IntEnum):
    """How far the end has got; it only moves forward."""

    OPEN = 0  # nothing said yet: the writer sends as long as there is something to send
    TELLING = 1  # the closing ERROR is queued: the writer flushes the queue, then stops
    BROKEN = 2  # a write failed: the socket is unusable, nothing more is said or read


class Ending:
    """Why (``reason``, ``shutdown``) and how far (``phase``) a connection is ending."""

    __slots__ = ("phase", "reason", "shutdown")

    def __init__(self) -> None:
        self.phase = Phase.OPEN
        # What to tell the client: the first reason given (a None from a broken write
        # leaves room for one, though a broken connection tells nobody anything).
        self.reason: RemoteProtocolError | None = None
        # Kept apart from ``reason``: a shutdown still cuts the linger short when it comes
        # while another reason is being told, and a reason given before or after it is
        # what the client hears.
        self.shutdown = False

    def stop(self, reason: RemoteProtocolError | None) -> None:
        """Someone stops the reader, for ``reason``; the first reason given is the one told."""
        if self.reason is None:
            self.reason = reason

    def shut_down(self) -> None:
        """The broker is shutting down."""
        self.shutdown = True

    def broke(self) -> None:
        """A write failed."""
        self.phase = Phase.BROKEN

    def told(self) -> None:
        """The closing ERROR is queued."""
        self.phase = max(self.phase, Phase.TELLING)

    @property
    def telling(self) -> bool:
        """Past saying anything new: the ERROR is queued, or nothing can be sent."""
        return self.phase >= Phase.TELLING

    @property
    def broken(self) -> bool:
        return self.phase is Phase.BROKEN

    @property
    def lingers(self) -> bool:
        """After telling: read and drop briefly so the ERROR survives (not when the socket
        is gone, nor while the broker shuts down)."""
        return self.phase is not Phase.BROKEN and not self.shutdown

    def why(self) -> RemoteProtocolError | None:
        """What to tell a client whose reader was stopped: the first reason given, else
        SHUTTING_DOWN while the broker shuts down, else nothing."""
        if self.reason is None and self.shutdown:
            return RemoteProtocolError(ErrorCode.SHUTTING_DOWN, "the broker is shutting down")
        return self.reason
