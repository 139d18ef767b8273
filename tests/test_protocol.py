"""Connection: the sans-IO facade, its state table, and the docs generated from it."""

from __future__ import annotations

import ast
import dataclasses
import random
import re
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError, render_error_table
from broker.wire import frames
from broker.wire.buffer import add_length_prefix
from broker.wire.codec import decode_frame, encode_frame, plain_pub
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Role, State
from broker.wire.states import RECEIVE, SEND, render_state_table
from tests.helpers import (
    CHUNKING_NAMES,
    CLIENT_FRAMES,
    DEFAULT_HELLO,
    DEFAULT_WELCOME,
    SERVER_FRAMES,
    TRAILING,
    ProtocolPair,
    chunked,
    drain,
    feed,
    framed,
    open_client,
    open_server,
    splits,
    wire,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
PEER_HELLO = frames.PeerHello(version=frames.PROTOCOL_VERSION, broker_id="b", incarnation=7)
PEER_WELCOME = frames.PeerWelcome(
    version=frames.PROTOCOL_VERSION, broker_id="a", incarnation=5, max_frame=1 << 20, keepalive=2.0
)


# -- conversations through a ProtocolPair -------------------------------------------------


@pytest.mark.parametrize("chunking", ["whole", "bytewise"])
def test_handshake_opens_both_ends(chunking: str) -> None:
    pair = ProtocolPair()
    assert pair.client.state is pair.server.state is State.AWAIT_HELLO
    pair.client_sends(DEFAULT_HELLO, chunking=chunking)
    assert pair.server.state is State.AWAIT_WELCOME
    pair.server_sends(DEFAULT_WELCOME, chunking=chunking)
    assert pair.client.state is pair.server.state is State.OPEN


@pytest.mark.parametrize("chunking", ["whole", "bytewise"])
def test_a_whole_session_passes_through_unchanged(chunking: str) -> None:
    pair = ProtocolPair()
    pair.handshake()
    pair.client_sends(frames.Sub(id=1, filter="beacon/eu/>"), chunking=chunking)
    pair.server_sends(frames.SubAck(id=1, sub=10), chunking=chunking)
    pair.client_sends(
        frames.Pub(topic="beacon/eu/de", payload=b"\x00\x01", headers={"k": "v"}, id=2, msg_id="m"),
        chunking=chunking,
    )
    pair.server_sends(
        frames.PubAck(id=2),
        frames.Msg(sub=10, seq=1, topic="beacon/eu/de", payload=b"\x00\x01", msg_id="m"),
        chunking=chunking,
    )
    pair.client_sends(frames.Ack(seq=1), frames.Ping(id=5), chunking=chunking)
    pair.server_sends(frames.Pong(id=5), frames.Ping(id=6), chunking=chunking)
    pair.client_sends(frames.Pong(id=6), frames.Stats(id=3), chunking=chunking)
    pair.server_sends(frames.StatsReply(id=3, stats={"connections": 1}), chunking=chunking)
    pair.client_sends(frames.Unsub(id=4, sub=10), chunking=chunking)
    pair.server_sends(frames.UnsubAck(id=4), chunking=chunking)
    pair.close(Role.CLIENT)


def test_request_level_error_keeps_both_ends_open() -> None:
    pair = ProtocolPair()
    pair.handshake()
    pair.server_sends(frames.Error(code=ErrorCode.UNKNOWN_SUBSCRIPTION, text="no sub 9", ref=4))
    assert pair.client.state is pair.server.state is State.OPEN
    pair.client_sends(frames.Ping())


def test_stream_level_error_moves_both_ends_to_closing() -> None:
    pair = ProtocolPair()
    pair.handshake()
    pair.server_sends(frames.Error(code=ErrorCode.SLOW_CONSUMER, text="queue full"))
    assert pair.client.state is pair.server.state is State.CLOSING
    with pytest.raises(LocalProtocolError, match="SERVER may not send MSG in state CLOSING"):
        pair.server.send(frames.Msg(sub=1, seq=1, topic="a", payload=b"", msg_id="m"))
    with pytest.raises(LocalProtocolError, match="CLIENT may not send ACK in state CLOSING"):
        pair.client.send(frames.Ack(seq=1))


def test_closing_end_drops_what_still_arrives_until_eof() -> None:
    server = open_server()
    server.send(frames.Error(code=ErrorCode.SHUTTING_DOWN, text="bye"))
    server.receive_data(framed(frames.Pub(topic="a", payload=b"in flight")) + b"\xc1garbage")
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    assert isinstance(server.next_event(), ConnectionClosed)


def test_auth_failure_before_welcome_closes() -> None:
    pair = ProtocolPair()
    pair.client_sends(DEFAULT_HELLO)
    pair.server_sends(frames.Error(code=ErrorCode.AUTH_FAILED, text="nope"))
    assert pair.client.state is State.CLOSING


def test_server_may_refuse_before_hello_arrives() -> None:
    pair = ProtocolPair()
    pair.server_sends(frames.Error(code=ErrorCode.SHUTTING_DOWN, text="draining"))
    assert pair.client.state is pair.server.state is State.CLOSING


def test_clean_eof_is_connection_closed_every_time() -> None:
    server = open_server()
    server.receive_data(b"")
    for _ in range(3):
        assert isinstance(server.next_event(), ConnectionClosed)
    assert server.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        server.send(frames.Ping())


def test_data_after_eof_is_a_local_error() -> None:
    server = open_server()
    server.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        server.receive_data(b"x")


def test_send_failed_closes_the_connection() -> None:
    client = open_client()
    client.send_failed()
    assert client.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        client.send(frames.Ping())
    assert isinstance(client.next_event(), ConnectionClosed)


# -- decoding errors, each fed whole, byte by byte and with trailing bytes -------------------


def assert_sticky(conn: Connection, code: ErrorCode) -> None:
    """After a stream-level error the state is ERROR and next_event raises it again."""
    assert conn.state is State.ERROR
    assert conn.error is not None and conn.error.code == code
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value is conn.error


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_garbage_bytes_are_bad_frame_and_the_error_sticks(chunking: str) -> None:
    server = open_server()
    with pytest.raises(RemoteProtocolError) as info:
        feed(server, chunked(chunking, b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1"))
    assert info.value.code == ErrorCode.BAD_FRAME
    assert_sticky(server, ErrorCode.BAD_FRAME)
    # The one thing still allowed is the ERROR frame that answers it; then input is
    # dropped until EOF, so the server can close gracefully.
    with pytest.raises(LocalProtocolError):
        server.send(frames.Ping())
    server.send(frames.Error.from_exception(info.value))
    assert server.state is State.CLOSING
    server.receive_data(b"more garbage")
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    assert isinstance(server.next_event(), ConnectionClosed)


# No "trailing" variant: bytes after a truncated frame would be part of it.
@pytest.mark.parametrize("chunking", ["whole", "bytewise"])
def test_truncated_frame_at_eof_is_bad_frame(chunking: str) -> None:
    server = open_server()
    data = framed(frames.Pub(topic="a/b", payload=b"x" * 20))[:-3]
    feed(server, chunked(chunking, data))
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="connection closed mid-frame") as info:
        server.next_event()
    assert info.value.code == ErrorCode.BAD_FRAME
    assert_sticky(server, ErrorCode.BAD_FRAME)


def test_frame_over_limit_is_rejected_before_its_body_is_buffered() -> None:
    server = open_server(max_frame=1000)
    server.receive_data((1001).to_bytes(4, "big"))  # just the header
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert server.buffered == 0
    server.receive_data(b"x" * 1001)  # the body, should it come, is not kept
    assert server.buffered == 0
    assert_sticky(server, ErrorCode.FRAME_TOO_LARGE)


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_unknown_frame_type_is_rejected(chunking: str) -> None:
    server = open_server()
    with pytest.raises(RemoteProtocolError) as info:
        feed(server, chunked(chunking, wire({"type": "TELEPORT", "id": "b2"})))
    assert info.value.code == ErrorCode.UNKNOWN_TYPE
    assert_sticky(server, ErrorCode.UNKNOWN_TYPE)


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_pub_before_hello_is_hello_required_whatever_its_contents(chunking: str) -> None:
    for pub in (
        framed(frames.Pub(topic="a", payload=b"x")),
        wire({"type": "PUB", "topic": "a//b", "payload": "not bytes"}),
    ):
        server = Connection(Role.SERVER)
        with pytest.raises(RemoteProtocolError) as info:
            feed(server, chunked(chunking, pub))
        assert info.value.code == ErrorCode.HELLO_REQUIRED
        assert info.value.closes_connection
        assert_sticky(server, ErrorCode.HELLO_REQUIRED)


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_second_hello_is_duplicate_hello(chunking: str) -> None:
    server = open_server()
    with pytest.raises(RemoteProtocolError) as info:
        feed(server, chunked(chunking, framed(DEFAULT_HELLO)))
    assert info.value.code == ErrorCode.DUPLICATE_HELLO
    assert_sticky(server, ErrorCode.DUPLICATE_HELLO)


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_invalid_topic_in_pub_is_refused_with_ref_and_the_connection_goes_on(
    chunking: str,
) -> None:
    server = open_server()
    bad = wire({"type": "PUB", "topic": "a/*", "payload": b"x", "id": 12})
    good = framed(frames.Pub(topic="a/b", payload=b"y", id=13))
    server.receive_data(b"".join(chunked(chunking, bad + good)))
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert (info.value.code, info.value.ref) == (ErrorCode.INVALID_TOPIC, 12)
    assert server.state is State.OPEN and server.error is None
    server.send(frames.Error.from_exception(info.value))
    assert server.state is State.OPEN
    assert server.next_event() == frames.Pub(topic="a/b", payload=b"y", id=13)
    assert server.next_event() is NEED_DATA
    assert server.buffered == (len(TRAILING) if chunking == "trailing" else 0)


def test_with_plain_pubs_a_plain_pub_comes_as_its_map_and_any_other_as_a_frame() -> None:
    server = open_server()
    server.plain_pubs = True
    plain = {"type": "PUB", "topic": "a/b", "payload": b"x"}
    with_id = frames.Pub(topic="a/b", payload=b"y", id=7)
    bad = {"type": "PUB", "topic": "a/*", "payload": b"z"}
    server.receive_data(wire(plain) + framed(with_id) + wire(bad) + wire(plain))
    events = server.next_events()
    assert events[0] == plain and events[0].__class__ is dict
    assert events[1] == with_id
    assert isinstance(events[2], RemoteProtocolError)
    assert events[2].code == ErrorCode.INVALID_TOPIC
    assert events[3:] == [plain, NEED_DATA]
    assert server.state is State.OPEN


#: The fields of a PUB-like map: plain ones, and every way of not being one.
PUB_FIELDS = st.dictionaries(
    st.sampled_from(["topic", "payload", "msg_id", "id", "headers", "retain", "extra"]),
    st.one_of(
        st.sampled_from(["a/b", "a//b", "/a", "a/*", "a/>", "", "é/x", "x" * 300]),
        st.text(max_size=4),
        st.binary(max_size=4),
        st.integers(-1, 2**64 - 1),
        st.none(),
        st.booleans(),
    ),
)


def _plain_events(server: Connection, limit: int) -> list[Any]:
    """``next_events`` until NEED_DATA (left out) or an error that closes the connection;
    each error as (code, ref, closes)."""
    out: list[Any] = []
    for _ in range(1000):
        for event in server.next_events(limit):
            if event is NEED_DATA:
                return out
            if isinstance(event, RemoteProtocolError):
                out.append((event.code, event.ref, event.closes_connection))
                if event.closes_connection:
                    return out
            else:
                out.append(event)
    raise AssertionError("next_events did not settle")


@settings(max_examples=300, deadline=None)
@given(
    pubs=st.lists(
        st.one_of(
            PUB_FIELDS,
            st.tuples(  # mostly plain: a valid topic and payload, perhaps more
                st.fixed_dictionaries(
                    {"topic": st.sampled_from(["a/b", "x/y/z"]), "payload": st.binary(max_size=4)}
                ),
                PUB_FIELDS,
                st.booleans(),
            ).map(lambda t: {**t[0], **t[1]} if t[2] else t[0]),
        ).map(lambda fields: {**fields, "type": "PUB"}),
        max_size=6,
    ),
    limit=st.sampled_from([0, 1, 3]),
    data=st.data(),
)
def test_with_plain_pubs_each_pub_comes_as_plain_pub_makes_it_whatever_the_chunks(
    pubs: list[dict[str, Any]], limit: int, data: st.DataObject
) -> None:
    """``next_events`` inlines ``plain_pub``'s commonest case: each PUB comes out as
    ``plain_pub`` makes it (the map itself, a frame, or the same error), however the bytes
    arrive and however many frames a call may return."""
    expected: list[Any] = []
    for pub in pubs:
        try:
            expected.append(plain_pub(dict(pub)))
        except RemoteProtocolError as exc:
            expected.append((exc.code, exc.ref, exc.closes_connection))
            if exc.closes_connection:
                break
    stream = b"".join(wire(pub) for pub in pubs)
    server = open_server()
    server.plain_pubs = True
    got: list[Any] = []
    for chunk in data.draw(splits(stream)) if stream else []:
        server.receive_data(chunk)
        got += _plain_events(server, limit)
        if got and got[-1].__class__ is tuple and got[-1][2]:
            break  # closed: nothing more is read
    assert got == expected
    maps = [event for event, want in zip(got, expected, strict=True) if want.__class__ is dict]
    assert all(event.__class__ is dict for event in maps)


#: Bodies a server may get between plain PUBs: requests of each kind (valid and refused), and
#: bodies that are not a frame at all.
MIXED_BODIES = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("PUB"),
            "topic": st.sampled_from(["a/b", "x/y/z"]),
            "payload": st.binary(max_size=4),
        }
    ).map(wire),
    st.fixed_dictionaries(
        {
            "type": st.just("SUB"),
            "id": st.integers(0, 9),
            "filter": st.sampled_from(["a/*", "a/>/b", "x/>"]),
        }
    ).map(wire),
    st.fixed_dictionaries(
        {"type": st.just("UNSUB"), "id": st.integers(0, 9), "sub": st.integers(-1, 9)}
    ).map(wire),
    st.integers(0, 9).map(lambda rid: framed(frames.Ping(id=rid))),
    st.sampled_from([b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"type": 7})]).map(
        add_length_prefix
    ),
)


