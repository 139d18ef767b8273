"""The protocol-agnostic heart of a broker: router, sessions, groups, delivery.

Front ends (one package per wire protocol) turn their frames into calls on
``Broker`` and drain ``Session`` queues with their own encoders; the peer mesh
plugs in as a ``Mesh``. Nothing here imports a front end, the mesh or a socket.
"""

from broker.core.counters import Counters
from broker.core.dedupe import RecentIds
from broker.core.delivery import DurableWork, Mesh, NullMesh, QuotaExceeded
from broker.core.groups import GROUP_PREFIX, Group, Member, group_session_id
from broker.core.message import Message
from broker.core.router import Broker
from broker.core.session import Holder, OutboundLimits, Session, SubRef
from broker.core.sessions import NotOwner

__all__ = [
    "GROUP_PREFIX",
    "Broker",
    "Counters",
    "DurableWork",
    "Group",
    "Holder",
    "Member",
    "Mesh",
    "Message",
    "NotOwner",
    "NullMesh",
    "OutboundLimits",
    "QuotaExceeded",
    "RecentIds",
    "Session",
    "SubRef",
    "group_session_id",
]
