"""Packets out as bytes, for either end and any protocol level, plus the fan-out fast path.

``encode(packet, protocol_level)`` writes any packet in the layout of that level: 3.x drops
what it has no field for (properties; reason codes of acks, UNSUBACK and DISCONNECT), and 5.0
leaves out a reason code and properties where the spec allows (e.g. a PUBACK with SUCCESS and
no properties is the packet identifier alone). A 3.x SUBACK turns any 5.0 failure code into
0x80. The encoder trusts its input (the broker built it) and raises ValueError only for a few
mistakes that are cheap to catch: a property the packet may not carry, QoS > 0 without a
packet identifier, AUTH before 5.0, a CONNECT whose level is not the one asked for.

Fan-out: ``PublishTemplate`` encodes what N deliveries of one message share (topic, payload,
shared properties) once; ``render`` adds a delivery's flags, packet identifier and own
properties (e.g. Subscription Identifiers from ``encode_properties``) and returns the header
bytes and the payload object itself, not copied, for ``writev``-style sending.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from broker.mqtt import packets as p
from broker.mqtt.packets import Packet, Properties
from broker.mqtt.properties import encode_properties, property_section
from broker.mqtt.wire import varint, write_binary, write_string

__all__ = ["PublishTemplate", "encode", "encode_publish", "publish_parts"]

_pack_H = struct.Struct(">H").pack
_BYTES = tuple(bytes((n,)) for n in range(256))
_EMPTY_SECTION = b"\x00"


def _check_level(protocol_level: int) -> None:
    if protocol_level not in (3, 4, 5):
        raise ValueError(f"protocol_level must be 3, 4 or 5, got {protocol_level}")


def _frame(first: int, body: bytes) -> bytes:
    """Fixed header (first byte, Remaining Length) and body."""
    return _BYTES[first] + varint(len(body)) + body


def encode(packet: Packet, protocol_level: int) -> bytes:
    """The wire form of ``packet`` for a connection at ``protocol_level`` (3, 4 or 5)."""
    _check_level(protocol_level)
    writer = _WRITERS.get(type(packet))
    if writer is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    return writer(packet, protocol_level)


def encode_publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    protocol_level: int,
    properties: Properties | None = None,
) -> bytes:
    """One PUBLISH packet, without building a ``Publish`` first."""
    raw = topic.encode()
    head = _pack_H(len(raw)) + raw
    if qos:
        if packet_id is None:
            raise ValueError(f"a QoS {qos} PUBLISH needs a packet identifier")
        head += _pack_H(packet_id)
    if protocol_level == 5:
        props = b"" if properties is None else encode_properties(properties, p.PUBLISH)
        head += varint(len(props)) + props if props else _EMPTY_SECTION
    first = _BYTES[0x30 | dup << 3 | qos << 1 | retain]
    return first + varint(len(head) + len(payload)) + head + payload


def publish_parts(
    topic_bytes: bytes,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    protocol_level: int,
    properties_bytes: bytes = b"",
) -> list[bytes]:
    """One PUBLISH as [header, payload]: the header is the fixed header, topic, packet
    identifier and (5.0) property section made of ``properties_bytes`` (as returned by
    ``encode_properties``; ignored before 5.0); the payload is passed through, not copied."""
    return PublishTemplate(topic_bytes, payload, protocol_level, properties_bytes).render(
        qos, retain, dup, packet_id
    )


class PublishTemplate:
    """The shared part of one message's PUBLISH packets, encoded once for N deliveries.

    ``topic`` is the topic name (str, or its UTF-8 bytes); ``properties_bytes`` the properties
    every delivery carries (``encode_properties(props, PUBLISH)``, e.g. Message Expiry, Content
    Type, User Properties), ignored before 5.0. One template serves one protocol level; a
    message going to 3.1.1 and 5.0 subscribers needs two (the topic and payload are shared).
    """

    __slots__ = (
        "_head0",
        "_head1",
        "_tail1",
        "payload",
        "properties_bytes",
        "protocol_level",
        "topic_part",
    )

    def __init__(
        self,
        topic: str | bytes,
        payload: bytes,
        protocol_level: int,
        properties_bytes: bytes = b"",
    ) -> None:
        _check_level(protocol_level)
        raw = topic.encode() if isinstance(topic, str) else topic
        self.topic_part = _pack_H(len(raw)) + raw
        self.payload = payload
        self.protocol_level = protocol_level
        self.properties_bytes = properties_bytes if protocol_level == 5 else b""
        section = varint(len(properties_bytes)) + properties_bytes if protocol_level == 5 else b""
        size = len(self.topic_part) + len(section) + len(payload)
        # After the first byte: QoS 0 has everything but the first byte ready; QoS 1 and 2
        # need the packet identifier between _head1 and _tail1.
        self._head0 = varint(size) + self.topic_part + section
        self._head1 = varint(size + 2) + self.topic_part
        self._tail1 = section

    def render(
        self,
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        extra_properties_bytes: bytes = b"",
    ) -> list[bytes]:
        """[header, payload] of one delivery; ``extra_properties_bytes`` (5.0 only) are added
        after the shared properties, e.g. this subscriber's Subscription Identifiers."""
        first = _BYTES[0x30 | dup << 3 | qos << 1 | retain]
        if extra_properties_bytes and self.protocol_level == 5:
            return self._render_extra(first, qos, packet_id, extra_properties_bytes)
        if not qos:
            return [first + self._head0, self.payload]
        if packet_id is None:
            raise ValueError(f"a QoS {qos} PUBLISH needs a packet identifier")
        return [first + self._head1 + _pack_H(packet_id) + self._tail1, self.payload]

    def size(self, qos: int = 0, extra_properties_bytes: bytes = b"") -> int:
        """The packet's size in bytes as ``render`` builds it (to compare with a client's
        Maximum Packet Size before sending)."""
        if extra_properties_bytes and self.protocol_level == 5:
            props = len(self.properties_bytes) + len(extra_properties_bytes)
            body = len(self.topic_part) + len(varint(props)) + props + len(self.payload)
            body += 2 if qos else 0
            return 1 + len(varint(body)) + body
        if qos:
            return 3 + len(self._head1) + len(self._tail1) + len(self.payload)
        return 1 + len(self._head0) + len(self.payload)

    def _render_extra(
        self, first: bytes, qos: int, packet_id: int | None, extra: bytes
    ) -> list[bytes]:
        props = self.properties_bytes + extra
        middle = varint(len(props)) + props
        if qos:
            if packet_id is None:
                raise ValueError(f"a QoS {qos} PUBLISH needs a packet identifier")
            middle = _pack_H(packet_id) + middle
        size = len(self.topic_part) + len(middle) + len(self.payload)
        return [first + varint(size) + self.topic_part + middle, self.payload]


