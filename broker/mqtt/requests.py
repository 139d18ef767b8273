"""An MQTT client's packets after CONNECT, turned into core calls and answered in order.

PUBLISH is routed at once (the router queues it to every interested session before
``publish_message`` returns, which keeps each publisher's order); a QoS 1 PUBACK or
QoS 2 PUBREC waits for the store when durable sessions got the message, and never
overtakes an earlier one (``Replies``). QoS 2 is exactly once towards the subscribers:
a PUBLISH whose packet id is still between PUBREC and PUBREL is not routed again.
SUBSCRIBE maps `+`/`#` filters onto the core's mqtt dialect, keeps MQTT's options in
``Subscriptions`` and sends the retained messages each new subscription asks for after
the SUBACK.

Topic ACLs (``Session.acl``): a filter the client's rules do not cover gets SUBACK 0x87
(5.0) or 0x80 (3.1.1) and is not subscribed (``$share/G/F``: F is checked). A PUBLISH they
do not allow is not routed: 5.0 answers PUBACK/PUBREC 0x87 (QoS 0: dropped); 3.1.1 has no
refusal, and closing would make the client send it again for ever, so it is acknowledged
as usual and dropped (MQTT-3.3.5-2 allows either). Both are counted and logged.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

import routing
from broker.core import Message, QuotaExceeded, Session
from broker.log import get_logger
from broker.mqtt import reasons as R
from broker.mqtt.closing import Closing
from broker.mqtt.codec import encode
from broker.mqtt.connect import TOPIC_ALIAS_MAXIMUM, Accepted
from broker.mqtt.holder import Conn
from broker.mqtt.outbound import Outbound, ShareSink
from broker.mqtt.packets import (
    Auth,
    Connect,
    Disconnect,
    PingReq,
    PlainPublish,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from broker.mqtt.publish import pass_through_properties
from broker.mqtt.subscriptions import Options
from broker.store import NotConfirmed, Pending, StoreError, StoreFull

log = get_logger("topiary.mqtt")

SHARE_PREFIX = "$share/"
PINGRESP = b"\xd0\x00"


class Replies:
    """PUBACKs and PUBRECs in the order the PUBLISHes came, each once its message is stored
    (like the native ``Confirms``): one task answers from the front as commits complete.
    A PUBLISH whose commit failed is answered by ``refuse(packet id, qos, error)``: its
    refusal, or None when there is none to send (3.1.1: the connection is being closed,
    and nothing after it is answered)."""

    def __init__(
        self, session: Session, refuse: Callable[[int, int, BaseException], bytes | None]
    ) -> None:
        self.session = session
        self.refuse = refuse
        self.waiting: deque[tuple[Pending | None, bytes, int, int]] = deque()
        self._nursery: trio.Nursery | None = None
        self._draining = False

    def start_in(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def after(
        self, pending: Pending | None, reply: bytes, packet_id: int = 0, qos: int = 0
    ) -> None:
        """Send ``reply`` once ``pending`` committed (if it did not: the refusal of the
        PUBLISH ``packet_id`` of ``qos``)."""
        if pending is None and not self.waiting:
            self.session.send_control(reply)
            return
        self.waiting.append((pending, reply, packet_id, qos))
        if not self._draining and self._nursery is not None:
            self._draining = True
            self._nursery.start_soon(self._drain)

    async def _drain(self) -> None:
        waiting = self.waiting
        try:
            while waiting:
                pending = waiting[0][0]
                if pending is not None and not pending.done:
                    with contextlib.suppress(StoreError):
                        await pending.wait()
                out = []
                while waiting and (waiting[0][0] is None or waiting[0][0].done):
                    pending, reply, packet_id, qos = waiting.popleft()
                    if pending is not None:
                        try:
                            pending.result()
                        except StoreError as exc:
                            refusal = self.refuse(packet_id, qos, exc)
                            if refusal is None:  # closing: nothing more is answered
                                waiting.clear()
                                break
                            reply = refusal
                    out.append(reply)
                if out:
                    self.session.send_control(b"".join(out))
        finally:
            self._draining = False


class Requests:
    """One MQTT client's packets on its session (see the module docstring)."""

    def __init__(self, conn: Conn, accepted: Accepted, outbound: Outbound) -> None:
        self.conn = conn
        self.broker = conn.broker
        self.accepted = accepted
        self.session = accepted.session
        self.state = accepted.state
        self.outbound = outbound
        self.level = accepted.protocol_level
        self.v5 = accepted.v5
        self.aliases: dict[int, str] = {}
        self.replies = Replies(self.session, self._not_stored)
        self.later: list[tuple[Any, tuple[Any, ...]]] = []
        self.publish_bucket = self.broker.guard.publish_bucket()  # None: no rate limit

    def start_in(self, nursery: trio.Nursery) -> None:
        self.replies.start_in(nursery)
        self.conn.requests_nursery = nursery

    async def wait_room(self) -> None:
        """Read no more while the client's replies do not fit its queue (backpressure)."""
        await self.session.wait_control_drained()

    def handle(self, packet: Any) -> Closing | None:
        """Handle one packet now; what has to wait (the store, a lock) is left in ``later``
        for the reader to ``run_later`` before the next packet, so the order holds."""
        handler = _HANDLERS.get(packet.__class__)
        if handler is None:
            return Closing(R.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")
        return handler(self, packet)

    async def run_later(self) -> Closing | None:
        """Await the jobs the last packets left, in order; the first that ends the
        connection says why."""
        later, self.later = self.later, []
        for job, args in later:
            closing = await job(*args)
            if closing is not None:
                return closing
        return None

    def _send(self, packet: Any, *, ordered: bool = False) -> None:
        self.session.send_control(encode(packet, self.level), ordered=ordered)

    # -- PUBLISH -------------------------------------------------------------------------

    def _publish(self, p: Publish) -> Closing | None:
        broker = self.broker
        bucket = self.publish_bucket
        if bucket is not None and not bucket.take(trio.current_time()):
            # Past the connection's publish rate: MQTT 5 is told (DISCONNECT Message rate
            # too high), 3.1.1 has no word for it and is closed; never a silent drop.
            return Closing(
                R.MESSAGE_RATE_TOO_HIGH, broker.guard.publish_refused(self.session.client_id)
            )
        props = p.properties
        topic = p.topic
        if self.v5 and props.topic_alias is not None:
            alias = props.topic_alias
            if not 0 < alias <= TOPIC_ALIAS_MAXIMUM:
                return Closing(R.TOPIC_ALIAS_INVALID, f"topic alias {alias} is not in 1..64")
            if topic:
                self.aliases[alias] = topic
            else:
                found = self.aliases.get(alias)
                if found is None:
                    return Closing(R.PROTOCOL_ERROR, f"topic alias {alias} was never set")
                topic = found
        try:
            routing.validate_topic(topic, empty_levels=True)
        except routing.TopicError as exc:
            return Closing(R.TOPIC_NAME_INVALID, f"PUBLISH: {exc}")
        qos = p.qos
        if qos == 2 and p.packet_id in self.state.qos2_received:
            self._send(PubRec(p.packet_id))  # a resend: routed once already
            return None
        acl = self.session.acl
        if acl is not None and not acl.may_publish(topic):
            return self._not_authorized(p, topic)
        if len(p.payload) > broker.config.max_payload:
            text = (
                f"payload of {len(p.payload)} bytes exceeds the limit of "
                f"{broker.config.max_payload}"
            )
            return self._refuse_publish(p, R.QUOTA_EXCEEDED, text)
        gate = broker.write_refusal
        if gate is not None and qos > 0 and (why := gate()) is not None:
            return self._refuse_publish(p, R.SERVER_UNAVAILABLE, why)  # fenced hot spare
        headers = dict(props.user_properties) if props.user_properties else None
        message = Message(topic, p.payload, headers, broker.next_msg_id(), qos)
        message.origin = self.session
        if self.v5:
            if (
                props.payload_format_indicator is not None
                or props.content_type is not None
                or props.response_topic is not None
                or props.correlation_data is not None
                or props.user_properties
            ):
                message.mqtt_props = pass_through_properties(
                    payload_format=props.payload_format_indicator,
                    content_type=props.content_type,
                    response_topic=props.response_topic,
                    correlation_data=props.correlation_data,
                    user=props.user_properties,
                )
            if props.message_expiry_interval is not None:
                message.expires_at = trio.current_time() + props.message_expiry_interval
        message.retain = p.retain
        try:
            work = broker.publish_message(message)
        except QuotaExceeded as exc:
            return self._refuse_publish(p, R.QUOTA_EXCEEDED, str(exc))
        pending = None
        if work is not None:
            pending = None if self.later else broker.persist_nowait(work)
            if pending is None:
                self.later.append((self._persist, (p, work)))
                return None
        self._acknowledge(p, pending)
        return None

    def publish_plain(self, plain: PlainPublish) -> Closing | None:
        """``_publish`` for a plain PUBLISH (``PlainPublish``: QoS 0, no properties, no
        RETAIN), the fan-out path's common case: the same checks in the same order, without
        what only the other PUBLISHes need; its head goes out again as the message's."""
        topic, payload, head = plain
        broker = self.broker
        bucket = self.publish_bucket
        if bucket is not None and not bucket.take(trio.current_time()):
            return Closing(
                R.MESSAGE_RATE_TOO_HIGH, broker.guard.publish_refused(self.session.client_id)
            )
        try:
            routing.validate_topic(topic, empty_levels=True)
        except routing.TopicError as exc:
            return Closing(R.TOPIC_NAME_INVALID, f"PUBLISH: {exc}")
        acl = self.session.acl
        if acl is not None and not acl.may_publish(topic):
            return self._not_authorized(Publish(topic, payload), topic)
        if len(payload) > broker.config.max_payload:
            text = (
                f"payload of {len(payload)} bytes exceeds the limit of {broker.config.max_payload}"
            )
            return self._refuse_publish(Publish(topic, payload), R.QUOTA_EXCEEDED, text)
        message = Message(topic, payload, None, broker.next_msg_id(), 0)
        message.origin = self.session
        message.mqtt_heads = [b"", head] if self.v5 else [head, b""]
        try:
            work = broker.publish_message(message)
        except QuotaExceeded as exc:
            return self._refuse_publish(Publish(topic, payload), R.QUOTA_EXCEEDED, str(exc))
        # durable sessions got it: the store's, in order (QoS 0: no acknowledgement)
        if work is not None and (self.later or broker.persist_nowait(work) is None):
            self.later.append((self._persist, (Publish(topic, payload), work)))
        return None

    async def _persist(self, p: Publish, work: Any) -> Closing | None:
        """Queue a publish's store work, waiting for room, then its acknowledgement."""
        broker = self.broker
        try:
            pending = await broker.persist(work)
        except StoreError as exc:
            broker.counters.store_errors += 1
            return self._refuse_publish(p, R.UNSPECIFIED_ERROR, f"not stored: {exc}")
        self._acknowledge(p, pending)
        return None

    def _acknowledge(self, p: Publish, pending: Pending | None) -> None:
        """PUBACK (QoS 1) or PUBREC (QoS 2) once ``pending`` committed, in order."""
        qos = p.qos
        pid: int = p.packet_id  # type: ignore[assignment]  (QoS > 0 has one)
        if qos == 1:
            self.replies.after(pending, encode(PubAck(pid), self.level), pid, 1)
        elif qos == 2:
            self.state.qos2_received.add(pid)
            self.replies.after(pending, encode(PubRec(pid), self.level), pid, 2)

    def _not_stored(self, packet_id: int, qos: int, error: BaseException) -> bytes | None:
        """The answer to a QoS > 0 PUBLISH whose commit failed (``Replies``), never its
        acknowledgement: 5.0 a PUBACK/PUBREC with 0x97 Quota exceeded when the disk refused
        it (``StoreFull``), 0x88 Server unavailable from a fenced hot-spare primary
        (``NotConfirmed``), else 0x80, and the error as Reason String; 3.1.1 has no
        refusal, so the connection is closed (None) and the client sends it again."""
        if qos == 2:
            self.state.qos2_received.discard(packet_id)  # not routed for good: take it again
        if isinstance(error, StoreFull):
            reason = R.QUOTA_EXCEEDED
        elif isinstance(error, NotConfirmed):
            reason = R.SERVER_UNAVAILABLE
        else:
            reason = R.UNSPECIFIED_ERROR
        text = str(error)  # ("<db file>: not stored: <what the disk said>" for StoreFull)
        self.broker.counters.errors[f"MQTT_{reason:#04x}"] += 1
        if not self.v5:
            self.conn.stop(Closing(reason, text))
            return None
        ack = PubAck(packet_id, reason) if qos == 1 else PubRec(packet_id, reason)
        if self.accepted.problem_information:
            ack.properties.reason_string = text[:200]
        return encode(ack, 5)

    def _not_authorized(self, p: Publish, topic: str) -> Closing | None:
        """A PUBLISH the topic ACLs refuse (see the module docstring)."""
        self.broker.counters.acl_denied_publish += 1
        text = f"publishing to {topic!r} is not allowed by the topic ACLs"
        if self.v5:
            return self._refuse_publish(p, R.NOT_AUTHORIZED, text)
        self.broker.counters.errors[f"MQTT_{R.NOT_AUTHORIZED:#04x}"] += 1
        log.info("publish dropped", client=self.session.client_id, text=text)
        self._acknowledge(p, None)  # 3.1.1: acknowledged as usual, not routed
        return None

    def _refuse_publish(self, p: Publish, reason: int, text: str) -> Closing | None:
        """A PUBLISH the broker does not take: MQTT 5 says why in its PUBACK/PUBREC; QoS 0
        and 3.1.1 have no way to refuse one, so it is dropped (counted) or, for 3.1.1 QoS
        > 0, the connection is closed (the client will resend it)."""
        self.broker.counters.errors[f"MQTT_{reason:#04x}"] += 1
        log.info("publish refused", client=self.session.client_id, reason=hex(reason), text=text)
        if p.qos == 0:
            return None
        if not self.v5:
            return Closing(reason, text)
        ack = PubAck(p.packet_id, reason) if p.qos == 1 else PubRec(p.packet_id, reason)  # type: ignore[arg-type]
        if self.accepted.problem_information:
            ack.properties.reason_string = text[:200]
        self.replies.after(None, encode(ack, 5))
        return None

    def _puback(self, p: PubAck) -> Closing | None:
        self.outbound.acked(p.packet_id, 1)
        return None

    def _pubrec(self, p: PubRec) -> Closing | None:
        pid = p.packet_id
        if p.reason_code >= 0x80:  # the client refused it: the exchange ends here
            self.outbound.acked(pid, 2)
            self.outbound.completed(pid)
            return None
        if self.outbound.acked(pid, 2) or pid in self.state.pubrel_due:
            self._send(PubRel(pid))
        elif self.v5:
            self._send(PubRel(pid, R.PACKET_IDENTIFIER_NOT_FOUND))
        return None

    def _pubrel(self, p: PubRel) -> Closing | None:
        pid = p.packet_id
        if pid in self.state.qos2_received:
            self.state.qos2_received.discard(pid)
            self.replies.after(None, encode(PubComp(pid), self.level))
        else:
            reason = R.PACKET_IDENTIFIER_NOT_FOUND if self.v5 else 0
            self.replies.after(None, encode(PubComp(pid, reason), self.level))
        return None

    def _pubcomp(self, p: PubComp) -> Closing | None:
        self.outbound.completed(p.packet_id)
        return None

    # -- SUBSCRIBE and UNSUBSCRIBE -------------------------------------------------------

    def _subscribe(self, p: Subscribe) -> Closing | None:
        self.later.append((self._subscribe_now, (p,)))  # it may wait for the store
        return None

    def _unsubscribe(self, p: Unsubscribe) -> Closing | None:
        self.later.append((self._unsubscribe_now, (p,)))
        return None

    async def _subscribe_now(self, p: Subscribe) -> Closing | None:
        broker = self.broker
        session = self.session
        ids = p.properties.subscription_identifiers
        identifier = ids[0] if ids else None
        codes: list[int] = []
        retained: list[tuple[int, routing.Filter]] = []
        for sub in p.subscriptions:
            text = sub.filter
            if text.startswith(SHARE_PREFIX):
                name = text[len(SHARE_PREFIX) :]
                if name not in self.outbound.shares and self._subscriptions_full():
                    codes.append(R.QUOTA_EXCEEDED if self.v5 else 0x80)
                    continue
                codes.append(await self._share(text, sub.qos, sub.retain_as_published, identifier))
                continue
            try:
                flt = routing.parse_filter(text, routing.MQTT)
            except routing.TopicError:
                codes.append(R.TOPIC_FILTER_INVALID if self.v5 else 0x80)
                continue
            if not self._may_subscribe(flt):
                codes.append(R.NOT_AUTHORIZED if self.v5 else 0x80)
                continue
            options = Options(
                qos=sub.qos,
                no_local=sub.no_local,
                retain_as_published=sub.retain_as_published,
                identifier=identifier,
            )
            existing = self.state.subscriptions.by_filter.get(text)
            if existing is None and self._subscriptions_full():
                codes.append(R.QUOTA_EXCEEDED if self.v5 else 0x80)
                continue
            sub_id = existing[0] if existing is not None else broker.subscribe(session, flt)
            if session.durable and (existing is None or existing[1] != options):
                store = broker.store
                assert store is not None
                try:  # the options too: they outlive the broker process with the session
                    await store.add_filter(session.client_id, flt.text, flt.dialect, options.pack())
                except StoreError as exc:
                    if existing is None:
                        broker.unsubscribe(session, sub_id)
                    broker.counters.store_errors += 1
                    log.error("store failed", client=session.client_id, error=str(exc))
                    codes.append(R.UNSPECIFIED_ERROR if self.v5 else 0x80)
                    continue
            self.state.subscriptions.add(flt, sub_id, options)
            codes.append(sub.qos)
            if sub.retain_handling == 0 or (sub.retain_handling == 1 and existing is None):
                retained.append((sub_id, flt))
        self._send(SubAck(p.packet_id, codes))
        for sub_id, flt in retained:
            await broker.deliver_retained(session, sub_id, flt)
        return None

    def _subscriptions_full(self) -> bool:
        """Is one more subscription past ``max_subscriptions`` (counted if so)?"""
        guard = self.broker.guard
        if guard.subscriptions_full(len(self.session.subs) + len(self.outbound.shares)):
            guard.subscriptions_refused(self.session.client_id)
            return True
        return False

    async def _share(
        self, text: str, qos: int, retain_as_published: bool, identifier: int | None
    ) -> int:
        """Join the shared subscription ``$share/G/F`` (the core's shared group ``G/F``,
        subscribed to ``F``): each message for it goes to one of its subscribers."""
        name = text[len(SHARE_PREFIX) :]
        share, _, flt_text = name.partition("/")
        invalid = R.TOPIC_FILTER_INVALID if self.v5 else 0x80
        if not share or not flt_text or "+" in share or "#" in share:
            return invalid
        try:
            flt = routing.parse_filter(flt_text, routing.MQTT)
        except routing.TopicError:
            return invalid
        if not self._may_subscribe(flt):
            return R.NOT_AUTHORIZED if self.v5 else 0x80
        options = Options(qos=qos, retain_as_published=retain_as_published, identifier=identifier)
        sinks = self.outbound.shares
        sink = sinks.get(name)
        if sink is not None:
            sink.options = options
            return qos
        broker = self.broker
        try:
            group, _existed = await broker.open_group(name)
            if (flt.text, flt.dialect) not in group.refs:
                broker.subscribe(group, flt)
                if broker.store is not None:
                    await broker.store.add_filter(group.client_id, flt.text, flt.dialect)
        except StoreError as exc:
            broker.counters.store_errors += 1
            log.error("store failed", client=self.session.client_id, error=str(exc))
            return R.UNSPECIFIED_ERROR if self.v5 else 0x80
        if self.session.durable:  # the session keeps it across reconnects
            self.state.shares[name] = options
        sink = sinks[name] = ShareSink(self.outbound, options)
        sink.member = group.join(sink)  # type: ignore[arg-type]  (a member's sink)
        return qos

    def _may_subscribe(self, flt: routing.Filter) -> bool:
        """Do the client's topic ACLs grant ``flt``? (Counted and logged when not.)"""
        acl = self.session.acl
        if acl is None or acl.may_subscribe(flt):
            return True
        self.broker.counters.acl_denied_subscribe += 1
        log.info("subscribe refused", client=self.session.client_id, filter=flt.text)
        return False

    def revoked(self, removed: list[tuple[int, routing.Filter]]) -> None:
        """New topic ACLs removed these subscriptions (``Broker.set_policy``): MQTT has no
        way to tell the client, so they are forgotten here (and logged by the core); shared
        subscriptions the new rules do not grant are left."""
        for _sub_id, flt in removed:
            self.state.subscriptions.remove(flt.text)
        acl = self.session.acl
        if acl is None:
            return
        for name in list(self.outbound.shares):
            _share, _, text = name.partition("/")
            if not acl.may_subscribe(routing.parse_filter(text, routing.MQTT)):
                self.broker.counters.acl_denied_subscribe += 1
                log.info(
                    "shared subscription removed by the topic ACLs",
                    client=self.session.client_id,
                    filter=SHARE_PREFIX + name,
                )
                self._unshare(SHARE_PREFIX + name)

    async def rejoin_shares(self) -> None:
        """A resumed session's shared subscriptions: this connection joins their groups."""
        for name, options in list(self.state.shares.items()):
            await self._share(
                SHARE_PREFIX + name, options.qos, options.retain_as_published, options.identifier
            )

    def _unshare(self, text: str) -> bool:
        """Leave the shared subscription ``text``; False if this client had none."""
        name = text[len(SHARE_PREFIX) :]
        self.state.shares.pop(name, None)
        sink = self.outbound.shares.pop(name, None)
        if sink is None:
            return False
        self.outbound.leave(sink)
        return True

    async def _unsubscribe_now(self, p: Unsubscribe) -> Closing | None:
        broker = self.broker
        session = self.session
        codes = []
        for text in p.filters:
            if text.startswith(SHARE_PREFIX):
                codes.append(R.SUCCESS if self._unshare(text) else R.NO_SUBSCRIPTION_EXISTED)
                continue
            sub_id = self.state.subscriptions.remove(text)
            if sub_id is None:
                codes.append(R.NO_SUBSCRIPTION_EXISTED)
                continue
            ref = session.subs.get(sub_id)
            broker.unsubscribe(session, sub_id)
            if session.durable and ref is not None and not ref.sub_ids:
                store = broker.store
                assert store is not None
                with contextlib.suppress(StoreError):
                    await store.remove_filter(session.client_id, ref.filter, ref.dialect)
            codes.append(R.SUCCESS)
        self._send(UnsubAck(p.packet_id, codes if self.v5 else []), ordered=True)
        return None

    # -- the rest ------------------------------------------------------------------------

    def _pingreq(self, p: PingReq) -> Closing | None:
        self.session.send_control(PINGRESP)
        return None

    def _disconnect(self, p: Disconnect) -> Closing | None:
        expiry = p.properties.session_expiry_interval
        if expiry is not None:
            if self.state.expiry == 0 and expiry > 0:
                return Closing(
                    R.PROTOCOL_ERROR, "DISCONNECT may not set a Session Expiry Interval now"
                )
            if self.session.durable:
                self.state.expiry = float(expiry)
        return Closing(None, "client disconnected", will=p.reason_code == R.DISCONNECT_WITH_WILL)

    def _auth(self, p: Auth) -> Closing | None:
        return Closing(R.PROTOCOL_ERROR, "AUTH without an authentication method")

    def _connect(self, p: Connect) -> Closing | None:
        return Closing(R.PROTOCOL_ERROR, "a second CONNECT")


_HANDLERS: dict[type, Any] = {
    tuple: Requests.publish_plain,  # (PlainPublish)
    Publish: Requests._publish,
    PubAck: Requests._puback,
    PubRec: Requests._pubrec,
    PubRel: Requests._pubrel,
    PubComp: Requests._pubcomp,
    Subscribe: Requests._subscribe,
    Unsubscribe: Requests._unsubscribe,
    PingReq: Requests._pingreq,
    Disconnect: Requests._disconnect,
    Auth: Requests._auth,
    Connect: Requests._connect,
}
