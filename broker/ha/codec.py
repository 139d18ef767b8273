"""The witness protocol on the wire: the native framing, a handshake, and a MAC on every frame.

Frames are msgpack maps with a ``type`` field behind the 4-byte length prefix of the native
protocol (``broker.wire.buffer``), but a codec of their own: they are spoken only between
the pair and the witness, never on a client connection (docs/protocol.md, "Witness").

Authentication, with the pair's ``[ha] secret`` and nothing sent in clear that would let a
listener ask in the broker's name:

1. broker -> witness ``WITNESS_HELLO {version, nonce}`` (16 random bytes);
2. witness -> broker ``WITNESS_WELCOME {nonce}`` (16 random bytes of its own);
3. both derive ``key = HMAC-SHA256(secret, "topiary-witness-1" + broker nonce + witness
   nonce)``; every later frame carries ``mac = HMAC-SHA256(key, msgpack([direction, type,
   seq, fields...]))`` (direction "b" from the broker, "w" from the witness), checked with a
   constant-time compare. Requests carry a strictly increasing ``seq``; an answer repeats
   its request's ``seq``.

Fresh nonces on both sides make every connection's key new, so a recorded frame replays
nowhere, and an answer MAC proves the witness knows the secret (the broker trusts votes
only from it). The MAC covers values, not bytes, so any msgpack encoder may be used.
The codec does not encrypt (terms and broker ids are not secret); with ``--ca --cert
--key`` the connection under it is mutual TLS (``broker.ha.tls``). A bad MAC or a malformed frame
is a ``WitnessProtocolError``: the witness sends ``WITNESS_ERROR {text}`` and closes.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any

import msgpack

from broker.ha.messages import OK, REFUSED, STALE, Answer, Renew, Request, Vote

__all__ = [
    "NONCE_BYTES",
    "VERSION",
    "WitnessAuthError",
    "WitnessConnectionClosed",
    "WitnessProtocolError",
    "decode_answer",
    "decode_error",
    "decode_hello",
    "decode_request",
    "decode_welcome",
    "encode_answer",
    "encode_error",
    "encode_hello",
    "encode_request",
    "encode_welcome",
    "session_key",
]

VERSION = 1
NONCE_BYTES = 16
#: The largest witness frame body: ids are at most 256 bytes, ``why`` is cut to fit.
MAX_FRAME = 4096
_MAX_ID = 256
_MAX_WHY = 1024
_TYPES = {Renew: "WITNESS_RENEW", Vote: "WITNESS_VOTE"}
_VERDICTS = (OK, STALE, REFUSED)


class WitnessProtocolError(Exception):
    """The other side sent something we cannot accept; the text says what."""


class WitnessAuthError(WitnessProtocolError):
    """A frame's MAC is wrong: the other side does not have the pair's secret."""


class WitnessConnectionClosed(WitnessProtocolError):
    """The other side closed the connection between frames."""


def session_key(
    secret: bytes, broker_nonce: bytes, witness_nonce: bytes, label: bytes = b"topiary-witness-1"
) -> bytes:
    """The connection's key; ``label`` keeps the witness' and the replication link's apart."""
    return hmac.digest(secret, label + broker_nonce + witness_nonce, "sha256")


def _mac(key: bytes, direction: str, values: list[Any]) -> bytes:
    return hmac.digest(key, msgpack.packb([direction, *values]), hashlib.sha256)