def _as_compared(event: Any) -> Any:
    """A plain PUB's map and the same PUB's frame compare alike; an error by what it says."""
    if event.__class__ is dict:
        return ("PUB", event["topic"], bytes(event["payload"]))
    if isinstance(event, frames.Pub):
        return ("PUB", event.topic, event.payload)
    if isinstance(event, RemoteProtocolError):
        return (event.code, event.ref, event.closes_connection)
    return event


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(MIXED_BODIES, max_size=8),
    plain=st.booleans(),
    limit=st.sampled_from([0, 1, 3]),
    data=st.data(),
)
def test_a_mixed_stream_gives_the_events_of_one_next_event_per_frame(
    bodies: list[bytes], plain: bool, limit: int, data: st.DataObject
) -> None:
    """``next_events`` unpacks each body once and takes runs of plain PUBs, of SUBs and of
    UNSUBs in loops of their own, each handing the map of the body it stopped at to the
    next. Whatever the mix (refused requests and bodies that are not frames included), the
    events are those of one ``next_event`` per frame, however the bytes arrive."""
    stream = b"".join(bodies)
    reference = open_server()
    if stream:  # (b"" would be the end of the stream)
        reference.receive_data(stream)
    expected: list[Any] = []
    for _ in range(100):
        try:
            event = reference.next_event()
        except RemoteProtocolError as exc:
            expected.append(_as_compared(exc))
            if exc.closes_connection:
                break
            continue
        if event is NEED_DATA:
            break
        expected.append(_as_compared(event))
    server = open_server()
    server.plain_pubs = plain
    got: list[Any] = []
    for chunk in data.draw(splits(stream)) if stream else []:
        server.receive_data(chunk)
        got += [_as_compared(e) for e in _plain_events(server, limit)]
        if got and got[-1].__class__ is tuple and got[-1][2] is True:
            break  # closed: nothing more is read
    assert got == expected


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_invalid_filter_in_sub_is_refused_with_ref_and_the_connection_goes_on(
    chunking: str,
) -> None:
    server = open_server()
    data = wire({"type": "SUB", "id": 8, "filter": "a/>/b"}) + framed(frames.Ping(id=1))
    events: list[object] = []
    errors: list[RemoteProtocolError] = []
    for chunk in chunked(chunking, data):
        server.receive_data(chunk)
        while True:
            try:
                event = server.next_event()
            except RemoteProtocolError as exc:
                errors.append(exc)
                continue
            if event is NEED_DATA:
                break
            events.append(event)
    assert [(e.code, e.ref) for e in errors] == [(ErrorCode.INVALID_FILTER, 8)]
    assert events == [frames.Ping(id=1)]


