"""PUBLISH packets for the fan-out path: the shared part once per message, a few bytes each.

A message that goes to N MQTT subscribers differs between them only in the first byte
(DUP, QoS, RETAIN), the remaining length, the packet id and, in MQTT 5, the properties
that belong to one delivery (the remaining Message Expiry Interval, Subscription
Identifiers). So the topic and the properties every delivery shares are encoded once
(``shared``, kept on the message) and each delivery adds its head and points at the
payload itself, which is never copied before the final join.

Only the properties a broker passes through from publisher to subscriber are written
here (Payload Format Indicator, Content Type, Response Topic, Correlation Data, User
Properties); the codec (``broker.mqtt.codec``) handles every packet in full.
"""

from __future__ import annotations

import struct
from typing import Final

from broker.core import Message
from broker.mqtt.wire import varint
from broker.mqtt.wire import write_binary as binary
from broker.mqtt.wire import write_string as utf8

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")

PUBLISH_TYPE: Final = 0x30
PROP_PAYLOAD_FORMAT: Final = 0x01
PROP_MESSAGE_EXPIRY: Final = 0x02
PROP_CONTENT_TYPE: Final = 0x03
PROP_RESPONSE_TOPIC: Final = 0x08
PROP_CORRELATION_DATA: Final = 0x09
PROP_SUBSCRIPTION_ID: Final = 0x0B
PROP_TOPIC_ALIAS: Final = 0x23
PROP_USER_PROPERTY: Final = 0x26


def user_properties(pairs: dict[str, str] | list[tuple[str, str]]) -> bytes:
    """User Property entries (0x26) for native headers or MQTT pairs, in order."""
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return b"".join(bytes((PROP_USER_PROPERTY,)) + utf8(k) + utf8(v) for k, v in items)


def pass_through_properties(
    *,
    payload_format: int | None = None,
    content_type: str | None = None,
    response_topic: str | None = None,
    correlation_data: bytes | None = None,
    user: list[tuple[str, str]] | None = None,
) -> bytes:
    """The encoded properties of an incoming PUBLISH that go to every subscriber as they
    came (``Message.mqtt_props``)."""
    parts = []
    if payload_format is not None:
        parts.append(bytes((PROP_PAYLOAD_FORMAT, payload_format)))
    if content_type is not None:
        parts.append(bytes((PROP_CONTENT_TYPE,)) + utf8(content_type))
    if response_topic is not None:
        parts.append(bytes((PROP_RESPONSE_TOPIC,)) + utf8(response_topic))
    if correlation_data is not None:
        parts.append(bytes((PROP_CORRELATION_DATA,)) + binary(correlation_data))
    if user:
        parts.append(user_properties(user))
    return b"".join(parts)


def shared(message: Message) -> tuple[bytes, bytes]:
    """(topic with its length, v5 properties every delivery shares), made once."""
    cached = message.mqtt_shared
    if cached is None:
        props = message.mqtt_props
        if props is None:
            props = user_properties(message.headers) if message.headers else b""
        cached = message.mqtt_shared = (utf8(message.topic), props)
    return cached


def plain_head(message: Message, v5: bool) -> bytes:
    """The head of a QoS 0 PUBLISH of ``message`` without RETAIN or properties of its own,
    made once per message and protocol version (3.1.1, 5.0), when first needed."""
    heads = message.mqtt_heads
    if heads is None:
        heads = message.mqtt_heads = [b"", b""]
    head = heads[v5]
    if not head:
        topic_bytes, props = shared(message)
        size = len(topic_bytes) + message.size
        if v5:
            prop_head = varint(len(props))
            size += len(prop_head) + len(props)
            head = bytes((PUBLISH_TYPE,)) + varint(size) + topic_bytes + prop_head + props
        else:
            head = bytes((PUBLISH_TYPE,)) + varint(size) + topic_bytes
        heads[v5] = head
    return head


def delivery_properties(
    expiry: int | None, subscription_ids: tuple[int, ...] | list[int], alias: int = 0
) -> bytes:
    """The v5 properties of one delivery: remaining expiry, subscription ids, topic alias."""
    parts = b""
    if expiry is not None:
        parts += bytes((PROP_MESSAGE_EXPIRY,)) + _U32.pack(expiry)
    for sid in subscription_ids:
        parts += bytes((PROP_SUBSCRIPTION_ID,)) + varint(sid)
    if alias:
        parts += bytes((PROP_TOPIC_ALIAS,)) + _U16.pack(alias)
    return parts


def append_publish(
    parts: list[bytes | memoryview],
    message: Message,
    *,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int,
    v5: bool,
    extra: bytes = b"",
    topic: bytes | None = None,
) -> int:
    """Append one PUBLISH of ``message`` to ``parts``; returns its size in bytes.

    ``extra`` is the delivery's own v5 properties (``delivery_properties``); ``topic``
    replaces the topic (an empty one, when a topic alias stands for it)."""
    if not qos and not retain and not extra and topic is None:
        # the same packet for every such delivery: its head made once per message and version
        head = plain_head(message, v5)
        parts.append(head)
        parts.append(message.payload)
        return len(head) + message.size
    topic_bytes, props = shared(message)
    if topic is not None:
        topic_bytes = topic
    payload = message.payload
    length = len(topic_bytes) + len(payload)
    if qos:
        length += 2
    if v5:
        prop_len = len(props) + len(extra)
        prop_head = varint(prop_len)
        length += len(prop_head) + prop_len
    first = PUBLISH_TYPE | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    head = bytes((first,)) + varint(length) + topic_bytes
    if qos:
        head += _U16.pack(packet_id)
    if v5:
        head += prop_head
        if props:
            head += props
        if extra:
            head += extra
    parts.append(head)
    parts.append(payload)
    return len(head) + len(payload)
