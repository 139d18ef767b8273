"""Readers for every packet but PUBLISH (which ``decoder`` reads itself, on its hot path):
each takes the buffer and the bounds of one packet's body, checks it as the spec says, and
returns the packet or raises ``MqttError``. Spec sections are 5.0's unless marked 3.1.1."""

from __future__ import annotations

import struct

from broker.mqtt import packets as p
from broker.mqtt import reasons as r
from broker.mqtt.errors import MqttError
from broker.mqtt.packets import Properties
from broker.mqtt.properties import decode_properties
from broker.mqtt.wire import read_binary, read_string, read_varint

__all__ = [
    "read_ack",
    "read_connack",
    "read_connect",
    "read_connect_level",
    "read_disconnect_or_auth",
    "read_packet_id",
    "read_properties",
    "read_suback",
    "read_subscribe",
    "read_unsuback",
    "read_unsubscribe",
]

_unpack_H = struct.Struct(">H").unpack_from
_MALFORMED = r.MALFORMED_PACKET
_PROTOCOL = r.PROTOCOL_ERROR
_NAMES = p.PACKET_NAMES
_PROTOCOL_NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


def read_connect_level(buf: bytearray, pos: int, end: int) -> tuple[int, int]:
    """CONNECT's protocol name and level (3.1.2.1, 3.1.2.2): the level (3, 4 or 5) and the
    position after it. Anything else is UNSUPPORTED_PROTOCOL_VERSION."""
    name, pos = read_string(buf, pos, end, "CONNECT: protocol name")
    if pos + 4 > end:
        raise MqttError(_MALFORMED, "CONNECT: truncated (level, flags, keep alive)")
    level = buf[pos]
    if name not in ("MQTT", "MQIsdp"):
        raise MqttError(
            r.UNSUPPORTED_PROTOCOL_VERSION, f"CONNECT: protocol name {name!r} is not MQTT"
        )
    if _PROTOCOL_NAMES.get(level) != name:
        raise MqttError(
            r.UNSUPPORTED_PROTOCOL_VERSION,
            f"CONNECT: protocol level {level} with name {name!r} is not supported",
        )
    return level, pos + 1


def read_connect(buf: bytearray, pos: int, end: int, level: int) -> p.Connect:
    """The rest of a CONNECT (3.1.2.3 on; 3.1.1 3.1.2.3 on), from the Connect Flags."""
    if pos + 3 > end:
        raise MqttError(_MALFORMED, "CONNECT: truncated (flags, keep alive)")
    flags = buf[pos]
    keepalive = _unpack_H(buf, pos + 1)[0]
    pos += 3
    if flags & 0x01:
        raise MqttError(_MALFORMED, "CONNECT: the reserved flag is set")
    will_qos = (flags >> 3) & 3
    if flags & 0x04:
        if will_qos == 3:
            raise MqttError(_MALFORMED, "CONNECT: Will QoS 3 is not valid")
    elif flags & 0x38:
        raise MqttError(_MALFORMED, "CONNECT: Will QoS or Will Retain set without a Will")
    if flags & 0x40 and not flags & 0x80 and level != 5:
        raise MqttError(_PROTOCOL, "CONNECT: a password without a user name (before 5.0)")
    v5 = level == 5
    props = Properties()
    if v5:
        props, pos = read_properties(buf, pos, end, p.CONNECT)
    client_id, pos = read_string(buf, pos, end, "CONNECT: client identifier")
    will = None
    if flags & 0x04:
        will_props = Properties()
        if v5:
            will_props, pos = read_properties(buf, pos, end, p.WILL_PROPERTIES)
        topic, pos = read_string(buf, pos, end, "CONNECT: Will topic")
        if not topic or "+" in topic or "#" in topic:
            raise MqttError(r.TOPIC_NAME_INVALID, f"CONNECT: Will topic {topic!r} is invalid")
        payload, pos = read_binary(buf, pos, end, "CONNECT: Will payload")
        will = p.Will(topic, payload, will_qos, bool(flags & 0x20), will_props)
    username = password = None
    if flags & 0x80:
        username, pos = read_string(buf, pos, end, "CONNECT: user name")
    if flags & 0x40:
        password, pos = read_binary(buf, pos, end, "CONNECT: password")
    _at_end(pos, end, "CONNECT")
    return p.Connect(
        client_id, level, bool(flags & 0x02), keepalive, username, password, will, props
    )


