"""What may be said on a connection: one frozen dataclass per frame, and the type table.

Frames are small values that are valid by construction (as h11's events): ``__post_init__``
checks every field (with the checks in ``broker.wire.checks``), so code holding a frame never
re-checks it. Building an invalid frame raises ``LocalProtocolError`` (our bug); the decoder
in ``broker.wire.codec`` re-raises the same error as ``RemoteProtocolError`` because then the
peer sent it (h11 converts at the same boundary). Please do not subclass the frames; add a
new frame class instead.

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
without whitespace or control characters (``broker.wire.checks.valid_broker_id``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import routing
from broker.errors import (
    ErrorCode,
    LocalProtocolError,
    ProtocolError,
    code_closes_connection,
)
from broker.wire.checks import (
    MAX_MSG_ID_BYTES,
    U64_MAX,
    check_bool,
    check_broker_id,
    check_broker_ids,
    check_digest,
    check_filter_list,
    check_headers,
    check_max_frame,
    check_msg_id,
    check_payload,
    check_plain_map,
    check_seconds,
    check_str,
    check_topic,
    check_uint,
    fail,
    parse_filters,
    plain_problem,
    type_name,
    wrong_type,
)

__all__ = [
    "FRAME_TYPES",
    "PEER_ROLES",
    "PROTOCOL_VERSION",
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
]

#: The protocol version these frames are (HELLO.version / WELCOME.version).
PROTOCOL_VERSION = 1
#: PEER_HELLO.role: a broker takes part in routing; an observer only listens (never a hop).
PEER_ROLES = ("broker", "observer")


class Frame:
    """Base class of all frames; ``TYPE`` is the wire ``type`` value."""

    __slots__ = ()
    TYPE: ClassVar[str]


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
        check_uint(self, "version")
        check_str(self, "client_id", optional=True)
        check_bool(self, "durable")
        check_str(self, "group", optional=True)
        check_plain_map(self, "credentials", optional=True)
        check_seconds(self, "keepalive", optional=True)


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
        check_uint(self, "version")
        check_str(self, "client_id")
        check_str(self, "server_id")
        check_bool(self, "session_present")
        check_max_frame(self, "max_frame")
        check_seconds(self, "keepalive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sub(Frame):
    """Client -> server: subscribe to ``filter`` (in ``dialect``: native or mqtt).

    ``id`` is the request id echoed by SUBACK (or by ERROR's ``ref``). ``sync`` asks the
    server to send SUBACK only once the subscription is in effect everywhere it routes from
    (peer route tables included), so a PUB sent after SUBACK is guaranteed to be matched.
    ``retained`` (default True) asks for the retained messages the filter matches, sent
    after the SUBACK; False: none.
    """

    TYPE: ClassVar[str] = "SUB"
    id: int
    filter: str
    dialect: str = routing.NATIVE
    sync: bool = False
    retained: bool = True
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
            and self.retained.__class__ is bool
        ):  # the precise checks, for the message, only when the common shape fails
            check_uint(self, "id")
            check_str(self, "filter", ref)
            check_str(self, "dialect", ref)
            check_bool(self, "sync", ref)
            check_bool(self, "retained", ref)
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
        check_uint(self, "id")
        check_uint(self, "sub")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unsub(Frame):
    """Client -> server: drop subscription ``sub``; ``id`` is the request id."""

    TYPE: ClassVar[str] = "UNSUB"
    id: int
    sub: int

    def __post_init__(self) -> None:
        check_uint(self, "id")
        check_uint(self, "sub")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnsubAck(Frame):
    """Server -> client: UNSUB ``id`` done."""

    TYPE: ClassVar[str] = "UNSUBACK"
    id: int

    def __post_init__(self) -> None:
        check_uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pub(Frame):
    """Client -> server: publish ``payload`` on ``topic``.

    With ``id`` set the publisher asks for PUBACK(id) once the message is stored; without it
    nothing is confirmed. ``msg_id`` (at most 256 bytes) lets the broker drop duplicates of a
    message the publisher sends again, e.g. after a reconnect. ``retain`` makes it the
    retained message of its topic (an empty payload deletes that instead).
    """

    TYPE: ClassVar[str] = "PUB"
    topic: str
    payload: bytes
    headers: dict[str, str] | None = None
    id: int | None = None
    msg_id: str | None = None
    retain: bool = False

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
            and self.retain.__class__ is bool
        ):
            try:
                routing.validate_topic(topic)
            except routing.TopicError as exc:
                raise LocalProtocolError(ErrorCode.INVALID_TOPIC, str(exc), ref=rid) from None
            return
        check_uint(self, "id", optional=True)
        ref = self.id
        check_topic(self, "topic", ref)
        check_payload(self, "payload", ref)
        check_headers(self, "headers", ref)
        check_msg_id(self, "msg_id", ref, optional=True)
        check_bool(self, "retain", ref)


@dataclass(frozen=True, slots=True, kw_only=True)
class PubAck(Frame):
    """Server -> client: the PUB with this ``id`` is stored."""

    TYPE: ClassVar[str] = "PUBACK"
    id: int

    def __post_init__(self) -> None:
        check_uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Msg(Frame):
    """Server -> client: a message for subscription ``sub``.

    ``seq`` is the per-session sequence number that ACK refers to; ``msg_id`` identifies the
    message (the publisher's, or one the broker assigned) so clients can drop redeliveries.
    ``discarded`` (0: absent on the wire) is how many messages for this client the broker
    dropped since the one before this (its queue was full): loss is never silent.
    ``retained`` (False: absent on the wire) says the message comes from the retained store,
    sent because a subscription was made, not because it was just published.
    """

    TYPE: ClassVar[str] = "MSG"
    sub: int
    seq: int
    topic: str
    payload: bytes
    headers: dict[str, str] | None = None
    msg_id: str
    discarded: int = 0
    retained: bool = False

    def __post_init__(self) -> None:
        check_uint(self, "sub")
        check_uint(self, "seq")
        check_uint(self, "discarded")
        check_bool(self, "retained")
        check_topic(self, "topic", empty_levels=True)
        check_payload(self, "payload")
        check_headers(self, "headers")
        check_msg_id(self, "msg_id")


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
        check_uint(self, "seq")
        check_bool(self, "single")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Frame):
    """Either direction: are you there? Answered by PONG with the same ``id``."""

    TYPE: ClassVar[str] = "PING"
    id: int = 0

    def __post_init__(self) -> None:
        check_uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Frame):
    """Either direction: the answer to PING ``id``."""

    TYPE: ClassVar[str] = "PONG"
    id: int = 0

    def __post_init__(self) -> None:
        check_uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Frame):
    """Either direction: ``code`` (an ErrorCode value) and a human-readable ``text``.

    ``ref`` is the id of the refused request, if any; ``sub`` the subscription the error
    ended, if any (a subscription the topic ACLs no longer grant). ``code`` is any string, so
    that codes added by newer peers are received intact; whether the connection closes
    follows the code (unknown codes close).
    """

    TYPE: ClassVar[str] = "ERROR"
    code: str
    text: str
    ref: int | None = None
    sub: int | None = None

    def __post_init__(self) -> None:
        check_str(self, "code")
        if not self.code:
            fail(self, "code", "must not be empty", None)
        check_str(self, "text")
        check_uint(self, "ref", optional=True)
        check_uint(self, "sub", optional=True)

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
        check_uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsReply(Frame):
    """Server -> client: counters for STATS ``id``, as a map of plain msgpack values."""

    TYPE: ClassVar[str] = "STATS_REPLY"
    id: int
    stats: dict[str, Any]

    def __post_init__(self) -> None:
        check_uint(self, "id")
        check_plain_map(self, "stats")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sessions(Frame):
    """Client -> server: an operator asks for the durable sessions."""

    TYPE: ClassVar[str] = "SESSIONS"
    id: int

    def __post_init__(self) -> None:
        check_uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionsReply(Frame):
    """Server -> client: one map per durable session (plain msgpack values)."""

    TYPE: ClassVar[str] = "SESSIONS_REPLY"
    id: int
    sessions: list[dict[str, Any]]

    def __post_init__(self) -> None:
        check_uint(self, "id")
        if type(self.sessions) is not list:
            wrong_type(self, "sessions", "list", self.sessions, self.id)
        if (problem := plain_problem(self.sessions, 0)) is not None:
            fail(self, "sessions", f"holds a {problem}", self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class DropSession(Frame):
    """Client -> server: delete the durable session ``client_id`` and everything stored for
    it. A client may name its own session: it then carries on as a transient one."""

    TYPE: ClassVar[str] = "DROP_SESSION"
    id: int
    client_id: str

    def __post_init__(self) -> None:
        check_uint(self, "id")
        check_str(self, "client_id", self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionDropped(Frame):
    """Server -> client: DROP_SESSION ``id`` done; ``dropped`` is False if there was none."""

    TYPE: ClassVar[str] = "SESSION_DROPPED"
    id: int
    dropped: bool

    def __post_init__(self) -> None:
        check_uint(self, "id")
        check_bool(self, "dropped", self.id)


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
        check_uint(self, "version")
        check_broker_id(self, "broker_id")
        check_uint(self, "incarnation")
        check_str(self, "role")
        if self.role not in PEER_ROLES:
            fail(self, "role", f"must be 'broker' or 'observer', got {self.role!r:.80}", None)
        check_str(self, "secret", optional=True)
        check_digest(self, "digest")
        check_seconds(self, "keepalive", optional=True)


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
        check_uint(self, "version")
        check_broker_id(self, "broker_id")
        check_uint(self, "incarnation")
        check_digest(self, "digest")
        check_max_frame(self, "max_frame")
        check_seconds(self, "keepalive")


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
        object.__setattr__(self, "added", parse_filters(self, "add"))
        object.__setattr__(self, "removed", parse_filters(self, "remove"))

    def _check(self) -> None:
        """Every check but parsing the filters."""
        check_broker_id(self, "origin")
        check_uint(self, "incarnation")
        check_uint(self, "seq")
        check_bool(self, "snapshot")
        check_bool(self, "more")
        if self.more and not self.snapshot:
            fail(self, "more", "is only allowed in a snapshot", None)
        check_broker_ids(self, "neighbors", optional=True)
        check_filter_list(self, "add")
        check_filter_list(self, "remove")
        if self.snapshot and self.remove:
            fail(self, "remove", "must be empty in a snapshot", None)

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
                    f"Route.build takes routing.Filter objects, got {type_name(item)}",
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
        check_broker_id(self, "origin")


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
        check_broker_id(self, "origin")
        check_uint(self, "incarnation")
        check_uint(self, "seq")
        check_broker_id(self, "by")
        check_uint(self, "hops")


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
        check_payload(self, "payload")
        check_headers(self, "headers")
        check_msg_id(self, "msg_id")
        check_bool(self, "dedup")
        check_broker_ids(self, "dests", required=True)
        check_uint(self, "hops")
        check_broker_id(self, "source")
        check_topic(self, "topic", empty_levels=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Routes(Frame):
    """Client -> server: an operator asks for the broker's route table (``topiary routes``)."""

    TYPE: ClassVar[str] = "ROUTES"
    id: int

    def __post_init__(self) -> None:
        check_uint(self, "id")


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutesReply(Frame):
    """Server -> client: the route table for ROUTES ``id``, as a map of plain msgpack values."""

    TYPE: ClassVar[str] = "ROUTES_REPLY"
    id: int
    routes: dict[str, Any]

    def __post_init__(self) -> None:
        check_uint(self, "id")
        check_plain_map(self, "routes")


# -- the type table ----------------------------------------------------------------------
# Adding a frame: define the class above, list it here, give it rows in
# broker/wire/states.py and a section in docs/protocol.md.

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