def _connect(packet: p.Connect, level: int) -> bytes:
    if packet.protocol_level != level:
        raise ValueError(f"a level {packet.protocol_level} CONNECT on a level {level} encoder")
    will = packet.will
    flags = (
        (packet.username is not None) << 7
        | (packet.password is not None) << 6
        | (packet.clean_start << 1)
    )
    parts = [
        write_string("MQIsdp" if level == 3 else "MQTT"),
        bytes((level,)),
        b"",  # flags, filled in below
        _pack_H(packet.keepalive),
    ]
    if level == 5:
        parts.append(property_section(packet.properties, p.CONNECT))
    parts.append(write_string(packet.client_id))
    if will is not None:
        flags |= 0x04 | will.qos << 3 | will.retain << 5
        if level == 5:
            parts.append(property_section(will.properties, p.WILL_PROPERTIES))
        parts.append(write_string(will.topic))
        parts.append(write_binary(will.payload))
    if packet.username is not None:
        parts.append(write_string(packet.username))
    if packet.password is not None:
        parts.append(write_binary(packet.password))
    parts[2] = _BYTES[flags]
    return _frame(0x10, b"".join(parts))


def _connack(packet: p.ConnAck, level: int) -> bytes:
    body = bytes((packet.session_present, packet.reason_code))
    if level == 5:
        body += property_section(packet.properties, p.CONNACK)
    return _frame(0x20, body)