def _at_end(pos: int, end: int, name: str) -> None:
    """Refuse bytes left over after the content: the Remaining Length does not match it."""
    if pos != end:
        raise MqttError(_MALFORMED, f"{name}: {end - pos} bytes after the end of the content")


def read_properties(buf: bytearray, pos: int, end: int, ptype: int) -> tuple[Properties, int]:
    """A Property Length and the properties after it; the position after them."""
    if pos >= end:
        raise MqttError(_MALFORMED, f"{_NAMES[ptype]}: truncated (property length)")
    if not buf[pos]:
        return Properties(), pos + 1
    length, pos = read_varint(buf, pos, end, f"{_NAMES[ptype]}: property length")
    stop = pos + length
    if stop > end:
        raise MqttError(_MALFORMED, f"{_NAMES[ptype]}: properties run past the packet")
    return decode_properties(buf, pos, stop, ptype), stop


def read_packet_id(buf: bytearray, pos: int, end: int, name: str) -> int:
    """A non-zero Packet Identifier (2.2.1) at ``pos``."""
    if pos + 2 > end:
        raise MqttError(_MALFORMED, f"{name}: truncated (packet identifier)")
    packet_id = _unpack_H(buf, pos)[0]
    if not packet_id:
        raise MqttError(_PROTOCOL, f"{name}: packet identifier 0")
    return packet_id


def _reason(code: int, allowed: frozenset[int], name: str) -> int:
    """A reason code ``name`` may carry."""
    if code not in allowed:
        raise MqttError(_MALFORMED, f"{name}: reason code 0x{code:02X} is not valid here")
    return code


_ACK_CLASSES = {p.PUBACK: p.PubAck, p.PUBREC: p.PubRec, p.PUBREL: p.PubRel, p.PUBCOMP: p.PubComp}


def read_ack(
    ptype: int, buf: bytearray, pos: int, end: int, v5: bool
) -> p.PubAck | p.PubRec | p.PubRel | p.PubComp:
    """PUBACK, PUBREC, PUBREL, PUBCOMP (3.4-3.7): the reason code and the properties may be
    left out in 5.0 (Remaining Length 2 or 3)."""
    name = _NAMES[ptype]
    packet_id = read_packet_id(buf, pos, end, name)
    cls = _ACK_CLASSES[ptype]
    if end - pos == 2:
        return cls(packet_id)
    if not v5:
        raise MqttError(_MALFORMED, f"{name}: Remaining Length is {end - pos}, not 2")
    allowed = r.PUBACK_CODES if ptype <= p.PUBREC else r.PUBREL_CODES
    code = _reason(buf[pos + 2], allowed, name)
    if end - pos == 3:
        return cls(packet_id, code)
    props, pos = read_properties(buf, pos + 3, end, ptype)
    _at_end(pos, end, name)
    return cls(packet_id, code, props)


def read_subscribe(buf: bytearray, pos: int, end: int, v5: bool) -> p.Subscribe:
    """SUBSCRIBE (3.8): at least one filter, each with its options byte."""
    packet_id = read_packet_id(buf, pos, end, "SUBSCRIBE")
    pos += 2
    props = Properties()
    if v5:
        props, pos = read_properties(buf, pos, end, p.SUBSCRIBE)
    subscriptions = []
    while pos < end:
        topic_filter, pos = read_string(buf, pos, end, "SUBSCRIBE: topic filter")
        if pos >= end:
            raise MqttError(_MALFORMED, "SUBSCRIBE: truncated (subscription options)")
        options = buf[pos]
        pos += 1
        qos = options & 3
        if v5:
            if options & 0xC0:
                raise MqttError(_MALFORMED, "SUBSCRIBE: reserved bits of the options are set")
            if qos == 3:
                raise MqttError(_PROTOCOL, f"SUBSCRIBE: QoS 3 for {topic_filter!r}")
            retain_handling = options >> 4
            if retain_handling == 3:
                raise MqttError(_PROTOCOL, f"SUBSCRIBE: Retain Handling 3 for {topic_filter!r}")
            subscriptions.append(
                p.Subscription(
                    topic_filter, qos, bool(options & 4), bool(options & 8), retain_handling
                )
            )
        else:
            if options & 0xFC or qos == 3:
                raise MqttError(
                    _MALFORMED, f"SUBSCRIBE: options 0x{options:02X} for {topic_filter!r}"
                )
            subscriptions.append(p.Subscription(topic_filter, qos))
    if not subscriptions:
        raise MqttError(_PROTOCOL, "SUBSCRIBE: no topic filter")
    return p.Subscribe(packet_id, subscriptions, props)


