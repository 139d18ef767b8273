"""The peer mesh: links to other brokers and observers, route flooding, forwarding.

``Peering`` is the trio shell around ``routing.exchange.RouteExchange``; the
core sees it only as its ``Mesh``.
"""

from broker.mesh.handshake import HANDSHAKE_TIMEOUT, dial_handshake
from broker.mesh.link import Keepalive, LinkOwner, PeerLink
from broker.mesh.peering import PeerCounters, Peering
from broker.mesh.translate import to_frame, update_from

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "Keepalive",
    "LinkOwner",
    "PeerCounters",
    "PeerLink",
    "Peering",
    "dial_handshake",
    "to_frame",
    "update_from",
]
