"""What the core hands out and asks for: store work, refusals, and the mesh it forwards to.

The router never imports a front end or the peer mesh: a front end implements the
``Subscriber`` side through ``Session`` (it attaches a connection and drains the queue), and
the mesh plugs in as a ``Mesh`` (``NullMesh`` until the broker is given peers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import routing
from broker.core.message import Message

if TYPE_CHECKING:
    from broker.core.session import Session


@dataclass(slots=True)
class DurableWork:
    """What one PUB asks of the store: the message and its (session, seq) deliveries, and
    with ``retain`` that it becomes its topic's retained message (empty payload: deleted)."""

    message: Message
    deliveries: list[tuple[Session, int]]
    publisher_msg_id: str | None
    trims: list[tuple[Session, int]] | None = None  # drop-oldest: (session, through seq)
    retain: bool = False


class QuotaExceeded(Exception):
    """A durable session that wants the message is full and its policy is reject-publish."""


class Mesh(Protocol):
    """What the router asks of the peer mesh (``broker.mesh.Peering`` implements it)."""

    active: bool

    def local_add(self, flt: routing.Filter) -> None: ...

    def local_remove(self, flt: routing.Filter) -> None: ...

    def wanting(self, topic: str) -> frozenset[str]: ...

    def forward(
        self, message: Message, dedup: bool, dests: frozenset[str], hops: int, source: str
    ) -> None: ...

    async def sync(self) -> bool: ...

    def shutdown(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...


class NullMesh:
    """No peers: nothing is mirrored, nothing is forwarded."""

    active = False

    def local_add(self, flt: routing.Filter) -> None:
        pass

    def local_remove(self, flt: routing.Filter) -> None:
        pass

    def wanting(self, topic: str) -> frozenset[str]:
        return frozenset()

    def forward(
        self, message: Message, dedup: bool, dests: frozenset[str], hops: int, source: str
    ) -> None:
        pass

    async def sync(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"active": False, "links": {}}

    def stats(self) -> dict[str, Any]:
        return {}