def _publish(packet: p.Publish, level: int) -> bytes:
    return encode_publish(
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.dup,
        packet.packet_id,
        level,
        packet.properties,
    )


def _ack_writer(ptype: int) -> Callable[[p.PubAck, int], bytes]:
    first = ptype << 4 | (2 if ptype == p.PUBREL else 0)

    def write(packet: p.PubAck, level: int) -> bytes:
        body = _pack_H(packet.packet_id)
        if level == 5:
            props = encode_properties(packet.properties, ptype)
            if props:
                body += _BYTES[packet.reason_code] + varint(len(props)) + props
            elif packet.reason_code:
                body += _BYTES[packet.reason_code]
        return _frame(first, body)

    return write


def _subscribe(packet: p.Subscribe, level: int) -> bytes:
    parts = [_pack_H(packet.packet_id)]
    if level == 5:
        parts.append(property_section(packet.properties, p.SUBSCRIBE))
        for sub in packet.subscriptions:
            parts.append(write_string(sub.filter))
            options = (
                sub.qos
                | sub.no_local << 2
                | sub.retain_as_published << 3
                | sub.retain_handling << 4
            )
            parts.append(_BYTES[options])
    else:
        for sub in packet.subscriptions:
            parts.append(write_string(sub.filter))
            parts.append(_BYTES[sub.qos])
    return _frame(0x82, b"".join(parts))


def _suback(packet: p.SubAck, level: int) -> bytes:
    if level == 5:
        section = property_section(packet.properties, p.SUBACK)
        return _frame(0x90, _pack_H(packet.packet_id) + section + bytes(packet.reason_codes))
    # 3.x has one failure code: every 5.0 failure (0x80 and above) becomes 0x80.
    codes = bytes(code if code < 0x80 else 0x80 for code in packet.reason_codes)
    return _frame(0x90, _pack_H(packet.packet_id) + codes)


def _unsubscribe(packet: p.Unsubscribe, level: int) -> bytes:
    section = property_section(packet.properties, p.UNSUBSCRIBE) if level == 5 else b""
    filters = b"".join(write_string(f) for f in packet.filters)
    return _frame(0xA2, _pack_H(packet.packet_id) + section + filters)


def _unsuback(packet: p.UnsubAck, level: int) -> bytes:
    body = _pack_H(packet.packet_id)
    if level == 5:
        body += property_section(packet.properties, p.UNSUBACK) + bytes(packet.reason_codes)
    return _frame(0xB0, body)


def _pingreq(packet: p.PingReq, level: int) -> bytes:
    return b"\xc0\x00"


def _pingresp(packet: p.PingResp, level: int) -> bytes:
    return b"\xd0\x00"


def _disconnect(packet: p.Disconnect, level: int) -> bytes:
    if level != 5:
        return b"\xe0\x00"
    return _frame(0xE0, _code_and_props(packet.reason_code, packet.properties, p.DISCONNECT))


def _auth(packet: p.Auth, level: int) -> bytes:
    if level != 5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    return _frame(0xF0, _code_and_props(packet.reason_code, packet.properties, p.AUTH))


def _code_and_props(code: int, props: Properties, ptype: int) -> bytes:
    """DISCONNECT and AUTH bodies: empty for 0 without properties, else the code, then the
    property section when there are properties."""
    body = encode_properties(props, ptype)
    if body:
        return _BYTES[code] + varint(len(body)) + body
    return _BYTES[code] if code else b""


_WRITERS: dict[type, Callable[[Packet, int], bytes]] = {  # type: ignore[dict-item]
    p.Connect: _connect,
    p.ConnAck: _connack,
    p.Publish: _publish,
    p.PubAck: _ack_writer(p.PUBACK),
    p.PubRec: _ack_writer(p.PUBREC),
    p.PubRel: _ack_writer(p.PUBREL),
    p.PubComp: _ack_writer(p.PUBCOMP),
    p.Subscribe: _subscribe,
    p.SubAck: _suback,
    p.Unsubscribe: _unsubscribe,
    p.UnsubAck: _unsuback,
    p.PingReq: _pingreq,
    p.PingResp: _pingresp,
    p.Disconnect: _disconnect,
    p.Auth: _auth,
}
