"""A minimal NATS client protocol codec for the benchmarks' lean clients: bytes in, events out.

A measuring tool that speaks the text protocol (https://docs.nats.io, "Client Protocol")
as far as the benchmarks need it, without headers, queue groups in use or TLS:

- client -> server: ``CONNECT {json}``, ``PUB subject n``, ``SUB subject sid``,
  ``UNSUB sid``, ``PING``, ``PONG``;
- server -> client: ``INFO {json}``, ``MSG subject sid [reply] n``, ``PING``, ``PONG``,
  ``+OK``, ``-ERR 'text'``.

``Parser`` decodes both directions (the tests round-trip every encoder through it). No I/O:
``Parser.feed(data)`` takes what one read returned and gives back every whole operation in
it, in order; one split across reads waits in the buffer. A MSG comes back as a plain
``(subject, payload)`` tuple (a subscriber's hot path: no object per message); everything
else as one of the small frozen classes below. Operation names are case-insensitive, as
the protocol says; a control line longer than ``max_control_line`` without its CRLF, or a
payload above ``max_payload``, is refused (``NatsError``) before it is buffered further.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

CRLF: Final = b"\r\n"
_BLANKS: Final = (b" ", b"\t")
PING: Final = b"PING\r\n"
PONG: Final = b"PONG\r\n"
DEFAULT_MAX_CONTROL_LINE: Final = 64 * 1024
DEFAULT_MAX_PAYLOAD: Final = 64 * 1024 * 1024
#: What the benchmarks' clients say in CONNECT: no +OK per operation, no pedantic checks,
#: and no copies of their own messages (they never subscribe to what they publish anyway).
CONNECT_OPTIONS: Final[dict[str, Any]] = {
    "verbose": False,
    "pedantic": False,
    "echo": False,
    "lang": "python-bench",
    "version": "0",
    "protocol": 1,
}


class NatsError(ValueError):
    """Bytes that are not the NATS protocol as this codec knows it."""


@dataclass(frozen=True, slots=True)
class Info:
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Connect:
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Pub:
    subject: str
    reply: str | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class Sub:
    subject: str
    queue: str | None
    sid: str


@dataclass(frozen=True, slots=True)
class Unsub:
    sid: str
    max_msgs: int | None


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Ok:
    pass


@dataclass(frozen=True, slots=True)
class Err:
    text: str


Event = tuple[str, bytes] | Info | Connect | Pub | Sub | Unsub | Ping | Pong | Ok | Err


# -- encoders -------------------------------------------------------------------------------


def check_subject(subject: str, wildcards: bool = False) -> str:
    """``subject`` if NATS takes it: non-empty tokens separated by ``.``, no whitespace;
    ``*`` and ``>`` only as whole tokens (``>`` last) and only when ``wildcards``."""
    tokens = subject.split(".")
    for index, token in enumerate(tokens):
        if not token or any(c in token for c in " \t\r\n"):
            raise NatsError(f"bad subject {subject!r}: empty token or whitespace")
        if ("*" in token or ">" in token) and not (
            wildcards and (token == "*" or (token == ">" and index == len(tokens) - 1))
        ):
            raise NatsError(f"bad subject {subject!r}: wildcard in token {token!r}")
    return subject


def encode_connect(options: dict[str, Any] | None = None) -> bytes:
    body = json.dumps(CONNECT_OPTIONS if options is None else options, separators=(",", ":"))
    return b"CONNECT " + body.encode() + CRLF


def encode_info(options: dict[str, Any]) -> bytes:
    return b"INFO " + json.dumps(options, separators=(",", ":")).encode() + CRLF


def encode_pub(subject: str, payload: bytes) -> bytes:
    """PUB without a reply subject; ``subject`` is the caller's to check (a hot path)."""
    return b"".join((b"PUB ", subject.encode(), b" %d\r\n" % len(payload), payload, CRLF))


def encode_msg(subject: str, sid: str, payload: bytes, reply: str | None = None) -> bytes:
    middle = f" {sid} {reply} " if reply else f" {sid} "
    return b"".join(
        (b"MSG ", subject.encode(), middle.encode(), b"%d\r\n" % len(payload), payload, CRLF)
    )


