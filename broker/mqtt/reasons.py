"""MQTT reason codes: every MQTT 5.0 code (spec 2.4), the 3.1.1 CONNACK return codes
(3.1.1 spec 3.2.2.3), and the codes each 5.0 packet type may carry.

A code below 0x80 means success; 0x80 and above means failure. Several 5.0 codes share a value
(0x00 is SUCCESS, NORMAL_DISCONNECTION and GRANTED_QOS_0), so they are plain ints, not an enum.
"""

from __future__ import annotations

__all__ = [
    "ADMINISTRATIVE_ACTION",
    "AUTH_CODES",
    "BAD_AUTHENTICATION_METHOD",
    "BAD_USER_NAME_OR_PASSWORD",
    "BANNED",
    "CLIENT_IDENTIFIER_NOT_VALID",
    "CONNACK_CODES",
    "CONNECTION_RATE_EXCEEDED",
    "CONTINUE_AUTHENTICATION",
    "DISCONNECT_CODES",
    "DISCONNECT_WITH_WILL",
    "DISCONNECT_WITH_WILL_MESSAGE",
    "GRANTED_QOS_0",
    "GRANTED_QOS_1",
    "GRANTED_QOS_2",
    "IMPLEMENTATION_SPECIFIC_ERROR",
    "KEEP_ALIVE_TIMEOUT",
    "MALFORMED_PACKET",
    "MAXIMUM_CONNECT_TIME",
    "MESSAGE_RATE_TOO_HIGH",
    "NAMES",
    "NORMAL_DISCONNECTION",
    "NOT_AUTHORIZED",
    "NO_MATCHING_SUBSCRIBERS",
    "NO_SUBSCRIPTION_EXISTED",
    "PACKET_IDENTIFIER_IN_USE",
    "PACKET_IDENTIFIER_NOT_FOUND",
    "PACKET_TOO_LARGE",
    "PAYLOAD_FORMAT_INVALID",
    "PROTOCOL_ERROR",
    "PUBACK_CODES",
    "PUBREL_CODES",
    "QOS_NOT_SUPPORTED",
    "QUOTA_EXCEEDED",
    "RECEIVE_MAXIMUM_EXCEEDED",
    "RETAIN_NOT_SUPPORTED",
    "RE_AUTHENTICATE",
    "SERVER_BUSY",
    "SERVER_MOVED",
    "SERVER_SHUTTING_DOWN",
    "SERVER_UNAVAILABLE",
    "SESSION_TAKEN_OVER",
    "SHARED_SUBSCRIPTIONS_NOT_SUPPORTED",
    "SUBACK_CODES",
    "SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED",
    "SUCCESS",
    "TOPIC_ALIAS_INVALID",
    "TOPIC_FILTER_INVALID",
    "TOPIC_NAME_INVALID",
    "UNSPECIFIED_ERROR",
    "UNSUBACK_CODES",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "USE_ANOTHER_SERVER",
    "V3_ACCEPTED",
    "V3_BAD_USER_NAME_OR_PASSWORD",
    "V3_CONNACK_CODES",
    "V3_IDENTIFIER_REJECTED",
    "V3_NOT_AUTHORIZED",
    "V3_SERVER_UNAVAILABLE",
    "V3_SUBACK_CODES",
    "V3_SUBACK_FAILURE",
    "V3_UNACCEPTABLE_PROTOCOL_VERSION",
    "WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED",
    "is_failure",
    "v3_connack_code",
]

# MQTT 5.0, spec 2.4 (Table 2-6).
SUCCESS = 0x00
NORMAL_DISCONNECTION = 0x00
GRANTED_QOS_0 = 0x00
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL_MESSAGE = 0x04
#: Short alias of DISCONNECT_WITH_WILL_MESSAGE.
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
RE_AUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_IN_USE = 0x91
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# MQTT 3.1.1 CONNACK return codes (3.1.1 spec 3.2.2.3, Table 3.1); 3.1 uses the same values.
V3_ACCEPTED = 0
V3_UNACCEPTABLE_PROTOCOL_VERSION = 1
V3_IDENTIFIER_REJECTED = 2
V3_SERVER_UNAVAILABLE = 3
V3_BAD_USER_NAME_OR_PASSWORD = 4
V3_NOT_AUTHORIZED = 5
#: The 3.1.1 SUBACK return code for a refused subscription (3.1.1 spec 3.9.3).
V3_SUBACK_FAILURE = 0x80

