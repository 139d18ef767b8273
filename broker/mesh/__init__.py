"""The peer mesh: links to other brokers and observers, route flooding, forwarding.

``Peering`` is the trio shell around ``routing.exchange.RouteExchange``; the
core sees it only as its ``Mesh``.
"""

from broker.mesh.link import PeerCounters, PeerLink
from broker.mesh.peering import Peering

__all__ = ["PeerCounters", "PeerLink", "Peering"]