def encode_sub(subject: str, sid: int | str) -> bytes:
    return f"SUB {subject} {sid}\r\n".encode()


def encode_unsub(sid: int | str) -> bytes:
    return f"UNSUB {sid}\r\n".encode()


def encode_err(text: str) -> bytes:
    return f"-ERR '{text}'\r\n".encode()


# -- decoder --------------------------------------------------------------------------------


def _json(rest: bytes, op: str) -> dict[str, Any]:
    try:
        value = json.loads(rest)
    except ValueError as exc:
        raise NatsError(f"{op} with bad JSON: {exc}") from None
    if not isinstance(value, dict):
        raise NatsError(f"{op} JSON is not an object")
    return value


def _size(token: bytes, limit: int) -> int:
    if not token.isdigit():
        raise NatsError(f"bad payload size {token!r}")
    size = int(token)
    if size > limit:
        raise NatsError(f"payload of {size} bytes, more than {limit}")
    return size


class Parser:
    """Bytes in, whole operations out; see the module docstring."""

    def __init__(
        self,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of an operation not yet whole."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Event]:
        buf = self._buf
        buf += data
        out: list[Event] = []
        pos, end_buf = 0, len(buf)
        find = buf.find
        while pos < end_buf:
            eol = find(CRLF, pos)
            if eol < 0:
                if end_buf - pos > self.max_control_line:
                    raise NatsError(f"control line longer than {self.max_control_line} bytes")
                break
            line = bytes(buf[pos:eol])
            op = line[:3].upper()
            if (op == b"MSG" or op == b"PUB") and line[3:4] in _BLANKS:  # the hot path
                parts = line.split()
                is_msg = op == b"MSG"
                if not (4 if is_msg else 3) <= len(parts) <= (5 if is_msg else 4):
                    raise NatsError(f"bad {op.decode()} line {line[:200]!r}")
                size = _size(parts[-1], self.max_payload)
                start = eol + 2
                end = start + size
                if end + 2 > end_buf:
                    break  # the payload (or its CRLF) is not all here yet
                if buf[end : end + 2] != CRLF:
                    raise NatsError("payload not followed by CRLF")
                payload = bytes(buf[start:end])
                try:
                    subject = parts[1].decode()
                    if is_msg:
                        out.append((subject, payload))
                    else:
                        reply = parts[2].decode() if len(parts) == 4 else None
                        out.append(Pub(subject, reply, payload))
                except UnicodeDecodeError as exc:
                    raise NatsError(f"subject is not UTF-8: {exc}") from None
                pos = end + 2
                continue
            out.append(self._control(line))
            pos = eol + 2
        if pos:
            del buf[:pos]
        return out

    def _control(self, line: bytes) -> Event:
        fields = line.split(None, 1)
        op = fields[0].upper() if fields else b""
        rest = fields[1].strip() if len(fields) > 1 else b""
        if op == b"PING" and not rest:
            return Ping()
        if op == b"PONG" and not rest:
            return Pong()
        if op == b"+OK" and not rest:
            return Ok()
        if op == b"-ERR":
            return Err(rest.decode(errors="replace").strip("'"))
        if op == b"INFO":
            return Info(_json(rest, "INFO"))
        if op == b"CONNECT":
            return Connect(_json(rest, "CONNECT"))
        parts = rest.split()
        try:
            if op == b"SUB" and len(parts) in (2, 3):
                queue = parts[1].decode() if len(parts) == 3 else None
                return Sub(parts[0].decode(), queue, parts[-1].decode())
            if op == b"UNSUB" and len(parts) in (1, 2):
                max_msgs = int(parts[1]) if len(parts) == 2 else None
                return Unsub(parts[0].decode(), max_msgs)
        except (UnicodeDecodeError, ValueError) as exc:
            raise NatsError(f"bad {op.decode()} line: {exc}") from None
        raise NatsError(f"unknown operation {line[:200]!r}")