def _pack(fields: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(fields)
    return len(body).to_bytes(4, "big") + body


def _unpack(body: bytes, expected: tuple[str, ...]) -> dict[str, Any]:
    try:
        wire = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad data
        raise WitnessProtocolError(f"not a msgpack frame ({type(exc).__name__})") from None
    if not isinstance(wire, dict):
        raise WitnessProtocolError("a frame must be a map")
    kind = wire.get("type")
    if kind == "WITNESS_ERROR" and "WITNESS_ERROR" not in expected:
        raise WitnessProtocolError(f"the other side refused: {decode_error(body)}")
    if kind not in expected:
        raise WitnessProtocolError(f"expected {' or '.join(expected)}, got {kind!r}")
    return wire


def _field(wire: dict[str, Any], name: str, kind: type, *, optional: bool = False) -> Any:
    value = wire.get(name)
    if value is None and optional:
        return None
    if value.__class__ is not kind and not (kind is float and value.__class__ is int):
        raise WitnessProtocolError(f"{wire.get('type')}.{name} must be {kind.__name__}")
    return value


def _uint(wire: dict[str, Any], name: str) -> int:
    value: int = _field(wire, name, int)
    if not 0 <= value < 1 << 63:
        raise WitnessProtocolError(f"{wire['type']}.{name} out of range: {value}")
    return value


def _broker_id(wire: dict[str, Any], name: str, *, optional: bool = False) -> str | None:
    value = _field(wire, name, str, optional=optional)
    if value is not None and not 0 < len(value.encode()) <= _MAX_ID:
        raise WitnessProtocolError(f"{wire['type']}.{name} must be 1..{_MAX_ID} bytes")
    return value


def _check_mac(key: bytes, direction: str, wire: dict[str, Any], values: list[Any]) -> None:
    mac = wire.get("mac")
    if mac.__class__ is not bytes or not hmac.compare_digest(mac, _mac(key, direction, values)):
        raise WitnessAuthError("bad MAC: not signed with the pair's secret")


# -- handshake --------------------------------------------------------------------------------


def encode_hello(nonce: bytes) -> bytes:
    return _pack({"type": "WITNESS_HELLO", "version": VERSION, "nonce": nonce})


def decode_hello(body: bytes) -> bytes:
    wire = _unpack(body, ("WITNESS_HELLO",))
    if _uint(wire, "version") != VERSION:
        raise WitnessProtocolError(f"unsupported witness protocol version {wire['version']}")
    return _nonce(wire)


def encode_welcome(nonce: bytes) -> bytes:
    return _pack({"type": "WITNESS_WELCOME", "nonce": nonce})


def decode_welcome(body: bytes) -> bytes:
    return _nonce(_unpack(body, ("WITNESS_WELCOME",)))


def _nonce(wire: dict[str, Any]) -> bytes:
    nonce: bytes = _field(wire, "nonce", bytes)
    if len(nonce) != NONCE_BYTES:
        raise WitnessProtocolError(f"{wire['type']}.nonce must be {NONCE_BYTES} bytes")
    return nonce


def encode_error(text: str) -> bytes:
    return _pack({"type": "WITNESS_ERROR", "text": text[:_MAX_WHY]})


def decode_error(body: bytes) -> str:
    try:
        wire = msgpack.unpackb(body, raw=False)
        return str(wire["text"])
    except Exception:
        return "(unreadable WITNESS_ERROR)"


# -- requests and answers ---------------------------------------------------------------------


def encode_request(key: bytes, seq: int, request: Request) -> bytes:
    kind = _TYPES[type(request)]
    mac = _mac(key, "b", [kind, seq, request.term, request.broker_id])
    return _pack({"type": kind, "seq": seq, "term": request.term, "id": request.broker_id,
                  "mac": mac})  # fmt: skip


def decode_request(key: bytes, body: bytes, last_seq: int) -> tuple[int, Request]:
    """The request in ``body`` and its seq, which must be above ``last_seq``."""
    wire = _unpack(body, ("WITNESS_RENEW", "WITNESS_VOTE"))
    seq, term, broker_id = _uint(wire, "seq"), _uint(wire, "term"), _broker_id(wire, "id")
    _check_mac(key, "b", wire, [wire["type"], seq, term, broker_id])
    if seq <= last_seq:
        raise WitnessProtocolError(f"seq {seq} repeated or out of order (last {last_seq})")
    assert broker_id is not None
    cls = Renew if wire["type"] == "WITNESS_RENEW" else Vote
    return seq, cls(term, broker_id)


def _answer_values(seq: int, a: Answer) -> list[Any]:
    return ["WITNESS_ANSWER", seq, a.verdict, a.term, a.primary, a.lease, a.wait, a.why]


def encode_answer(key: bytes, seq: int, answer: Answer) -> bytes:
    answer = Answer(answer.verdict, answer.term, answer.primary, float(answer.lease),
                    float(answer.wait), answer.why[:_MAX_WHY])  # fmt: skip
    fields = dict(zip(("type", "seq", "verdict", "term", "primary", "lease", "wait", "why"),
                      _answer_values(seq, answer), strict=True))  # fmt: skip
    fields["mac"] = _mac(key, "w", _answer_values(seq, answer))
    return _pack(fields)


def decode_answer(key: bytes, body: bytes, seq: int) -> Answer:
    """The answer in ``body``, which must answer request ``seq``."""
    wire = _unpack(body, ("WITNESS_ANSWER",))
    verdict = _field(wire, "verdict", str)
    if verdict not in _VERDICTS:
        raise WitnessProtocolError(f"WITNESS_ANSWER.verdict {verdict!r} is not one we know")
    lease, wait = float(_field(wire, "lease", float)), float(_field(wire, "wait", float))
    if not (math.isfinite(lease) and math.isfinite(wait) and lease >= 0 and wait >= 0):
        raise WitnessProtocolError("WITNESS_ANSWER.lease and .wait must be seconds >= 0")
    answer = Answer(verdict, _uint(wire, "term"), _broker_id(wire, "primary", optional=True),
                    lease, wait, _field(wire, "why", str))  # fmt: skip
    _check_mac(key, "w", wire, _answer_values(_uint(wire, "seq"), answer))
    if wire["seq"] != seq:
        raise WitnessProtocolError(f"answer to seq {wire['seq']}, expected {seq}")
    return answer