#: A readable name for each 5.0 value (the first name where values are shared), for texts.
NAMES: dict[int, str] = {
    0x00: "Success",
    0x01: "Granted QoS 1",
    0x02: "Granted QoS 2",
    0x04: "Disconnect with Will Message",
    0x10: "No matching subscribers",
    0x11: "No subscription existed",
    0x18: "Continue authentication",
    0x19: "Re-authenticate",
    0x80: "Unspecified error",
    0x81: "Malformed Packet",
    0x82: "Protocol Error",
    0x83: "Implementation specific error",
    0x84: "Unsupported Protocol Version",
    0x85: "Client Identifier not valid",
    0x86: "Bad User Name or Password",
    0x87: "Not authorized",
    0x88: "Server unavailable",
    0x89: "Server busy",
    0x8A: "Banned",
    0x8B: "Server shutting down",
    0x8C: "Bad authentication method",
    0x8D: "Keep Alive timeout",
    0x8E: "Session taken over",
    0x8F: "Topic Filter invalid",
    0x90: "Topic Name invalid",
    0x91: "Packet Identifier in use",
    0x92: "Packet Identifier not found",
    0x93: "Receive Maximum exceeded",
    0x94: "Topic Alias invalid",
    0x95: "Packet too large",
    0x96: "Message rate too high",
    0x97: "Quota exceeded",
    0x98: "Administrative action",
    0x99: "Payload format invalid",
    0x9A: "Retain not supported",
    0x9B: "QoS not supported",
    0x9C: "Use another server",
    0x9D: "Server moved",
    0x9E: "Shared Subscriptions not supported",
    0x9F: "Connection rate exceeded",
    0xA0: "Maximum connect time",
    0xA1: "Subscription Identifiers not supported",
    0xA2: "Wildcard Subscriptions not supported",
}

# The codes each 5.0 packet may carry (spec 3.2.2.2, 3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1,
# 3.9.3, 3.11.3, 3.14.2.1, 3.15.2.1). The decoder refuses others as a Malformed Packet.
CONNACK_CODES = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C}
    | {0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
#: PUBACK and PUBREC.
PUBACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
#: PUBREL and PUBCOMP.
PUBREL_CODES = frozenset({0x00, 0x92})
SUBACK_CODES = frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2})
UNSUBACK_CODES = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
DISCONNECT_CODES = frozenset(
    {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90}
    | {0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F}
    | {0xA0, 0xA1, 0xA2}
)
AUTH_CODES = frozenset({0x00, 0x18, 0x19})
#: 3.1 and 3.1.1 CONNACK return codes.
V3_CONNACK_CODES = frozenset(range(6))
#: 3.1.1 SUBACK return codes.
V3_SUBACK_CODES = frozenset({0x00, 0x01, 0x02, 0x80})

# The closest 3.1.1 CONNACK return code for a 5.0 refusal; anything else is "server
# unavailable", the 3.1.1 code that blames neither the client's identity nor its credentials.
_V3_CONNACK = {
    SUCCESS: V3_ACCEPTED,
    UNSUPPORTED_PROTOCOL_VERSION: V3_UNACCEPTABLE_PROTOCOL_VERSION,
    CLIENT_IDENTIFIER_NOT_VALID: V3_IDENTIFIER_REJECTED,
    BAD_USER_NAME_OR_PASSWORD: V3_BAD_USER_NAME_OR_PASSWORD,
    BAD_AUTHENTICATION_METHOD: V3_BAD_USER_NAME_OR_PASSWORD,
    NOT_AUTHORIZED: V3_NOT_AUTHORIZED,
    BANNED: V3_NOT_AUTHORIZED,
}


def is_failure(code: int) -> bool:
    """True for a 5.0 reason code that reports a failure (0x80 and above)."""
    return code >= 0x80


def v3_connack_code(v5_code: int) -> int:
    """The 3.1.1 CONNACK return code closest to a 5.0 CONNACK reason code.

    Identity, credential and authorization refusals keep their meaning; every other failure
    (server busy or moving, quota, rate, QoS or retain not supported, ...) becomes
    V3_SERVER_UNAVAILABLE. For a Malformed Packet or Protocol Error, 3.1.1 expects no CONNACK
    at all (the server just closes), so the caller should close rather than send this.
    """
    return _V3_CONNACK.get(v5_code, V3_SERVER_UNAVAILABLE)
