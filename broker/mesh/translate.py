"""Route-exchange messages <-> wire frames.

``routing.exchange`` speaks in ``Update``, ``RouteAck`` and ``RouteRequest`` (pure logic);
peer links carry ROUTE, ROUTE_ACK and ROUTE_REQUEST frames. Both the broker's mesh and the
Kafka bridge's route watcher read ROUTEs, so the translation lives here once.
"""

from __future__ import annotations

from typing import Any

from broker.wire.frames import Frame, Route, RouteAck, RouteRequest
from routing.exchange import RouteAck as AckMessage
from routing.exchange import RouteRequest as RequestMessage
from routing.linkstate import Update


def update_from(frame: Route) -> Update:
    """The link-state update a ROUTE frame carries."""
    return Update(
        frame.origin,
        frame.incarnation,
        frame.seq,
        snapshot=frame.snapshot,
        more=frame.more,
        neighbors=None if frame.neighbors is None else frozenset(frame.neighbors),
        add=frame.added,
        remove=frame.removed,
    )


def to_frame(message: Any) -> Frame:
    """The frame that carries an exchange message to a peer."""
    if isinstance(message, Update):
        return Route.build(
            origin=message.origin,
            incarnation=message.incarnation,
            seq=message.seq,
            snapshot=message.snapshot,
            more=message.more,
            neighbors=None if message.neighbors is None else sorted(message.neighbors),
            add=message.add,
            remove=message.remove,
        )
    if isinstance(message, AckMessage):
        return RouteAck(
            origin=message.origin,
            incarnation=message.incarnation,
            seq=message.seq,
            by=message.by,
            hops=message.hops,
        )
    if isinstance(message, RequestMessage):
        return RouteRequest(origin=message.origin)
    raise AssertionError(message)
