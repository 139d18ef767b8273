"""Protocol errors, and the codes that travel in ERROR frames.

Errors say whose fault it was (as in h11's ``_util.py``): a ``RemoteProtocolError`` means the
peer broke the protocol, and the connection answers with an ERROR frame carrying its ``code``; a
``LocalProtocolError`` means our own code misused the protocol, which is a bug and should fail
loudly. Both carry the same ``code``/``text``/``ref`` so that an error found while *building* a
frame (``LocalProtocolError``) can be re-raised as the peer's fault when the frame came off the
wire, which is what the decoder does.

Every code states whether the connection is closed after it: stream-level errors mean the byte
stream or the session can no longer be trusted; request-level errors refuse one request (the
ERROR frame's ``ref`` names it) and the connection carries on.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

__all__ = [
    "CLOSES_CONNECTION",
    "ERROR_DESCRIPTIONS",
    "ErrorCode",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "code_closes_connection",
    "render_error_table",
]


class ErrorCode(StrEnum):
    """The ``code`` of an ERROR frame; the wire value is the member's name."""

    BAD_FRAME = "BAD_FRAME"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    UNEXPECTED_FRAME = "UNEXPECTED_FRAME"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    INVALID_TOPIC = "INVALID_TOPIC"
    INVALID_FILTER = "INVALID_FILTER"
    HELLO_REQUIRED = "HELLO_REQUIRED"
    DUPLICATE_HELLO = "DUPLICATE_HELLO"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    AUTH_FAILED = "AUTH_FAILED"
    UNKNOWN_SUBSCRIPTION = "UNKNOWN_SUBSCRIPTION"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    SLOW_CONSUMER = "SLOW_CONSUMER"
    IDLE_TIMEOUT = "IDLE_TIMEOUT"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    INVALID_ACK = "INVALID_ACK"
    SESSION_TAKEN = "SESSION_TAKEN"
    UNSUPPORTED = "UNSUPPORTED"
    INVALID_CLIENT_ID = "INVALID_CLIENT_ID"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    BROKER_ID_CLASH = "BROKER_ID_CLASH"
    DUPLICATE_LINK = "DUPLICATE_LINK"
    SYNC_TIMEOUT = "SYNC_TIMEOUT"
    NOT_A_PEER = "NOT_A_PEER"
    NOT_AUTHORIZED = "NOT_AUTHORIZED"
    RATE_LIMITED = "RATE_LIMITED"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    NOT_PRIMARY = "NOT_PRIMARY"
    FENCED = "FENCED"
    STORE_FULL = "STORE_FULL"
    INTERNAL = "INTERNAL"

    @property
    def closes_connection(self) -> bool:
        """True when the sender closes the connection right after an ERROR with this code."""
        return CLOSES_CONNECTION[self]

    @property
    def description(self) -> str:
        """One sentence for operators and docs/protocol.md."""
        return ERROR_DESCRIPTIONS[self]


_C = ErrorCode

#: Whether the connection is closed after an ERROR with this code (see the module docstring).
CLOSES_CONNECTION: Mapping[ErrorCode, bool] = MappingProxyType(
    {
        _C.BAD_FRAME: True,
        _C.UNKNOWN_TYPE: True,
        _C.UNEXPECTED_FRAME: True,
        _C.FRAME_TOO_LARGE: True,
        _C.INVALID_TOPIC: False,
        _C.INVALID_FILTER: False,
        _C.HELLO_REQUIRED: True,
        _C.DUPLICATE_HELLO: True,
        _C.VERSION_MISMATCH: True,
        _C.AUTH_FAILED: True,
        _C.UNKNOWN_SUBSCRIPTION: False,
        _C.PAYLOAD_TOO_LARGE: False,
        _C.SLOW_CONSUMER: True,
        _C.IDLE_TIMEOUT: True,
        _C.SHUTTING_DOWN: True,
        _C.INVALID_ACK: False,
        _C.SESSION_TAKEN: True,
        _C.UNSUPPORTED: True,
        _C.INVALID_CLIENT_ID: True,
        _C.QUOTA_EXCEEDED: False,
        _C.BROKER_ID_CLASH: True,
        _C.DUPLICATE_LINK: True,
        _C.SYNC_TIMEOUT: False,
        _C.NOT_A_PEER: True,
        _C.NOT_AUTHORIZED: False,
        _C.RATE_LIMITED: False,
        _C.LIMIT_EXCEEDED: False,
        _C.NOT_PRIMARY: True,
        _C.FENCED: True,
        _C.STORE_FULL: False,
        _C.INTERNAL: True,
    }
)

