"""A minimal MQTT 3.1.1 codec for the benchmarks' lean clients: bytes in, events out.

A measuring tool, not the broker's MQTT front end (that is a separate piece of work): it
speaks just what the benchmarks need, QoS 0 and clean sessions:

- client -> server: CONNECT, SUBSCRIBE, UNSUBSCRIBE, PUBLISH (QoS 0), PINGREQ, DISCONNECT;
- server -> client: CONNACK, SUBACK, UNSUBACK, PUBLISH, PINGRESP.

``Parser`` decodes both directions (the tests round-trip every encoder through it). No I/O:
``Parser.feed(data)`` takes what one read returned and gives back every whole packet in it,
in order; a packet split across reads waits in the buffer. A PUBLISH comes back as a plain
``(topic, payload)`` tuple (the hot path of a subscriber: no object per message); every other
packet as one of the small frozen classes below. A remaining length above ``max_packet`` is
refused before its body is buffered (``MqttError``), as the broker's own frame buffer does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PROTOCOL_NAME: Final = b"MQTT"
PROTOCOL_LEVEL: Final = 4  # 3.1.1
MAX_REMAINING: Final = 268_435_455  # four bytes of variable-length integer
DEFAULT_MAX_PACKET: Final = 16 * 1024 * 1024

CONNECT: Final = 0x10
CONNACK: Final = 0x20
PUBLISH: Final = 0x30
SUBSCRIBE: Final = 0x82  # type 8 with the reserved flags 0b0010
SUBACK: Final = 0x90
UNSUBSCRIBE: Final = 0xA2
UNSUBACK: Final = 0xB0
PINGREQ_BYTE: Final = 0xC0
PINGRESP_BYTE: Final = 0xD0
DISCONNECT_BYTE: Final = 0xE0

PINGREQ: Final = bytes((PINGREQ_BYTE, 0))
PINGRESP: Final = bytes((PINGRESP_BYTE, 0))
DISCONNECT: Final = bytes((DISCONNECT_BYTE, 0))
SUBACK_FAILURE: Final = 0x80


class MqttError(ValueError):
    """Bytes that are not MQTT 3.1.1 as this codec knows it."""


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    keepalive: int
    clean_session: bool


@dataclass(frozen=True, slots=True)
class ConnAck:
    session_present: bool
    return_code: int  # 0: accepted


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    filters: tuple[tuple[str, int], ...]  # (filter, requested QoS)


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    return_codes: tuple[int, ...]  # granted QoS per filter, or 0x80: refused


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    pass


Event = (
    tuple[str, bytes]
    | Connect
    | ConnAck
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
)
_BODILESS: Final = {
    PINGREQ_BYTE: PingReq(),
    PINGRESP_BYTE: PingResp(),
    DISCONNECT_BYTE: Disconnect(),
}


# -- encoders -------------------------------------------------------------------------------


def remaining_length(n: int) -> bytes:
    """The variable-length integer of MQTT (7 bits per byte, high bit: more follow)."""
    if not 0 <= n <= MAX_REMAINING:
        raise MqttError(f"remaining length {n} out of range")
    if n < 128:
        return bytes((n,))
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise MqttError("string longer than 65,535 bytes")
    return len(raw).to_bytes(2, "big") + raw


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def _packet_id(packet_id: int) -> bytes:
    if not 1 <= packet_id <= 0xFFFF:
        raise MqttError(f"packet id {packet_id} out of 1..65535")
    return packet_id.to_bytes(2, "big")


def encode_connect(client_id: str, keepalive: int = 0, clean_session: bool = True) -> bytes:
    """CONNECT without will, user name or password; ``keepalive`` 0 turns keep-alive off."""
    flags = 0x02 if clean_session else 0
    body = _string("MQTT") + bytes((PROTOCOL_LEVEL, flags)) + keepalive.to_bytes(2, "big")
    return _packet(CONNECT, body + _string(client_id))


def encode_connack(return_code: int = 0, session_present: bool = False) -> bytes:
    return bytes((CONNACK, 2, int(session_present), return_code))


def encode_publish(topic: str, payload: bytes) -> bytes:
    """PUBLISH at QoS 0, not retained (so no packet id)."""
    raw = topic.encode()
    size = 2 + len(raw) + len(payload)
    if size < 128:  # most of a benchmark's packets: no loop, one join
        return b"".join((bytes((PUBLISH, size)), len(raw).to_bytes(2, "big"), raw, payload))
    return b"".join(
        (bytes((PUBLISH,)), remaining_length(size), len(raw).to_bytes(2, "big"), raw, payload)
    )


def encode_subscribe(packet_id: int, filters: list[str], qos: int = 0) -> bytes:
    body = _packet_id(packet_id) + b"".join(_string(f) + bytes((qos,)) for f in filters)
    return _packet(SUBSCRIBE, body)


def encode_suback(packet_id: int, return_codes: list[int]) -> bytes:
    return _packet(SUBACK, _packet_id(packet_id) + bytes(return_codes))


def encode_unsubscribe(packet_id: int, filters: list[str]) -> bytes:
    return _packet(UNSUBSCRIBE, _packet_id(packet_id) + b"".join(_string(f) for f in filters))


def encode_unsuback(packet_id: int) -> bytes:
    return _packet(UNSUBACK, _packet_id(packet_id))


# -- decoder --------------------------------------------------------------------------------


def _read_string(body: bytes | memoryview, pos: int) -> tuple[str, int]:
    if pos + 2 > len(body):
        raise MqttError("string length past the end of the packet")
    end = pos + 2 + int.from_bytes(body[pos : pos + 2], "big")
    if end > len(body):
        raise MqttError("string past the end of the packet")
    try:
        return bytes(body[pos + 2 : end]).decode(), end
    except UnicodeDecodeError as exc:
        raise MqttError(f"string is not UTF-8: {exc}") from None


def _two(body: bytes, what: str) -> int:
    if len(body) < 2:
        raise MqttError(f"{what} without a packet id")
    return int.from_bytes(body[:2], "big")


def decode_packet(first: int, body: bytes) -> Event:
    """One packet from its first byte and its body (what follows the remaining length)."""
    kind = first & 0xF0
    if kind == PUBLISH:
        topic, pos = _read_string(body, 0)
        if first & 0x06:  # QoS 1 or 2: a packet id before the payload
            pos += 2
            if pos > len(body):
                raise MqttError("PUBLISH too short for its packet id")
        return (topic, bytes(body[pos:]))
    if first == CONNACK:
        if len(body) != 2:
            raise MqttError(f"CONNACK of {len(body)} bytes")
        return ConnAck(bool(body[0] & 1), body[1])
    if first == SUBACK:
        return SubAck(_two(body, "SUBACK"), tuple(body[2:]))
    if first == UNSUBACK:
        if len(body) != 2:
            raise MqttError(f"UNSUBACK of {len(body)} bytes")
        return UnsubAck(_two(body, "UNSUBACK"))
    bodiless = _BODILESS.get(first)
    if bodiless is not None:
        if body:
            raise MqttError(f"packet 0x{first:02x} with a body")
        return bodiless
    if first == SUBSCRIBE:
        packet_id = _two(body, "SUBSCRIBE")
        pos, wanted = 2, []
        while pos < len(body):
            text, pos = _read_string(body, pos)
            if pos >= len(body):
                raise MqttError("SUBSCRIBE filter without its QoS byte")
            wanted.append((text, body[pos]))
            pos += 1
        return Subscribe(packet_id, tuple(wanted))
    if first == UNSUBSCRIBE:
        packet_id = _two(body, "UNSUBSCRIBE")
        pos, names = 2, []
        while pos < len(body):
            text, pos = _read_string(body, pos)
            names.append(text)
        return Unsubscribe(packet_id, tuple(names))
    if first == CONNECT:
        name, pos = _read_string(body, 0)
        if name != "MQTT" or len(body) < pos + 4:
            raise MqttError(f"CONNECT for protocol {name!r}")
        flags = body[pos + 1]
        keepalive = int.from_bytes(body[pos + 2 : pos + 4], "big")
        client_id, _ = _read_string(body, pos + 4)
        return Connect(client_id, keepalive, bool(flags & 0x02))
    raise MqttError(f"unexpected packet type 0x{first:02x}")


class Parser:
    """Bytes in, whole packets out; see the module docstring."""

    def __init__(self, max_packet: int = DEFAULT_MAX_PACKET) -> None:
        self.max_packet = max_packet
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of a packet not yet whole."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Event]:
        buf = self._buf
        buf += data
        out: list[Event] = []
        pos, end_buf = 0, len(buf)
        while end_buf - pos >= 2:
            first = buf[pos]
            # The remaining length: 1 to 4 bytes, 7 bits each.
            size = buf[pos + 1]
            head = pos + 2
            if size & 0x80:
                size &= 0x7F
                shift = 7
                while True:
                    if head >= end_buf:
                        size = -1  # the length itself is not whole yet
                        break
                    byte = buf[head]
                    head += 1
                    size |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift > 21:
                        raise MqttError("remaining length longer than 4 bytes")
                if size < 0:
                    break
            if size > self.max_packet:
                raise MqttError(f"packet of {size} bytes, more than {self.max_packet}")
            end = head + size
            if end > end_buf:
                break
            if first == PUBLISH:  # QoS 0, the hot path: inline
                if size < 2:
                    raise MqttError("PUBLISH too short for its topic")
                topic_end = head + 2 + ((buf[head] << 8) | buf[head + 1])
                if topic_end > end:
                    raise MqttError("PUBLISH topic past the end of the packet")
                try:
                    topic = buf[head + 2 : topic_end].decode()
                except UnicodeDecodeError as exc:
                    raise MqttError(f"topic is not UTF-8: {exc}") from None
                out.append((topic, bytes(buf[topic_end:end])))
            else:
                out.append(decode_packet(first, bytes(buf[head:end])))
            pos = end
        if pos:
            del buf[:pos]
        return out
