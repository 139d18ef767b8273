"""Bytes in, packets out: the MQTT decoder for either end of a connection.

Operations:
  - ``receive_data(data)`` appends what the transport read (b"" is ignored: EOF is the
    caller's business, and a connection closed mid-packet simply ends).
  - ``next_packet()`` returns the next whole packet, or None while more bytes are needed.

Goal: work linear in the bytes received. Plan (as ``broker/wire/buffer.py``): one
``bytearray`` plus ``_pos``, the first byte not handed out; the consumed front is dropped when
it is the whole buffer (free) or at least half of it and over ``COMPACT_AT`` bytes.

Limit: ``receive_data`` reads the fixed header of every packet in what it is given, as soon
as the Remaining Length is there, and refuses a packet bigger than ``max_packet`` bytes (fixed
header included, as 5.0's Maximum Packet Size counts) *before* keeping its body: the bad
header and everything after it is dropped. So the buffer holds at most the whole packets fed
so far plus one partial packet of at most ``max_packet`` bytes. The error itself
(PACKET_TOO_LARGE, or MALFORMED_PACKET for a Remaining Length over 4 bytes) is raised by
``next_packet`` once the packets before it were handed out.

Errors: every problem with the input raises ``MqttError``, and only that; after one, every
call to ``next_packet`` raises it again, since the stream can no longer be trusted.

Versions: a server-side decoder reads the first packet, which must be CONNECT, in any version
(3 "MQIsdp", 4 and 5 "MQTT"), and from then on reads the layout of the CONNECT's level,
kept in ``protocol_level``. A client-side decoder is told the level. While a CONNECT is being
checked, ``protocol_level`` is set as soon as its (supported) level is read, so that after an
error in the rest of the CONNECT the front end knows which CONNACK to answer with; when it
stays None the level itself was refused (UNSUPPORTED_PROTOCOL_VERSION), and a 3.1.1 CONNACK
with V3_UNACCEPTABLE_PROTOCOL_VERSION is the answer every version understands.

What is checked (spec sections are 5.0's, 3.1.1 agrees unless said): everything the spec calls
a Malformed Packet or a Protocol Error that can be seen in one packet without session state:
packet type and direction, reserved flag bits (2.1.3), QoS 3 (3.3.1.2), DUP with QoS 0 (5.0
only: 3.1.1 lets the receiver ignore it), Packet Identifier 0 (2.2.1), UTF-8 strings (1.5.4),
CONNECT's protocol name, level, reserved bit and Will/password flags (3.1.2), property rules
(``properties``), subscription options (3.8.3.1), empty SUBSCRIBE/UNSUBSCRIBE, reason codes
each packet may carry (``reasons``), a Remaining Length that does not match the content, a
second CONNECT, a Subscription Identifier in a PUBLISH from a client (3.3.4), an empty topic
without a Topic Alias, an AUTH without Authentication Method (3.15.2.2.2), and ``+``/``#`` in
a PUBLISH or Will topic (TOPIC_NAME_INVALID). PUBLISH is read here, on the hot path; every
other packet by ``readers``.

Left to the front end, which has the state or the routing rules: topic and filter syntax
(levels, wildcard placement, length, ``$share``, No Local on shared subscriptions), Topic
Alias above the negotiated maximum, Client Identifier rules, Receive Maximum, packet
identifiers in use, a Session Expiry Interval in DISCONNECT after 0 in CONNECT, AUTH when
CONNECT had no Authentication Method, and a Payload Format Indicator of 1 with a payload that
is not UTF-8.
"""

from __future__ import annotations

import struct

from broker.mqtt import packets as p
from broker.mqtt import reasons as r
from broker.mqtt.errors import MqttError
from broker.mqtt.packets import Packet, Properties
from broker.mqtt.readers import (
    read_ack,
    read_connack,
    read_connect,
    read_connect_level,
    read_disconnect_or_auth,
    read_packet_id,
    read_properties,
    read_suback,
    read_subscribe,
    read_unsuback,
    read_unsubscribe,
)
from broker.mqtt.wire import MAX_VARINT

__all__ = ["COMPACT_AT", "DEFAULT_MAX_PACKET", "Decoder"]

#: Default limit on a packet's size, fixed header included (1 MiB, as the native protocol).
DEFAULT_MAX_PACKET = 1 << 20
#: Compact once this many consumed bytes sit at the front (and they are half the buffer).
COMPACT_AT = 1 << 16
# Payloads at least this long are copied out through a memoryview (one copy, not two).
_VIEW_AT = 4096

