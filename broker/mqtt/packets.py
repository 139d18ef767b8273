"""MQTT control packets as plain values, one dataclass per packet type, shared by 3.1, 3.1.1
and 5.0.

The classes are mutable ``@dataclass(slots=True)`` values that compare by fields. They do not
validate when built: the decoder (``codec.Decoder``) checks what arrives, and the encoder
trusts what the broker builds. Fields that only exist in 5.0 (``properties``, most reason
codes) are ignored when encoding 3.1.1, and take their defaults when decoding it.

``protocol_level`` is the byte on the wire: 3 is MQTT 3.1 ("MQIsdp"), 4 is 3.1.1 and 5 is 5.0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "AUTH",
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
    "PACKET_NAMES",
    "PINGREQ",
    "PINGRESP",
    "PUBACK",
    "PUBCOMP",
    "PUBLISH",
    "PUBREC",
    "PUBREL",
    "SUBACK",
    "SUBSCRIBE",
    "UNSUBACK",
    "UNSUBSCRIBE",
    "WILL_PROPERTIES",
    "Auth",
    "ConnAck",
    "Connect",
    "Disconnect",
    "Packet",
    "PingReq",
    "PingResp",
    "Properties",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "Will",
]

#: Protocol levels (the CONNECT "Protocol Level" / "Protocol Version" byte).
MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5

# Packet types: the high nibble of the first byte (spec 2.1.2).
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15
#: Not a packet type: the key of the Will Properties in property tables (type 0 is reserved).
WILL_PROPERTIES = 0

#: Packet type -> name, for error texts.
PACKET_NAMES: dict[int, str] = {
    0: "Will",
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
}


@dataclass(slots=True)
class Properties:
    """MQTT 5.0 properties (spec 2.2.2.2); None means absent. Each packet type allows only
    some of them (``properties.ALLOWED``). Only the two list fields may hold several values:
    ``subscription_identifiers`` (several only in a PUBLISH from the server) and
    ``user_properties`` (name/value pairs in wire order, repeats allowed)."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:
        """Only the properties that are set: most packets carry none or few."""
        shown = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is not None and value != []:
                shown.append(f"{name}={value!r}")
        return f"Properties({', '.join(shown)})"


@dataclass(slots=True)
class Will:
    """The Will Message of a CONNECT: published by the server if the connection ends badly."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    """CONNECT (client -> server, first packet). ``protocol_level`` 3, 4 or 5; ``clean_start``
    is 3.1.1's Clean Session flag. 3.1.1 allows a password only with a user name."""

    client_id: str
    protocol_level: int = MQTT_3_1_1
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class ConnAck:
    """CONNACK (server -> client). ``reason_code`` is the 5.0 reason code, or for 3.x the
    return code 0-5 as it is (see ``reasons.v3_connack_code``)."""

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Publish:
    """PUBLISH (both ways). ``packet_id`` is present exactly when ``qos`` > 0. In 5.0 the topic
    may be empty when ``properties.topic_alias`` names it."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubAck:
    """PUBACK: answers a QoS 1 PUBLISH. Reason code and properties are 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubRec:
    """PUBREC: first answer to a QoS 2 PUBLISH."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubRel:
    """PUBREL: answers PUBREC."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubComp:
    """PUBCOMP: answers PUBREL, ending a QoS 2 exchange."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its options; the last three are 5.0 only."""

    filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE (client -> server): at least one subscription."""

    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubAck:
    """SUBACK (server -> client): one code per subscription (3.1.1: 0, 1, 2 or 0x80)."""

    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (client -> server): at least one filter."""

    packet_id: int
    filters: list[str]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class UnsubAck:
    """UNSUBACK (server -> client): one code per filter in 5.0; none in 3.1.1."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PingReq:
    """PINGREQ (client -> server)."""


@dataclass(slots=True)
class PingResp:
    """PINGRESP (server -> client)."""


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT: client -> server in 3.x; both ways in 5.0, with a reason code."""

    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Auth:
    """AUTH (5.0 only, both ways): a step of enhanced authentication."""

    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


#: A plain PUBLISH as a server's ``Decoder`` with ``plain_publishes`` hands it out: QoS 0, no
#: DUP, RETAIN or properties, a topic: (topic, payload, head), ``head`` being the packet's
#: bytes before the payload. It stands for ``Publish(topic, payload)``, and ``head`` is also
#: that message's PUBLISH head for subscribers of the publisher's protocol version (the same
#: packet goes out), so the fan-out path reuses it instead of encoding one.
PlainPublish = tuple[str, bytes, bytes]

Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
