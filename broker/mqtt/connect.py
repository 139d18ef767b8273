"""The start of an MQTT connection: CONNECT in, a session opened, CONNACK out.

Its own module because it is where a client may be refused outright (CONNACK with a
reason code, then close) and where MQTT's session rules meet the core's:

- Clean Session (3.1.1) / Clean Start (5.0) discards a session the client id had;
- a session that outlives its connection (3.1.1 without Clean Session; 5.0 with a
  Session Expiry Interval above 0) is a core durable session, stored under the data dir
  like a native one; without a data dir it cannot be kept, and an MQTT 5 client is told
  so (CONNACK Session Expiry Interval 0);
- a client id already connected is taken over: the old connection is closed (5.0:
  DISCONNECT Session taken over) before the new one is answered;
- an empty client id gets one assigned (5.0: Assigned Client Identifier).
"""

from __future__ import annotations

import contextlib
import hmac
from dataclasses import dataclass

import trio

import routing
from broker.core import GROUP_PREFIX, Message, NotOwner, Session
from broker.log import get_logger
from broker.mqtt import reasons as R
from broker.mqtt.codec import MqttError, encode
from broker.mqtt.holder import Conn
from broker.mqtt.packets import ConnAck, Connect
from broker.mqtt.publish import pass_through_properties
from broker.mqtt.state import NEVER, ClientState
from broker.mqtt.subscriptions import Options
from broker.net import RECEIVE_SIZE
from broker.security import ANONYMOUS, Identity, certificate_subject
from broker.security.floods import MAX_CONNECTIONS, REFUSED_HELLO_TIMEOUT
from broker.security.logins import LoginRefused
from broker.store import StoreError

log = get_logger("topiary.mqtt")

#: Topic aliases a client may define towards us (MQTT 5 Topic Alias Maximum).
TOPIC_ALIAS_MAXIMUM = 64
#: Unacknowledged QoS 1 and 2 PUBLISHes we send a 3.1.1 client (5.0 says its own).
V3_INFLIGHT = 1000


@dataclass(slots=True)
class Accepted:
    """A client's CONNECT, accepted: its session and what it asked for."""

    session: Session
    client_id: str
    state: ClientState
    protocol_level: int
    keepalive: float  # seconds; 0: none
    will: Message | None
    will_delay: float
    receive_maximum: int  # how many QoS > 0 PUBLISHes the client takes unacknowledged
    maximum_packet: int  # the largest packet the client takes (bytes)
    topic_alias_maximum: int  # aliases the client lets us define (we define none)
    problem_information: bool  # may a Reason String go to the client
    identity: Identity = ANONYMOUS  # who the client proved to be (broker/security)

    @property
    def v5(self) -> bool:
        return self.protocol_level == 5


async def accept_connect(conn: Conn) -> Accepted | None:
    """Read CONNECT and answer it: the session opened, or None (refused, or no CONNECT)."""
    broker = conn.broker
    decoder = conn.decoder
    packet = None
    timeout = broker.config.hello_timeout
    if conn.refusal is not None:  # only long enough to say why in its protocol version
        timeout = min(timeout, REFUSED_HELLO_TIMEOUT)
    with trio.move_on_after(timeout):
        while packet is None:
            try:
                packet = decoder.next_packet()
            except MqttError as exc:
                conn.mqtt.counters.packets_malformed += 1
                level = decoder.protocol_level
                if level == 5 or exc.reason_code == R.UNSUPPORTED_PROTOCOL_VERSION:
                    await _refuse(conn, level or 4, exc.reason_code, exc.text)
                else:  # 3.1.1: no CONNACK for a CONNECT that does not conform, just close
                    conn.mqtt.counters.connect_refused += 1
                    conn.broker.counters.errors[f"MQTT_{exc.reason_code:#04x}"] += 1
                    log.info("connect refused", peer=conn.peer, reason=hex(exc.reason_code))
                return None
            if packet is None:
                try:
                    data = await conn.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    return None
                conn.last_heard = trio.current_time()
                decoder.receive_data(data)
    if packet is None:
        broker.counters.idle_disconnects += 1
        return None
    assert isinstance(packet, Connect)  # the decoder lets nothing else come first
    try:
        return await _open(conn, packet)
    except _Refused as refused:
        await _refuse(conn, packet.protocol_level, refused.reason, refused.text)
        return None


class _Refused(Exception):
    def __init__(self, reason: int, text: str) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text