_unpack_H = struct.Struct(">H").unpack_from
_MALFORMED = r.MALFORMED_PACKET
_PROTOCOL = r.PROTOCOL_ERROR
_NAMES = p.PACKET_NAMES
# The flags (low nibble of the first byte) every packet type but PUBLISH must have (2.1.3).
_FLAGS = (0, 0, 0, None, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)
_SERVER_RECEIVES = frozenset(
    {p.PUBLISH, p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP, p.SUBSCRIBE, p.UNSUBSCRIBE}
    | {p.PINGREQ, p.DISCONNECT, p.AUTH}
)
_CLIENT_RECEIVES = frozenset(
    {p.CONNACK, p.PUBLISH, p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP, p.SUBACK, p.UNSUBACK}
    | {p.PINGRESP, p.DISCONNECT, p.AUTH}
)


class Decoder:
    """Cuts a byte stream into MQTT packets for one end of a connection; see the module
    docstring. ``server=True`` reads what a client sends (CONNECT first); ``server=False``
    reads what a server sends and needs ``protocol_level``. ``max_packet`` may be lowered
    later (e.g. to the negotiated Maximum Packet Size) and applies to headers not read yet."""

    __slots__ = (
        "_buf",
        "_connected",
        "_error",
        "_error_at",
        "_pos",
        "_receives",
        "_scan",
        "max_packet",
        "plain_publishes",
        "protocol_level",
        "server",
    )

    def __init__(
        self,
        *,
        server: bool = True,
        max_packet: int = DEFAULT_MAX_PACKET,
        protocol_level: int | None = None,
    ) -> None:
        if not 2 <= max_packet <= MAX_VARINT + 5:
            raise ValueError(f"max_packet must be in 2..{MAX_VARINT + 5}, got {max_packet}")
        if protocol_level not in (None, 3, 4, 5):
            raise ValueError(f"protocol_level must be 3, 4 or 5, got {protocol_level}")
        if not server and protocol_level is None:
            raise ValueError("a client-side Decoder needs the protocol_level it connected with")
        self.server = server
        self.max_packet = max_packet
        #: The protocol level in use (3, 4 or 5), or None before the CONNECT (server side).
        self.protocol_level = protocol_level
        self._receives = _SERVER_RECEIVES if server else _CLIENT_RECEIVES
        self._connected = not server
        self._buf = bytearray()
        self._pos = 0
        # Start of the first packet whose header is unread or whose body is incomplete.
        self._scan = 0
        # An error found in the stream: raised once _pos reaches _error_at, then forever.
        self._error: MqttError | None = None
        self._error_at = 0
        #: Hand out a plain PUBLISH (QoS 0, no DUP, RETAIN or properties) as a
        #: ``PlainPublish`` tuple instead of a ``Publish`` (the MQTT front end's reader,
        #: whose hot path it is): the same packet, checked the same way, without the objects.
        self.plain_publishes = False

    @property
    def buffered(self) -> int:
        """Bytes held and not handed out yet."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        """Append received bytes and check the size of every packet they start."""
        if not data or self._error is not None:
            return  # nothing to add, or the stream is broken: keep nothing more
        self._buf += data
        self._check_headers()

    def next_packet(self) -> Packet | p.PlainPublish | None:
        """The next whole packet, or None when more bytes are needed; raises MqttError. With
        ``plain_publishes``, a plain PUBLISH comes as a ``PlainPublish`` tuple."""
        pos = self._pos
        if pos == self._scan:
            if self._error is not None and pos >= self._error_at:
                raise self._error
            return None
        buf = self._buf
        first = buf[pos]
        length = buf[pos + 1]
        start = pos + 2
        if length & 0x80:  # a longer Remaining Length, already checked by _check_headers
            length &= 0x7F
            shift = 7
            while True:
                byte = buf[start]
                start += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
        end = start + length
        try:
            if not self._connected:
                packet: Packet | p.PlainPublish = self._other(first, buf, start, end)
            elif first == 0x30 and self.plain_publishes:  # QoS 0, no DUP, no RETAIN
                packet = self._plain(buf, pos, start, end)
            elif first >> 4 == 3:
                packet = self._publish(first, buf, start, end)
            elif first == 0x40 and length == 2:  # a PUBACK with no reason code: QoS 1's path
                packet = p.PubAck(read_packet_id(buf, start, end, "PUBACK"))
            else:
                packet = self._other(first, buf, start, end)
        except MqttError as exc:
            self._fail(exc, pos)
            raise
        except (LookupError, ValueError, struct.error) as exc:  # a bug here, not the peer's
            error = MqttError(_MALFORMED, f"{_NAMES[first >> 4]}: decoder bug: {exc!r}")
            self._fail(error, pos)
            raise error from exc
        self._pos = end
        if end == len(buf):
            buf.clear()
            self._pos = self._scan = self._error_at = 0
        elif end >= COMPACT_AT and 2 * end >= len(buf):
            del buf[:end]
            self._pos = 0
            self._scan -= end
            self._error_at -= end
        return packet

    # -- framing -------------------------------------------------------------------------

    def _check_headers(self) -> None:
        """Advance ``_scan`` over whole packets, checking each fixed header once."""
        buf = self._buf
        size = len(buf)
        scan = self._scan
        limit = self.max_packet
        while scan + 2 <= size:
            length = buf[scan + 1]
            start = scan + 2
            if length & 0x80:
                length &= 0x7F
                shift = 7
                while True:
                    if start == size:
                        self._scan = scan
                        return  # the Remaining Length is not all there yet
                    byte = buf[start]
                    start += 1
                    length |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        break
                    if shift == 21:
                        self._broken(
                            MqttError(_MALFORMED, "Remaining Length longer than 4 bytes"), scan
                        )
                        return
                    shift += 7
                if byte == 0:
                    self._broken(MqttError(_MALFORMED, "Remaining Length not minimal"), scan)
                    return
            total = start - scan + length
            if total > limit:
                name = _NAMES[buf[scan] >> 4] if buf[scan] >> 4 else "packet"
                text = f"{name} of {total} bytes exceeds the maximum packet size of {limit}"
                self._broken(MqttError(r.PACKET_TOO_LARGE, text), scan)
                return
            if scan + total > size:
                break
            scan += total
        self._scan = scan

    def _broken(self, error: MqttError, at: int) -> None:
        """Record an error found at ``at`` by the header check and drop what follows."""
        self._error = error
        self._error_at = at
        self._scan = at
        del self._buf[at:]

    def _fail(self, error: MqttError, at: int) -> None:
        """Record an error in the packet at ``at``: it and everything after are dropped."""
        self._broken(error, at)
        self._pos = at

    # -- packets -------------------------------------------------------------------------

    def _publish(self, first: int, buf: bytearray, pos: int, end: int) -> p.Publish:
        """PUBLISH, the hot path: a few slices and unpacks, properties only when present."""
        qos = (first >> 1) & 3
        if qos == 3:
            raise MqttError(_MALFORMED, "PUBLISH: QoS 3 is not valid")
        v5 = self.protocol_level == 5
        dup = (first & 8) != 0
        if dup and not qos and v5:
            raise MqttError(_MALFORMED, "PUBLISH: DUP is set on a QoS 0 message")
        if pos + 2 > end:
            raise MqttError(_MALFORMED, "PUBLISH: truncated (topic length)")
        stop = pos + 2 + _unpack_H(buf, pos)[0]
        if stop > end:
            raise MqttError(_MALFORMED, "PUBLISH: topic runs past the packet")
        try:
            topic = buf[pos + 2 : stop].decode()
        except UnicodeDecodeError as exc:
            raise MqttError(
                _MALFORMED, f"PUBLISH: topic is not valid UTF-8 (byte {exc.start})"
            ) from None
        # Checked on the text: a str search is several times faster than one on a bytearray,
        # and in UTF-8 these bytes only ever stand for these characters.
        if "\x00" in topic:
            raise MqttError(_MALFORMED, "PUBLISH: topic contains U+0000")
        if "+" in topic or "#" in topic:
            raise MqttError(r.TOPIC_NAME_INVALID, f"PUBLISH: topic {topic!r} has a wildcard")
        pos = stop
        packet_id = None
        if qos:
            if pos + 2 > end:
                raise MqttError(_MALFORMED, "PUBLISH: truncated (packet identifier)")
            packet_id = _unpack_H(buf, pos)[0]
            if not packet_id:
                raise MqttError(_PROTOCOL, "PUBLISH: packet identifier 0")
            pos += 2
        if v5:
            if pos >= end:
                raise MqttError(_MALFORMED, "PUBLISH: truncated (property length)")
            if buf[pos]:
                props, pos = read_properties(buf, pos, end, p.PUBLISH)
                if props.subscription_identifiers and self.server:
                    raise MqttError(
                        _PROTOCOL, "PUBLISH: a client may not send a Subscription Identifier"
                    )
                if not topic and props.topic_alias is None:
                    raise MqttError(_PROTOCOL, "PUBLISH: empty topic and no Topic Alias")
            else:
                props = Properties()
                pos += 1
                if not topic:
                    raise MqttError(_PROTOCOL, "PUBLISH: empty topic and no Topic Alias")
        else:
            props = Properties()
            if not topic:
                raise MqttError(_PROTOCOL, "PUBLISH: empty topic")
        if end - pos < _VIEW_AT:
            payload = bytes(buf[pos:end])
        else:
            with memoryview(buf) as view:
                payload = view[pos:end].tobytes()
        return p.Publish(topic, payload, qos, (first & 1) != 0, dup, packet_id, props)

    def _plain(self, buf: bytearray, at: int, pos: int, end: int) -> p.PlainPublish | p.Publish:
        """A PUBLISH whose first byte is 0x30 (QoS 0, no DUP, no RETAIN; the packet starts
        at ``at``, its body at ``pos``): a ``PlainPublish`` when it has a topic and (5.0)
        no properties; anything else, and every error, is ``_publish``'s to read."""
        v5 = self.protocol_level == 5
        if pos + 2 <= end:
            stop = pos + 2 + _unpack_H(buf, pos)[0]
            body = stop + 1 if v5 else stop
            if pos + 2 < stop and body <= end and not (v5 and buf[stop]):
                try:
                    topic = buf[pos + 2 : stop].decode()
                except UnicodeDecodeError:
                    topic = "\x00"  # (so _publish says why)
                if "\x00" not in topic and "+" not in topic and "#" not in topic:
                    if end - body < _VIEW_AT:
                        payload = bytes(buf[body:end])
                    else:
                        with memoryview(buf) as view:
                            payload = view[body:end].tobytes()
                    return (topic, payload, bytes(buf[at:body]))
        return self._publish(0x30, buf, pos, end)

    def _other(self, first: int, buf: bytearray, pos: int, end: int) -> Packet:
        """Every packet but a PUBLISH after CONNECT: check type, direction and flags, then
        read the packet with the layout of the protocol level."""
        ptype = first >> 4
        name = _NAMES[ptype]
        level = self.protocol_level
        if not self._connected:
            if ptype != p.CONNECT:
                text = f"{name}: the first packet must be CONNECT" if ptype else ""
                text = text or "packet type 0 is reserved"
                raise MqttError(_PROTOCOL if ptype else _MALFORMED, text)
        elif ptype == 0 or (ptype == p.AUTH and level != 5):
            raise MqttError(
                _MALFORMED, f"packet type {ptype} is reserved at protocol level {level}"
            )
        elif ptype not in self._receives or (
            ptype == p.DISCONNECT and not self.server and level != 5
        ):
            if ptype == p.CONNECT and self.server:
                raise MqttError(_PROTOCOL, "CONNECT: a second CONNECT on the connection")
            side = "server" if self.server else "client"
            raise MqttError(_PROTOCOL, f"{name}: a {side} never receives this packet")
        if first & 0x0F != _FLAGS[ptype]:
            raise MqttError(
                _MALFORMED, f"{name}: reserved flags are 0x{first & 0x0F:X}, not {_FLAGS[ptype]}"
            )
        if ptype == p.CONNECT:
            self.protocol_level, pos = read_connect_level(buf, pos, end)
            # Known from here on, even if the rest is bad: it says which CONNACK to answer.
            packet: Packet = read_connect(buf, pos, end, self.protocol_level)
            self._connected = True
            return packet
        v5 = level == 5
        if p.PUBACK <= ptype <= p.PUBCOMP:
            return read_ack(ptype, buf, pos, end, v5)
        if ptype == p.SUBSCRIBE:
            return read_subscribe(buf, pos, end, v5)
        if ptype == p.UNSUBSCRIBE:
            return read_unsubscribe(buf, pos, end, v5)
        if ptype == p.PINGREQ or ptype == p.PINGRESP:
            if end != pos:
                raise MqttError(_MALFORMED, f"{name}: Remaining Length is {end - pos}, not 0")
            return p.PingReq() if ptype == p.PINGREQ else p.PingResp()
        if ptype == p.DISCONNECT or ptype == p.AUTH:
            return read_disconnect_or_auth(ptype, buf, pos, end, v5)
        if ptype == p.CONNACK:
            return read_connack(buf, pos, end, v5)
        if ptype == p.SUBACK:
            return read_suback(buf, pos, end, v5)
        return read_unsuback(buf, pos, end, v5)  # UNSUBACK is the only type left
