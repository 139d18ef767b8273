"""What may be said on a connection: one frozen dataclass per frame, and the msgpack codec.

Frames are small values that are valid by construction (as h11's events): ``__post_init__``
checks every field, so code holding a frame never re-checks it. Building an invalid frame
raises ``LocalProtocolError`` (our bug); ``decode_frame`` re-raises the same error as
``RemoteProtocolError`` because then the peer sent it (h11 converts at the same boundary).
Please do not subclass the frames; add a new frame class instead.

Wire form: each frame body is a msgpack map with a ``"type"`` key holding the wire type (the
class's ``TYPE``) and one key per field, named as the field. Fields whose value is None are
left out, and a missing optional field takes its default, so the two spellings are equal.

Compatibility rule: keys a receiver does not know are ignored, so a newer peer may add
optional fields without breaking older ones. An unknown ``type`` is an error (UNKNOWN_TYPE),
because skipping a frame silently could lose a request.

Types are strict, because msgpack keeps them: ``bool`` is never accepted for ``int`` nor the
reverse, ``str`` fields need msgpack str and ``payload`` needs msgpack bin (``bytes``); integer
ids, sequence numbers and sizes are in 0..2**64-1. Float fields also take ints (a peer written
in another language may send ``30`` for 30 seconds); they are stored as ``float``.

Frames are keyword-only (``Sub(id=1, filter="a/>")``): several fields are ints, and a
positional mix-up of ``id``, ``sub`` and ``seq`` would still be a valid frame.

Frames with ``dict`` or ``list`` fields (``headers``, ``credentials``, ``stats``, ``digest``,
``dests``, ...) hold the value as given: treat it as read-only, and note that such frames are
not hashable.

Peer frames (PEER_HELLO ... FWD, docs/peering.md) name brokers by id: 1..256 bytes of UTF-8
without whitespace or control characters (``valid_broker_id``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn, Self

import msgpack

import routing
from broker.errors import (
    ErrorCode,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    code_closes_connection,
)

__all__ = [
    "FRAME_TYPES",
    "MAX_BROKER_ID_BYTES",
    "MAX_MSG_ID_BYTES",
    "PEER_ROLES",
    "PROTOCOL_VERSION",
    "U64_MAX",
    "Ack",
    "DropSession",
    "Error",
    "Frame",
    "Fwd",
    "Hello",
    "Msg",
    "PeerHello",
    "PeerWelcome",
    "Ping",
    "Pong",
    "Pub",
    "PubAck",
    "Route",
    "RouteAck",
    "RouteRequest",
    "Routes",
    "RoutesReply",
    "SessionDropped",
    "Sessions",
    "SessionsReply",
    "Stats",
    "StatsReply",
    "Sub",
    "SubAck",
    "Unsub",
    "UnsubAck",
    "Welcome",
    "build_frame",
    "decode_frame",
    "encode_frame",
    "fast_fwd",
    "fast_pub",
    "fast_puback",
    "fast_sub",
    "fast_suback",
    "unpack_body",
    "valid_broker_id",
]

#: The protocol version this module speaks (HELLO.version / WELCOME.version).
PROTOCOL_VERSION = 1
#: The largest integer msgpack carries unsigned; ids and sequence numbers stay within it.
U64_MAX = (1 << 64) - 1
#: Publisher-assigned message ids are at most this many bytes of UTF-8.
MAX_MSG_ID_BYTES = 256
#: Nesting limit for free-form values (credentials, stats).
MAX_NESTING = 16
#: Broker ids (PEER_HELLO.broker_id, ROUTE.origin, FWD.dests, ...) are 1..this many bytes.
MAX_BROKER_ID_BYTES = 256
#: PEER_HELLO.role: a broker takes part in routing; an observer only listens (never a hop).
PEER_ROLES = ("broker", "observer")


class Frame:
    """Base class of all frames; ``TYPE`` is the wire ``type`` value."""

    __slots__ = ()
    TYPE: ClassVar[str]


# -- field checks ----------------------------------------------------------------------------
# Each raises LocalProtocolError(BAD_FRAME); decode_frame turns it into RemoteProtocolError.


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _fail(frame: Frame, name: str, problem: str, ref: int | None) -> NoReturn:
    raise LocalProtocolError(ErrorCode.BAD_FRAME, f"{frame.TYPE} field {name!r} {problem}", ref=ref)


def _wrong_type(frame: Frame, name: str, expected: str, value: object, ref: int | None) -> NoReturn:
    _fail(frame, name, f"must be {expected}, got {_type_name(value)}", ref)


def _encodable(text: str) -> bool:
    """Lone surrogates cannot be sent as UTF-8; most strings are ASCII and skip the encode."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _uint(frame: Frame, name: str, ref: int | None = None, *, optional: bool = False) -> None:
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not int:  # exact: bool (and int subclasses such as IntEnum) refused
        _wrong_type(frame, name, "int or None" if optional else "int", value, ref)
    if not 0 <= value <= U64_MAX:
        _fail(frame, name, f"must be in 0..2**64-1, got {value}", ref)


def _bool(frame: Frame, name: str, ref: int | None = None) -> None:
    value = getattr(frame, name)
    if type(value) is not bool:
        _wrong_type(frame, name, "bool", value, ref)