def test_frame_a_client_may_not_send_is_unexpected_frame() -> None:
    server = open_server()
    server.receive_data(framed(frames.PubAck(id=1)))
    with pytest.raises(RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code == ErrorCode.UNEXPECTED_FRAME
    assert "SERVER does not accept PUBACK in state OPEN" in info.value.text


def test_client_refuses_frames_before_welcome() -> None:
    client = Connection(Role.CLIENT)
    client.send(DEFAULT_HELLO)
    client.receive_data(framed(frames.Msg(sub=1, seq=1, topic="a", payload=b"", msg_id="m")))
    with pytest.raises(RemoteProtocolError) as info:
        client.next_event()
    assert info.value.code == ErrorCode.UNEXPECTED_FRAME


# -- local misuse ----------------------------------------------------------------------------


def test_server_must_answer_hello_before_reading_on() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(framed(DEFAULT_HELLO) + framed(frames.Ping()))
    assert server.next_event() == DEFAULT_HELLO
    with pytest.raises(LocalProtocolError, match="may not read"):
        server.next_event()
    server.send(DEFAULT_WELCOME)
    assert server.next_event() == frames.Ping()  # the early frame waited in the buffer


def test_client_may_not_send_requests_before_welcome() -> None:
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.send(frames.Sub(id=1, filter="a"))
    client.send(DEFAULT_HELLO)
    with pytest.raises(LocalProtocolError, match="CLIENT may not send SUB in state AWAIT_WELCOME"):
        client.send(frames.Sub(id=1, filter="a"))
    assert client.state is State.AWAIT_WELCOME


def test_server_may_not_send_messages_before_welcome() -> None:
    server = Connection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        server.send(frames.Msg(sub=1, seq=1, topic="a", payload=b"", msg_id="m"))
    with pytest.raises(LocalProtocolError):
        server.send(DEFAULT_WELCOME)  # no HELLO yet


def test_send_many_is_all_or_nothing() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(framed(DEFAULT_HELLO))
    server.next_event()
    with pytest.raises(LocalProtocolError):
        server.send_many([DEFAULT_WELCOME, frames.PubAck(id=1), DEFAULT_WELCOME])
    assert server.state is State.AWAIT_WELCOME
    data = server.send_many([DEFAULT_WELCOME, frames.PubAck(id=1)])
    assert data == framed(DEFAULT_WELCOME) + framed(frames.PubAck(id=1))
    assert server.state is State.OPEN


def test_client_learns_the_servers_frame_limit_from_welcome() -> None:
    client = Connection(Role.CLIENT)
    client.send(DEFAULT_HELLO)
    client.receive_data(framed(dataclasses.replace(DEFAULT_WELCOME, max_frame=100)))
    client.next_event()
    assert client.peer_max_frame == 100
    client.send(frames.Pub(topic="a", payload=b"x" * 50))
    with pytest.raises(LocalProtocolError) as info:
        client.send(frames.Pub(topic="a", payload=b"x" * 100))
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert client.state is State.OPEN


def test_sending_something_that_is_not_a_frame_is_a_local_error() -> None:
    client = open_client()
    with pytest.raises(LocalProtocolError):
        client.send(object())  # type: ignore[arg-type]


# -- the table and the docs ------------------------------------------------------------------


def test_every_frame_type_can_be_sent_and_received_somewhere() -> None:
    sendable = {t for row in SEND.values() for t in row}
    receivable = {t for row in RECEIVE.values() for t in row}
    assert sendable == receivable == set(frames.FRAME_TYPES.values())


def test_docs_contain_exactly_the_rendered_state_table() -> None:
    assert render_state_table() in DOCS.read_text(encoding="utf-8")


def test_docs_contain_exactly_the_rendered_error_table() -> None:
    assert render_error_table() in DOCS.read_text(encoding="utf-8")


def frame_section(text: str, wire_type: str) -> str:
    """The docs section "### <wire_type>", up to the next heading."""
    parts = text.split(f"\n### {wire_type}\n", 1)
    assert len(parts) == 2, f"no section for {wire_type}"
    return re.split(r"\n##+ ", parts[1], maxsplit=1)[0]


def test_docs_describe_every_frame_and_field() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for wire_type, cls in frames.FRAME_TYPES.items():
        section = frame_section(text, wire_type)
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.init:  # derived fields (Sub.parsed) are not on the wire
                assert f"| `{field.name}` |" in section, (wire_type, field.name)


def test_docs_examples_are_valid_frames_of_their_section() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for wire_type in frames.FRAME_TYPES:
        blocks = re.findall(r"```python\n(.*?)```", frame_section(text, wire_type), re.S)
        assert blocks, f"no example for {wire_type}"
        for block in blocks:
            for node in ast.parse(block).body:
                assert isinstance(node, ast.Expr)
                example = ast.literal_eval(node.value)
                frame = decode_frame(msgpack.packb(example, use_bin_type=True))
                assert wire_type == frame.TYPE


# -- properties ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "strategy"),
    [(Role.CLIENT, CLIENT_FRAMES), (Role.SERVER, SERVER_FRAMES)],
    ids=["client-to-server", "server-to-client"],
)
@settings(deadline=None)
@given(data=st.data())
def test_frames_reach_the_other_end_unchanged_for_any_split(
    sender: Role, strategy: st.SearchStrategy[frames.Frame], data: st.DataObject
) -> None:
    sent = data.draw(st.lists(strategy, min_size=1, max_size=5))
    client, server = open_client(), open_server()
    src, dst = (client, server) if sender is Role.CLIENT else (server, client)
    stream = src.send_many(sent)
    received = feed(dst, data.draw(splits(stream)))
    assert received == sent


