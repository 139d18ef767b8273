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
_MSG_TYPE: Final = _packb("type") + _packb("MSG")


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
        self._shared: bytes | None = None
        self._shared_fields = 0

    def shared_wire(self) -> tuple[bytes, int]:
        """The encoded fields every MSG of this message carries, and how many there are."""
        if self._shared is None:
            parts = [
                _MSG_TYPE,
                _packb("topic"),
                _packb(self.topic),
                _packb("payload"),
                _packb(self.payload),
                _packb("msg_id"),
                _packb(self.msg_id),
            ]
            fields = 4
            if self.headers is not None:
                parts += [_packb("headers"), _packb(self.headers)]
                fields += 1
            self._shared = b"".join(parts)
            self._shared_fields = fields
        return self._shared, self._shared_fields


def encode_msg(message: Message, sub: int, seq: int) -> bytes:
    """The wire bytes (length prefix included) of MSG(sub, seq) for ``message``."""
    shared, fields = message.shared_wire()
    body = b"".join(
        (bytes((0x80 | (fields + 2),)), shared, _SUB_KEY, _packb(sub), _SEQ_KEY, _packb(seq))
    )
    return len(body).to_bytes(4, "big") + body
