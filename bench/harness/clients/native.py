"""topiary's native protocol, shaped like the lean MQTT and NATS codecs beside it.

The frames and their encoding are the broker's own (broker/wire), but for SUB and UNSUB,
which are packed directly (no frame object, no client-side filter check: the broker
checks). What is lean is the reader: a length prefix and one ``msgpack.unpackb`` per frame,
a MSG handed on as a plain ``(topic, payload)`` tuple without building (and checking) a
``Msg`` frame, as the subscribers of bench/e2e.py do. Every other frame comes back as the
broker's frame object (``decode_frame`` checks it). A length above ``max_frame`` is refused
before its body is buffered, as the broker's own frame buffer does.
"""

from __future__ import annotations

from typing import Final

import msgpack

from broker.wire.buffer import DEFAULT_MAX_FRAME
from broker.wire.codec import decode_frame, encode_frame, encode_pub
from broker.wire.frames import Frame

__all__ = ["NativeError", "Parser", "encode_pub", "encode_sub", "encode_unsub", "frame_bytes"]

_unpackb: Final = msgpack.unpackb
_packb: Final = msgpack.packb


class NativeError(ValueError):
    """Bytes that are not the native protocol."""


def frame_bytes(frame: Frame) -> bytes:
    """One frame as it goes on the wire: length prefix + msgpack body."""
    body = encode_frame(frame)
    return len(body).to_bytes(4, "big") + body


def encode_sub(request_id: int, text: str) -> bytes:
    """SUB ``text`` (native dialect) without building, or checking, a ``Sub`` frame: a storm
    connection encodes tens of thousands, and the broker is the one meant to check them."""
    body = _packb({"type": "SUB", "id": request_id, "filter": text})
    return len(body).to_bytes(4, "big") + body


def encode_unsub(request_id: int, sub: int) -> bytes:
    """UNSUB of subscription ``sub``, as ``encode_sub`` does SUB."""
    body = _packb({"type": "UNSUB", "id": request_id, "sub": sub})
    return len(body).to_bytes(4, "big") + body


class Parser:
    """Bytes in, whole frames out: MSG as ``(topic, payload)``, the rest as frames."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[str, bytes] | Frame]:
        buf = self._buf
        buf += data
        out: list[tuple[str, bytes] | Frame] = []
        pos, end_buf = 0, len(buf)
        unpack = _unpackb
        while end_buf - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if size > self.max_frame:
                raise NativeError(f"frame of {size} bytes, more than {self.max_frame}")
            end = pos + 4 + size
            if end > end_buf:
                break
            body = buf[pos + 4 : end]
            pos = end
            try:
                wire = unpack(body)
            except Exception as exc:  # msgpack raises several kinds
                raise NativeError(f"bad msgpack body: {exc}") from None
            if wire.__class__ is dict and wire.get("type") == "MSG":
                out.append((wire["topic"], wire["payload"]))
            else:
                try:
                    out.append(decode_frame(bytes(body)))
                except Exception as exc:  # a protocol error of any kind
                    raise NativeError(f"bad frame: {exc}") from None
        if pos:
            del buf[:pos]
        return out
