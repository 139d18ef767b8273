"""What goes to an MQTT client: its session's messages as PUBLISHes, within its window.

The writer drains the client's ``Session`` like the native one does (replies first, many
packets per write, gaps of a durable session filled from the store; while it is parked,
a transient session's messages are written by the reader that routed them: ``direct``)
and encodes each delivery for this client (``append``): the QoS is the lower of the
publisher's and the subscription's, the RETAIN flag says whether the message came from
the retained store (or, with Retain As Published, how it was published), MQTT 5 adds the
remaining expiry and the subscription identifiers. A message whose expiry passed is not
sent, nor one larger than the client's Maximum Packet Size; both are counted.

QoS 1 and 2 deliveries take a free packet id and stay in flight until acknowledged; at
most the client's Receive Maximum are (3.1.1: ``V3_INFLIGHT``), QoS 2 ones until PUBCOMP.
A durable session remembers the packet id of each delivery not yet acknowledged
(``ClientState.sent_pids``), so its redelivery after a reconnect (from the store, after
the last ack) carries the same id, with DUP set. Its acknowledgement moves to just before
the oldest of its deliveries still in flight, so the store keeps exactly what may have to
be sent again.

Deliveries of shared subscriptions (``$share/G/F``: a core ``Group``, this connection one
of its members) do not pass through the session's queue: the group hands each member at
most its prefetch window, so they wait in ``shared`` (never dropped) and go out first;
their PUBACK acknowledges the one message to the group.

A QoS 2 delivery the client has PUBREC'd is not sent again: a reconnect resends our PUBREL
for it instead (MQTT-4.4.0-1), and a redelivery from the store skips it.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from broker.core import Member, Message, Session
from broker.core.extra import apply_extra
from broker.core.session import AppendRun
from broker.mqtt.closing import Closing
from broker.mqtt.codec import encode
from broker.mqtt.connect import Accepted
from broker.mqtt.holder import Conn
from broker.mqtt.packets import PubRel
from broker.mqtt.publish import append_publish, delivery_properties, plain_head
from broker.mqtt.subscriptions import Options
from routing.acl import Access

BATCH_BYTES = 256 * 1024
EMPTY_TOPIC = b"\x00\x00"  # a PUBLISH topic of length 0: its topic alias says which
FILL_PAGE = 1000
PACKET_IDS = 65535


class ShareSink:
    """What a shared group sees of this connection as its member (``Member.session``): its
    share of the group's messages goes to the connection's ``shared`` queue."""

    __slots__ = ("member", "options", "outbound")

    def __init__(self, outbound: Outbound, options: Options) -> None:
        self.outbound = outbound
        self.options = options
        self.member: Member | None = None  # set once joined

    @property
    def acl(self) -> Access | None:
        """The member's topic ACL rules: its connection's (shared groups check them)."""
        return self.outbound.session.acl

    def push(self, message: Message, sub_id: int, seq: int) -> None:
        self.outbound.shared.append((message, self, seq))
        self.outbound.session.wake()


class Outbound:
    """One connection's deliveries: encoding, the in-flight window, acknowledgements."""

    def __init__(self, conn: Conn, accepted: Accepted) -> None:
        self.conn = conn
        self.accepted = accepted
        self.session = accepted.session
        self.state = accepted.state
        self.v5 = accepted.v5
        self.level = accepted.protocol_level
        # packet id -> (seq, qos, share) of each QoS 1/2 PUBLISH sent and not yet
        # acknowledged (PUBACK, or PUBREC for QoS 2); share is None for the session's own
        # deliveries (in seq order among themselves), else the shared subscription's sink
        self.inflight: dict[int, tuple[int, int, ShareSink | None]] = {}
        self.window = max(1, accepted.receive_maximum)
        self._window_open: trio.Event | None = None
        self._next_pid = 1
        self._now = 0.0
        self.shared: list[tuple[Message, ShareSink, int]] = []  # shared subs' deliveries
        self.shares: dict[str, ShareSink] = {}  # "G/F" of each $share/G/F subscription
        # MQTT 5 topic aliases towards the client (topic -> alias), when it takes them: the
        # first topics it is sent get one each, up to its Topic Alias Maximum, for good
        self.aliases: dict[str, int] | None = {} if accepted.topic_alias_maximum else None
        # a durable session's acks, written to the store in order by one task at a time
        self._acking = False
        self._ack_wanted = 0
        # PUBRELs left unanswered by the last connection go first, with their packet ids;
        # the deliveries they release are not sent again
        self._released = set(self.state.pubrel_due.values())
        for pid in self.state.pubrel_due:
            self.session.send_control(encode(PubRel(pid), self.level))
        # The rest of a direct write the socket did not take (``direct``): the writer sends
        # it before anything else. The socket's descriptor when direct writes are made.
        self._unsent = b""
        self._fd: int | None = None
        self._last_word_due: trio.Event | None = None

    # -- the writer ----------------------------------------------------------------------

    def write_directly(self, fd: int, last_word_due: trio.Event) -> None:
        """Let the router's flush write to socket ``fd`` while the writer is parked
        (``Session.direct``): a transient session only (a durable one fills gaps)."""
        if self.session.durable:
            return
        self._fd = fd
        self._last_word_due = last_word_due
        self.session.direct = self.direct

    def direct(self) -> bool:
        """``Session.direct`` (the writer is parked in ``wait_data``): encode what is queued
        as the writer would and write it with one non-blocking send, in the caller's turn.
        True when all of it went and nothing is left queued; else the writer, woken, sends
        the rest first (``_unsent``) and goes on as usual."""
        if self._unsent or self.shared or self._last_word_due.is_set():  # type: ignore[union-attr]
            return False
        session = self.session
        if not session.queued:  # its writer ran meanwhile and sent it (a held wake)
            return True
        room = self._room()
        if room <= 0:
            return False  # the writer waits for the window
        self._now = 0.0  # (read when a message with an expiry needs it: _clock)
        data, _messages = session.take_batch(self.append, BATCH_BYTES, None, room, self._runs())
        try:
            sent = os.write(self._fd, data)  # type: ignore[arg-type]
        except OSError:  # full (BlockingIOError), or broken: the writer's send finds out
            sent = 0
        self.conn.broker.counters.bytes_sent += sent
        if sent < len(data):
            self._unsent = data[sent:]
            return False
        if session.sampled:
            self._observe_latency()
        return not session.queued

    async def run_writer(self, done: trio.Event, last_word_due: trio.Event) -> None:
        session = self.session
        conn = self.conn
        counters = conn.broker.counters
        try:
            while True:
                if self._unsent:  # the rest of a direct write: it goes on where it stopped
                    data = self._unsent
                    self._unsent = b""
                    await conn.stream.send_all(data)
                    counters.bytes_sent += len(data)
                    data = b""
                    if session.sampled:
                        self._observe_latency()
                    continue
                if last_word_due.is_set():
                    await self._say_last_word()
                    return
                if self.shared:
                    if self._room() <= 0:
                        await self._wait_window(last_word_due)
                        continue
                    await self._send_shared()
                    continue
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
                self._now = 0.0
                data, _messages = session.take_batch(
                    self.append, BATCH_BYTES, None, max(room, 0), self._runs()
                )
                if data:
                    await conn.stream.send_all(data)
                    counters.bytes_sent += len(data)
                    data = b""
                if session.sampled:
                    self._observe_latency()
                if session.durable and not self._own_inflight():
                    self.acknowledge()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            conn.stop(Closing(None, "connection lost"))
        finally:
            done.set()

    def _clock(self) -> float:
        """The time a batch's expiries are judged by, read once per batch when first needed
        (``_now`` is 0.0 until then)."""
        self._now = now = trio.current_time()
        return now

    def _messages_queued(self) -> bool:
        return self.session.queued > 0 and not self.session._control  # (replies need no room)

    def _room(self) -> int:
        """How many more messages may be encoded now (the client's window: QoS 2 ones count
        until their PUBCOMP)."""
        return self.window - len(self.inflight) - len(self.state.pubrel_due)

    def _own_inflight(self) -> bool:
        return any(share is None for _seq, _qos, share in self.inflight.values())

    async def _wait(self, last_word_due: trio.Event) -> None:
        if last_word_due.is_set() or self.shared:
            return
        await self.session.wait_data()

    async def _send_shared(self) -> None:
        """Send the shared subscriptions' deliveries waiting (as many as the window takes)."""
        take = self.shared[: self._room()]
        del self.shared[: len(take)]
        parts: list[bytes | memoryview] = []
        self._now = now = trio.current_time()
        for message, sink, seq in take:
            if message.expires_at and now >= message.expires_at:
                self.conn.mqtt.counters.expired += 1
                self._settle_share(sink, seq)
                continue
            options = sink.options
            qos = min(message.qos, options.qos)
            retain = options.retain_as_published and message.retain
            ids = (options.identifier,) if options.identifier is not None else ()
            pid = self._pid() if qos else 0
            if not self._encode(parts, message, qos, retain, False, pid, ids):
                self._settle_share(sink, seq)
                continue
            if qos:
                self.inflight[pid] = (seq, qos, sink)
            else:
                self._settle_share(sink, seq)
        if parts:
            data = b"".join(parts)
            await self.conn.stream.send_all(data)
            self.conn.broker.counters.bytes_sent += len(data)

    def _settle_share(self, sink: ShareSink, seq: int) -> None:
        """The group's message ``seq`` is done with (acknowledged, or never to be sent)."""
        member = sink.member
        if member is None:
            return
        group = member.group
        settled = group.ack(member, seq, True)
        store = self.conn.broker.store
        nursery = self.conn.requests_nursery
        if settled and store is not None and nursery is not None:
            nursery.start_soon(store.begin_ack_one, group.client_id, seq)

    def leave(self, sink: ShareSink) -> None:
        """Leave a shared group: what this connection held of it goes to its other members
        (the group ends with its last member, unless a persistent session away still holds
        it: ``MqttFrontEnd.release_share``)."""
        member = sink.member
        sink.member = None
        self.shared = [entry for entry in self.shared if entry[1] is not sink]
        for pid, (_seq, _qos, share) in list(self.inflight.items()):
            if share is sink:
                del self.inflight[pid]
        if member is None:
            return
        group = member.group
        group.leave(member)
        self.conn.mqtt.release_share(group)

    def leave_all(self) -> None:
        for sink in self.shares.values():
            self.leave(sink)
        self.shares.clear()

    def _pid(self) -> int:
        """A packet id no PUBLISH or PUBREL in flight holds."""
        inflight = self.inflight
        due = self.state.pubrel_due
        pid = self._next_pid
        while pid in inflight or pid in due:
            pid = pid % PACKET_IDS + 1
        self._next_pid = pid % PACKET_IDS + 1
        return pid

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
        """Send the replies due and the closing DISCONNECT (MQTT 5), at a packet boundary.
        At shutdown the queued messages go first, as far as the client's window allows (as
        the native front end flushes: what was acknowledged reaches who was connected);
        otherwise they are dropped."""
        session = self.session
        if self.conn.shutting_down:
            while session.queued and (room := self._room()) > 0:
                self._now = trio.current_time()
                data, messages = session.take_batch(self.append, BATCH_BYTES, None, room)
                if data:
                    await self.conn.stream.send_all(data)
                if not messages:
                    break
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
            apply_extra(message, m.extra)  # QoS, MQTT 5 properties, expiry
            self.append(parts, message, 0, m.seq)
        session.sent_upto = page[-1].seq
        broker.counters.messages_replayed += len(page)
        data = b"".join(parts)
        await self.conn.stream.send_all(data)
        session.delivered += len(page)
        broker.counters.bytes_sent += len(data)
        if not self._own_inflight():
            self.acknowledge()

    # -- encoding ------------------------------------------------------------------------

    def _runs(self) -> AppendRun | None:
        """``_append_run`` when this connection's deliveries may take it: no topic aliases
        towards the client, and subscriptions that all have the same options and no
        Subscription Identifier (a delivery's options do not depend on its topic)."""
        if self.aliases is not None:
            return None
        options = self.state.subscriptions.uniform
        if options is None or options.identifier is not None:
            return None
        return self._append_run

    def _append_run(
        self, parts: list[bytes | memoryview], entries: list[Any], start: int, end: int, budget: int
    ) -> tuple[int, int, int]:
        """``append`` for the queued deliveries ``entries[start:end]`` in one loop
        (``Session.take_batch``'s ``append_run``, for a transient session; see ``_runs``):
        each a QoS 0 PUBLISH without RETAIN or properties of its own, the same packet for
        every such delivery of the message, so its head is made once per message
        (``plain_head``; a plain PUBLISH's own head, from the reader). It stops at anything
        else (a reply, a sampled message, one that expires, comes from the retained store,
        keeps its QoS or RETAIN, is the session's own under No Local, or is too large for
        the client), which ``append`` then encodes, and once ``budget`` bytes are appended;
        returns (the index after the last encoded, bytes appended, payload bytes)."""
        options = self.state.subscriptions.uniform
        assert options is not None
        sub_qos = options.qos
        rap = options.retain_as_published
        own = self.session if options.no_local else None
        v5 = self.v5
        maximum = self.accepted.maximum_packet
        append = parts.append
        size = payload_bytes = 0
        i = start
        while i < end and size < budget:
            entry = entries[i]
            if entry.__class__ is not tuple:
                break
            message = entry[0]
            if (
                message.routed_at
                or message.expires_at
                or message.from_retained
                or (message.qos and sub_qos)
                or (rap and message.retain)
                or (own is not None and message.origin is own)
            ):
                break
            heads = message.mqtt_heads
            head = heads[v5] if heads is not None else b""
            if not head:
                head = plain_head(message, v5)
            n = len(head) + message.size
            if n > maximum:
                break
            append(head)
            append(message.payload)
            size += n
            payload_bytes += message.size
            i += 1
        return i, size, payload_bytes

    def append(
        self, parts: list[bytes | memoryview], message: Message, sub_id: int, seq: int
    ) -> int:
        """Encode one delivery (``Session.take_batch``'s ``append_msg``); its size, 0 when it
        is not sent (expired, No Local, too large)."""
        if seq in self._released and self.session.durable:
            return 0  # PUBREC'd: it is PUBREL's turn, not the PUBLISH's
        if message.expires_at and (self._now or self._clock()) >= message.expires_at:
            self.conn.mqtt.counters.expired += 1
            return 0
        delivery = self.state.subscriptions.delivery(message.topic, message.origin is self.session)
        if delivery.skip:
            return 0
        qos = min(message.qos, delivery.qos)
        retain = message.from_retained or (delivery.retain_as_published and message.retain)
        pid = 0
        dup = False
        state = self.state
        durable = self.session.durable
        if qos:
            if durable:
                dup = seq <= state.sent_max
                pid = state.sent_pids.get(seq, 0)
                if not pid or pid in self.inflight or pid in state.pubrel_due:
                    pid = state.sent_pids[seq] = self._pid()
            else:
                pid = self._pid()
        size = self._encode(parts, message, qos, retain, dup, pid, delivery.identifiers)
        if not size:
            return 0
        if qos:
            self.inflight[pid] = (seq, qos, None)
        if durable and seq > state.sent_max:
            state.sent_max = seq
        return size

    def _encode(
        self,
        parts: list[bytes | memoryview],
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        pid: int,
        identifiers: tuple[int, ...],
    ) -> int:
        """Append one PUBLISH; its size, or 0 (nothing appended) when it is larger than the
        client's Maximum Packet Size (counted)."""
        extra = b""
        topic = None
        alias = 0
        if self.v5:
            expiry = None
            if message.expires_at:
                expiry = max(int(message.expires_at - (self._now or self._clock())), 1)
            aliases = self.aliases
            if aliases is not None:  # the client takes topic aliases from us
                alias = aliases.get(message.topic, 0)
                if alias:
                    topic = EMPTY_TOPIC  # known to the client: the alias stands for it
                elif len(aliases) < self.accepted.topic_alias_maximum:
                    alias = len(aliases) + 1  # defined by this packet (topic sent in full)
            if expiry is not None or identifiers or alias:
                extra = delivery_properties(expiry, identifiers, alias)
        mark = len(parts)
        size = append_publish(
            parts,
            message,
            qos=qos,
            retain=retain,
            dup=dup,
            packet_id=pid,
            v5=self.v5,
            extra=extra,
            topic=topic,
        )
        if size > self.accepted.maximum_packet:
            del parts[mark:]
            self.conn.mqtt.counters.too_large_for_client += 1
            return 0
        if alias and topic is None:
            self.aliases[message.topic] = alias  # type: ignore[index]  (the packet is out)
        return size

    # -- acknowledgements ----------------------------------------------------------------

    def acked(self, pid: int, qos: int) -> bool:
        """The client acknowledged packet ``pid`` (PUBACK for QoS 1, PUBREC for QoS 2);
        False when no such delivery is in flight."""
        entry = self.inflight.get(pid)
        if entry is None or entry[1] != qos:
            return False
        del self.inflight[pid]
        seq, _qos, share = entry
        if qos == 2:
            self.state.pubrel_due[pid] = seq
        self._opened()
        if share is not None:
            self._settle_share(share, seq)
        elif self.session.durable:
            self.state.sent_pids.pop(seq, None)
            self.acknowledge()
        return True

    def completed(self, pid: int) -> bool:
        """PUBCOMP for ``pid``: the QoS 2 exchange is over (its window slot frees)."""
        done = self.state.pubrel_due.pop(pid, None) is not None
        if done:
            self._opened()
        return done

    def _opened(self) -> None:
        if self._window_open is not None:
            self._window_open.set()
            self._window_open = None

    def acknowledge(self) -> None:
        """Move a durable session's acknowledgement to just before the oldest delivery in
        flight (or to the last sent), and queue it for the store."""
        session = self.session
        through = session.sent_upto
        for seq, _qos, share in self.inflight.values():
            if share is None:  # the oldest of the session's own (they are in seq order)
                through = seq - 1
                break
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


__all__ = ["Outbound", "Session", "ShareSink"]
