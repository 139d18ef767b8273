"""Connection's hot-path sends (``send_puback``, ``append_msg``, ``send_fwd``, ...): their bytes
say exactly what ``send(frame)`` says, and they are refused exactly when ``send(frame)`` is,
for the connection's state and for the peer's frame limit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.message import Message
from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from broker.wire import codec
from broker.wire.checks import U64_MAX
from broker.wire.codec import decode_frame
from broker.wire.connection import Connection, Role, State
from broker.wire.frames import (
    PROTOCOL_VERSION,
    Error,
    Frame,
    Fwd,
    Msg,
    PeerHello,
    PeerWelcome,
    Pub,
    PubAck,
    SubAck,
    UnsubAck,
)
from tests.helpers import DEFAULT_HELLO, DEFAULT_WELCOME, framed, open_client, open_server


@dataclass(frozen=True)
class HotSend:
    """One call of a hot-path send, the frame it stands for, and the codec call it wraps."""

    name: str
    frame: Frame
    send: Callable[[Connection], bytes]
    encode: Callable[[], bytes]


def _append(message: Message, sub: int, seq: int) -> Callable[[Connection], bytes]:
    def send(conn: Connection) -> bytes:
        parts: list[bytes | memoryview] = [b"before"]
        size = conn.append_msg(parts, message, sub, seq)
        assert parts[0] == b"before"
        data = b"".join(parts[1:])
        assert size == len(data)
        return data

    return send


def _encode_appended(message: Message, sub: int, seq: int) -> Callable[[], bytes]:
    def encode() -> bytes:
        parts: list[bytes | memoryview] = []
        codec.append_msg(parts, message, sub, seq)
        return b"".join(parts)

    return encode


ids = st.integers(0, U64_MAX)
topics = st.sampled_from(["a", "beacon/eu/de/site42/checkout/purchase", "x/\u00e9/y"])
payloads = st.binary(max_size=300)
headers = st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)
msg_ids = st.text(min_size=1, max_size=20)
broker_ids = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=16
)


@st.composite
def hot_sends(draw: st.DrawFn, name: str | None = None) -> HotSend:
    """Any hot send (or the one called ``name``) with any valid fields."""
    name = name or draw(st.sampled_from(HOT_SENDS))
    rid, sub = draw(ids), draw(ids)
    if name == "send_puback":
        return HotSend(
            name, PubAck(id=rid), lambda c: c.send_puback(rid), lambda: codec.encode_puback(rid)
        )
    if name == "send_suback":
        return HotSend(
            name,
            SubAck(id=rid, sub=sub),
            lambda c: c.send_suback(rid, sub),
            lambda: codec.encode_suback(rid, sub),
        )
    if name == "send_unsuback":
        return HotSend(
            name,
            UnsubAck(id=rid),
            lambda c: c.send_unsuback(rid),
            lambda: codec.encode_unsuback(rid),
        )
    topic, payload, hdrs = draw(topics), draw(payloads), draw(headers)
    if name == "send_pub":
        msg_id = draw(st.none() | msg_ids)
        request_id = draw(st.none() | ids)
        return HotSend(
            name,
            Pub(topic=topic, payload=payload, headers=hdrs, id=request_id, msg_id=msg_id),
            lambda c: c.send_pub(topic, payload, hdrs, request_id, msg_id),
            lambda: codec.encode_pub(topic, payload, hdrs, request_id, msg_id),
        )
    message = Message(topic, payload, hdrs, draw(msg_ids))
    if name in ("send_msg", "append_msg"):
        frame = Msg(
            sub=sub, seq=rid, topic=topic, payload=payload, headers=hdrs, msg_id=message.msg_id
        )
        if name == "send_msg":
            return HotSend(
                name,
                frame,
                lambda c: c.send_msg(message, sub, rid),
                lambda: codec.encode_msg(message, sub, rid),
            )
        return HotSend(name, frame, _append(message, sub, rid), _encode_appended(message, sub, rid))
    assert name == "send_fwd"
    dedup, hops, source = draw(st.booleans()), draw(ids), draw(broker_ids)
    dests = tuple(draw(st.lists(broker_ids, min_size=1, max_size=4, unique=True)))
    return HotSend(
        name,
        Fwd(
            topic=topic,
            payload=payload,
            headers=hdrs,
            msg_id=message.msg_id,
            dedup=dedup,
            dests=list(dests),
            hops=hops,
            source=source,
        ),
        lambda c: c.send_fwd(message, dedup, dests, hops, source),
        lambda: codec.encode_fwd(message, dedup, dests, hops, source),
    )


HOT_SENDS = [
    "send_puback",
    "send_suback",
    "send_unsuback",
    "send_msg",
    "append_msg",
    "send_pub",
    "send_fwd",
]

PEER_HELLO = PeerHello(version=PROTOCOL_VERSION, broker_id="broker-b", incarnation=1)
PEER_WELCOME = PeerWelcome(
    version=PROTOCOL_VERSION, broker_id="broker-a", incarnation=5, max_frame=1 << 20, keepalive=2
)
#: An ERROR whose code closes the connection, and one that only refuses a request.
CLOSING_ERROR = Error(code=ErrorCode.BAD_FRAME.value, text="bye")
REFUSAL = Error(code=ErrorCode.INVALID_TOPIC.value, text="no", ref=1)


def open_peer_link(welcome: PeerWelcome = PEER_WELCOME) -> tuple[Connection, Connection]:
    """The dialer (PEER) and the listener (SERVER) of a peer link in PEER_OPEN."""
    dialer, listener = Connection(Role.PEER), Connection(Role.SERVER)
    listener.receive_data(dialer.send(PEER_HELLO))
    assert listener.next_event() == PEER_HELLO
    dialer.receive_data(listener.send(welcome))
    assert dialer.next_event() == welcome
    assert dialer.state is listener.state is State.PEER_OPEN
    return dialer, listener


def open_sender(hot: HotSend) -> tuple[Connection, Connection]:
    """An open connection whose end may send ``hot``, and the end that receives it."""
    if hot.name == "send_fwd":
        return open_peer_link()
    if hot.name == "send_pub":
        return open_client(), open_server()
    return open_server(), open_client()


def outcome(call: Callable[[], bytes]) -> tuple[str, object]:
    """What a send did: its frame decoded, or the error it raised."""
    try:
        data = call()
    except LocalProtocolError as exc:
        return "refused", (exc.code, exc.text)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    return "sent", decode_frame(data[4:])


# -- the bytes -------------------------------------------------------------------------------


@given(hot=hot_sends())
def test_a_hot_send_says_what_send_of_its_frame_says(hot: HotSend) -> None:
    conn, receiver = open_sender(hot)
    data = hot.send(conn)
    assert data == hot.encode()  # one codec: the method wraps the fast encoder
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert decode_frame(data[4:]) == hot.frame
    assert conn.state is receiver.state
    receiver.receive_data(data)  # and the far end reads the frame (through its fast decoder)
    assert receiver.next_event() == hot.frame


@pytest.mark.parametrize("name", HOT_SENDS)
@given(data=st.data())
def test_the_other_end_of_a_peer_link_sends_fwd_too_and_nobody_else_does(
    name: str, data: st.DataObject
) -> None:
    hot = data.draw(hot_sends(name))
    dialer, listener = open_peer_link()
    for conn, receiver in ((listener, dialer), (dialer, listener)):
        if name == "send_fwd":
            receiver.receive_data(hot.send(conn))
            assert receiver.next_event() == hot.frame
        else:
            with pytest.raises(LocalProtocolError):
                hot.send(conn)
        assert conn.state is State.PEER_OPEN


# -- refused in the wrong state --------------------------------------------------------------


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("name", HOT_SENDS)
@settings(max_examples=5)  # 168 cases; the fields do not decide, the state does
@given(data=st.data())
def test_a_hot_send_is_refused_exactly_when_send_of_its_frame_is(
    name: str, role: Role, state: State, data: st.DataObject
) -> None:
    """Every role in every state (set directly: both depend on nothing else), against the
    table as ``send`` reads it: the same frame or the same error, and the same next state."""
    hot = data.draw(hot_sends(name))
    slow_conn, fast_conn = Connection(role), Connection(role)
    slow_conn.state = fast_conn.state = state
    slow = outcome(lambda: slow_conn.send(hot.frame))
    fast = outcome(lambda: hot.send(fast_conn))
    assert fast == slow
    assert fast_conn.state is slow_conn.state


@pytest.mark.parametrize("name", HOT_SENDS)
@given(data=st.data())
def test_before_welcome_nothing_hot_may_be_sent(name: str, data: st.DataObject) -> None:
    hot = data.draw(hot_sends(name))
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    dialer, listener = Connection(Role.PEER), Connection(Role.SERVER)
    ends = [client, server, dialer, listener]
    for conn in ends:  # nothing said yet
        with pytest.raises(LocalProtocolError):
            hot.send(conn)
    server.receive_data(client.send(DEFAULT_HELLO))
    assert server.next_event() == DEFAULT_HELLO
    listener.receive_data(dialer.send(PEER_HELLO))
    assert listener.next_event() == PEER_HELLO
    for conn in ends:  # HELLO said, WELCOME not yet
        with pytest.raises(LocalProtocolError) as info:
            hot.send(conn)
        assert info.value.code == ErrorCode.INTERNAL
    assert [conn.state for conn in ends] == [
        State.AWAIT_WELCOME,
        State.AWAIT_WELCOME,
        State.AWAIT_PEER_WELCOME,
        State.AWAIT_PEER_WELCOME,
    ]


@pytest.mark.parametrize("name", HOT_SENDS)
@given(data=st.data())
def test_after_a_closing_error_nothing_hot_may_be_sent(name: str, data: st.DataObject) -> None:
    hot = data.draw(hot_sends(name))
    conn, _receiver = open_sender(hot)
    conn.send(REFUSAL)  # a refused request: the connection carries on
    assert decode_frame(hot.send(conn)[4:]) == hot.frame
    conn.send(CLOSING_ERROR)
    assert conn.state is State.CLOSING
    with pytest.raises(LocalProtocolError):
        hot.send(conn)
    assert conn.state is State.CLOSING


@pytest.mark.parametrize("name", HOT_SENDS)
@given(data=st.data())
def test_after_the_peer_broke_the_stream_nothing_hot_may_be_sent(
    name: str, data: st.DataObject
) -> None:
    hot = data.draw(hot_sends(name))
    conn, _receiver = open_sender(hot)
    conn.receive_data(b"\x00\x00\x00\x01\xc1")  # 0xc1: never valid msgpack
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        hot.send(conn)
    conn.send_failed()
    with pytest.raises(LocalProtocolError):
        hot.send(conn)


def test_refused_append_msg_leaves_the_batch_as_it_was() -> None:
    server = Connection(Role.SERVER)
    parts: list[bytes | memoryview] = [b"x"]
    with pytest.raises(LocalProtocolError):
        server.append_msg(parts, Message("a", b"p", None, "m"), 1, 1)
    assert parts == [b"x"]


# -- refused over the peer's frame limit -----------------------------------------------------


@given(hot=hot_sends())
def test_a_hot_send_fits_the_peers_limit_to_the_byte(hot: HotSend) -> None:
    conn, _receiver = open_sender(hot)
    size = len(hot.encode()) - 4
    conn.peer_max_frame = size
    assert hot.send(conn) == hot.encode()
    conn.peer_max_frame = size - 1
    with pytest.raises(LocalProtocolError) as info:
        hot.send(conn)
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert f"{hot.frame.TYPE} frame of {size} bytes" in info.value.text
    assert conn.state in (State.OPEN, State.PEER_OPEN)


def test_refused_append_msg_over_the_limit_leaves_the_batch_as_it_was() -> None:
    server = open_server()
    server.peer_max_frame = 100
    parts: list[bytes | memoryview] = []
    assert server.append_msg(parts, Message("a", b"p" * 10, None, "m"), 1, 1) > 0
    before = list(parts)
    with pytest.raises(LocalProtocolError) as info:
        server.append_msg(parts, Message("a", b"p" * 100, None, "m"), 1, 2)
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert parts == before


def test_a_client_publishes_within_the_limit_welcome_announced() -> None:
    client = Connection(Role.CLIENT)
    client.send(DEFAULT_HELLO)
    client.receive_data(framed(dataclasses.replace(DEFAULT_WELCOME, max_frame=100)))
    client.next_event()
    client.send_pub("a", b"x" * 50)
    with pytest.raises(LocalProtocolError) as info:
        client.send_pub("a", b"x" * 100)
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert client.state is State.OPEN


def test_a_dialer_forwards_within_the_limit_peer_welcome_announced() -> None:
    dialer, _listener = open_peer_link(dataclasses.replace(PEER_WELCOME, max_frame=100))
    assert dialer.peer_max_frame == 100
    dialer.send_fwd(Message("a", b"x" * 20, None, "m"), False, ("broker-a",), 0, "broker-b")
    with pytest.raises(LocalProtocolError) as info:
        dialer.send_fwd(Message("a", b"x" * 100, None, "m"), False, ("broker-a",), 0, "broker-b")
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert dialer.state is State.PEER_OPEN


@settings(max_examples=300, deadline=None)
@given(
    topic=st.sampled_from(["a", "x/\u00e9/y", "b" * 31, "b" * 32, "c/" * 100 + "d"]),
    size=st.sampled_from([0, 1, 255, 256, 65_535, 65_536, 70_000]),
    hdrs=headers,
    msg_id=st.text(min_size=1, max_size=40) | st.sampled_from(["m" * 31, "m" * 32, "m" * 200]),
    retained=st.booleans(),
    sub=ids,
    seq=ids,
)
def test_a_msg_is_packed_as_its_frame_whatever_the_lengths_of_its_fields(
    topic: str,
    size: int,
    hdrs: dict[str, str] | None,
    msg_id: str,
    retained: bool,
    sub: int,
    seq: int,
) -> None:
    """The shared fields (packed once per message) and the head (per delivery): the bytes
    msgpack packs for the MSG's map (in the fast encoders' key order), which decode to the
    frame, across every msgpack length form of the topic, msg_id and payload (fixstr /
    str 8, bin 8 / 16 / 32), with headers and the retained flag or without."""
    try:
        frame = Msg(
            sub=sub,
            seq=seq,
            topic=topic,
            payload=bytes(size),
            headers=hdrs,
            msg_id=msg_id,
            retained=retained,
        )
    except RemoteProtocolError:
        return  # (a msg_id the protocol does not allow: no frame to compare with)
    fields: dict[str, Any] = {"sub": sub, "seq": seq, "type": "MSG", "topic": topic}
    fields["msg_id"] = msg_id
    if hdrs is not None:
        fields["headers"] = hdrs
    if retained:
        fields["retained"] = True
    fields["payload"] = bytes(size)
    body = msgpack.packb(fields, use_bin_type=True)
    expected = len(body).to_bytes(4, "big") + body
    message = Message(topic, bytes(size), hdrs, msg_id, from_retained=retained)
    assert codec.encode_msg(message, sub, seq) == expected
    assert decode_frame(expected[4:]) == frame
    parts: list[bytes | memoryview] = []
    entries: list[Any] = [(message, sub, seq)]
    assert codec.append_msg_run(parts, entries, 0, 1, 1 << 30)[0] == 1
    assert b"".join(parts) == expected
