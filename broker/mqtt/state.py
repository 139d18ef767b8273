"""What the MQTT front end keeps of a client id between its connections, and its timers.

The core keeps a durable session's filters, sequence numbers and stored messages; MQTT
adds a little per client: the options of its subscriptions, the QoS 2 packet ids in
flight both ways, the highest sequence number ever sent (a redelivery at or below it
carries DUP), a Will waiting out its delay and a session waiting to expire. ``MqttFrontEnd``
holds that by client id, knows which connection holds each id (MQTT takes a client id
over from the connection that had it), and owns the nursery where delayed wills and
session expiries wait, so each lives in a task with a clear owner and is cancelled when
the client comes back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import trio

from broker.core import Broker, Group, Holder, Message
from broker.log import get_logger
from broker.mqtt.subscriptions import Options, Subscriptions

log = get_logger("topiary.mqtt")

#: MQTT 5's "never expires" Session Expiry Interval (and 3.1.1's persistent session).
NEVER: float = 0xFFFFFFFF


@dataclass(slots=True)
class ClientState:
    """One client id's MQTT state that outlives a connection (while the broker runs)."""

    subscriptions: Subscriptions = field(default_factory=Subscriptions)
    qos2_received: set[int] = field(default_factory=set)  # PUBRECs sent, PUBREL not yet in
    pubrel_due: dict[int, int] = field(default_factory=dict)  # our PUBRELs: packet id -> seq
    sent_max: int = 0  # highest seq ever sent to this client (durable sessions)
    sent_pids: dict[int, int] = field(default_factory=dict)  # seq -> packet id, unacked
    shares: dict[str, Options] = field(default_factory=dict)  # "G/F" -> options (durable)
    expiry: float = 0.0  # seconds the session outlives its connection (NEVER: for ever)
    waiting: trio.CancelScope | None = None  # a delayed will or the expiry, while away
    will: Message | None = None  # the will waiting out its delay, while away


@dataclass(slots=True)
class FrontEndCounters:
    """What only MQTT has, for STATS and /metrics."""

    connections_total: int = 0
    connect_refused: int = 0
    packets_malformed: int = 0
    protocol_errors: int = 0
    expired: int = 0  # messages not delivered because their expiry interval passed
    too_large_for_client: int = 0  # not sent: above the client's Maximum Packet Size
    wills_published: int = 0
    sessions_expired: int = 0
    takeovers: int = 0

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


class MqttFrontEnd:
    """The MQTT side of one broker: client state by id, live connections, timers."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.clients: dict[str, ClientState] = {}
        self.live: dict[str, Holder] = {}  # the connection holding each client id
        self.counters = FrontEndCounters()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the timers' nursery until cancelled (by the server, at shutdown)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def state(self, client_id: str) -> ClientState:
        state = self.clients.get(client_id)
        if state is None:
            state = self.clients[client_id] = ClientState()
        return state

    def came_back(self, client_id: str, resumed: bool = True) -> None:
        """A connection took ``client_id``: a session waiting to expire does not, and a will
        waiting out its delay is not sent if the session is ``resumed``; a clean start ends
        the session, and so its will goes now (MQTT 5, 3.1.2.5)."""
        state = self.clients.get(client_id)
        if state is not None and state.waiting is not None:
            state.waiting.cancel()
            state.waiting = None
            will, state.will = state.will, None
            if will is not None and not resumed:
                self.publish_will(will)

    def away(self, client_id: str, will: Message | None, will_delay: float, durable: bool) -> None:
        """The connection of ``client_id`` ended: publish its will (now or after its delay,
        at the latest when the session ends) and let a durable session expire."""
        state = self.clients.get(client_id)
        expiry = state.expiry if state is not None and durable else 0.0
        if will is not None and (will_delay <= 0 or expiry <= 0):
            self.publish_will(will)
            will = None
        if not durable:
            self.clients.pop(client_id, None)
            return
        if expiry <= 0:
            self.spawn(self._drop_now, client_id)
            return
        if will is None and expiry >= NEVER:
            return
        assert state is not None
        scope = trio.CancelScope()
        state.waiting = scope
        state.will = will
        self.spawn(self._wait_away, client_id, scope, will, min(will_delay, expiry), expiry)

    def spawn(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the front end's nursery (timers, store work after a close)."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    async def _wait_away(
        self,
        client_id: str,
        scope: trio.CancelScope,
        will: Message | None,
        will_at: float,
        expiry: float,
    ) -> None:
        with scope:
            if will is not None:
                await trio.sleep(will_at)
                state = self.clients.get(client_id)
                if state is not None:
                    state.will = None
                self.publish_will(will)
            if expiry >= NEVER or math.isinf(expiry):
                return
            await trio.sleep(max(expiry - (will_at if will is not None else 0.0), 0.0))
            self.counters.sessions_expired += 1
            log.info("session expired", client=client_id)
            await self._drop(client_id)

    async def _drop_now(self, client_id: str) -> None:
        await self._drop(client_id)

    async def _drop(self, client_id: str) -> None:
        """End a durable session that nobody holds (its expiry came)."""
        session = self.broker.durable.get(client_id)
        if session is not None and session.connection is not None:
            return  # taken again meanwhile
        state = self.clients.pop(client_id, None)
        for name in state.shares if state is not None else ():
            group = self.broker.groups.get(name)
            if group is not None:
                self.release_share(group)
        try:
            await self.broker.drop_session(client_id)
        except Exception as exc:  # a store failure: logged, the session stays stored
            log.error("session expiry failed", client=client_id, error=str(exc))

    def release_share(self, group: Group) -> None:
        """A subscriber left shared group ``group`` (an MQTT ``$share``): the group ends when
        nobody is in it and no persistent session away holds it."""
        if group.members:
            return
        if any(group.name in state.shares for state in self.clients.values()):
            return
        self.spawn(self.broker.drop_group, group)

    def publish_will(self, will: Message) -> None:
        """Route a will like any publish (its store work queued in a task of ours)."""
        self.counters.wills_published += 1
        broker = self.broker
        if will.expires_at < 0:  # an interval, counted from now (broker.mqtt.connect)
            will.expires_at = trio.current_time() - will.expires_at
        work = broker.publish_message(will)
        if work is not None and broker.store is not None:
            self.spawn(broker.persist, work)

    def stats(self) -> dict[str, Any]:
        return {**self.counters.snapshot(), "clients": len(self.live)}
