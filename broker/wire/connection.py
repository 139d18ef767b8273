"""The wire protocol as one object: bytes in, frames out; frames in, bytes out.

``Connection`` does no I/O (as h11's ``Connection``): the caller reads the socket and passes
what it got to ``receive_data`` (``b""`` at EOF), then calls ``next_event`` until it returns
``NEED_DATA``; to talk, it calls ``send`` and writes the bytes returned. So the whole protocol
is tested without sockets, and the trio shells (broker/native/connection.py for clients,
broker/mesh/ for peer links) stay thin::

    while True:
        try:
            event = conn.next_event()
        except RemoteProtocolError as exc:
            await stream.send_all(conn.send(Error.from_exception(exc)))
            if exc.closes_connection:
                return
            continue  # a refused request: the connection carries on
        if event is NEED_DATA:
            conn.receive_data(await stream.receive_some(RECEIVE_SIZE))
        elif isinstance(event, ConnectionClosed):
            return
        else:
            ...  # handle the frame

``next_events`` returns every event of one read in one call (errors in place, not raised),
for readers that handle pipelined frames in batches (the broker's).

The rules for which frame may go when are in broker/wire/states.py; the frames in
broker/wire/frames.py, their field checks in broker/wire/checks.py and their codec in
broker/wire/codec.py; the length prefix in broker/wire/buffer.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal, NoReturn

import msgpack

from broker.core.message import Message
from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from broker.wire.buffer import DEFAULT_MAX_FRAME, LENGTH_PREFIX, FrameBuffer
from broker.wire.codec import (
    PlainPub,
    append_msg,
    build_frame,
    decode_frame,
    encode_frame,
    encode_fwd,
    encode_msg,
    encode_pub,
    encode_puback,
    encode_suback,
    encode_unsuback,
    fast_fwd,
    fast_pub,
    fast_puback,
    fast_sub,
    fast_suback,
    fast_unsub,
    fast_unsuback,
    frame_too_large,
    plain_pub,
    unpack_body,
)
from broker.wire.frames import (
    Frame,
    Fwd,
    Msg,
    PeerWelcome,
    Pub,
    PubAck,
    Sub,
    SubAck,
    Unsub,
    UnsubAck,
    Welcome,
)
from broker.wire.states import (
    CLOSED,
    DISCARDING_STATES,
    ERROR,
    INITIAL_STATE,
    OPEN,
    PEER_OPEN,
    SEND,
    Role,
    State,
    check_readable,
    check_receive,
    check_send,
    send_transition,
    settle,
    steady_send_state,
)
from routing import TopicError, validate_topic

__all__ = [
    "NEED_DATA",
    "Connection",
    "ConnectionClosed",
    "Event",
    "NeedData",
    "Role",
    "State",
    "decode_frame",
    "encode_frame",
]


_SERVER: Final = Role.SERVER
_CLIENT: Final = Role.CLIENT
# What a server in OPEN decodes without check_receive (OPEN -> OPEN, nothing to settle), by
# wire type; ``next_events`` looks them up directly, ``_receive`` by frame class.
_SERVER_FAST: Final[dict[str, Callable[[dict[str, Any]], Frame]]] = {
    Pub.TYPE: fast_pub,
    Sub.TYPE: fast_sub,
    Unsub.TYPE: fast_unsub,
}
#: The same for a server whose plain PUBs are routed from their map (``plain_pubs``).
_SERVER_PLAIN: Final[dict[str, Callable[[dict[str, Any]], Frame | PlainPub]]] = {
    **_SERVER_FAST,
    Pub.TYPE: plain_pub,
}
_unpackb: Final = msgpack.unpackb
_validate_topic: Final = validate_topic
#: Per role: the one state in which each hot-path frame may be sent (None: never), so that
#: the ``send_puback``/``append_msg``/... methods check their state with one compare.
_HOT_STATES: Final = {
    role: {cls: steady_send_state(role, cls) for cls in (Msg, PubAck, SubAck, UnsubAck, Pub, Fwd)}
    for role in Role
}


#: ``_plain_pubs``' answer when it did not unpack the body it stopped at.
_UNREAD: Final = object()


def _plain_pubs(
    bodies: list[memoryview], start: int, append: Callable[[PlainPub], None]
) -> tuple[int, Any]:
    """Append the maps of the plain PUBs (type, topic and payload only: ``plain_pub``'s
    commonest case, which it returns as they come) from ``bodies[start]`` on, up to the first
    body that is anything else; returns that body's index (``len(bodies)`` if none) and what
    it unpacked it to (None if it does not unpack, ``_UNREAD`` at the end), so that the
    caller does not unpack it again: a storm of pipelined SUBs stops here at every frame.

    A publisher's read is hundreds of them: this loop is ``next_events``' per-frame work for
    them, with nothing but the checks ``plain_pub`` makes.
    """
    for i in range(start, len(bodies)):
        try:
            wire = _unpackb(bodies[i])
        except Exception:  # (next_events says what is wrong)
            return i, None
        if wire.__class__ is not dict or len(wire) != 3 or wire.get("type") != "PUB":
            return i, wire
        topic = wire.get("topic")
        if topic.__class__ is not str or wire.get("payload").__class__ is not bytes:
            return i, wire
        try:
            _validate_topic(topic)
        except TopicError:
            return i, wire  # (plain_pub says what is wrong)
        append(wire)
    return len(bodies), _UNREAD


def _requests_run(
    bodies: list[memoryview],
    start: int,
    wire_type: str,
    build: Callable[[dict[str, Any]], Frame],
    append: Callable[[Frame], None],
) -> tuple[int, Any]:
    """Append the frames of the run of requests of one type (SUB or UNSUB: a storm pipelines
    tens of thousands) from ``bodies[start]`` on, each built by ``build``, the fast path the
    caller took for the one before; returns the index of the first body of another type, and
    its map as ``_plain_pubs`` does. A body ``build`` refuses is left to the caller (its map
    ``_UNREAD``), which says what is wrong."""
    for i in range(start, len(bodies)):
        try:
            wire = _unpackb(bodies[i])
        except Exception:  # (next_events says what is wrong)
            return i, None
        if wire.__class__ is not dict or wire.get("type") != wire_type:
            return i, wire
        try:
            frame = build(wire)
        except RemoteProtocolError:
            return i, _UNREAD
        append(frame)
    return len(bodies), _UNREAD


class NeedData(Enum):
    """The type of the ``NEED_DATA`` sentinel."""

    NEED_DATA = "NEED_DATA"


#: ``next_event`` has no whole frame yet: read the socket and call ``receive_data``.
NEED_DATA: Final = NeedData.NEED_DATA


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed its side (EOF) at a frame boundary; nothing more will arrive."""


