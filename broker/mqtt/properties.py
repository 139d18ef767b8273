"""MQTT 5.0 properties (spec 2.2.2): which exist, which packet may carry which, and their
encoding.

``encode_properties`` returns the properties alone, *without* the Property Length in front, so
that pre-encoded parts can be concatenated (a message's shared properties, then a delivery's
Subscription Identifiers); ``property_section`` adds the length. ``decode_properties`` reads a
section whose bounds the caller has checked, and refuses, as the spec says:

- an identifier that is unknown or not allowed in that packet: Malformed Packet (2.2.2.2);
- a second copy of a property that may appear once: Protocol Error (each property's section);
- a value the spec rules out (0 or 1 flags, Receive Maximum 0, Maximum Packet Size 0,
  Subscription Identifier 0): Protocol Error; Topic Alias 0: Topic Alias invalid (3.3.2.3.4);
- Authentication Data without Authentication Method: Protocol Error (3.1.2.11.10).
"""

from __future__ import annotations

import struct
from operator import attrgetter

from broker.mqtt import packets as p
from broker.mqtt.errors import MqttError
from broker.mqtt.packets import Properties
from broker.mqtt.reasons import MALFORMED_PACKET, PROTOCOL_ERROR, TOPIC_ALIAS_INVALID
from broker.mqtt.wire import decode_utf8, read_varint, varint

__all__ = [
    "ALLOWED",
    "PROPERTY_IDS",
    "decode_properties",
    "encode_properties",
    "property_section",
]

# Value kinds (spec 2.2.2.2, "Type" column).
_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = range(7)

_WILL = p.WILL_PROPERTIES
_ACKS = (p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP)
_UNSUB_ON = (p.UNSUBSCRIBE, p.UNSUBACK, p.DISCONNECT, p.AUTH)
# Identifier -> (field of Properties, kind, packet types that may carry it): Table 2-4.
_TABLE: dict[int, tuple[str, int, tuple[int, ...]]] = {
    0x01: ("payload_format_indicator", _BYTE, (p.PUBLISH, _WILL)),
    0x02: ("message_expiry_interval", _U32, (p.PUBLISH, _WILL)),
    0x03: ("content_type", _STR, (p.PUBLISH, _WILL)),
    0x08: ("response_topic", _STR, (p.PUBLISH, _WILL)),
    0x09: ("correlation_data", _BIN, (p.PUBLISH, _WILL)),
    0x0B: ("subscription_identifiers", _VARINT, (p.PUBLISH, p.SUBSCRIBE)),
    0x11: ("session_expiry_interval", _U32, (p.CONNECT, p.CONNACK, p.DISCONNECT)),
    0x12: ("assigned_client_identifier", _STR, (p.CONNACK,)),
    0x13: ("server_keep_alive", _U16, (p.CONNACK,)),
    0x15: ("authentication_method", _STR, (p.CONNECT, p.CONNACK, p.AUTH)),
    0x16: ("authentication_data", _BIN, (p.CONNECT, p.CONNACK, p.AUTH)),
    0x17: ("request_problem_information", _BYTE, (p.CONNECT,)),
    0x18: ("will_delay_interval", _U32, (_WILL,)),
    0x19: ("request_response_information", _BYTE, (p.CONNECT,)),
    0x1A: ("response_information", _STR, (p.CONNACK,)),
    0x1C: ("server_reference", _STR, (p.CONNACK, p.DISCONNECT)),
    0x1F: (
        "reason_string",
        _STR,
        (p.CONNACK, *_ACKS, p.SUBACK, p.UNSUBACK, p.DISCONNECT, p.AUTH),
    ),
    0x21: ("receive_maximum", _U16, (p.CONNECT, p.CONNACK)),
    0x22: ("topic_alias_maximum", _U16, (p.CONNECT, p.CONNACK)),
    0x23: ("topic_alias", _U16, (p.PUBLISH,)),
    0x24: ("maximum_qos", _BYTE, (p.CONNACK,)),
    0x25: ("retain_available", _BYTE, (p.CONNACK,)),
    0x26: (
        "user_properties",
        _PAIR,
        (p.CONNECT, p.CONNACK, p.PUBLISH, _WILL, *_ACKS, p.SUBSCRIBE, p.SUBACK, *_UNSUB_ON),
    ),
    0x27: ("maximum_packet_size", _U32, (p.CONNECT, p.CONNACK)),
    0x28: ("wildcard_subscription_available", _BYTE, (p.CONNACK,)),
    0x29: ("subscription_identifier_available", _BYTE, (p.CONNACK,)),
    0x2A: ("shared_subscription_available", _BYTE, (p.CONNACK,)),
}

#: Field name of Properties -> property identifier.
PROPERTY_IDS: dict[str, int] = {name: pid for pid, (name, _, _) in _TABLE.items()}
#: Packet type (or WILL_PROPERTIES) -> identifiers it may carry. PINGREQ/PINGRESP have none.
ALLOWED: dict[int, frozenset[int]] = {
    ptype: frozenset(pid for pid, (_, _, types) in _TABLE.items() if ptype in types)
    for ptype in p.PACKET_NAMES
}

# Values limited to 0 or 1 (spec: "a value other than 0 or 1" is a Protocol Error).
_FLAGS = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
# Values that must not be 0.
_NONZERO = frozenset({0x0B, 0x21, 0x23, 0x27})