FUZZ_MAX_FRAME = 120  # small, so that mutated prefixes often exceed it
SEED_FRAMES = [
    DEFAULT_HELLO,
    frames.Sub(id=1, filter="a/*/>"),
    frames.Pub(topic="a/b", payload=b"\x00" * 10, id=2, msg_id="m"),
    frames.Ack(seq=4),
    frames.Ping(id=1),
    frames.Error(code="INVALID_ACK", text="x", ref=1),
    frames.Msg(sub=1, seq=2, topic="a/b", payload=b"p", msg_id="m"),
    DEFAULT_WELCOME,
]
SEED_STREAM = b"".join(framed(f) for f in SEED_FRAMES)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    """Valid frames with bytes flipped, inserted, deleted or the stream cut short."""
    data = bytearray(draw(st.sampled_from([SEED_STREAM, SEED_STREAM[:60], framed(frames.Ping())])))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if not data:
            break
        i = draw(st.integers(min_value=0, max_value=len(data) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if op == "flip":
            data[i] = draw(st.integers(min_value=0, max_value=255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[i]
        else:
            del data[i:]
    return bytes(data)


def run_fuzz(conn: Connection, chunks: list[bytes]) -> None:
    """Feed chunks and drain; only frames, NEED_DATA, ConnectionClosed or RemoteProtocolError
    may come out, and after NEED_DATA at most one partial frame is buffered."""
    steps = 0
    for chunk in [*chunks, b""]:
        conn.receive_data(chunk)
        while True:
            steps += 1
            assert steps < 10_000, "next_event did not settle"
            try:
                event = conn.next_event()
            except RemoteProtocolError as exc:
                if exc.closes_connection:
                    assert conn.state is State.ERROR
                    with pytest.raises(RemoteProtocolError):
                        conn.next_event()
                    return
                continue
            if event is NEED_DATA:
                assert conn.buffered < 4 + FUZZ_MAX_FRAME
                break
            if isinstance(event, ConnectionClosed):
                return
            assert isinstance(event, frames.Frame)
            if isinstance(event, frames.Hello):
                conn.send(DEFAULT_WELCOME)
            elif isinstance(event, frames.PeerHello):
                conn.send(PEER_WELCOME)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    role=st.sampled_from(Role),
    stream=st.binary(max_size=200) | mutated_streams(),
    data=st.data(),
)
def test_fuzzed_input_yields_frames_or_remote_errors_only(
    role: Role, stream: bytes, data: st.DataObject
) -> None:
    conn = Connection(role, max_frame=FUZZ_MAX_FRAME)
    if role is Role.CLIENT:
        conn.send(DEFAULT_HELLO)
    elif role is Role.PEER:
        conn.send(PEER_HELLO)
    run_fuzz(conn, data.draw(splits(stream)) if stream else [])


def test_fuzzed_input_on_open_connections_with_a_fixed_seed() -> None:
    """Cheap extra breadth beyond hypothesis: many mutations of the seed stream, both roles."""
    rng = random.Random(0)
    for _ in range(300):
        data = bytearray(SEED_STREAM)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        conn = open_server(FUZZ_MAX_FRAME) if rng.random() < 0.5 else open_client(FUZZ_MAX_FRAME)
        cuts = sorted(rng.sample(range(1, len(data)), 5))
        chunks = [bytes(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        run_fuzz(conn, chunks)


# What each end reads in OPEN, so that mutations hit frames after good ones in one read
# (a closing error or a closing ERROR after frames that must be handled first).
OPEN_SERVER_STREAM = b"".join(
    framed(f)
    for f in [
        frames.Sub(id=1, filter="a/*/>"),
        frames.Pub(topic="a/b", payload=b"\x00" * 10, id=2, msg_id="m"),
        frames.Ping(id=1),
        frames.Unsub(id=3, sub=1),
        frames.Ack(seq=4),
        frames.Error(code="INVALID_ACK", text="x", ref=1),
        frames.Sub(id=4, filter="b"),
        frames.Error(code="INTERNAL", text="bye"),
        frames.Ping(id=5),
    ]
)
OPEN_CLIENT_STREAM = b"".join(
    framed(f)
    for f in [
        frames.SubAck(id=1, sub=1),
        frames.Msg(sub=1, seq=2, topic="a/b", payload=b"p", msg_id="m"),
        frames.UnsubAck(id=2),
        frames.PubAck(id=3),
        frames.Pong(id=1),
        frames.Error(code="INTERNAL", text="bye"),
        frames.Ping(id=5),
    ]
)


def _events_one_by_one(conn: Connection) -> list[object]:
    """What ``next_events`` must return: ``next_event`` until NEED_DATA or EOF, with the
    errors it raises in their place (a closing one ends the list)."""
    events: list[object] = []
    while True:
        try:
            event = conn.next_event()
        except RemoteProtocolError as exc:
            events.append(exc)
            if exc.closes_connection:
                return events
            continue
        events.append(event)
        if event is NEED_DATA or isinstance(event, ConnectionClosed):
            return events


def _events_in_batches(conn: Connection) -> list[object]:
    """``next_events`` until a list ends with NEED_DATA, EOF or a closing error; a list
    that stops short must stop just before a frame that changes the state."""
    events: list[object] = []
    stopped_short = False
    while True:
        state = conn.state
        batch = conn.next_events()
        assert batch
        if stopped_short:
            assert conn.state is not State.OPEN
        events += batch
        last = batch[-1]
        if (
            last is NEED_DATA
            or isinstance(last, ConnectionClosed)
            or (isinstance(last, RemoteProtocolError) and last.closes_connection)
        ):
            return events
        assert conn.state is state is State.OPEN
        stopped_short = True


def _comparable(events: list[object]) -> list[object]:
    return [
        (e.code, e.text, e.ref, e.closes_connection) if isinstance(e, RemoteProtocolError) else e
        for e in events
    ]


def test_next_events_is_next_event_until_need_data() -> None:
    """The batch form returns exactly what one-by-one reading returns, errors in place."""
    rng = random.Random(1)
    seeds = [SEED_STREAM, SEED_STREAM * 3, OPEN_SERVER_STREAM, OPEN_CLIENT_STREAM]
    streams = list(seeds)
    for _ in range(600):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(0, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        streams.append(bytes(data))
    for stream in streams:
        for opener in (open_server, open_client):
            one, batch = opener(FUZZ_MAX_FRAME), opener(FUZZ_MAX_FRAME)
            cuts = sorted(rng.sample(range(1, len(stream)), 3))
            chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
            for chunk in [*chunks, b""]:
                one.receive_data(chunk)
                batch.receive_data(chunk)
                expected = _comparable(_events_one_by_one(one))
                assert _comparable(_events_in_batches(batch)) == expected
                assert batch.state is one.state
                if one.state is State.ERROR or one.state is State.CLOSED:
                    break  # (in ERROR the batch dropped the frames after the error)
                assert batch.buffered == one.buffered


def test_encode_frame_is_the_body_without_prefix() -> None:
    body = encode_frame(frames.Ping(id=1))
    assert framed(frames.Ping(id=1)) == len(body).to_bytes(4, "big") + body
    assert list(drain(open_server())) == [NEED_DATA]