def _str(frame: Frame, name: str, ref: int | None = None, *, optional: bool = False) -> None:
    value = getattr(frame, name)
    if value is None and optional:
        return
    if not isinstance(value, str):
        _wrong_type(frame, name, "str or None" if optional else "str", value, ref)
    if not _encodable(value):
        _fail(frame, name, "is not valid UTF-8 (lone surrogate)", ref)


def _seconds(frame: Frame, name: str, *, optional: bool = False) -> None:
    """A duration in seconds: finite, >= 0; ints are accepted and stored as float."""
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not float and type(value) is not int:
        _wrong_type(frame, name, "float or None" if optional else "float", value, None)
    if not (math.isfinite(value) and value >= 0):
        _fail(frame, name, f"must be a finite number >= 0, got {value!r}", None)
    object.__setattr__(frame, name, float(value))


def _headers(frame: Frame, name: str, ref: int | None = None) -> None:
    value = getattr(frame, name)
    if value is None:
        return
    if type(value) is not dict:
        _wrong_type(frame, name, "dict[str, str] or None", value, ref)
    for key, item in value.items():
        if not isinstance(key, str) or not _encodable(key):
            _fail(frame, name, f"keys must be str, got {_type_name(key)}", ref)
        if not isinstance(item, str) or not _encodable(item):
            _fail(frame, name, f"values must be str, got {_type_name(item)} for {key!r}", ref)


def _plain_problem(value: object, depth: int) -> str | None:
    """Why ``value`` is not a plain msgpack value (one that round-trips unchanged), or None."""
    if value is None or type(value) in (bool, float, bytes):
        return None
    if type(value) is int:
        return None if -(1 << 63) <= value <= U64_MAX else f"integer {value} out of range"
    if type(value) is str:
        return None if _encodable(value) else "string with a lone surrogate"
    if depth >= MAX_NESTING:
        return f"nested deeper than {MAX_NESTING} levels"
    if type(value) is list:
        for item in value:
            if (problem := _plain_problem(item, depth + 1)) is not None:
                return problem
        return None
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"map key of type {_type_name(key)} (keys must be str)"
            if (problem := _plain_problem(item, depth + 1)) is not None:
                return problem
        return None
    return f"value of type {_type_name(value)}"


def _plain_map(frame: Frame, name: str, ref: int | None = None, *, optional: bool = False) -> None:
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not dict:
        _wrong_type(frame, name, "dict or None" if optional else "dict", value, ref)
    if (problem := _plain_problem(value, 0)) is not None:
        _fail(frame, name, f"holds a {problem}", ref)


def _payload(frame: Frame, name: str, ref: int | None = None) -> None:
    value = getattr(frame, name)
    if type(value) is not bytes:  # bytearray/memoryview would not round-trip as equal
        _wrong_type(frame, name, "bytes", value, ref)


def _msg_id(frame: Frame, name: str, ref: int | None = None, *, optional: bool = False) -> None:
    _str(frame, name, ref, optional=optional)
    value = getattr(frame, name)
    if value is not None and len(value.encode("utf-8")) > MAX_MSG_ID_BYTES:
        _fail(frame, name, f"must be at most {MAX_MSG_ID_BYTES} bytes of UTF-8", ref)


def _topic(frame: Frame, name: str, ref: int | None = None) -> None:
    _str(frame, name, ref)
    try:
        routing.validate_topic(getattr(frame, name))
    except routing.TopicError as exc:
        raise LocalProtocolError(ErrorCode.INVALID_TOPIC, str(exc), ref=ref) from None


def _max_frame(frame: Frame, name: str) -> None:
    _uint(frame, name)
    value = getattr(frame, name)
    if not 0 < value < 1 << 32:
        _fail(frame, name, f"must be in 1..2**32-1, got {value}", None)


def valid_broker_id(text: object) -> bool:
    """Whether ``text`` is a broker id: 1..256 bytes of UTF-8, no whitespace or control
    characters (so that ids can be written in logs, lists and config files unquoted)."""
    if type(text) is not str:
        return False
    if text.isascii():  # printable ASCII is everything but controls; space is the only blank
        return 0 < len(text) <= MAX_BROKER_ID_BYTES and text.isprintable() and " " not in text
    if not _encodable(text):
        return False
    return 0 < len(text.encode("utf-8")) <= MAX_BROKER_ID_BYTES and all(
        char.isprintable() and not char.isspace() for char in text
    )


_BROKER_ID_RULE = (
    f"1..{MAX_BROKER_ID_BYTES} bytes of UTF-8 without whitespace or control characters"
)


def _broker_id(frame: Frame, name: str) -> None:
    value = getattr(frame, name)
    if not isinstance(value, str):
        _wrong_type(frame, name, "str", value, None)
    if not valid_broker_id(value):
        _fail(frame, name, f"must be a broker id ({_BROKER_ID_RULE}), got {value!r:.80}", None)


def _broker_ids(frame: Frame, name: str, *, optional: bool = False, required: bool = False) -> None:
    """A list of distinct broker ids; ``required``: at least one."""
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not list:
        _wrong_type(frame, name, "list or None" if optional else "list", value, None)
    if required and not value:
        _fail(frame, name, "must not be empty", None)
    for item in value:
        if not valid_broker_id(item):
            _fail(
                frame, name, f"items must be broker ids ({_BROKER_ID_RULE}), got {item!r:.80}", None
            )
    if len(set(value)) != len(value):
        _fail(frame, name, "must not name a broker twice", None)


