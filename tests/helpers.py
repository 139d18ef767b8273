"""Shared test helpers for the wire protocol: a two-ended pair, chunkings, frame strategies."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any

import msgpack
from hypothesis import strategies as st

from broker.errors import ErrorCode
from broker.wire import frames
from broker.wire.buffer import add_length_prefix
from broker.wire.checks import U64_MAX
from broker.wire.codec import encode_frame
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Event, Role, State

#: Appended by the "trailing" chunking: a length prefix and part of a body that never ends,
#: so the frame under test must come out alone and these bytes must stay buffered.
TRAILING = b"\x00\x00\x00\x10partial"

DEFAULT_HELLO = frames.Hello(version=frames.PROTOCOL_VERSION, client_id="c1")
DEFAULT_WELCOME = frames.Welcome(
    version=frames.PROTOCOL_VERSION,
    client_id="c1",
    server_id="s1",
    max_frame=1 << 20,
    keepalive=30.0,
)


def wire(fields: dict[str, Any]) -> bytes:
    """A length-prefixed frame with an arbitrary map as its body (for hand-made bad frames)."""
    return add_length_prefix(msgpack.packb(fields, use_bin_type=True))


def framed(frame: frames.Frame) -> bytes:
    """The wire bytes of a valid frame, length prefix included."""
    return add_length_prefix(encode_frame(frame))


def chunkings(data: bytes) -> list[tuple[str, list[bytes]]]:
    """The three ways every decoder test feeds its input: whole, byte by byte, with trailing
    bytes (as h11's ``tr()``)."""
    return [
        ("whole", [data]),
        ("bytewise", [data[i : i + 1] for i in range(len(data))]),
        ("trailing", [data + TRAILING]),
    ]


CHUNKING_NAMES = ["whole", "bytewise", "trailing"]


def chunked(name: str, data: bytes) -> list[bytes]:
    """One of ``chunkings(data)`` by name."""
    return dict(chunkings(data))[name]


def drain(conn: Connection) -> Iterator[Event]:
    """Events until NEED_DATA or ConnectionClosed (the last one included), or until a server
    has a HELLO to answer (it may not read on before); errors propagate."""
    for _ in range(100_000):
        event = conn.next_event()
        yield event
        if event is NEED_DATA or isinstance(event, ConnectionClosed):
            return
        if conn.role is Role.SERVER and conn.state is State.AWAIT_WELCOME:
            return
    raise AssertionError("next_event did not settle")


def feed(conn: Connection, chunks: Sequence[bytes]) -> list[Event]:
    """Feed the chunks one at a time, draining after each; every frame and the last event."""
    events: list[Event] = []
    for chunk in chunks:
        conn.receive_data(chunk)
        events.extend(e for e in drain(conn) if e is not NEED_DATA)
    return events


def open_server(max_frame: int = 1 << 20) -> Connection:
    """A server Connection that has received HELLO and sent WELCOME."""
    server = Connection(Role.SERVER, max_frame)
    server.receive_data(framed(DEFAULT_HELLO))
    assert server.next_event() == DEFAULT_HELLO
    server.send(DEFAULT_WELCOME)
    assert server.state is State.OPEN
    return server


def open_client(max_frame: int = 1 << 20) -> Connection:
    """A client Connection that has sent HELLO and received WELCOME."""
    client = Connection(Role.CLIENT, max_frame)
    client.send(DEFAULT_HELLO)
    client.receive_data(framed(DEFAULT_WELCOME))
    assert client.next_event() == DEFAULT_WELCOME
    assert client.state is State.OPEN
    return client


class ProtocolPair:
    """A client and a server Connection joined by a fake link (as h11's ``ConnectionPair``).

    ``send`` pushes frames from one end to the other and asserts that the far side decodes
    exactly the frames sent, and that both ends then agree on the connection's state.
    """

    def __init__(self, max_frame: int = 1 << 20) -> None:
        self.client = Connection(Role.CLIENT, max_frame)
        self.server = Connection(Role.SERVER, max_frame)

    def ends(self, sender: Role) -> tuple[Connection, Connection]:
        if sender is Role.CLIENT:
            return self.client, self.server
        return self.server, self.client

    def send(
        self, sender: Role, *sent: frames.Frame, chunking: str = "whole"
    ) -> list[frames.Frame]:
        """Send ``sent`` from ``sender``, deliver it all, return what the other end decoded.

        ``chunking`` is "whole" or "bytewise" (trailing bytes would corrupt the link)."""
        src, dst = self.ends(sender)
        data = src.send_many(sent) if len(sent) > 1 else src.send(sent[0])
        assert chunking in ("whole", "bytewise"), chunking
        chunks = chunked(chunking, data)
        received = feed(dst, chunks)
        assert received == list(sent)
        assert src.state is dst.state, (src, dst)
        return received  # type: ignore[return-value]

    def client_sends(self, *sent: frames.Frame, chunking: str = "whole") -> list[frames.Frame]:
        return self.send(Role.CLIENT, *sent, chunking=chunking)

    def server_sends(self, *sent: frames.Frame, chunking: str = "whole") -> list[frames.Frame]:
        return self.send(Role.SERVER, *sent, chunking=chunking)

    def handshake(
        self, hello: frames.Frame = DEFAULT_HELLO, welcome: frames.Frame = DEFAULT_WELCOME
    ) -> None:
        self.client_sends(hello)
        self.server_sends(welcome)
        assert self.client.state is self.server.state is State.OPEN

    def close(self, closer: Role) -> None:
        """``closer`` closes its side: the other end sees ConnectionClosed."""
        _src, dst = self.ends(closer)
        dst.receive_data(b"")
        assert isinstance(dst.next_event(), ConnectionClosed)
        assert dst.state is State.CLOSED


# -- hypothesis strategies for valid frames ------------------------------------------------

uints = st.integers(min_value=0, max_value=U64_MAX)
small_ids = st.integers(min_value=0, max_value=1000)
names = st.text(max_size=12)
levels = st.text(alphabet="abcé$-_.0", min_size=1, max_size=6)
topics = st.lists(levels, min_size=1, max_size=5).map("/".join)
native_filters = st.tuples(
    st.lists(
        st.one_of(levels, st.just("*"), levels.map(lambda s: s + "*")), min_size=1, max_size=4
    ),
    st.booleans(),
).map(lambda t: "/".join([*t[0], ">"] if t[1] else t[0]))
mqtt_filters = st.tuples(
    st.lists(st.one_of(levels, st.just("+"), st.just("*"), st.just(">")), min_size=1, max_size=4),
    st.booleans(),
).map(lambda t: "/".join([*t[0], "#"] if t[1] else t[0]))
headers = st.none() | st.dictionaries(names, names, max_size=3)
msg_ids = st.text(max_size=20) | st.text(alphabet="é", min_size=128, max_size=128)
seconds = st.floats(min_value=0, max_value=1e6) | st.integers(min_value=0, max_value=10_000)
plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=U64_MAX)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
plain_values = st.recursive(
    plain_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
plain_maps = st.dictionaries(names, plain_values, max_size=4)

CLIENT_FRAMES = st.one_of(
    st.builds(
        frames.Sub,
        id=uints,
        filter=native_filters,
        dialect=st.just("native"),
        sync=st.booleans(),
    ),
    st.builds(
        frames.Sub, id=uints, filter=mqtt_filters, dialect=st.just("mqtt"), sync=st.booleans()
    ),
    st.builds(frames.Unsub, id=uints, sub=uints),
    st.builds(
        frames.Pub,
        topic=topics,
        payload=st.binary(max_size=64),
        headers=headers,
        id=st.none() | uints,
        msg_id=st.none() | msg_ids,
    ),
    st.builds(frames.Ack, seq=uints, single=st.booleans()),
    st.builds(frames.Ping, id=uints),
    st.builds(frames.Pong, id=uints),
    st.builds(frames.Stats, id=uints),
    st.builds(frames.Sessions, id=uints),
    st.builds(frames.DropSession, id=uints, client_id=st.text(max_size=10)),
    # Request-level codes only: a closing ERROR ends the conversation (see ERROR_FRAMES).
    st.builds(frames.Error, code=st.sampled_from(["INVALID_ACK", "PAYLOAD_TOO_LARGE"]), text=names),
)
SERVER_FRAMES = st.one_of(
    st.builds(frames.SubAck, id=uints, sub=uints),
    st.builds(frames.UnsubAck, id=uints),
    st.builds(frames.PubAck, id=uints),
    st.builds(
        frames.Msg,
        sub=uints,
        seq=uints,
        topic=topics,
        payload=st.binary(max_size=64),
        headers=headers,
        msg_id=msg_ids,
    ),
    st.builds(frames.Ping, id=uints),
    st.builds(frames.Pong, id=uints),
    st.builds(frames.StatsReply, id=uints, stats=plain_maps),
    st.builds(
        frames.Error,
        code=st.sampled_from(["INVALID_FILTER", "UNKNOWN_SUBSCRIPTION"]),
        text=names,
        ref=st.none() | uints,
    ),
)
HANDSHAKE_FRAMES = st.one_of(
    st.builds(
        frames.Hello,
        version=uints,
        client_id=st.none() | names,
        durable=st.booleans(),
        group=st.none() | names,
        credentials=st.none() | plain_maps,
        keepalive=st.none() | seconds,
    ),
    st.builds(
        frames.Welcome,
        version=uints,
        client_id=names,
        server_id=names,
        session_present=st.booleans(),
        max_frame=st.integers(min_value=1, max_value=(1 << 32) - 1),
        keepalive=seconds,
    ),
)
ERROR_FRAMES = st.builds(
    frames.Error,
    code=st.sampled_from(list(ErrorCode)) | st.text(min_size=1, max_size=12),
    text=names,
    ref=st.none() | uints,
)
ANY_FRAME = st.one_of(HANDSHAKE_FRAMES, CLIENT_FRAMES, SERVER_FRAMES, ERROR_FRAMES)


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut into chunks at arbitrary points (empty chunks excluded: b"" means EOF)."""
    if len(data) <= 1:
        return [data]
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=len(data) - 1), max_size=8)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]
