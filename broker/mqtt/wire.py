"""MQTT data representations (spec 1.5): variable byte integers, UTF-8 strings and binary
data (each with a two-byte length), read with explicit bounds checks so that bad input can
only raise ``MqttError`` (MALFORMED_PACKET), never IndexError or UnicodeDecodeError."""

from __future__ import annotations

import struct

from broker.mqtt.errors import MqttError
from broker.mqtt.reasons import MALFORMED_PACKET

__all__ = [
    "MAX_VARINT",
    "decode_utf8",
    "read_binary",
    "read_string",
    "read_varint",
    "varint",
    "write_binary",
    "write_string",
]

#: The largest value a variable byte integer can carry (4 bytes, spec 1.5.5).
MAX_VARINT = 268_435_455

_pack_H = struct.Struct(">H").pack
_unpack_H = struct.Struct(">H").unpack_from
# One-byte variable byte integers, built once: encoding looks them up.
_VARINT_1 = tuple(bytes((n,)) for n in range(128))


def varint(value: int) -> bytes:
    """A variable byte integer (spec 1.5.5), in the fewest bytes."""
    if 0 <= value < 128:
        return _VARINT_1[value]
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"{value} does not fit in a variable byte integer")
    out = bytearray()
    while True:
        digit = value & 0x7F
        value >>= 7
        if value:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


def write_string(text: str) -> bytes:
    """A UTF-8 encoded string: two-byte length, then the bytes."""
    raw = text.encode()
    return _pack_H(len(raw)) + raw


def write_binary(data: bytes) -> bytes:
    """Binary data: two-byte length, then the bytes."""
    return _pack_H(len(data)) + data


def read_varint(data: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
    """The variable byte integer at ``pos`` and the position after it."""
    value = 0
    shift = 0
    for i in range(pos, min(pos + 4, end)):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and i > pos:
                raise MqttError(MALFORMED_PACKET, f"{where}: variable byte integer not minimal")
            return value, i + 1
        shift += 7
    if end - pos >= 4:
        raise MqttError(MALFORMED_PACKET, f"{where}: variable byte integer longer than 4 bytes")
    raise MqttError(MALFORMED_PACKET, f"{where}: truncated (variable byte integer)")


def read_binary(data: bytes, pos: int, end: int, where: str) -> tuple[bytes, int]:
    """The binary data at ``pos`` and the position after it."""
    if pos + 2 > end:
        raise MqttError(MALFORMED_PACKET, f"{where}: truncated (length of binary data)")
    stop = pos + 2 + _unpack_H(data, pos)[0]
    if stop > end:
        raise MqttError(MALFORMED_PACKET, f"{where}: binary data runs past the packet")
    return bytes(data[pos + 2 : stop]), stop


def read_string(data: bytes, pos: int, end: int, where: str) -> tuple[str, int]:
    """The UTF-8 encoded string at ``pos`` and the position after it. Refuses what spec 1.5.4
    calls malformed: ill-formed UTF-8 (surrogates included) and U+0000."""
    if pos + 2 > end:
        raise MqttError(MALFORMED_PACKET, f"{where}: truncated (length of string)")
    stop = pos + 2 + _unpack_H(data, pos)[0]
    if stop > end:
        raise MqttError(MALFORMED_PACKET, f"{where}: string runs past the packet")
    return decode_utf8(data[pos + 2 : stop], where), stop


def decode_utf8(raw: bytes, where: str) -> str:
    """``raw`` as text, or MALFORMED_PACKET for ill-formed UTF-8 or U+0000."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise MqttError(
            MALFORMED_PACKET, f"{where}: string is not valid UTF-8 (byte {exc.start})"
        ) from None
    if "\x00" in text:  # faster on the text than on the bytes, and the same test in UTF-8
        raise MqttError(MALFORMED_PACKET, f"{where}: string contains U+0000")
    return text