def _digest(frame: Frame, name: str) -> None:
    """A map of origin broker id -> [incarnation, seq] (two uints)."""
    value = getattr(frame, name)
    if type(value) is not dict:
        _wrong_type(frame, name, "dict", value, None)
    for origin, version in value.items():
        if not valid_broker_id(origin):
            _fail(
                frame,
                name,
                f"keys must be broker ids ({_BROKER_ID_RULE}), got {origin!r:.80}",
                None,
            )
        if not (
            type(version) is list
            and len(version) == 2
            and all(type(n) is int and 0 <= n <= U64_MAX for n in version)
        ):
            _fail(
                frame,
                name,
                f"values must be [incarnation, seq] (two uints), got {version!r:.80} "
                f"for {origin!r}",
                None,
            )


def _filter_list(frame: Frame, name: str) -> None:
    value = getattr(frame, name)
    if type(value) is not list:
        _wrong_type(frame, name, "list", value, None)


def _parse_filters(frame: Frame, name: str) -> tuple[routing.Filter, ...]:
    """The filters of a list of ``[filter, dialect]`` pairs, each parsed (and so checked)."""
    parsed = []
    for pair in getattr(frame, name):
        if not (
            type(pair) is list
            and len(pair) == 2
            and type(pair[0]) is str
            and type(pair[1]) is str
            and _encodable(pair[0])
            and _encodable(pair[1])
        ):
            _fail(
                frame, name, f"items must be [filter, dialect] pairs of str, got {pair!r:.80}", None
            )
        text, dialect = pair
        try:
            parsed.append(routing.parse_filter(text, dialect))
        except ValueError as exc:  # TopicError, or ValueError for an unknown dialect
            _fail(
                frame, name, f"holds an invalid filter {text!r:.80} ({dialect!r:.20}): {exc}", None
            )
    return tuple(parsed)