# In the order of the fields of Properties (which is the order written on the wire).
_FIELDS: tuple[str, ...] = tuple(Properties.__dataclass_fields__)
_get_all = attrgetter(*_FIELDS)
_EMPTY = _get_all(Properties())
_ENCODE: tuple[tuple[int, int], ...] = tuple(
    (PROPERTY_IDS[name], _TABLE[PROPERTY_IDS[name]][1]) for name in _FIELDS
)
_unpack_H = struct.Struct(">H").unpack_from
_unpack_I = struct.Struct(">I").unpack_from
_pack_H = struct.Struct(">H").pack
_pack_BH = struct.Struct(">BH").pack
_pack_BI = struct.Struct(">BI").pack


def encode_properties(props: Properties, packet_type: int) -> bytes:
    """The properties of ``props`` as written in a ``packet_type`` packet, without the
    Property Length; b"" when none is set. ``packet_type`` is a packet type constant of
    ``packets`` (or WILL_PROPERTIES). Raises ValueError for a property that packet may not
    carry: that is a bug in the caller, not something to send."""
    values = _get_all(props)
    if values == _EMPTY:
        return b""
    allowed = ALLOWED[packet_type]
    out = bytearray()
    for (pid, kind), value in zip(_ENCODE, values, strict=True):
        if value is None or value == []:
            continue
        if pid not in allowed:
            raise ValueError(
                f"{p.PACKET_NAMES[packet_type]} may not carry the property {_TABLE[pid][0]}"
            )
        if kind == _BYTE:
            out.append(pid)
            out.append(value)
        elif kind == _U16:
            out += _pack_BH(pid, value)
        elif kind == _U32:
            out += _pack_BI(pid, value)
        elif kind == _STR:
            raw = value.encode()
            out += _pack_BH(pid, len(raw))
            out += raw
        elif kind == _BIN:
            out += _pack_BH(pid, len(value))
            out += value
        elif kind == _VARINT:
            for number in value:
                out.append(pid)
                out += varint(number)
        else:
            for name, text in value:
                out.append(pid)
                for part in (name.encode(), text.encode()):
                    out += _pack_H(len(part))
                    out += part
    return bytes(out)


def property_section(props: Properties, packet_type: int) -> bytes:
    """Property Length followed by the properties (b"\\x00" when none is set)."""
    body = encode_properties(props, packet_type)
    return varint(len(body)) + body


def decode_properties(data: bytes, pos: int, end: int, packet_type: int) -> Properties:
    """The properties in ``data[pos:end]`` (the caller read the Property Length and checked
    that ``end`` is within the packet), for a ``packet_type`` packet."""
    props = Properties()
    allowed = ALLOWED[packet_type]
    where = p.PACKET_NAMES[packet_type] + (" properties" if packet_type else " Properties")
    while pos < end:
        pid = data[pos]
        pos += 1
        spec = _TABLE.get(pid)
        if spec is None:
            raise MqttError(MALFORMED_PACKET, f"{where}: unknown property 0x{pid:02X}")
        name, kind, _ = spec
        if pid not in allowed:
            raise MqttError(MALFORMED_PACKET, f"{where}: property {name} is not allowed here")
        if kind == _BYTE:
            if pos >= end:
                raise MqttError(MALFORMED_PACKET, f"{where}: {name} is truncated")
            value = data[pos]
            pos += 1
        elif kind == _U16:
            if pos + 2 > end:
                raise MqttError(MALFORMED_PACKET, f"{where}: {name} is truncated")
            value = _unpack_H(data, pos)[0]
            pos += 2
        elif kind == _U32:
            if pos + 4 > end:
                raise MqttError(MALFORMED_PACKET, f"{where}: {name} is truncated")
            value = _unpack_I(data, pos)[0]
            pos += 4
        elif kind == _VARINT:
            value, pos = read_varint(data, pos, end, f"{where}: {name}")
        elif kind == _PAIR:
            key, pos = _read_text(data, pos, end, where, name)
            text, pos = _read_text(data, pos, end, where, name)
            props.user_properties.append((key, text))
            continue
        else:
            if pos + 2 > end:
                raise MqttError(MALFORMED_PACKET, f"{where}: {name} is truncated")
            stop = pos + 2 + _unpack_H(data, pos)[0]
            if stop > end:
                raise MqttError(MALFORMED_PACKET, f"{where}: {name} runs past the properties")
            raw = bytes(data[pos + 2 : stop])
            value = raw if kind == _BIN else decode_utf8(raw, f"{where}: {name}")
            pos = stop
        if pid in _FLAGS:
            if value > 1:
                raise MqttError(PROTOCOL_ERROR, f"{where}: {name} is {value}, not 0 or 1")
        elif pid in _NONZERO and value == 0:
            code = TOPIC_ALIAS_INVALID if pid == 0x23 else PROTOCOL_ERROR
            raise MqttError(code, f"{where}: {name} is 0")
        if kind == _VARINT:
            ids = props.subscription_identifiers
            if ids and packet_type != p.PUBLISH:
                raise MqttError(PROTOCOL_ERROR, f"{where}: {name} appears more than once")
            ids.append(value)
        elif getattr(props, name) is not None:
            raise MqttError(PROTOCOL_ERROR, f"{where}: {name} appears more than once")
        else:
            setattr(props, name, value)
    if props.authentication_data is not None and props.authentication_method is None:
        raise MqttError(
            PROTOCOL_ERROR, f"{where}: authentication_data without authentication_method"
        )
    return props


def _read_text(data: bytes, pos: int, end: int, where: str, name: str) -> tuple[str, int]:
    """One string of a property, with the property's name in errors."""
    if pos + 2 > end:
        raise MqttError(MALFORMED_PACKET, f"{where}: {name} is truncated")
    stop = pos + 2 + _unpack_H(data, pos)[0]
    if stop > end:
        raise MqttError(MALFORMED_PACKET, f"{where}: {name} runs past the properties")
    return decode_utf8(data[pos + 2 : stop], f"{where}: {name}"), stop
