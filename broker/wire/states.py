"""When each frame may be said: the connection state machine, as tables.

Theory of operation
-------------------
A connection goes through phases that both ends name the same way, so that after every frame
has been delivered the two ends' ``Connection`` objects are in the same state. A client
connection goes

    AWAIT_HELLO --HELLO--> AWAIT_WELCOME --WELCOME--> OPEN

The client sends HELLO and the server receives it, and the other way round for WELCOME. In
OPEN the client sends requests (SUB, UNSUB, PUB, ACK, STATS, ROUTES, ...) and the server
answers and delivers (SUBACK, UNSUBACK, PUBACK, MSG, STATS_REPLY, ROUTES_REPLY, ...);
PING/PONG go both ways. The client does not pipeline requests behind HELLO: it waits for
WELCOME, which tells it the server's frame limit. The server answers HELLO (WELCOME or ERROR)
before it reads on, so it may not call ``next_event`` in AWAIT_WELCOME; a client's early
frames stay buffered meanwhile.

Peer links (docs/peering.md) use the same port. The dialing broker (or observer) plays PEER;
the listening broker plays SERVER, as for clients, because it learns only from the first
frame which kind of connection it has:

    AWAIT_HELLO --PEER_HELLO--> AWAIT_PEER_WELCOME --PEER_WELCOME--> PEER_OPEN

The listener answers PEER_HELLO (PEER_WELCOME, or ERROR such as BROKER_ID_CLASH) before it
reads on, as it answers HELLO. In PEER_OPEN both ends are brokers and say the same frames:
ROUTE, ROUTE_REQUEST, ROUTE_ACK, FWD, PING, PONG and ERROR, in either direction; client
frames are UNEXPECTED_FRAME there, and peer frames are UNEXPECTED_FRAME on a client's OPEN
connection. A second HELLO or PEER_HELLO after either handshake is DUPLICATE_HELLO.

ERROR may be sent by either end in every state before CLOSING. Its code decides what follows
(``broker.errors.CLOSES_CONNECTION``): a request-level code (INVALID_FILTER, ...) leaves the
state as it is; a stream-level code moves both ends to CLOSING, where nothing more may be sent
and whatever still arrives is read and dropped until EOF (so the closing end can drain its
socket and its ERROR is not lost to a TCP reset). EOF moves either end to CLOSED from any state.

A frame received that the table does not allow is the peer's fault (``RemoteProtocolError``):
HELLO_REQUIRED before HELLO, DUPLICATE_HELLO for a second HELLO, UNEXPECTED_FRAME otherwise. A
frame sent that the table does not allow is ours (``LocalProtocolError``). When a received
frame is refused with a stream-level code, ``Connection`` moves to ERROR, where ``next_event``
keeps raising that error and the only frame that may be sent is the ERROR that answers it.

Everything that affects transitions lives in this file (as h11's ``_state.py`` asks); the
state table in docs/protocol.md is ``render_state_table()`` and a test keeps them equal. To
add a role, add rows keyed by it; to add a frame, add it to the rows that allow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from broker.wire.frames import (
    Ack,
    DropSession,
    Error,
    Frame,
    Fwd,
    Hello,
    Msg,
    PeerHello,
    PeerWelcome,
    Ping,
    Pong,
    Pub,
    PubAck,
    Route,
    RouteAck,
    RouteRequest,
    Routes,
    RoutesReply,
    SessionDropped,
    Sessions,
    SessionsReply,
    Stats,
    StatsReply,
    Sub,
    SubAck,
    Unsub,
    UnsubAck,
    Welcome,
)

__all__ = [
    "DISCARDING_STATES",
    "INITIAL_STATE",
    "RECEIVE",
    "RECEIVE_REFUSALS",
    "SEND",
    "Role",
    "State",
    "check_readable",
    "check_receive",
    "check_send",
    "render_state_table",
    "send_transition",
    "settle",
    "steady_send_state",
]


class Role(StrEnum):
    """Which end of the connection a ``Connection`` plays."""

    CLIENT = "CLIENT"
    #: The listening end, for clients and peer brokers alike.
    SERVER = "SERVER"
    #: The dialing end of a peer link: a broker or an observer.
    PEER = "PEER"


class State(StrEnum):
    """The phase of the conversation (the same name on both ends, see the module docstring)."""

    AWAIT_HELLO = "AWAIT_HELLO"
    AWAIT_WELCOME = "AWAIT_WELCOME"
    OPEN = "OPEN"
    AWAIT_PEER_WELCOME = "AWAIT_PEER_WELCOME"
    PEER_OPEN = "PEER_OPEN"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"
    ERROR = "ERROR"


CLIENT, SERVER, PEER = Role.CLIENT, Role.SERVER, Role.PEER
AWAIT_HELLO, AWAIT_WELCOME, OPEN = State.AWAIT_HELLO, State.AWAIT_WELCOME, State.OPEN
AWAIT_PEER_WELCOME, PEER_OPEN = State.AWAIT_PEER_WELCOME, State.PEER_OPEN
CLOSING, CLOSED, ERROR = State.CLOSING, State.CLOSED, State.ERROR

#: Where a new connection starts.
INITIAL_STATE: Mapping[Role, State] = {
    CLIENT: AWAIT_HELLO,
    SERVER: AWAIT_HELLO,
    PEER: AWAIT_HELLO,
}

_CLIENT_REQUESTS = (
    Sub, Unsub, Pub, Ack, Ping, Pong, Stats, Sessions, DropSession, Routes, Error
)  # fmt: skip
_SERVER_REPLIES = (
    SubAck, UnsubAck, PubAck, Msg, Ping, Pong, StatsReply, SessionsReply, SessionDropped,
    RoutesReply, Error,
)  # fmt: skip
#: What both ends of an open peer link may say, in either direction.
_PEER_FRAMES = (Route, RouteRequest, RouteAck, Fwd, Ping, Pong, Error)


def _stay(state: State, *frames: type[Frame]) -> dict[type[Frame], State]:
    return dict.fromkeys(frames, state)


#: (role, state) -> frame type this role may send -> next state. A missing row: send nothing.
SEND: Mapping[tuple[Role, State], Mapping[type[Frame], State]] = {
    (CLIENT, AWAIT_HELLO): {Hello: AWAIT_WELCOME, Error: AWAIT_HELLO},
    (CLIENT, AWAIT_WELCOME): {Error: AWAIT_WELCOME},
    (CLIENT, OPEN): _stay(OPEN, *_CLIENT_REQUESTS),
    (CLIENT, ERROR): {Error: ERROR},
    (SERVER, AWAIT_HELLO): {Error: AWAIT_HELLO},
    (SERVER, AWAIT_WELCOME): {Welcome: OPEN, Error: AWAIT_WELCOME},
    (SERVER, OPEN): _stay(OPEN, *_SERVER_REPLIES),
    (SERVER, AWAIT_PEER_WELCOME): {PeerWelcome: PEER_OPEN, Error: AWAIT_PEER_WELCOME},
    (SERVER, PEER_OPEN): _stay(PEER_OPEN, *_PEER_FRAMES),
    (SERVER, ERROR): {Error: ERROR},
    (PEER, AWAIT_HELLO): {PeerHello: AWAIT_PEER_WELCOME, Error: AWAIT_HELLO},
    (PEER, AWAIT_PEER_WELCOME): {Error: AWAIT_PEER_WELCOME},
    (PEER, PEER_OPEN): _stay(PEER_OPEN, *_PEER_FRAMES),
    (PEER, ERROR): {Error: ERROR},
}

#: (role, state) -> frame type this role may receive -> next state. A missing row: this role
#: may not read in that state (CLOSING and CLOSED are handled by ``Connection`` itself).
RECEIVE: Mapping[tuple[Role, State], Mapping[type[Frame], State]] = {
    (CLIENT, AWAIT_HELLO): {Error: AWAIT_HELLO},
    (CLIENT, AWAIT_WELCOME): {Welcome: OPEN, Error: AWAIT_WELCOME},
    (CLIENT, OPEN): _stay(OPEN, *_SERVER_REPLIES),
    (SERVER, AWAIT_HELLO): {Hello: AWAIT_WELCOME, PeerHello: AWAIT_PEER_WELCOME},
    (SERVER, OPEN): _stay(OPEN, *_CLIENT_REQUESTS),
    (SERVER, PEER_OPEN): _stay(PEER_OPEN, *_PEER_FRAMES),
    (PEER, AWAIT_HELLO): {Error: AWAIT_HELLO},
    (PEER, AWAIT_PEER_WELCOME): {PeerWelcome: PEER_OPEN, Error: AWAIT_PEER_WELCOME},
    (PEER, PEER_OPEN): _stay(PEER_OPEN, *_PEER_FRAMES),
}

#: Codes for received frames the table refuses: (role, state, frame type or None for any
#: other type) -> code. Refusals not listed here are UNEXPECTED_FRAME.
RECEIVE_REFUSALS: Mapping[tuple[Role, State, type[Frame] | None], ErrorCode] = {
    (SERVER, AWAIT_HELLO, None): ErrorCode.HELLO_REQUIRED,
    (SERVER, OPEN, Hello): ErrorCode.DUPLICATE_HELLO,
    (SERVER, OPEN, PeerHello): ErrorCode.DUPLICATE_HELLO,
    (SERVER, PEER_OPEN, Hello): ErrorCode.DUPLICATE_HELLO,
    (SERVER, PEER_OPEN, PeerHello): ErrorCode.DUPLICATE_HELLO,
    (PEER, PEER_OPEN, Hello): ErrorCode.DUPLICATE_HELLO,
    (PEER, PEER_OPEN, PeerHello): ErrorCode.DUPLICATE_HELLO,
}

#: States in which received frames are read and dropped, undecoded, until EOF; framing
#: errors are ignored there too, since nobody would answer them.
DISCARDING_STATES: frozenset[State] = frozenset({CLOSING})
# States whose reading rules are not in RECEIVE: ERROR re-raises, CLOSED returns EOF.
_READ_ELSEWHERE: frozenset[State] = DISCARDING_STATES | {CLOSED, ERROR}


def send_transition(role: Role, state: State, frame: Frame) -> State:
    """The state after ``role`` sends ``frame`` in ``state``; LocalProtocolError if it may not."""
    next_state = SEND.get((role, state), {}).get(type(frame))
    if next_state is None:
        next_state = check_send(role, state, type(frame))  # raises, saying why
    return settle(frame, next_state)


def check_send(role: Role, state: State, frame_type: type[Frame]) -> State:
    """The state after ``role`` sends a ``frame_type`` in ``state``, before ``settle``;
    LocalProtocolError if it may not."""
    next_state = SEND.get((role, state), {}).get(frame_type)
    if next_state is None:
        name = getattr(frame_type, "TYPE", frame_type.__name__)
        raise LocalProtocolError(
            ErrorCode.INTERNAL, f"a {role.value} may not send {name} in state {state.value}"
        )
    return next_state


def steady_send_state(role: Role, frame_type: type[Frame]) -> State | None:
    """The one state in which ``role`` may send ``frame_type`` and stay in it (None: none).

    ``Connection``'s hot-path sends (MSG, PUBACK, FWD, ...) check their state with one
    compare against this instead of a table lookup per frame. A frame type with more than
    one such state has no single answer, so that is a ValueError: teach those sends first.
    """
    states = [
        state for (r, state), row in SEND.items() if r is role and row.get(frame_type) is state
    ]
    if len(states) > 1:
        raise ValueError(f"a {role.value} may send {frame_type.TYPE} in several states: {states}")
    return states[0] if states else None


def check_readable(role: Role, state: State) -> None:
    """LocalProtocolError if ``role`` may not read frames in ``state`` (the server between
    HELLO and its answer); checked before a frame is taken from the buffer, so none is lost."""
    if (role, state) not in RECEIVE and state not in _READ_ELSEWHERE:
        raise LocalProtocolError(
            ErrorCode.INTERNAL, f"a {role.value} may not read frames in state {state.value}"
        )


def check_receive(role: Role, state: State, frame_type: type[Frame]) -> State:
    """The state after ``role`` receives a ``frame_type`` in ``state``, before ``settle``.

    Called before the frame's fields are checked, so a refused frame is refused for its type
    whatever its contents (PUB before HELLO is HELLO_REQUIRED even with a bad topic).
    """
    check_readable(role, state)
    next_state = RECEIVE[role, state].get(frame_type)
    if next_state is not None:
        return next_state
    code = RECEIVE_REFUSALS.get((role, state, frame_type)) or RECEIVE_REFUSALS.get(
        (role, state, None), ErrorCode.UNEXPECTED_FRAME
    )
    raise RemoteProtocolError(
        code, f"a {role.value} does not accept {frame_type.TYPE} in state {state.value}"
    )


def settle(frame: Frame, next_state: State) -> State:
    """Apply the ERROR rule: an ERROR whose code closes the connection leads to CLOSING."""
    if isinstance(frame, Error) and frame.closes_connection:
        return CLOSING
    return next_state


def _describe(row: Mapping[type[Frame], State], state: State) -> str:
    parts = []
    for frame_type, next_state in row.items():
        if frame_type is Error:
            parts.append("ERROR†")
        elif next_state is state:
            parts.append(frame_type.TYPE)
        else:
            parts.append(f"{frame_type.TYPE} → {next_state.value}")
    return ", ".join(parts) if parts else "nothing"


#: The handshake frame a listener must answer before it reads on, per waiting state.
_ANSWER_FIRST: Mapping[State, str] = {AWAIT_WELCOME: "HELLO", AWAIT_PEER_WELCOME: "PEER_HELLO"}


def render_state_table() -> str:
    """The state table as markdown; docs/protocol.md must contain exactly this text.

    A role's row for a state it never reaches (a CLIENT in PEER_OPEN) is left out."""
    lines = [
        "| role | state | may send | may receive | other frames received |",
        "| --- | --- | --- | --- | --- |",
    ]
    for role in Role:
        for state in State:
            if (
                (role, state) not in SEND
                and (role, state) not in RECEIVE
                and state not in (*DISCARDING_STATES, CLOSED)
            ):
                continue
            send_row = SEND.get((role, state), {})
            receive_row = RECEIVE.get((role, state))
            if state in DISCARDING_STATES:
                receive = "anything, dropped unread; EOF → CLOSED"
                refused = "-"
            elif state is CLOSED:
                receive = "nothing (EOF seen)"
                refused = "-"
            elif state is ERROR:
                receive = "nothing: `next_event` raises the error again"
                refused = "-"
            elif receive_row is None:
                first = _ANSWER_FIRST.get(state, "the handshake")
                receive = f"nothing: answer {first} first (`next_event` is a local error)"
                refused = "-"
            else:
                receive = _describe(receive_row, state)
                default = RECEIVE_REFUSALS.get((role, state, None), ErrorCode.UNEXPECTED_FRAME)
                specific = [
                    f"{frame_type.TYPE}: {code.value}"
                    for (r, s, frame_type), code in RECEIVE_REFUSALS.items()
                    if r is role and s is state and frame_type is not None
                ]
                refused = ", ".join([*specific, f"others: {default.value}"])
            lines.append(
                f"| {role.value} | {state.value} | {_describe(send_row, state)} "
                f"| {receive} | {refused} |"
            )
    lines += ["", "† ERROR leaves the state as it is, except that a closing code leads to CLOSING."]
    return "\n".join(lines) + "\n"