# -- frames ----------------------------------------------------------------------------------
# In frames that carry a request id, the id is checked first, so every later error can name
# the request in ``ref`` (that is how a refused SUB or PUB gets its ERROR with ``ref``).


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Frame):
    """Client -> server, first frame on a connection.

    ``client_id`` None asks the server to assign one; ``durable`` keeps the session (filters
    and last-acked position) after the connection ends; ``group`` names a shared group whose
    members share one durable session; ``keepalive`` is the seconds the client intends to
    leave between PINGs (None: no preference). The server checks version and credentials.
    """

    TYPE: ClassVar[str] = "HELLO"
    version: int
    client_id: str | None = None
    durable: bool = False
    group: str | None = None
    credentials: dict[str, Any] | None = None
    keepalive: float | None = None

    def __post_init__(self) -> None:
        _uint(self, "version")
        _str(self, "client_id", optional=True)
        _bool(self, "durable")
        _str(self, "group", optional=True)
        _plain_map(self, "credentials", optional=True)
        _seconds(self, "keepalive", optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome(Frame):
    """Server -> client, the answer to HELLO; the connection is open after it.

    ``client_id`` is the id in use (assigned if HELLO had none); ``session_present`` says a
    durable session was resumed; ``max_frame`` is the largest frame body the server accepts;
    ``keepalive`` is the seconds of silence after which the server closes (0: never).
    """

    TYPE: ClassVar[str] = "WELCOME"
    version: int
    client_id: str
    server_id: str
    session_present: bool = False
    max_frame: int
    keepalive: float

    def __post_init__(self) -> None:
        _uint(self, "version")
        _str(self, "client_id")
        _str(self, "server_id")
        _bool(self, "session_present")
        _max_frame(self, "max_frame")
        _seconds(self, "keepalive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sub(Frame):
    """Client -> server: subscribe to ``filter`` (in ``dialect``: native or mqtt).

    ``id`` is the request id echoed by SUBACK (or by ERROR's ``ref``). ``sync`` asks the
    server to send SUBACK only once the subscription is in effect everywhere it routes from
    (peer route tables included), so a PUB sent after SUBACK is guaranteed to be matched.
    """

    TYPE: ClassVar[str] = "SUB"
    id: int
    filter: str
    dialect: str = routing.NATIVE
    sync: bool = False
    #: The filter, parsed while checking it: the broker hands it on instead of parsing again.
    parsed: routing.Filter = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ref = self.id
        if not (
            ref.__class__ is int
            and 0 <= ref <= U64_MAX
            and self.filter.__class__ is str
            and self.dialect.__class__ is str
            and self.sync.__class__ is bool
        ):  # the precise checks, for the message, only when the common shape fails
            _uint(self, "id")
            _str(self, "filter", ref)
            _str(self, "dialect", ref)
            _bool(self, "sync", ref)
        try:
            parsed = routing.parse_filter(self.filter, self.dialect)
        except ValueError as exc:  # TopicError, or ValueError for an unknown dialect
            raise LocalProtocolError(ErrorCode.INVALID_FILTER, str(exc), ref=ref) from None
        object.__setattr__(self, "parsed", parsed)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubAck(Frame):
    """Server -> client: SUB ``id`` succeeded; ``sub`` is the subscription id for MSG/UNSUB."""

    TYPE: ClassVar[str] = "SUBACK"
    id: int
    sub: int

    def __post_init__(self) -> None:
        _uint(self, "id")
        _uint(self, "sub")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unsub(Frame):
    """Client -> server: drop subscription ``sub``; ``id`` is the request id."""

    TYPE: ClassVar[str] = "UNSUB"
    id: int
    sub: int

    def __post_init__(self) -> None:
        _uint(self, "id")
        _uint(self, "sub")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnsubAck(Frame):
    """Server -> client: UNSUB ``id`` done."""

    TYPE: ClassVar[str] = "UNSUBACK"
    id: int

    def __post_init__(self) -> None:
        _uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pub(Frame):
    """Client -> server: publish ``payload`` on ``topic``.

    With ``id`` set the publisher asks for PUBACK(id) once the message is stored; without it
    nothing is confirmed. ``msg_id`` (at most 256 bytes) lets the broker drop duplicates of a
    message the publisher sends again, e.g. after a reconnect.
    """

    TYPE: ClassVar[str] = "PUB"
    topic: str
    payload: bytes
    headers: dict[str, str] | None = None
    id: int | None = None
    msg_id: str | None = None

    def __post_init__(self) -> None:
        # The hot path of every broker: one inline test for the common shape, the
        # field-by-field checks (with their precise messages) only when it fails.
        rid, topic, msg_id = self.id, self.topic, self.msg_id
        if (
            (rid is None or (rid.__class__ is int and 0 <= rid <= U64_MAX))
            and topic.__class__ is str
            and self.payload.__class__ is bytes
            and self.headers is None
            and (
                msg_id is None
                or (
                    msg_id.__class__ is str and msg_id.isascii() and len(msg_id) <= MAX_MSG_ID_BYTES
                )
            )
        ):
            try:
                routing.validate_topic(topic)
            except routing.TopicError as exc:
                raise LocalProtocolError(ErrorCode.INVALID_TOPIC, str(exc), ref=rid) from None
            return
        _uint(self, "id", optional=True)
        ref = self.id
        _topic(self, "topic", ref)
        _payload(self, "payload", ref)
        _headers(self, "headers", ref)
        _msg_id(self, "msg_id", ref, optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class PubAck(Frame):
    """Server -> client: the PUB with this ``id`` is stored."""

    TYPE: ClassVar[str] = "PUBACK"
    id: int

    def __post_init__(self) -> None:
        _uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Msg(Frame):
    """Server -> client: a message for subscription ``sub``.

    ``seq`` is the per-session sequence number that ACK refers to; ``msg_id`` identifies the
    message (the publisher's, or one the broker assigned) so clients can drop redeliveries.
    """

    TYPE: ClassVar[str] = "MSG"
    sub: int
    seq: int
    topic: str
    payload: bytes
    headers: dict[str, str] | None = None
    msg_id: str

    def __post_init__(self) -> None:
        _uint(self, "sub")
        _uint(self, "seq")
        _topic(self, "topic")
        _payload(self, "payload")
        _headers(self, "headers")
        _msg_id(self, "msg_id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack(Frame):
    """Client -> server: acknowledge delivery.

    ``single`` False acknowledges every sequence number up to and including ``seq``
    (cumulative, for ordinary sessions); True acknowledges only ``seq`` (shared groups, where
    a member sees a subset of the sequence).
    """

    TYPE: ClassVar[str] = "ACK"
    seq: int
    single: bool = False

    def __post_init__(self) -> None:
        _uint(self, "seq")
        _bool(self, "single")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Frame):
    """Either direction: are you there? Answered by PONG with the same ``id``."""

    TYPE: ClassVar[str] = "PING"
    id: int = 0

    def __post_init__(self) -> None:
        _uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Frame):
    """Either direction: the answer to PING ``id``."""

    TYPE: ClassVar[str] = "PONG"
    id: int = 0

    def __post_init__(self) -> None:
        _uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Frame):
    """Either direction: ``code`` (an ErrorCode value) and a human-readable ``text``.

    ``ref`` is the id of the refused request, if any. ``code`` is any string, so that codes
    added by newer peers are received intact; whether the connection closes follows the code
    (unknown codes close).
    """

    TYPE: ClassVar[str] = "ERROR"
    code: str
    text: str
    ref: int | None = None

    def __post_init__(self) -> None:
        _str(self, "code")
        if not self.code:
            _fail(self, "code", "must not be empty", None)
        _str(self, "text")
        _uint(self, "ref", optional=True)

    @classmethod
    def from_exception(cls, exc: ProtocolError) -> Self:
        """The ERROR frame that answers ``exc``."""
        return cls(code=str(exc.code), text=exc.text, ref=exc.ref)

    @property
    def closes_connection(self) -> bool:
        """Whether the sender closes the connection after this ERROR."""
        return code_closes_connection(self.code)


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats(Frame):
    """Client -> server: an operator asks for the broker's counters."""

    TYPE: ClassVar[str] = "STATS"
    id: int

    def __post_init__(self) -> None:
        _uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsReply(Frame):
    """Server -> client: counters for STATS ``id``, as a map of plain msgpack values."""

    TYPE: ClassVar[str] = "STATS_REPLY"
    id: int
    stats: dict[str, Any]

    def __post_init__(self) -> None:
        _uint(self, "id")
        _plain_map(self, "stats")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sessions(Frame):
    """Client -> server: an operator asks for the durable sessions."""

    TYPE: ClassVar[str] = "SESSIONS"
    id: int

    def __post_init__(self) -> None:
        _uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionsReply(Frame):
    """Server -> client: one map per durable session (plain msgpack values)."""

    TYPE: ClassVar[str] = "SESSIONS_REPLY"
    id: int
    sessions: list[dict[str, Any]]

    def __post_init__(self) -> None:
        _uint(self, "id")
        if type(self.sessions) is not list:
            _wrong_type(self, "sessions", "list", self.sessions, self.id)
        if (problem := _plain_problem(self.sessions, 0)) is not None:
            _fail(self, "sessions", f"holds a {problem}", self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class DropSession(Frame):
    """Client -> server: delete the durable session ``client_id`` and everything stored for
    it. A client may name its own session: it then carries on as a transient one."""

    TYPE: ClassVar[str] = "DROP_SESSION"
    id: int
    client_id: str

    def __post_init__(self) -> None:
        _uint(self, "id")
        _str(self, "client_id", self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionDropped(Frame):
    """Server -> client: DROP_SESSION ``id`` done; ``dropped`` is False if there was none."""

    TYPE: ClassVar[str] = "SESSION_DROPPED"
    id: int
    dropped: bool

    def __post_init__(self) -> None:
        _uint(self, "id")
        _bool(self, "dropped", self.id)


# -- peer links (docs/peering.md) ----------------------------------------------------------
# Between brokers a malformed frame means the peer cannot be trusted: every check here is
# BAD_FRAME (stream-level), except a bad FWD topic, which is INVALID_TOPIC as for PUB.


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerHello(Frame):
    """Dialing broker (or observer) -> listener, the first frame of a peer link.

    ``incarnation`` is fixed when the dialer starts (a newer one replaces all the mesh knew
    of it); ``role`` is "broker" (takes part in routing) or "observer" (only listens, never
    in anyone's adjacency); ``secret`` must equal the listener's ``peer_secret`` if it has
    one; ``digest`` maps every origin the dialer knows to its ``[incarnation, seq]``, so
    that the listener sends only the snapshots it lacks; ``keepalive`` is the seconds the
    dialer intends to leave between PINGs (None: no preference).
    """

    TYPE: ClassVar[str] = "PEER_HELLO"
    version: int
    broker_id: str
    incarnation: int
    role: str = "broker"
    secret: str | None = None
    digest: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    keepalive: float | None = None

    def __post_init__(self) -> None:
        _uint(self, "version")
        _broker_id(self, "broker_id")
        _uint(self, "incarnation")
        _str(self, "role")
        if self.role not in PEER_ROLES:
            _fail(self, "role", f"must be 'broker' or 'observer', got {self.role!r:.80}", None)
        _str(self, "secret", optional=True)
        _digest(self, "digest")
        _seconds(self, "keepalive", optional=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerWelcome(Frame):
    """Listener -> dialer, the answer to PEER_HELLO; the link is open (PEER_OPEN) after it.

    ``digest`` as in PEER_HELLO, for the dialer's snapshots; ``max_frame`` is the largest
    frame body the listener accepts; ``keepalive`` the seconds of silence after which the
    listener closes the link (0: never).
    """

    TYPE: ClassVar[str] = "PEER_WELCOME"
    version: int
    broker_id: str
    incarnation: int
    digest: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    max_frame: int
    keepalive: float

    def __post_init__(self) -> None:
        _uint(self, "version")
        _broker_id(self, "broker_id")
        _uint(self, "incarnation")
        _digest(self, "digest")
        _max_frame(self, "max_frame")
        _seconds(self, "keepalive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Route(Frame):
    """Either direction on a peer link: a change of ``origin``'s routing state.

    ``(incarnation, seq)`` numbers the change. A delta (``snapshot`` False) adds and removes
    filters and carries ``neighbors`` only when the adjacency changed (None: unchanged; []:
    no links). A snapshot is the origin's whole state: ``add`` holds all its filters (no
    ``remove``), ``neighbors`` its adjacency, and ``more`` True on all frames but the last
    when it is split. ``add``/``remove`` are ``[filter, dialect]`` pairs on the wire;
    ``added``/``removed`` hold them parsed. Build one from ``routing.Filter`` objects with
    ``Route.build``, which does not parse them again.
    """

    TYPE: ClassVar[str] = "ROUTE"
    origin: str
    incarnation: int
    seq: int
    snapshot: bool = False
    more: bool = False
    neighbors: list[str] | None = None
    add: list[list[str]] = dataclasses.field(default_factory=list)
    remove: list[list[str]] = dataclasses.field(default_factory=list)
    #: ``add`` and ``remove``, parsed while checking them.
    added: tuple[routing.Filter, ...] = dataclasses.field(init=False, repr=False, compare=False)
    removed: tuple[routing.Filter, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check()
        object.__setattr__(self, "added", _parse_filters(self, "add"))
        object.__setattr__(self, "removed", _parse_filters(self, "remove"))

    def _check(self) -> None:
        """Every check but parsing the filters."""
        _broker_id(self, "origin")
        _uint(self, "incarnation")
        _uint(self, "seq")
        _bool(self, "snapshot")
        _bool(self, "more")
        if self.more and not self.snapshot:
            _fail(self, "more", "is only allowed in a snapshot", None)
        _broker_ids(self, "neighbors", optional=True)
        _filter_list(self, "add")
        _filter_list(self, "remove")
        if self.snapshot and self.remove:
            _fail(self, "remove", "must be empty in a snapshot", None)

    @classmethod
    def build(
        cls,
        *,
        origin: str,
        incarnation: int,
        seq: int,
        add: Iterable[routing.Filter] = (),
        remove: Iterable[routing.Filter] = (),
        snapshot: bool = False,
        more: bool = False,
        neighbors: list[str] | None = None,
    ) -> Self:
        """A ROUTE from parsed filters: the wire pairs come from ``filter.text`` and
        ``filter.dialect``, and the filters are kept as ``added``/``removed`` unparsed."""
        added, removed = tuple(add), tuple(remove)
        for item in (*added, *removed):
            if not isinstance(item, routing.Filter):
                raise LocalProtocolError(
                    ErrorCode.BAD_FRAME,
                    f"Route.build takes routing.Filter objects, got {_type_name(item)}",
                )
        frame = object.__new__(cls)
        for name, value in (
            ("origin", origin),
            ("incarnation", incarnation),
            ("seq", seq),
            ("snapshot", snapshot),
            ("more", more),
            ("neighbors", neighbors),
            ("add", [[f.text, f.dialect] for f in added]),
            ("remove", [[f.text, f.dialect] for f in removed]),
            ("added", added),
            ("removed", removed),
        ):
            object.__setattr__(frame, name, value)
        frame._check()
        return frame


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteRequest(Frame):
    """Either direction on a peer link: send me a snapshot of ``origin`` (a delta did not
    follow on from what I hold)."""

    TYPE: ClassVar[str] = "ROUTE_REQUEST"
    origin: str

    def __post_init__(self) -> None:
        _broker_id(self, "origin")


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteAck(Frame):
    """Either direction, routed hop by hop to ``origin``: broker ``by`` has applied
    ``origin``'s update ``(incarnation, seq)``; ``hops`` counts the links it has crossed."""

    TYPE: ClassVar[str] = "ROUTE_ACK"
    origin: str
    incarnation: int
    seq: int
    by: str
    hops: int

    def __post_init__(self) -> None:
        _broker_id(self, "origin")
        _uint(self, "incarnation")
        _uint(self, "seq")
        _broker_id(self, "by")
        _uint(self, "hops")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fwd(Frame):
    """Either direction on a peer link: an event for the brokers in ``dests``.

    ``topic``, ``payload``, ``headers`` and ``msg_id`` are the event's (``msg_id`` always
    set: the publisher's or one ``source``, the broker the PUB arrived at, assigned);
    ``dedup`` says the id came from the publisher, so receivers may drop duplicates by it.
    ``dests`` (distinct, at least one) are the broker ids this copy is for; ``hops`` counts
    the links crossed, against the hop limit.
    """

    TYPE: ClassVar[str] = "FWD"
    topic: str
    payload: bytes
    headers: dict[str, str] | None = None
    msg_id: str
    dedup: bool = False
    dests: list[str]
    hops: int
    source: str

    def __post_init__(self) -> None:
        # The topic last: a frame that is malformed as well is BAD_FRAME (the link closes),
        # not the request-level INVALID_TOPIC.
        _payload(self, "payload")
        _headers(self, "headers")
        _msg_id(self, "msg_id")
        _bool(self, "dedup")
        _broker_ids(self, "dests", required=True)
        _uint(self, "hops")
        _broker_id(self, "source")
        _topic(self, "topic")


@dataclass(frozen=True, slots=True, kw_only=True)
class Routes(Frame):
    """Client -> server: an operator asks for the broker's route table (``topiary routes``)."""

    TYPE: ClassVar[str] = "ROUTES"
    id: int

    def __post_init__(self) -> None:
        _uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutesReply(Frame):
    """Server -> client: the route table for ROUTES ``id``, as a map of plain msgpack values."""

    TYPE: ClassVar[str] = "ROUTES_REPLY"
    id: int
    routes: dict[str, Any]

    def __post_init__(self) -> None:
        _uint(self, "id")
        _plain_map(self, "routes")


# -- the type table ----------------------------------------------------------------------
# Adding a frame: define the class above, list it here, give it rows in
# broker/protocol_states.py and a section in docs/protocol.md.

#: Wire ``type`` value -> frame class.
FRAME_TYPES: Mapping[str, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        Welcome,
        Sub,
        SubAck,
        Unsub,
        UnsubAck,
        Pub,
        PubAck,
        Msg,
        Ack,
        Ping,
        Pong,
        Error,
        Stats,
        StatsReply,
        Sessions,
        SessionsReply,
        DropSession,
        SessionDropped,
        Routes,
        RoutesReply,
        PeerHello,
        PeerWelcome,
        Route,
        RouteRequest,
        RouteAck,
        Fwd,
    )
}

_MISSING: Any = object()

# Per class: (field name, default or _MISSING), in declaration order; read once, used per frame.
# A field with a default factory (``digest``, ``add``) is optional: its default is the factory.
_FIELDS: dict[type[Frame], tuple[tuple[str, Any], ...]] = {
    cls: tuple(
        (
            f.name,
            f.default
            if f.default is not dataclasses.MISSING
            else _MISSING
            if f.default_factory is dataclasses.MISSING
            else f.default_factory,
        )
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.init
    )
    for cls in FRAME_TYPES.values()
}


#: Per class: the wire keys that are fields.
_NAMES: dict[type[Frame], frozenset[str]] = {
    cls: frozenset(name for name, _default in fields) for cls, fields in _FIELDS.items()
}


def encode_frame(frame: Frame) -> bytes:
    """The msgpack body of ``frame`` (no length prefix; ``Connection.send`` adds it)."""
    try:
        fields = _FIELDS[type(frame)]
    except KeyError:
        raise LocalProtocolError(
            ErrorCode.INTERNAL, f"not a frame: {type(frame).__name__}"
        ) from None
    wire: dict[str, Any] = {"type": frame.TYPE}
    for name, _default in fields:
        value = getattr(frame, name)
        if value is not None:
            wire[name] = value
    return msgpack.packb(wire, use_bin_type=True)


def unpack_body(body: bytes) -> tuple[type[Frame], dict[str, Any]]:
    """Step one of decoding: the frame class and the raw map, before any field is checked.

    Split out so that ``Connection`` can check the frame type against its state before it
    looks at the fields (a PUB before HELLO is HELLO_REQUIRED, whatever its topic).
    """
    try:
        wire = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise RemoteProtocolError(ErrorCode.BAD_FRAME, f"undecodable msgpack: {exc}") from None
    if type(wire) is not dict:
        raise RemoteProtocolError(
            ErrorCode.BAD_FRAME, f"a frame must be a msgpack map, got {_type_name(wire)}"
        )
    wire_type = wire.get("type", _MISSING)
    if wire_type is _MISSING:
        raise RemoteProtocolError(ErrorCode.BAD_FRAME, "frame has no 'type' field")
    if type(wire_type) is not str:
        raise RemoteProtocolError(
            ErrorCode.BAD_FRAME, f"frame field 'type' must be str, got {_type_name(wire_type)}"
        )
    cls = FRAME_TYPES.get(wire_type)
    if cls is None:
        raise RemoteProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown frame type {wire_type!r}")
    return cls, wire


def build_frame(cls: type[Frame], wire: Mapping[str, Any]) -> Frame:
    """Step two of decoding: the frame, from its class and raw map; unknown keys are ignored."""
    names = _NAMES[cls]
    kwargs = {name: value for name, value in wire.items() if name in names}
    try:
        return cls(**kwargs)
    except LocalProtocolError as exc:
        # The peer built it, so it is the peer's fault (code, text and ref unchanged).
        raise RemoteProtocolError(exc.code, exc.text, ref=exc.ref) from None
    except TypeError:  # a required field is missing: say which
        for name, default in _FIELDS[cls]:
            if default is _MISSING and name not in kwargs:
                raise RemoteProtocolError(
                    ErrorCode.BAD_FRAME, f"{cls.TYPE} field {name!r} is missing"
                ) from None
        raise


_new_pub = _new_frame = object.__new__
_set = object.__setattr__


def fast_pub(wire: dict[str, Any]) -> Pub:
    """The Pub in an unpacked PUB map, for the broker's hot path.

    The common shape (int-or-absent id, str topic, bytes payload, no headers, short ASCII
    msg_id or none) is checked inline and the frame is built without re-running the checks;
    anything else goes through ``build_frame`` for its precise errors. Either way the
    result is a valid Pub, or RemoteProtocolError.
    """
    topic = wire.get("topic")
    payload = wire.get("payload")
    rid = wire.get("id")
    msg_id = wire.get("msg_id")
    if (
        topic.__class__ is str
        and payload.__class__ is bytes
        and "headers" not in wire
        and (rid is None or (rid.__class__ is int and 0 <= rid <= U64_MAX))
        and (
            msg_id is None
            or (msg_id.__class__ is str and msg_id.isascii() and len(msg_id) <= MAX_MSG_ID_BYTES)
        )
    ):
        try:
            routing.validate_topic(topic)
        except routing.TopicError as exc:
            raise RemoteProtocolError(ErrorCode.INVALID_TOPIC, str(exc), ref=rid) from None
        frame = _new_pub(Pub)
        _set(frame, "topic", topic)
        _set(frame, "payload", payload)
        _set(frame, "headers", None)
        _set(frame, "id", rid)
        _set(frame, "msg_id", msg_id)
        return frame
    return build_frame(Pub, wire)  # type: ignore[return-value]


def fast_sub(wire: dict[str, Any]) -> Sub:
    """The Sub in an unpacked SUB map, for the broker's subscribe path (as ``fast_pub``).

    A client may pipeline tens of thousands of SUBs; the common shape (uint id, str filter,
    str-or-absent dialect, bool-or-absent sync) is checked inline, the filter parsed once,
    and the frame built without the dataclass machinery. Anything else goes through
    ``build_frame`` for its precise errors. Either way the result is a valid Sub, or
    RemoteProtocolError.
    """
    rid = wire.get("id")
    text = wire.get("filter")
    dialect = wire.get("dialect", routing.NATIVE)
    sync = wire.get("sync", False)
    if (
        rid.__class__ is int
        and 0 <= rid <= U64_MAX
        and text.__class__ is str
        and dialect.__class__ is str
        and sync.__class__ is bool
    ):
        try:
            parsed = routing.parse_filter(text, dialect)
        except ValueError as exc:  # TopicError, or ValueError for an unknown dialect
            raise RemoteProtocolError(ErrorCode.INVALID_FILTER, str(exc), ref=rid) from None
        frame = _new_frame(Sub)
        _set(frame, "id", rid)
        _set(frame, "filter", text)
        _set(frame, "dialect", dialect)
        _set(frame, "sync", sync)
        _set(frame, "parsed", parsed)
        return frame
    return build_frame(Sub, wire)  # type: ignore[return-value]


def fast_unsub(wire: dict[str, Any]) -> Unsub:
    """The Unsub in an unpacked UNSUB map (as ``fast_sub``: pipelined by the ten thousand):
    well-formed ids are taken as they are, anything else gets the full checks and their
    precise error."""
    rid = wire.get("id")
    sub = wire.get("sub")
    if (
        rid.__class__ is int
        and sub.__class__ is int
        and 0 <= rid <= U64_MAX
        and 0 <= sub <= U64_MAX
    ):
        frame = _new_frame(Unsub)
        _set(frame, "id", rid)
        _set(frame, "sub", sub)
        return frame
    return build_frame(Unsub, wire)  # type: ignore[return-value]


def fast_unsuback(wire: dict[str, Any]) -> UnsubAck:
    """The UnsubAck in an unpacked UNSUBACK map (as ``fast_suback``)."""
    rid = wire.get("id")
    if rid.__class__ is int and 0 <= rid <= U64_MAX and len(wire) == 2:
        frame = _new_frame(UnsubAck)
        _set(frame, "id", rid)
        return frame
    return build_frame(UnsubAck, wire)  # type: ignore[return-value]


def _fast_id(value: Any) -> bool:
    """The common shape of a broker id (short printable ASCII, no space), checked inline."""
    return (
        value.__class__ is str
        and 0 < len(value) <= MAX_BROKER_ID_BYTES
        and value.isascii()
        and value.isprintable()
        and " " not in value
    )


def fast_puback(wire: dict[str, Any]) -> PubAck:
    """The PubAck in an unpacked PUBACK map, for a confirming publisher's hot path (one per
    confirmed message): a well-formed id is taken as it is, anything else gets the full
    checks and their precise error."""
    rid = wire.get("id")
    if rid.__class__ is int and 0 <= rid <= U64_MAX and len(wire) == 2:
        frame = _new_frame(PubAck)
        _set(frame, "id", rid)
        return frame
    return build_frame(PubAck, wire)  # type: ignore[return-value]


def fast_suback(wire: dict[str, Any]) -> SubAck:
    """The SubAck in an unpacked SUBACK map, for a client that pipelines many SUBs (as
    ``fast_puback``): well-formed ids are taken as they are, anything else gets the full
    checks and their precise error."""
    rid = wire.get("id")
    sub = wire.get("sub")
    if (
        rid.__class__ is int
        and sub.__class__ is int
        and 0 <= rid <= U64_MAX
        and 0 <= sub <= U64_MAX
        and len(wire) == 3
    ):
        frame = _new_frame(SubAck)
        _set(frame, "id", rid)
        _set(frame, "sub", sub)
        return frame
    return build_frame(SubAck, wire)  # type: ignore[return-value]


def fast_fwd(wire: dict[str, Any]) -> Fwd:
    """The Fwd in an unpacked FWD map, for the hot path between brokers (as ``fast_pub``).

    The common shape (str topic, bytes payload, no headers, short ASCII msg_id, bool or
    absent dedup, distinct ASCII broker ids in ``dests`` and ``source``, uint hops) is
    checked inline and the frame is built without re-running the checks; anything else goes
    through ``build_frame`` for its precise errors. Either way the result is a valid Fwd, or
    RemoteProtocolError.
    """
    topic = wire.get("topic")
    payload = wire.get("payload")
    msg_id = wire.get("msg_id")
    dedup = wire.get("dedup", False)
    dests = wire.get("dests")
    hops = wire.get("hops")
    source = wire.get("source")
    if (
        topic.__class__ is str
        and payload.__class__ is bytes
        and "headers" not in wire
        and msg_id.__class__ is str
        and msg_id.isascii()
        and len(msg_id) <= MAX_MSG_ID_BYTES
        and dedup.__class__ is bool
        and hops.__class__ is int
        and 0 <= hops <= U64_MAX
        and _fast_id(source)
        and dests.__class__ is list
        and (
            (len(dests) == 1 and _fast_id(dests[0]))
            or (
                len(dests) > 1
                and all(_fast_id(dest) for dest in dests)
                and len(set(dests)) == len(dests)
            )
        )
    ):
        try:
            routing.validate_topic(topic)
        except routing.TopicError as exc:
            raise RemoteProtocolError(ErrorCode.INVALID_TOPIC, str(exc)) from None
        frame = _new_frame(Fwd)
        _set(frame, "topic", topic)
        _set(frame, "payload", payload)
        _set(frame, "headers", None)
        _set(frame, "msg_id", msg_id)
        _set(frame, "dedup", dedup)
        _set(frame, "dests", dests)
        _set(frame, "hops", hops)
        _set(frame, "source", source)
        return frame
    return build_frame(Fwd, wire)  # type: ignore[return-value]


def decode_frame(body: bytes) -> Frame:
    """The frame in ``body`` (no length prefix); raises RemoteProtocolError if it is bad."""
    cls, wire = unpack_body(body)
    return build_frame(cls, wire)
