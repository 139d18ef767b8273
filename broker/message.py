"""A published message, stored once however many sessions it goes to.

Fan-out is the hot path: one PUB becomes a MSG per interested session, and
only ``sub`` and ``seq`` differ between them. So the message keeps the
msgpack encoding of its shared fields, made once, and ``encode_msg`` adds the
two per-session fields and the length prefix. The result decodes to exactly
the ``Msg`` frame ``broker.frames`` defines (a test checks it); skipping the
frame's field checks is safe because every field came from a PUB that passed
them.
"""

from __future__ import annotations

from typing import Final

import msgpack

_packb = msgpack.Packer(use_bin_type=True).pack
_SUB_KEY: Final = _packb("sub")
_SEQ_KEY: Final = _packb("seq")


class Message:
    __slots__ = ("_shared", "_shared_fields", "headers", "msg_id", "payload", "size", "topic")

    def __init__(
        self, topic: str, payload: bytes, headers: dict[str, str] | None, msg_id: str
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.headers = headers
        self.msg_id = msg_id
        self.size = len(payload)
        self._shared: memoryview | None = None
        self._shared_fields = 0

    def shared_wire(self) -> tuple[memoryview, int]:
        """The encoded fields every MSG of this message carries, and how many there are."""
        if self._shared is None:
            fields: dict[str, object] = {
                "type": "MSG",
                "topic": self.topic,
                "payload": self.payload,
                "msg_id": self.msg_id,
            }
            if self.headers is not None:
                fields["headers"] = self.headers
            packed = _packb(fields)  # one C call; its map header is replaced per MSG
            self._shared = memoryview(packed)[1:]  # no copy of the payload
            self._shared_fields = len(fields)
        return self._shared, self._shared_fields


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
    shared = message._shared
    if shared is None:
        shared, fields = message.shared_wire()
    else:
        fields = message._shared_fields
    tail = b"".join((_SUB_KEY, _packb(sub), _SEQ_KEY, _packb(seq)))
    size = 1 + len(shared) + len(tail)
    parts.append(size.to_bytes(4, "big") + _MAP_HEADERS[fields + 2])
    parts.append(shared)
    parts.append(tail)
    return size + 4


_MAP_HEADERS: Final = tuple(bytes((0x80 | n,)) for n in range(16))


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
