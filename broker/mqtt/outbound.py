"""What goes to an MQTT client: its session's messages as PUBLISHes, within its window.

The writer drains the client's ``Session`` like the native one does (replies first, many
packets per write, gaps of a durable session filled from the store) and encodes each
delivery for this client (``append``): the QoS is the lower of the publisher's and the
subscription's, the RETAIN flag says whether the message came from the retained store
(or, with Retain As Published, how it was published), MQTT 5 adds the remaining expiry
and the subscription identifiers. A message whose expiry passed is not sent, nor one
larger than the client's Maximum Packet Size; both are counted.

QoS 1 and 2 deliveries take a packet id and stay in flight until acknowledged; at most
the client's Receive Maximum are (3.1.1: ``V3_INFLIGHT``). The packet id of a delivery is
derived from its sequence number (``packet_id``), so a durable session's redelivery after
a reconnect (from the store, after the last ack) carries the same id, with DUP set. A
durable session's acknowledgement moves to just before the oldest delivery still in
flight, so the store keeps exactly what may have to be sent again.

A QoS 2 delivery the client has PUBREC'd is not sent again: a reconnect resends our PUBREL
for it instead (MQTT-4.4.0-1), and a redelivery from the store skips it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from broker.core import Message, Session
from broker.mqtt.closing import Closing
from broker.mqtt.codec import encode
from broker.mqtt.connect import Accepted
from broker.mqtt.packets import PubRel
from broker.mqtt.publish import append_publish, delivery_properties

if TYPE_CHECKING:
    from broker.mqtt.connection import MqttConnection

BATCH_BYTES = 256 * 1024
FILL_PAGE = 1000
PACKET_IDS = 65535


def packet_id(seq: int) -> int:
    """The packet id of the delivery with sequence number ``seq`` (1..65535, cycling)."""
    return (seq - 1) % PACKET_IDS + 1


class Outbound:
    """One connection's deliveries: encoding, the in-flight window, acknowledgements."""

    def __init__(self, conn: MqttConnection, accepted: Accepted) -> None:
        self.conn = conn
        self.accepted = accepted
        self.session = accepted.session
        self.state = accepted.state
        self.v5 = accepted.v5
        self.level = accepted.protocol_level
        # packet id -> (seq, qos) of each QoS 1/2 PUBLISH sent and not yet acknowledged
        # (PUBACK, or PUBREC for QoS 2); insertion order is seq order
        self.inflight: dict[int, tuple[int, int]] = {}
        self.window = max(1, accepted.receive_maximum)
        self._window_open: trio.Event | None = None
        self._last_seq = 0  # the seq of the last delivery encoded
        self._now = 0.0
        # a durable session's acks, written to the store in order by one task at a time
        self._acking = False
        self._ack_wanted = 0
        # PUBRELs left unanswered by the last connection go first, with their packet ids
        for pid in self.state.pubrel_due:
            self.session.send_control(encode(PubRel(pid), self.level))

    # -- the writer ----------------------------------------------------------------------

    async def run_writer(self, done: trio.Event, last_word_due: trio.Event) -> None:
        session = self.session
        conn = self.conn
        counters = conn.broker.counters
        try:
            while True:
                if last_word_due.is_set():
                    await self._say_last_word()
                    return
                if session.needs_fill():
                    if self._room() <= 0:
                        await self._wait_window(last_word_due)
                        continue
                    await self._fill_from_store()
                    continue
                if not session.queued:
                    await self._wait(last_word_due)
                    continue
                room = self._room()
                if room <= 0 and self._messages_queued():
                    await self._wait_window(last_word_due)
                    continue
                self._now = trio.current_time()
                data, _messages = session.take_batch(self.append, BATCH_BYTES, None, max(room, 0))
                if data:
                    await conn.stream.send_all(data)
                    counters.bytes_sent += len(data)
                    data = b""
                if session.sampled:
                    self._observe_latency()
                if session.durable and not self.inflight:
                    self.acknowledge()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            conn.stop(Closing(None, "connection lost"))
        finally:
            done.set()

    def _messages_queued(self) -> bool:
        return self.session.queued > 0 and not self.session._control  # (replies need no room)

    def _room(self) -> int:
        """How many more messages may be encoded now: the window, and the packet ids (the
        oldest in flight must not meet its own id again)."""
        inflight = self.inflight
        room = self.window - len(inflight)
        if inflight:
            oldest = next(iter(inflight.values()))[0]
            room = min(room, oldest + PACKET_IDS - 1 - self._last_seq)
        return room

    async def _wait(self, last_word_due: trio.Event) -> None:
        if last_word_due.is_set():
            return
        await self.session.wait_data()

    async def _wait_window(self, last_word_due: trio.Event) -> None:
        """Wait for an acknowledgement (or the end) while the window is full."""
        self._window_open = trio.Event()
        async with trio.open_nursery() as nursery:

            async def end() -> None:
                await last_word_due.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(end)
            await self._window_open.wait()
            nursery.cancel_scope.cancel()

    def _observe_latency(self) -> None:
        now = trio.current_time()
        observe = self.conn.broker.delivery_latency.observe
        for routed_at in self.session.sampled:
            observe(now - routed_at)
        self.session.sampled.clear()

    async def _say_last_word(self) -> None:
        session = self.session
        session.discard_messages()
        data, _messages = session.take_batch(self.append)
        data += self.conn.last_word()
        if data:
            await self.conn.stream.send_all(data)

    async def _fill_from_store(self) -> None:
        """Send the next messages of a durable session from the store."""
        session = self.session
        broker = self.conn.broker
        store = broker.store
        assert store is not None
        target = session.fill_target()
        await session.wait_committed(session.sent_upto + 1)
        page = await store.pending(
            session.client_id, session.sent_upto, min(FILL_PAGE, max(self._room(), 1))
        )
        page = [m for m in page if m.seq <= target]
        if not page:
            session.sent_upto = min(target, session.committed_upto)
            return
        parts: list[bytes | memoryview] = []
        self._now = trio.current_time()
        for m in page:
            message = Message(m.topic, m.payload, m.headers, m.msg_id, from_retained=m.retained)
            self.append(parts, message, 0, m.seq)
        session.sent_upto = page[-1].seq
        broker.counters.messages_replayed += len(page)
        data = b"".join(parts)
        await self.conn.stream.send_all(data)
        session.delivered += len(page)
        broker.counters.bytes_sent += len(data)
        if not self.inflight:
            self.acknowledge()

    # -- encoding ------------------------------------------------------------------------

    def append(
        self, parts: list[bytes | memoryview], message: Message, sub_id: int, seq: int
    ) -> int:
        """Encode one delivery (``Session.take_batch``'s ``append_msg``); its size, 0 when it
        is not sent (expired, No Local, too large)."""
        self._last_seq = seq
        pubrel_due = self.state.pubrel_due
        if pubrel_due and pubrel_due.get(packet_id(seq)) == seq:
            return 0  # PUBREC'd: it is PUBREL's turn, not the PUBLISH's
        if message.expires_at and self._now >= message.expires_at:
            self.conn.mqtt.counters.expired += 1
            return 0
        delivery = self.state.subscriptions.delivery(message.topic, message.origin is self.session)
        if delivery.skip:
            return 0
        qos = min(message.qos, delivery.qos)
        retain = message.from_retained or (delivery.retain_as_published and message.retain)
        pid = 0
        dup = False
        if qos:
            pid = packet_id(seq)
            if self.session.durable:
                dup = seq <= self.state.sent_max
        extra = b""
        if self.v5:
            expiry = None
            if message.expires_at:
                expiry = max(int(message.expires_at - self._now), 1)
            if expiry is not None or delivery.identifiers:
                extra = delivery_properties(expiry, delivery.identifiers)
        mark = len(parts)
        size = append_publish(
            parts, message, qos=qos, retain=retain, dup=dup, packet_id=pid, v5=self.v5, extra=extra
        )
        if size > self.accepted.maximum_packet:
            del parts[mark:]
            self.conn.mqtt.counters.too_large_for_client += 1
            return 0
        if qos:
            self.inflight[pid] = (seq, qos)
        if self.session.durable and seq > self.state.sent_max:
            self.state.sent_max = seq
        return size

    # -- acknowledgements ----------------------------------------------------------------

    def acked(self, pid: int, qos: int) -> bool:
        """The client acknowledged packet ``pid`` (PUBACK for QoS 1, PUBREC for QoS 2);
        False when no such delivery is in flight."""
        entry = self.inflight.get(pid)
        if entry is None or entry[1] != qos:
            return False
        del self.inflight[pid]
        if qos == 2:
            self.state.pubrel_due[pid] = entry[0]
        self._opened()
        if self.session.durable:
            self.acknowledge()
        return True

    def completed(self, pid: int) -> bool:
        """PUBCOMP for ``pid``: the QoS 2 exchange is over."""
        return self.state.pubrel_due.pop(pid, None) is not None

    def _opened(self) -> None:
        if self._window_open is not None:
            self._window_open.set()
            self._window_open = None

    def acknowledge(self) -> None:
        """Move a durable session's acknowledgement to just before the oldest delivery in
        flight (or to the last sent), and queue it for the store."""
        session = self.session
        inflight = self.inflight
        through = next(iter(inflight.values()))[0] - 1 if inflight else session.sent_upto
        if through <= session.last_ack:
            return
        session.last_ack = through
        session.release_through(through)
        self._ack_wanted = through
        if not self._acking:
            self._acking = True
            nursery = self.conn.requests_nursery
            if nursery is not None:
                nursery.start_soon(self._store_acks)
            else:
                self._acking = False

    async def _store_acks(self) -> None:
        store = self.conn.broker.store
        assert store is not None
        try:
            done = 0
            while self._ack_wanted > done:
                done = self._ack_wanted
                await store.begin_ack(self.session.client_id, done)
        finally:
            self._acking = False


__all__ = ["Outbound", "Session", "packet_id"]