def read_unsubscribe(buf: bytearray, pos: int, end: int, v5: bool) -> p.Unsubscribe:
    """UNSUBSCRIBE (3.10): at least one filter."""
    packet_id = read_packet_id(buf, pos, end, "UNSUBSCRIBE")
    pos += 2
    props = Properties()
    if v5:
        props, pos = read_properties(buf, pos, end, p.UNSUBSCRIBE)
    filters = []
    while pos < end:
        topic_filter, pos = read_string(buf, pos, end, "UNSUBSCRIBE: topic filter")
        filters.append(topic_filter)
    if not filters:
        raise MqttError(_PROTOCOL, "UNSUBSCRIBE: no topic filter")
    return p.Unsubscribe(packet_id, filters, props)


def read_disconnect_or_auth(
    ptype: int, buf: bytearray, pos: int, end: int, v5: bool
) -> p.Disconnect | p.Auth:
    """DISCONNECT (3.14) or AUTH (3.15): 3.x DISCONNECT is empty; in 5.0 the reason code and
    the properties may be left out (Remaining Length 0 or 1)."""
    name = _NAMES[ptype]
    cls = p.Disconnect if ptype == p.DISCONNECT else p.Auth
    if pos == end:
        return cls()
    if not v5:
        raise MqttError(_MALFORMED, f"{name}: Remaining Length is {end - pos}, not 0")
    allowed = r.DISCONNECT_CODES if ptype == p.DISCONNECT else r.AUTH_CODES
    code = _reason(buf[pos], allowed, name)
    props = Properties()
    if end - pos > 1:
        props, pos = read_properties(buf, pos + 1, end, ptype)
        _at_end(pos, end, name)
    if ptype == p.AUTH and props.authentication_method is None:
        # 3.15.2.2.2: only an AUTH of Remaining Length 0 may leave the method out.
        raise MqttError(_PROTOCOL, "AUTH: no Authentication Method")
    return cls(code, props)


def read_connack(buf: bytearray, pos: int, end: int, v5: bool) -> p.ConnAck:
    """CONNACK (3.2): acknowledge flags, then the reason (5.0) or return (3.x) code."""
    if end - pos < 2 or (not v5 and end - pos != 2):
        raise MqttError(_MALFORMED, f"CONNACK: Remaining Length {end - pos} is not valid")
    flags = buf[pos]
    if flags & 0xFE:
        raise MqttError(_MALFORMED, "CONNACK: reserved acknowledge flags are set")
    code = _reason(buf[pos + 1], r.CONNACK_CODES if v5 else r.V3_CONNACK_CODES, "CONNACK")
    props = Properties()
    pos += 2
    if v5:
        props, pos = read_properties(buf, pos, end, p.CONNACK)
        _at_end(pos, end, "CONNACK")
    return p.ConnAck(bool(flags), code, props)


def read_suback(buf: bytearray, pos: int, end: int, v5: bool) -> p.SubAck:
    """SUBACK (3.9): one code per subscription, at least one."""
    packet_id = read_packet_id(buf, pos, end, "SUBACK")
    pos += 2
    props = Properties()
    if v5:
        props, pos = read_properties(buf, pos, end, p.SUBACK)
    codes = list(buf[pos:end])
    if not codes:
        raise MqttError(_PROTOCOL, "SUBACK: no reason code")
    allowed = r.SUBACK_CODES if v5 else r.V3_SUBACK_CODES
    for code in codes:
        _reason(code, allowed, "SUBACK")
    return p.SubAck(packet_id, codes, props)


def read_unsuback(buf: bytearray, pos: int, end: int, v5: bool) -> p.UnsubAck:
    """UNSUBACK (3.11): 3.x has just the packet identifier; 5.0 a code per filter."""
    packet_id = read_packet_id(buf, pos, end, "UNSUBACK")
    if not v5:
        _at_end(pos + 2, end, "UNSUBACK")
        return p.UnsubAck(packet_id)
    props, pos = read_properties(buf, pos + 2, end, p.UNSUBACK)
    codes = list(buf[pos:end])
    if not codes:
        raise MqttError(_PROTOCOL, "UNSUBACK: no reason code")
    for code in codes:
        _reason(code, r.UNSUBACK_CODES, "UNSUBACK")
    return p.UnsubAck(packet_id, codes, props)
