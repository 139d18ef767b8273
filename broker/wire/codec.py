"""Hand-packed frames for the hot path: MSG, FWD, PUBACK, SUBACK, UNSUBACK.

Fan-out and confirmation are what a broker does most. Building a frame object,
checking its fields and packing a dict for each copy costs more than the
routing it carries, so these encoders write the bytes directly: a MSG reuses
the message's shared fields, packed once (``shared_fields``), and adds only
``sub`` and ``seq``; a reply is a fixed head and an id. Skipping the frame
checks is safe because every field came from a frame that passed them, and a
test checks that each encoding decodes to exactly the frame
``broker.wire.frames`` defines. The sans-IO ``Connection`` wraps these in
``send_msg``/``send_puback``/... so that its state is checked for them too.
"""

from __future__ import annotations

from typing import Final

import msgpack

from broker.core.message import Message

_packb = msgpack.Packer(use_bin_type=True).pack
_SUB_KEY: Final = _packb("sub")
_SEQ_KEY: Final = _packb("seq")
_MAP_HEADERS: Final = tuple(bytes((0x80 | n,)) for n in range(16))


def _head(frame_type: str, fields: int) -> bytes:
    return bytes((0x80 | (fields + 1),)) + _packb("type") + _packb(frame_type)


_PUBACK: Final = _head("PUBACK", 1) + _packb("id")
_SUBACK: Final = _head("SUBACK", 2) + _packb("id")
_UNSUBACK: Final = _head("UNSUBACK", 1) + _packb("id")


def _framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def encode_puback(request_id: int) -> bytes:
    return _framed(_PUBACK + _packb(request_id))


def encode_suback(request_id: int, sub_id: int) -> bytes:
    return _framed(_SUBACK + _packb(request_id) + _SUB_KEY + _packb(sub_id))


def encode_unsuback(request_id: int) -> bytes:
    return _framed(_UNSUBACK + _packb(request_id))


def shared_fields(message: Message) -> tuple[memoryview, int]:
    """The encoded fields every MSG of ``message`` carries, and how many there are (packed
    once, kept on the message)."""
    if message.encoded is None:
        fields: dict[str, object] = {
            "type": "MSG",
            "topic": message.topic,
            "payload": message.payload,
            "msg_id": message.msg_id,
        }
        if message.headers is not None:
            fields["headers"] = message.headers
        packed = _packb(fields)  # one C call; its map header is replaced per MSG
        message.encoded = memoryview(packed)[1:]  # no copy of the payload
        message.encoded_fields = len(fields)
    return message.encoded, message.encoded_fields


def encode_msg(message: Message, sub: int, seq: int) -> bytes:
    """The wire bytes (length prefix included) of MSG(sub, seq) for ``message``."""
    parts: list[bytes | memoryview] = []
    append_msg(parts, message, sub, seq)
    return b"".join(parts)


def append_msg(parts: list[bytes | memoryview], message: Message, sub: int, seq: int) -> int:
    """Append the pieces of MSG(sub, seq) for ``message`` to ``parts``; their total size.

    For a writer that joins a whole batch at once: the shared fields (the payload) are
    copied once, into the batch, instead of into a MSG first and the batch then.
    """
    shared = message.encoded
    if shared is None:
        shared, fields = shared_fields(message)
    else:
        fields = message.encoded_fields
    tail = b"".join((_SUB_KEY, _packb(sub), _SEQ_KEY, _packb(seq)))
    size = 1 + len(shared) + len(tail)
    parts.append(size.to_bytes(4, "big") + _MAP_HEADERS[fields + 2])
    parts.append(shared)
    parts.append(tail)
    return size + 4


def encode_fwd(
    message: Message, dedup: bool, dests: tuple[str, ...], hops: int, source: str
) -> bytes:
    """The wire bytes (length prefix included) of a FWD frame carrying ``message``.

    Brokers forward every event they route to peers, so this skips the frame class and its
    checks: every field came from a PUB or a FWD that passed them.
    """
    fields: dict[str, object] = {
        "type": "FWD",
        "topic": message.topic,
        "payload": message.payload,
        "msg_id": message.msg_id,
        "dests": list(dests),
        "hops": hops,
        "source": source,
    }
    if dedup:
        fields["dedup"] = True
    if message.headers is not None:
        fields["headers"] = message.headers
    body = _packb(fields)
    return len(body).to_bytes(4, "big") + body