#: What each code means; docs/protocol.md's error table is rendered from this.
ERROR_DESCRIPTIONS: Mapping[ErrorCode, str] = MappingProxyType(
    {
        _C.BAD_FRAME: (
            "The frame body is not valid msgpack, is not a map, lacks `type` or a required "
            "field, or a field has the wrong type or is out of range; also EOF in the middle "
            "of a frame, and a zero length prefix."
        ),
        _C.UNKNOWN_TYPE: "The `type` value names no frame this side knows.",
        _C.UNEXPECTED_FRAME: (
            "A known frame that the receiver does not accept from the sender's role in the "
            "current state (for example MSG sent by a client)."
        ),
        _C.FRAME_TOO_LARGE: (
            "The length prefix announces more than the receiver's maximum frame size; "
            "rejected before the body is read."
        ),
        _C.INVALID_TOPIC: (
            "The topic of a PUB (or of a MSG or FWD) breaks the topic rules; `ref` is the PUB id."
        ),
        _C.INVALID_FILTER: "The filter or dialect of a SUB is invalid; `ref` is the SUB id.",
        _C.HELLO_REQUIRED: "A frame other than HELLO or PEER_HELLO arrived first.",
        _C.DUPLICATE_HELLO: (
            "A HELLO or PEER_HELLO arrived on a connection whose handshake is already done."
        ),
        _C.VERSION_MISMATCH: (
            "The receiver does not speak the protocol version in HELLO or PEER_HELLO."
        ),
        _C.AUTH_FAILED: (
            "The credentials in HELLO were refused; or PEER_HELLO came from a broker or "
            "observer the listener does not list, or without its secret or certificate (or "
            "not with the mesh's shared `secret`); or a dialled peer answered with another id."
        ),
        _C.UNKNOWN_SUBSCRIPTION: "UNSUB named a subscription id this session does not hold.",
        _C.PAYLOAD_TOO_LARGE: "A PUB payload exceeds the broker's payload limit.",
        _C.SLOW_CONSUMER: (
            "The client did not read its messages fast enough and its outbound queue overflowed."
        ),
        _C.IDLE_TIMEOUT: (
            "The client neither sent anything nor read its messages within the keepalive "
            "interval (plus grace); see [Order and liveness](#order-and-liveness)."
        ),
        _C.SHUTTING_DOWN: "The broker is shutting down; reconnect elsewhere or later.",
        _C.INVALID_ACK: "ACK named a sequence number that was never delivered on this session.",
        _C.SESSION_TAKEN: (
            "Another connection took over this durable session (same client id); this one "
            "is closed."
        ),
        _C.UNSUPPORTED: (
            "HELLO asked for a feature this broker does not offer (for example a durable "
            "session on a broker built without storage)."
        ),
        _C.INVALID_CLIENT_ID: (
            "HELLO's client_id is empty or over 256 bytes, or missing where a durable session "
            "needs one."
        ),
        _C.QUOTA_EXCEEDED: (
            "A durable session that wants this PUB is full and its overflow policy is "
            "reject-publish; nothing was delivered or stored; `ref` is the PUB id."
        ),
        _C.BROKER_ID_CLASH: (
            "PEER_HELLO claims the listener's own broker id, or the id of a broker already "
            "linked under another incarnation."
        ),
        _C.DUPLICATE_LINK: (
            "There is already a link between these two brokers (they dialled each other at "
            "once); the link dialled by the higher id is closed."
        ),
        _C.SYNC_TIMEOUT: (
            "The route of a `sync` SUB was not acknowledged by every reachable broker within "
            "the sync timeout; the subscription was removed again; `ref` is the SUB id."
        ),
        _C.NOT_A_PEER: (
            "A peer frame or peer feature was asked of a broker that does not take it: "
            "PEER_HELLO to a broker without peering, or ROUTE from an observer."
        ),
        _C.NOT_AUTHORIZED: (
            "The client's identity may not do this: a PUB or SUB the topic ACLs refuse (`ref` "
            "names it; nothing was routed or subscribed), or a durable session another "
            "identity owns (the connection is then closed)."
        ),
        _C.RATE_LIMITED: (
            "A PUB past the connection's publish rate (`ref` names it; it was not routed), "
            "or a connection past the broker's new-connection rate (then closed)."
        ),
        _C.LIMIT_EXCEEDED: (
            "A configured limit refused the request: a SUB past the per-client subscription "
            "limit (`ref` names it), or a connection past `max_connections` (then closed)."
        ),
        _C.NOT_PRIMARY: (
            "HELLO reached the standby of a hot-spare pair, which serves no clients; the text "
            "names the primary's address (docs/ha.md). Connect there (a server list does)."
        ),
        _C.FENCED: (
            "A confirmed PUB reached a hot-spare primary that may not write now (it has lost "
            "both the witness and its standby, or was replaced): not confirmed (refused "
            "before routing, or committed here only, which the next resynchronisation "
            "discards); `ref` names it. The connection closes so that a server list moves "
            "on, and a reconnecting client sends the PUB again, with its msg id."
        ),
        _C.STORE_FULL: (
            "A confirmed PUB the broker could not store: its disk refused the write (full, a "
            "quota or file size limit reached, or a failing device); nothing of it was stored "
            "or confirmed, and the text says what the disk answered; `ref` names it. The "
            "connection stays open; the same PUB may be sent again later."
        ),
        _C.INTERNAL: (
            "A bug or unexpected failure on the sender's side (for a PUB: it could not be "
            "stored; `ref` names it)."
        ),
    }
)


