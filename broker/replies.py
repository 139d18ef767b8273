"""Encoded replies for the hot path: PUBACK, SUBACK, UNSUBACK.

A broker answers every confirmed PUB and every SUB; building a frame object,
checking it and packing a dict for each costs more than the routing it
confirms. These replies never change the connection's state (they are only
sent in OPEN), so the connection writes these bytes directly; a test checks
that each decodes to exactly the frame ``broker.frames`` defines.
"""

from __future__ import annotations

from typing import Final

import msgpack

_packb = msgpack.Packer(use_bin_type=True).pack


def _head(frame_type: str, fields: int) -> bytes:
    return bytes((0x80 | (fields + 1),)) + _packb("type") + _packb(frame_type)


_PUBACK: Final = _head("PUBACK", 1) + _packb("id")
_SUBACK: Final = _head("SUBACK", 2) + _packb("id")
_SUB_KEY: Final = _packb("sub")
_UNSUBACK: Final = _head("UNSUBACK", 1) + _packb("id")


def _framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def encode_puback(request_id: int) -> bytes:
    return _framed(_PUBACK + _packb(request_id))


def encode_suback(request_id: int, sub_id: int) -> bytes:
    return _framed(_SUBACK + _packb(request_id) + _SUB_KEY + _packb(sub_id))


def encode_unsuback(request_id: int) -> bytes:
    return _framed(_UNSUBACK + _packb(request_id))