async def _open(conn: Conn, connect: Connect) -> Accepted:
    broker = conn.broker
    config = broker.config
    frontend = conn.mqtt
    v5 = connect.protocol_level == 5
    props = connect.properties
    refusal = conn.refusal
    if refusal is not None:  # a limit against floods (3.1.1: Server unavailable)
        if refusal.limit == MAX_CONNECTIONS:
            raise _Refused(R.QUOTA_EXCEEDED, refusal.text)
        raise _Refused(R.CONNECTION_RATE_EXCEEDED, refusal.text)
    if v5 and props.authentication_method is not None:
        raise _Refused(R.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
    if config.auth_token is not None:
        given = connect.password or b""
        if not hmac.compare_digest(given, config.auth_token.encode()):
            broker.counters.connections_refused += 1
            raise _Refused(R.BAD_USER_NAME_OR_PASSWORD, "bad or missing password")
    identity = await _login(conn, connect)
    client_id = connect.client_id
    assigned = None
    if not client_id:
        if not v5 and not connect.clean_start:
            raise _Refused(
                R.CLIENT_IDENTIFIER_NOT_VALID, "an empty client id needs a clean session"
            )
        client_id = assigned = f"auto-{broker.next_msg_id()}"
    elif client_id.startswith(GROUP_PREFIX):
        raise _Refused(
            R.CLIENT_IDENTIFIER_NOT_VALID,
            f"client ids starting with {GROUP_PREFIX!r} name shared groups",
        )
    will = None
    will_delay = 0.0
    if connect.will is not None:
        will = _will_message(conn, connect)
        will_delay = float(connect.will.properties.will_delay_interval or 0)
    if v5:
        expiry = float(props.session_expiry_interval or 0)
    else:
        expiry = 0.0 if connect.clean_start else NEVER
    told_expiry = None
    if expiry > 0 and broker.store is None:
        expiry = 0.0
        told_expiry = 0  # a session cannot outlive its connection without a store

    # Another identity's durable session, or a connection another identity holds, is not
    # taken over (nor, with Clean Start, dropped).
    if not broker.may_own(client_id, identity.owner):
        raise _Refused(R.NOT_AUTHORIZED, f"the session {client_id!r} belongs to another identity")
    previous = frontend.live.get(client_id)
    if previous is not None and previous.identity.owner != identity.owner:
        raise _Refused(R.NOT_AUTHORIZED, f"client id {client_id!r} is in use by another identity")
    # Take the client id over from a connection that holds it.
    if previous is not None:
        previous.take_over()
        with trio.move_on_after(config.shutdown_timeout):
            while frontend.live.get(client_id) is previous:
                await trio.sleep(0.01)  # bounded: until the old connection has let go
        if frontend.live.get(client_id) is previous:
            raise _Refused(R.SERVER_BUSY, "the client id's connection did not let go")
    frontend.came_back(client_id, resumed=not connect.clean_start)
    conn.identity = identity
    frontend.live[client_id] = conn
    try:
        session, present = await _session(
            conn, client_id, connect.clean_start, expiry, identity.owner, identity.cert
        )
    except NotOwner as exc:  # (its owner opened it meanwhile)
        frontend.live.pop(client_id, None)
        raise _Refused(R.NOT_AUTHORIZED, str(exc)) from exc
    except StoreError as exc:
        frontend.live.pop(client_id, None)
        broker.counters.store_errors += 1
        raise _Refused(R.UNSPECIFIED_ERROR, f"storage failed: {exc}") from exc
    state = frontend.clients.get(client_id) if present else None
    if state is not None:  # the topic ACLs may have removed filters while it was away
        refs = session.refs
        for text in [t for t in state.subscriptions.by_filter if (t, routing.MQTT) not in refs]:
            state.subscriptions.remove(text)
    if state is None:
        state = frontend.clients[client_id] = ClientState()
        if present:  # restored from the store, with the options it kept
            stored = broker.registry.filter_options.pop(client_id, {})
            for (text, dialect), ref in session.refs.items():
                if dialect == routing.MQTT:
                    options = Options.unpack(stored.get((text, dialect))) or Options(qos=1)
                    state.subscriptions.add(
                        routing.parse_filter(text, dialect), ref.sub_id, options
                    )
    state.expiry = expiry
    keepalive = float(connect.keepalive)
    connack = ConnAck(session_present=present, reason_code=R.SUCCESS)
    if v5:
        out = connack.properties
        out.assigned_client_identifier = assigned
        out.topic_alias_maximum = TOPIC_ALIAS_MAXIMUM
        out.maximum_packet_size = config.max_frame
        out.retain_available = 1
        out.wildcard_subscription_available = 1
        out.subscription_identifier_available = 1
        out.shared_subscription_available = 1
        if told_expiry is not None:
            out.session_expiry_interval = told_expiry
    session.ready = True  # MQTT: stored messages follow CONNACK at once
    session.send_control(encode(connack, connect.protocol_level))
    log.debug("connect", peer=conn.peer, client=client_id, level=connect.protocol_level)
    receive_maximum = (props.receive_maximum or 65535) if v5 else V3_INFLIGHT
    return Accepted(
        session=session,
        client_id=client_id,
        state=state,
        protocol_level=connect.protocol_level,
        keepalive=keepalive,
        will=will,
        will_delay=will_delay,
        receive_maximum=receive_maximum,
        maximum_packet=(props.maximum_packet_size or (1 << 28)) if v5 else 1 << 28,
        topic_alias_maximum=(props.topic_alias_maximum or 0) if v5 else 0,
        problem_information=props.request_problem_information != 0 if v5 else False,
        identity=identity,
    )


async def _login(conn: Conn, connect: Connect) -> Identity:
    """Who CONNECT's user name and password and the stream's TLS client certificate prove
    the client to be (``broker.security.logins``); refused: 5.0 Bad User Name or Password
    (0x86) for wrong credentials, Not Authorized (0x87) for none where some are needed
    (3.1.1: return codes 4 and 5)."""
    broker = conn.broker
    try:
        return await broker.logins.login(
            username=connect.username,
            password=connect.password,
            cert=certificate_subject(conn.stream),
            client_id=connect.client_id or None,
            peer=conn.peer,
        )
    except LoginRefused as refused:
        broker.counters.connections_refused += 1
        reason = R.BAD_USER_NAME_OR_PASSWORD if refused.bad_credentials else R.NOT_AUTHORIZED
        raise _Refused(reason, refused.text) from None


async def _session(
    conn: Conn, client_id: str, clean: bool, expiry: float, owner: str, cert: str | None
) -> tuple[Session, bool]:
    """The client's session and whether it was there (CONNACK Session Present); a durable
    one belongs to ``owner`` (``NotOwner`` when it is another identity's), whose
    certificate subject ``cert`` is stored with it."""
    broker = conn.broker
    stored = broker.durable.get(client_id)
    if clean and stored is not None:
        await broker.drop_session(client_id, owner=owner)
        conn.mqtt.clients.pop(client_id, None)
        stored = None
    if expiry > 0 or (stored is not None and not clean):
        session, present = await broker.open_durable(client_id, owner, cert)
        session.attach(conn)
        return session, present and not clean
    conn.mqtt.clients.pop(client_id, None)
    return broker.open_session(client_id), False


def _will_message(conn: Conn, connect: Connect) -> Message:
    will = connect.will
    assert will is not None
    try:
        routing.validate_topic(will.topic, empty_levels=True)
    except routing.TopicError as exc:
        raise _Refused(R.TOPIC_NAME_INVALID, f"will topic: {exc}") from exc
    props = will.properties
    headers = dict(props.user_properties) if props.user_properties else None
    message = Message(will.topic, will.payload, headers, conn.broker.next_msg_id(), will.qos)
    message.retain = will.retain
    if connect.protocol_level == 5:
        message.mqtt_props = pass_through_properties(
            payload_format=props.payload_format_indicator,
            content_type=props.content_type,
            response_topic=props.response_topic,
            correlation_data=props.correlation_data,
            user=props.user_properties,
        )
        if props.message_expiry_interval is not None:
            # counted from when the will is published, not from now: set at publish
            message.expires_at = -float(props.message_expiry_interval)
    return message


async def _refuse(conn: Conn, level: int, reason: int, text: str) -> None:
    """CONNACK with ``reason`` (3.1.1: the nearest return code), then close."""
    conn.mqtt.counters.connect_refused += 1
    conn.broker.counters.errors[f"MQTT_{reason:#04x}"] += 1
    log.info("connect refused", peer=conn.peer, reason=hex(reason), text=text)
    if level == 5:
        packet = ConnAck(reason_code=reason)
        packet.properties.reason_string = text[:200]
        data = encode(packet, 5)
    else:
        data = encode(ConnAck(reason_code=R.v3_connack_code(reason)), 4)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await conn.stream.send_all(data)