def code_closes_connection(code: str) -> bool:
    """Whether an ERROR with ``code`` closes the connection; unknown codes close, to be safe
    (a newer peer's code may well be stream-level)."""
    try:
        return CLOSES_CONNECTION[ErrorCode(code)]
    except ValueError:
        return True


#: Refusals that connecting again will not change (a bad credential, another protocol
#: version, a durable session another identity owns): every client that reconnects gives up
#: on these, and only these.
REFUSED_FOR_GOOD: frozenset[ErrorCode] = frozenset(
    {_C.AUTH_FAILED, _C.VERSION_MISMATCH, _C.NOT_AUTHORIZED}
)


def refused_for_good(code: str) -> bool:
    """Whether a refusal with ``code`` will be the same however often one connects again."""
    return code in REFUSED_FOR_GOOD


def render_error_table() -> str:
    """Markdown table of every code; docs/protocol.md must contain exactly this text."""
    lines = ["| code | closes connection | meaning |", "| --- | --- | --- |"]
    for code in ErrorCode:
        closes = "yes" if code.closes_connection else "no"
        lines.append(f"| `{code.value}` | {closes} | {code.description} |")
    return "\n".join(lines) + "\n"


class ProtocolError(Exception):
    """A protocol violation, carrying what the ERROR frame will say.

    ``code`` is normally an ``ErrorCode`` but any string is kept as given, so that codes added
    by newer peers survive a round trip; ``ref`` is the id of the refused request, if known.
    """

    code: str
    text: str
    ref: int | None

    def __init__(self, code: str, text: str, *, ref: int | None = None) -> None:
        super().__init__(code, text, ref)
        self.code = code
        self.text = text
        self.ref = ref

    @property
    def closes_connection(self) -> bool:
        """Whether the connection must close after this error (unknown codes close)."""
        return code_closes_connection(self.code)

    def __str__(self) -> str:
        suffix = "" if self.ref is None else f" (ref {self.ref})"
        return f"{self.code}: {self.text}{suffix}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.code)!r}, {self.text!r}, ref={self.ref!r})"


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; answer with ERROR(code) and close if the code says so."""


class LocalProtocolError(ProtocolError):
    """Our own code misused the protocol (or built an invalid frame): a bug, fail loudly."""