#: What ``next_event`` returns.
Event = Frame | Literal[NeedData.NEED_DATA] | ConnectionClosed


class Connection:
    """One end of one connection, in the given ``role``; see the module docstring.

    ``role`` is CLIENT or SERVER for client connections; a broker dialing a peer link plays
    PEER, and the listener SERVER (PEER_HELLO takes it down the peer branch of the table).

    ``max_frame`` is the largest frame body we accept. ``peer_max_frame`` is the largest we
    send: 1 MiB (the protocol default) until a client learns the server's from WELCOME, or a
    dialing broker the listener's from PEER_WELCOME; a server may set it if it knows better.
    """

    def __init__(self, role: Role, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.role = Role(role)
        self.state: State = INITIAL_STATE[self.role]
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self._buffer = FrameBuffer(max_frame)
        hot = _HOT_STATES[self.role]
        self._msg_state = hot[Msg]
        self._puback_state = hot[PubAck]
        self._suback_state = hot[SubAck]
        self._unsuback_state = hot[UnsubAck]
        self._pub_state = hot[Pub]
        self._fwd_state = hot[Fwd]
        self._error: RemoteProtocolError | None = None
        # Whole bodies next_events cut but did not decode yet: the first would change the
        # state, and the frames returned before it must be handled in the state they came in.
        self._held: list[bytes] = []
        # A server's ``next_events`` returns each plain PUB (no id, headers or retain flag) as
        # its checked wire map (``codec.plain_pub``), not as a Pub frame: set by the broker's
        # native front end, which routes them from the map.
        self.plain_pubs = False

    def __repr__(self) -> str:
        return f"<Connection {self.role.value} {self.state.value}>"

    @property
    def max_frame(self) -> int:
        """The largest frame body this end accepts."""
        return self._buffer.max_frame

    @property
    def error(self) -> RemoteProtocolError | None:
        """The stream-level error that put the connection in ERROR, if any."""
        return self._error

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames (at most one partial frame after
        ``next_event`` returned NEED_DATA)."""
        return self._buffer.buffered + sum(LENGTH_PREFIX + len(body) for body in self._held)

    def receive_data(self, data: bytes) -> None:
        """Add bytes read from the peer; ``b""`` means EOF. Never raises for bad input:
        ``next_event`` does. After EOF, more data is a LocalProtocolError."""
        self._buffer.feed(data)

    def next_event(self) -> Event:
        """The next frame, ``NEED_DATA`` or ``ConnectionClosed()``; never blocks.

        Raises RemoteProtocolError when the peer broke the protocol. If its code closes the
        connection, the state becomes ERROR and every later call raises it again, until the
        ERROR frame that answers it is sent (then CLOSING: input is dropped until EOF); if
        not (a refused request such as INVALID_FILTER, with ``ref``), that frame is dropped
        and the next call goes on with the following one.
        """
        if self.state is not OPEN:  # (OPEN, the common state, is readable for both roles)
            if self.state is ERROR and self._error is not None:
                raise self._error
            check_readable(self.role, self.state)
        while True:
            state = self.state
            if state is OPEN:
                discarding = False
            elif state is CLOSED:
                return ConnectionClosed()
            else:
                discarding = state in DISCARDING_STATES
            try:
                body = self._held.pop(0) if self._held else self._buffer.next_frame()
            except RemoteProtocolError as exc:
                if not discarding:
                    self._fail(exc)
                body = None  # closing anyway: a broken stream only means "wait for EOF"
            if body is None:
                if self._buffer.at_eof:
                    self.state = CLOSED
                    return ConnectionClosed()
                return NEED_DATA
            if discarding:
                continue
            return self._receive(body)

    def next_events(self, max_frames: int = 0) -> list[Event | PlainPub | RemoteProtocolError]:
        """The events ``next_event`` would return now, in order, with each error it would
        raise put in the list in its place instead (after a refused request the following
        frames come next). The list ends with NEED_DATA or ``ConnectionClosed()``, or with an
        error that closes the connection, or else it stops just before a frame that changes
        the state (a closing ERROR from the peer, or a frame that is a closing error), or
        after about ``max_frames`` frames when that is not 0: then handle the list and call
        again before reading, so that every frame is handled in the state it was received in
        (replies to it may be sent), and a reader can bound its work per turn.

        One call per read instead of one per frame: a client may pipeline thousands of SUBs
        in one read. LocalProtocolError (our own misuse) is raised as by ``next_event``.
        With ``plain_pubs``, a plain PUB is its checked wire map (``codec.plain_pub``).
        """
        events: list[Event | PlainPub | RemoteProtocolError] = []
        append = events.append
        buffer = self._buffer
        receive = self._receive
        fast = None
        plain = False
        if self.role is _SERVER:
            plain = self.plain_pubs
            fast = _SERVER_PLAIN if plain else _SERVER_FAST
        while True:
            if self.state is OPEN:  # the common state: next_event's loop, inlined
                try:
                    if self._held:
                        bodies, self._held = self._held, []
                    else:
                        bodies = buffer.next_frames(max_frames)
                except RemoteProtocolError as exc:
                    self._error = exc
                    self.state = ERROR
                    append(exc)
                    return events
                if not bodies:
                    if buffer.at_eof:
                        self.state = CLOSED
                        append(ConnectionClosed())
                    else:
                        append(NEED_DATA)
                    return events
                count = len(bodies)
                i, wire = _plain_pubs(bodies, 0, append) if plain else (0, _UNREAD)
                while i < count:
                    body = bodies[i]
                    build = None
                    if fast:  # a server's PUB, SUB, UNSUB: _receive's fast paths, inlined
                        if wire is _UNREAD:
                            try:
                                wire = _unpackb(body)  # (raw=False, strict_map_key, use_list)
                            except Exception:  # _receive says what is wrong
                                wire = None
                        if wire.__class__ is dict:
                            wire_type = wire.get("type")  # type: ignore[union-attr]
                            if wire_type.__class__ is str:
                                build = fast.get(wire_type)
                    try:
                        # (a fast path's frame leaves the state OPEN: only _receive's may not)
                        event = receive(body) if build is None else build(wire)
                    except RemoteProtocolError as exc:
                        if exc.closes_connection:
                            if events:  # first let the caller handle the frames before it
                                self.state = OPEN
                                self._error = None
                                self._held = bodies[i:]
                                return events
                            self._error = exc
                            self.state = ERROR
                            append(exc)
                            return events  # (the frames after it are dropped)
                        append(exc)
                    else:
                        if build is None and self.state is not OPEN:  # a closing ERROR frame
                            if events:  # likewise
                                self.state = OPEN
                                self._held = bodies[i:]
                                return events
                            append(event)
                            break  # (the frames after it are dropped)
                        append(event)
                    i += 1
                    wire = _UNREAD
                    if build is fast_sub or build is fast_unsub:  # pipelined: the rest of the run
                        i, wire = _requests_run(bodies, i, wire_type, build, append)
                    elif plain:
                        i, wire = _plain_pubs(bodies, i, append)
                if max_frames and len(events) >= max_frames:
                    return events  # the caller's turn is up: it calls again
                continue
            try:
                event = self.next_event()
            except RemoteProtocolError as exc:
                append(exc)
                if exc.closes_connection:
                    return events
                continue
            append(event)
            if event is NEED_DATA or event.__class__ is ConnectionClosed:
                return events

    def _receive(self, body: bytes) -> Frame:
        try:
            frame_type, wire = unpack_body(body)
            if self.state is OPEN:
                if self.role is _SERVER:
                    if frame_type is Pub:
                        return fast_pub(wire)  # the hot path: OPEN -> OPEN, no state to settle
                    if frame_type is Sub:
                        return fast_sub(wire)  # pipelined by the ten thousand: OPEN -> OPEN
                    if frame_type is Unsub:
                        return fast_unsub(wire)  # likewise
                elif self.role is _CLIENT:
                    if frame_type is PubAck:
                        return fast_puback(wire)  # a confirming publisher reads one per message
                    if frame_type is SubAck:
                        return fast_suback(wire)  # one per SUB, pipelined by the thousand
                    if frame_type is UnsubAck:
                        return fast_unsuback(wire)  # likewise
            if frame_type is Fwd and self.state is PEER_OPEN:
                return fast_fwd(wire)  # between brokers: PEER_OPEN -> PEER_OPEN, either end
            next_state = check_receive(self.role, self.state, frame_type)
            frame = build_frame(frame_type, wire)
        except RemoteProtocolError as exc:
            if exc.closes_connection:
                self._fail(exc)
            raise
        self.state = settle(frame, next_state)
        if isinstance(frame, Welcome | PeerWelcome):
            self.peer_max_frame = frame.max_frame
        return frame

    def _fail(self, exc: RemoteProtocolError) -> NoReturn:
        self._error = exc
        self.state = ERROR
        raise exc

    def may_send(self, frame_type: type[Frame]) -> bool:
        """Whether a ``frame_type`` may be sent now (for a task that answers late, after the
        connection may have begun to close: it asks instead of being refused)."""
        return frame_type in SEND.get((self.role, self.state), ())

    def send(self, frame: Frame) -> bytes:
        """The bytes to write for ``frame`` (length prefix included).

        Raises LocalProtocolError if this role may not send it now, or if it is larger than
        ``peer_max_frame``; the state is unchanged then.
        """
        return self.send_many((frame,))

    def send_many(self, frames: Iterable[Frame]) -> bytes:
        """The bytes for several frames in one write; all of them are sent or none."""
        state = self.state
        out = bytearray()
        for frame in frames:
            state = send_transition(self.role, state, frame)
            body = encode_frame(frame)
            if len(body) > self.peer_max_frame:
                raise frame_too_large(frame.TYPE, len(body), self.peer_max_frame)
            out += len(body).to_bytes(LENGTH_PREFIX, "big")
            out += body
        self.state = state
        return bytes(out)

    # -- hot-path sends ----------------------------------------------------------------------
    # The frames a broker or a publisher sends most, packed by the fast encoders in
    # broker/wire/codec.py: no frame object is built and the fields are not checked again
    # (they come from frames that passed the checks, or from the client, which checks them).
    # The state and the peer's frame limit are checked as ``send`` checks them: the state
    # with one compare against the state the table allows (none of these frames changes it),
    # the size with one more. Each raises LocalProtocolError as ``send`` does.

    def append_msg(
        self, parts: list[bytes | memoryview], message: Message, sub: int, seq: int
    ) -> int:
        """As ``broker.wire.codec.append_msg`` (append MSG(sub, seq) to ``parts``, return its
        size): for ``Session.take_batch``. If refused, nothing is appended."""
        if self.state is not self._msg_state:
            self._refuse(Msg)
        return append_msg(parts, message, sub, seq, self.peer_max_frame)

    def send_msg(self, message: Message, sub: int, seq: int) -> bytes:
        """The bytes of MSG(sub, seq) for ``message``."""
        if self.state is not self._msg_state:
            self._refuse(Msg)
        return self._fits(Msg, encode_msg(message, sub, seq))

    def send_puback(self, request_id: int) -> bytes:
        """The bytes of PUBACK(request_id)."""
        if self.state is not self._puback_state:
            self._refuse(PubAck)
        return self._fits(PubAck, encode_puback(request_id))

    def send_suback(self, request_id: int, sub_id: int) -> bytes:
        """The bytes of SUBACK(request_id, sub_id)."""
        if self.state is not self._suback_state:
            self._refuse(SubAck)
        return self._fits(SubAck, encode_suback(request_id, sub_id))

    def send_unsuback(self, request_id: int) -> bytes:
        """The bytes of UNSUBACK(request_id)."""
        if self.state is not self._unsuback_state:
            self._refuse(UnsubAck)
        return self._fits(UnsubAck, encode_unsuback(request_id))

    def send_pub(
        self,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        request_id: int | None = None,
        msg_id: str | None = None,
    ) -> bytes:
        """The bytes of a PUB; ``request_id`` asks for PUBACK. The caller checks the fields."""
        if self.state is not self._pub_state:
            self._refuse(Pub)
        return self._fits(Pub, encode_pub(topic, payload, headers, request_id, msg_id))

    def send_fwd(
        self, message: Message, dedup: bool, dests: tuple[str, ...], hops: int, source: str
    ) -> bytes:
        """The bytes of a FWD carrying ``message`` to the brokers ``dests``."""
        if self.state is not self._fwd_state:
            self._refuse(Fwd)
        return self._fits(Fwd, encode_fwd(message, dedup, dests, hops, source))

    def _refuse(self, frame_type: type[Frame]) -> NoReturn:
        check_send(self.role, self.state, frame_type)  # raises, saying why
        raise LocalProtocolError(  # allowed, but it would change the state: not a hot path
            ErrorCode.INTERNAL, f"{frame_type.TYPE} in state {self.state.value}: use send()"
        )

    def _fits(self, frame_type: type[Frame], data: bytes) -> bytes:
        """``data`` (a whole frame) if its body is within the peer's limit."""
        size = len(data) - LENGTH_PREFIX
        if size > self.peer_max_frame:
            raise frame_too_large(frame_type.TYPE, size, self.peer_max_frame)
        return data

    def send_failed(self) -> None:
        """Call when writing failed or was cancelled halfway: the stream is unusable, and
        the connection is CLOSED for both sending and receiving."""
        self.state = CLOSED
