"""Frames: valid by construction, strict about types, and the msgpack codec around them."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from broker.wire import frames
from broker.wire.buffer import FrameBuffer
from broker.wire.checks import MAX_MSG_ID_BYTES, U64_MAX
from broker.wire.codec import (
    build_frame,
    decode_frame,
    encode_frame,
    fast_puback,
    fast_suback,
    fast_unsub,
    fast_unsuback,
    plain_pub,
)
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Event, Role, State
from tests.helpers import (
    ANY_FRAME,
    DEFAULT_HELLO,
    TRAILING,
    chunkings,
    framed,
    open_client,
    open_server,
    splits,
    wire,
)

#: A minimal valid wire map for every frame type; tests change one field at a time.
VALID: dict[str, dict[str, Any]] = {
    "HELLO": {"version": 1},
    "WELCOME": {
        "version": 1,
        "client_id": "c",
        "server_id": "s",
        "max_frame": 1024,
        "keepalive": 30.0,
    },
    "SUB": {"id": 1, "filter": "a/>"},
    "SUBACK": {"id": 1, "sub": 2},
    "UNSUB": {"id": 1, "sub": 2},
    "UNSUBACK": {"id": 1},
    "PUB": {"topic": "a/b", "payload": b"x"},
    "PUBACK": {"id": 1},
    "MSG": {"sub": 1, "seq": 2, "topic": "a/b", "payload": b"x", "msg_id": "m1"},
    "ACK": {"seq": 3},
    "PING": {},
    "PONG": {},
    "ERROR": {"code": "INTERNAL", "text": "oops"},
    "STATS": {"id": 1},
    "STATS_REPLY": {"id": 1, "stats": {"a": 1}},
    "SESSIONS": {"id": 1},
    "SESSIONS_REPLY": {"id": 1, "sessions": [{"client_id": "a", "pending": 0}]},
    "DROP_SESSION": {"id": 1, "client_id": "a"},
    "SESSION_DROPPED": {"id": 1, "dropped": True},
    "ROUTES": {"id": 1},
    "ROUTES_REPLY": {"id": 1, "routes": {"origins": {"b": {"seq": 1}}}},
    "PEER_HELLO": {"version": 1, "broker_id": "b", "incarnation": 7},
    "PEER_WELCOME": {
        "version": 1,
        "broker_id": "a",
        "incarnation": 5,
        "max_frame": 1024,
        "keepalive": 2.0,
    },
    "ROUTE": {"origin": "b", "incarnation": 7, "seq": 1},
    "ROUTE_REQUEST": {"origin": "b"},
    "ROUTE_ACK": {"origin": "a", "incarnation": 5, "seq": 3, "by": "b", "hops": 1},
    "FWD": {
        "topic": "a/b",
        "payload": b"x",
        "msg_id": "m1",
        "dests": ["c"],
        "hops": 0,
        "source": "a",
    },
}

_CLIENT_SENT = {
    frames.Sub,
    frames.Unsub,
    frames.Pub,
    frames.Ack,
    frames.Ping,
    frames.Pong,
    frames.Stats,
    frames.Sessions,
    frames.DropSession,
    frames.Routes,
    frames.Error,
}
_PEER_LINK = {frames.Route, frames.RouteRequest, frames.RouteAck, frames.Fwd}
DEFAULT_PEER_HELLO = frames.PeerHello(version=frames.PROTOCOL_VERSION, broker_id="b", incarnation=7)
DEFAULT_PEER_WELCOME = frames.PeerWelcome(
    version=frames.PROTOCOL_VERSION, broker_id="a", incarnation=5, max_frame=1 << 20, keepalive=2.0
)


def open_peer_server() -> Connection:
    """A listener that has received PEER_HELLO and sent PEER_WELCOME."""
    server = Connection(Role.SERVER)
    server.receive_data(framed(DEFAULT_PEER_HELLO))
    assert server.next_event() == DEFAULT_PEER_HELLO
    server.send(DEFAULT_PEER_WELCOME)
    assert server.state is State.PEER_OPEN
    return server


def receiver_for(cls: type[frames.Frame]) -> Connection:
    """A fresh Connection in a state that accepts ``cls`` from its peer."""
    if cls in (frames.Hello, frames.PeerHello):
        return Connection(Role.SERVER)
    if cls is frames.Welcome:
        client = Connection(Role.CLIENT)
        client.send(DEFAULT_HELLO)
        return client
    if cls is frames.PeerWelcome:
        dialer = Connection(Role.PEER)
        dialer.send(DEFAULT_PEER_HELLO)
        return dialer
    if cls in _PEER_LINK:
        return open_peer_server()
    return open_server() if cls in _CLIENT_SENT else open_client()


def feed(conn: Connection, chunks: list[bytes]) -> list[Event]:
    """As ``tests.helpers.feed``, but a listener also stops reading after PEER_HELLO (it
    must answer first)."""
    events: list[Event] = []
    for chunk in chunks:
        conn.receive_data(chunk)
        while True:
            event = conn.next_event()
            if event is NEED_DATA:
                break
            events.append(event)
            if isinstance(event, ConnectionClosed) or (
                conn.role is Role.SERVER
                and conn.state in (State.AWAIT_WELCOME, State.AWAIT_PEER_WELCOME)
            ):
                break
    return events


def decode_every_way(fields: dict[str, Any]) -> frames.Frame:
    """Decode a wire map with decode_frame and through a Connection fed whole, byte by byte
    and with trailing bytes; all must agree."""
    data = wire(fields)
    frame = decode_frame(data[4:])
    for name, chunks in chunkings(data):
        conn = receiver_for(type(frame))
        assert feed(conn, chunks) == [frame], name
        assert conn.buffered == (len(TRAILING) if name == "trailing" else 0)
    return frame


def reject_every_way(fields: dict[str, Any] | bytes) -> RemoteProtocolError:
    """The error for a bad frame (a wire map, or a raw body), the same every way it is fed."""
    body = fields if isinstance(fields, bytes) else msgpack.packb(fields, use_bin_type=True)
    data = len(body).to_bytes(4, "big") + body
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(body)
    expected = info.value
    wire_type = fields.get("type") if isinstance(fields, dict) else None
    cls = frames.FRAME_TYPES.get(wire_type) if isinstance(wire_type, str) else None
    for name, chunks in chunkings(data):
        conn = receiver_for(cls) if cls is not None else open_server()
        with pytest.raises(RemoteProtocolError) as info:
            feed(conn, chunks)
        got = info.value
        assert (got.code, got.text, got.ref) == (expected.code, expected.text, expected.ref), name
    return expected


def with_type(wire_type: str, **changes: Any) -> dict[str, Any]:
    return {"type": wire_type, **VALID[wire_type], **changes}


# -- the type table --------------------------------------------------------------------------


def test_frame_types_map_every_frame_class_and_back() -> None:
    classes = {
        obj
        for obj in vars(frames).values()
        if isinstance(obj, type) and issubclass(obj, frames.Frame) and obj is not frames.Frame
    }
    assert set(frames.FRAME_TYPES.values()) == classes
    for wire_type, cls in frames.FRAME_TYPES.items():
        assert wire_type == cls.TYPE
    assert set(VALID) == set(frames.FRAME_TYPES)


@pytest.mark.parametrize("wire_type", sorted(VALID))
def test_every_minimal_frame_decodes_every_way(wire_type: str) -> None:
    frame = decode_every_way(with_type(wire_type))
    assert wire_type == frame.TYPE
    assert decode_frame(encode_frame(frame)) == frame


def test_frames_are_frozen_and_keyword_only() -> None:
    ack = frames.Ack(seq=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ack.seq = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        frames.Ack(1)  # type: ignore[misc]


def test_none_fields_are_left_off_the_wire_and_come_back_as_defaults() -> None:
    body = encode_frame(frames.Pub(topic="a/b", payload=b"x"))
    assert msgpack.unpackb(body) == {"type": "PUB", "topic": "a/b", "payload": b"x"}
    assert decode_frame(body) == frames.Pub(topic="a/b", payload=b"x", headers=None, id=None)


def test_explicit_nil_for_an_optional_field_is_the_default() -> None:
    assert decode_every_way(with_type("PUB", id=None, headers=None)) == frames.Pub(
        topic="a/b", payload=b"x"
    )


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    frame = decode_every_way(with_type("ACK", future_field=[1, 2], priority=7))
    assert frame == frames.Ack(seq=3)


def test_defaults_apply_when_optional_fields_are_missing() -> None:
    assert decode_every_way(with_type("SUB")) == frames.Sub(id=1, filter="a/>", dialect="native")
    assert decode_every_way({"type": "PING"}) == frames.Ping(id=0)


# -- bad bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never used in msgpack
        b"\x81",  # map header, no content
        b"\xff\xfe\xfd garbage",
        msgpack.packb({"type": "ACK", "seq": 1}) + b"\x00",  # extra data inside the frame
        b"\x81\xa4type\xa2\xff\xfe",  # invalid UTF-8 in a str
        msgpack.packb({1: 2}),  # non-string map key
    ],
)
def test_undecodable_body_is_bad_frame(body: bytes) -> None:
    assert reject_every_way(body).code == ErrorCode.BAD_FRAME


@pytest.mark.parametrize("value", [[1, 2], "ACK", 5, None, b"bin"])
def test_body_that_is_not_a_map_is_bad_frame(value: object) -> None:
    err = reject_every_way(msgpack.packb(value, use_bin_type=True))
    assert err.code == ErrorCode.BAD_FRAME
    assert "must be a msgpack map" in err.text


def test_missing_type_is_bad_frame() -> None:
    err = reject_every_way({"seq": 1})
    assert (err.code, err.text) == (ErrorCode.BAD_FRAME, "frame has no 'type' field")


def test_type_that_is_not_a_string_is_bad_frame() -> None:
    err = reject_every_way({"type": 7, "seq": 1})
    assert err.code == ErrorCode.BAD_FRAME
    assert "must be str, got int" in err.text


def test_unknown_frame_type_is_unknown_type() -> None:
    err = reject_every_way({"type": "TELEPORT", "where": "mars"})
    assert err.code == ErrorCode.UNKNOWN_TYPE
    assert "'TELEPORT'" in err.text


@pytest.mark.parametrize("wire_type", sorted(t for t in VALID if VALID[t]))
def test_missing_required_field_is_bad_frame(wire_type: str) -> None:
    field = next(iter(VALID[wire_type]))
    fields = with_type(wire_type)
    del fields[field]
    err = reject_every_way(fields)
    assert err.code == ErrorCode.BAD_FRAME
    assert err.text == f"{wire_type} field {field!r} is missing"


# Every frame type at least once; bool/int confusions both ways; str/bytes both ways.
WRONG_FIELDS: list[tuple[str, str, Any, str]] = [
    ("HELLO", "version", "1", "must be int, got str"),
    ("HELLO", "version", True, "must be int, got bool"),
    ("HELLO", "client_id", 5, "must be str or None, got int"),
    ("HELLO", "durable", 1, "must be bool, got int"),
    ("HELLO", "group", b"g", "must be str or None, got bytes"),
    ("HELLO", "credentials", [1], "must be dict or None, got list"),
    ("HELLO", "credentials", {"k": msgpack.ExtType(5, b"x")}, "holds a value of type ExtType"),
    ("HELLO", "keepalive", "30", "must be float or None, got str"),
    ("HELLO", "keepalive", -1.0, "must be a finite number >= 0"),
    ("HELLO", "keepalive", math.inf, "must be a finite number >= 0"),
    ("WELCOME", "client_id", None, "must be str, got None"),
    ("WELCOME", "server_id", 1, "must be str, got int"),
    ("WELCOME", "session_present", 0, "must be bool, got int"),
    ("WELCOME", "max_frame", 0, "must be in 1..2**32-1"),
    ("WELCOME", "keepalive", True, "must be float, got bool"),
    ("SUB", "id", -1, "must be in 0..2**64-1, got -1"),
    ("SUB", "id", 1.0, "must be int, got float"),
    ("SUB", "filter", b"a/b", "must be str, got bytes"),
    ("SUB", "dialect", None, "must be str, got None"),
    ("SUB", "sync", "yes", "must be bool, got str"),
    ("SUBACK", "sub", "2", "must be int, got str"),
    ("UNSUB", "sub", None, "must be int, got None"),
    ("UNSUBACK", "id", [1], "must be int, got list"),
    ("PUB", "topic", 1, "must be str, got int"),
    ("PUB", "payload", "text", "must be bytes, got str"),
    ("PUB", "headers", {"k": 1}, "values must be str, got int for 'k'"),
    ("PUB", "headers", ["k"], "must be dict[str, str] or None, got list"),
    ("PUB", "id", False, "must be int or None, got bool"),
    ("PUB", "msg_id", "x" * (MAX_MSG_ID_BYTES + 1), "must be at most 256 bytes of UTF-8"),
    ("PUBACK", "id", -5, "must be in 0..2**64-1"),
    ("MSG", "seq", "1", "must be int, got str"),
    ("MSG", "payload", None, "must be bytes, got None"),
    ("MSG", "msg_id", None, "must be str, got None"),
    ("MSG", "headers", {b"k": "v"}, "keys must be str, got bytes"),
    ("ACK", "seq", True, "must be int, got bool"),
    ("ACK", "single", 1, "must be bool, got int"),
    ("PING", "id", None, "must be int, got None"),
    ("PONG", "id", "0", "must be int, got str"),
    ("ERROR", "code", 1, "must be str, got int"),
    ("ERROR", "code", "", "must not be empty"),
    ("ERROR", "text", None, "must be str, got None"),
    ("ERROR", "ref", "1", "must be int or None, got str"),
    ("STATS", "id", 1.5, "must be int, got float"),
    ("SESSIONS_REPLY", "sessions", {"a": 1}, "must be list, got dict"),
    ("DROP_SESSION", "client_id", 7, "must be str, got int"),
    ("SESSION_DROPPED", "dropped", 1, "must be bool, got int"),
    ("STATS_REPLY", "stats", None, "must be dict, got None"),
    ("STATS_REPLY", "stats", {"a": {b"k": 1}}, "holds a map key of type bytes"),
    ("ROUTES", "id", "1", "must be int, got str"),
    ("ROUTES_REPLY", "routes", [], "must be dict, got list"),
    ("PEER_HELLO", "broker_id", "", "must be a broker id"),
    ("PEER_HELLO", "broker_id", "a b", "must be a broker id"),
    ("PEER_HELLO", "broker_id", "a\x00", "must be a broker id"),
    ("PEER_HELLO", "broker_id", "x" * 257, "must be a broker id"),
    ("PEER_HELLO", "broker_id", b"b", "must be str, got bytes"),
    ("PEER_HELLO", "incarnation", -1, "must be in 0..2**64-1"),
    ("PEER_HELLO", "role", "client", "must be 'broker' or 'observer'"),
    ("PEER_HELLO", "role", None, "must be str, got None"),
    ("PEER_HELLO", "secret", 1, "must be str or None, got int"),
    ("PEER_HELLO", "digest", [], "must be dict, got list"),
    ("PEER_HELLO", "digest", {"a": [1]}, "values must be [incarnation, seq]"),
    ("PEER_HELLO", "digest", {"a": [1, -2]}, "values must be [incarnation, seq]"),
    ("PEER_HELLO", "digest", {"a": [1, True]}, "values must be [incarnation, seq]"),
    ("PEER_HELLO", "digest", {"a": {"seq": 1}}, "values must be [incarnation, seq]"),
    ("PEER_HELLO", "digest", {"a b": [1, 2]}, "keys must be broker ids"),
    ("PEER_HELLO", "keepalive", -1, "must be a finite number >= 0"),
    ("PEER_WELCOME", "max_frame", 0, "must be in 1..2**32-1"),
    ("PEER_WELCOME", "keepalive", None, "must be float, got None"),
    ("PEER_WELCOME", "broker_id", 5, "must be str, got int"),
    ("ROUTE", "origin", "a\tb", "must be a broker id"),
    ("ROUTE", "seq", "1", "must be int, got str"),
    ("ROUTE", "snapshot", 1, "must be bool, got int"),
    ("ROUTE", "more", True, "is only allowed in a snapshot"),
    ("ROUTE", "neighbors", "b", "must be list or None, got str"),
    ("ROUTE", "neighbors", ["b", ""], "items must be broker ids"),
    ("ROUTE", "neighbors", ["b", "b"], "must not name a broker twice"),
    ("ROUTE", "add", {"a/>": "native"}, "must be list, got dict"),
    ("ROUTE", "add", [["a/>"]], "items must be [filter, dialect] pairs"),
    ("ROUTE", "add", ["a/>"], "items must be [filter, dialect] pairs"),
    ("ROUTE", "add", [["a/>/b", "native"]], "holds an invalid filter 'a/>/b'"),
    ("ROUTE", "remove", [["a//b", "native"]], "holds an invalid filter 'a//b'"),
    ("ROUTE", "add", [["a", "regex"]], "holds an invalid filter 'a' ('regex')"),
    ("ROUTE_REQUEST", "origin", None, "must be str, got None"),
    ("ROUTE_ACK", "by", "", "must be a broker id"),
    ("ROUTE_ACK", "hops", 1.0, "must be int, got float"),
    ("FWD", "payload", "x", "must be bytes, got str"),
    ("FWD", "msg_id", None, "must be str, got None"),
    ("FWD", "dedup", "yes", "must be bool, got str"),
    ("FWD", "dests", [], "must not be empty"),
    ("FWD", "dests", "c", "must be list, got str"),
    ("FWD", "dests", ["c", "c"], "must not name a broker twice"),
    ("FWD", "dests", ["c d"], "items must be broker ids"),
    ("FWD", "hops", -1, "must be in 0..2**64-1"),
    ("FWD", "source", "", "must be a broker id"),
    ("FWD", "headers", {"k": 1}, "values must be str, got int for 'k'"),
]


@pytest.mark.parametrize(
    ("wire_type", "field", "value", "message"),
    WRONG_FIELDS,
    ids=[f"{t}.{f}={v!r:.12}" for t, f, v, _ in WRONG_FIELDS],
)
def test_wrong_field_type_is_bad_frame(
    wire_type: str, field: str, value: Any, message: str
) -> None:
    err = reject_every_way(with_type(wire_type, **{field: value}))
    assert err.code == ErrorCode.BAD_FRAME
    assert err.text.startswith(f"{wire_type} field {field!r} {message}"), err.text


def test_building_a_bad_frame_locally_is_a_local_error_with_the_same_message() -> None:
    with pytest.raises(LocalProtocolError) as info:
        frames.Ack(seq="1")  # type: ignore[arg-type]
    assert (info.value.code, info.value.text) == (
        ErrorCode.BAD_FRAME,
        "ACK field 'seq' must be int, got str",
    )
    assert not isinstance(info.value, RemoteProtocolError)


@pytest.mark.parametrize("value", [-1, U64_MAX + 1])
def test_integers_outside_u64_are_refused(value: int) -> None:
    with pytest.raises(LocalProtocolError, match=r"must be in 0\.\.2\*\*64-1"):
        frames.PubAck(id=value)


def test_largest_u64_is_accepted() -> None:
    assert decode_frame(encode_frame(frames.PubAck(id=U64_MAX))) == frames.PubAck(id=U64_MAX)


@pytest.mark.parametrize("payload", [bytearray(b"x"), memoryview(b"x"), "x"])
def test_payload_must_be_exactly_bytes(payload: Any) -> None:
    with pytest.raises(LocalProtocolError, match="must be bytes"):
        frames.Pub(topic="a", payload=payload)


def test_keepalive_sent_as_an_int_is_stored_as_float() -> None:
    frame = decode_every_way(with_type("HELLO", keepalive=30))
    assert isinstance(frame, frames.Hello)
    assert frame.keepalive == 30.0
    assert type(frame.keepalive) is float


def test_msg_id_limit_counts_utf8_bytes() -> None:
    frames.Pub(topic="a", payload=b"", msg_id="é" * (MAX_MSG_ID_BYTES // 2))
    with pytest.raises(LocalProtocolError, match="at most 256 bytes"):
        frames.Pub(topic="a", payload=b"", msg_id="é" * (MAX_MSG_ID_BYTES // 2) + "x")


def test_strings_with_lone_surrogates_are_refused_because_they_cannot_be_sent() -> None:
    with pytest.raises(LocalProtocolError, match="lone surrogate"):
        frames.Error(code="X", text="\udcff")


@pytest.mark.parametrize("value", [{1, 2}, (1, 2), object()])
def test_free_form_maps_hold_only_values_that_round_trip(value: object) -> None:
    with pytest.raises(LocalProtocolError, match="holds a"):
        frames.StatsReply(id=1, stats={"k": value})


# -- topics and filters: request-level errors that carry the request id ---------------------


def test_invalid_topic_in_pub_carries_the_pub_id() -> None:
    err = reject_every_way(with_type("PUB", topic="a//b", id=42))
    assert (err.code, err.ref) == (ErrorCode.INVALID_TOPIC, 42)
    assert "empty level" in err.text
    assert not err.closes_connection


def test_invalid_topic_in_pub_without_id_has_no_ref() -> None:
    err = reject_every_way(with_type("PUB", topic="a/*"))
    assert (err.code, err.ref) == (ErrorCode.INVALID_TOPIC, None)


@pytest.mark.parametrize(
    ("filter_", "dialect"),
    [("a/>/b", "native"), ("a*b", "native"), ("", "native"), ("a/#/b", "mqtt"), ("a", "regex")],
)
def test_invalid_filter_in_sub_carries_the_sub_id(filter_: str, dialect: str) -> None:
    err = reject_every_way(with_type("SUB", id=7, filter=filter_, dialect=dialect))
    assert (err.code, err.ref) == (ErrorCode.INVALID_FILTER, 7)
    assert not err.closes_connection


def test_sub_with_bad_id_and_bad_filter_reports_the_id_first() -> None:
    err = reject_every_way(with_type("SUB", id="7", filter="a/>/b"))
    assert (err.code, err.ref) == (ErrorCode.BAD_FRAME, None)


def test_bad_field_after_a_valid_request_id_names_the_request() -> None:
    err = reject_every_way(with_type("PUB", id=9, payload="not bytes"))
    assert (err.code, err.ref) == (ErrorCode.BAD_FRAME, 9)


def test_invalid_topic_in_msg_is_invalid_topic() -> None:
    assert reject_every_way(with_type("MSG", topic="a/>")).code == ErrorCode.INVALID_TOPIC


def test_valid_filters_of_both_dialects_are_accepted() -> None:
    assert decode_every_way(with_type("SUB", filter="a/ab*/*/>")).filter == "a/ab*/*/>"
    sub = decode_every_way(with_type("SUB", filter="a/+/#", dialect="mqtt", sync=True))
    assert sub == frames.Sub(id=1, filter="a/+/#", dialect="mqtt", sync=True)


# -- ERROR helpers ---------------------------------------------------------------------------


def test_error_frame_answers_a_protocol_error() -> None:
    exc = RemoteProtocolError(ErrorCode.INVALID_FILTER, "bad filter", ref=3)
    frame = frames.Error.from_exception(exc)
    assert frame == frames.Error(code="INVALID_FILTER", text="bad filter", ref=3)
    assert type(frame.code) is str
    assert not frame.closes_connection
    assert frames.Error(code="BAD_FRAME", text="").closes_connection


def test_unknown_error_codes_are_kept_and_close_the_connection() -> None:
    frame = decode_every_way({"type": "ERROR", "code": "FROM_THE_FUTURE", "text": "?"})
    assert isinstance(frame, frames.Error)
    assert frame.code == "FROM_THE_FUTURE"
    assert frame.closes_connection
    assert ProtocolError("FROM_THE_FUTURE", "?").closes_connection


def test_every_error_code_states_whether_it_closes_the_connection() -> None:
    request_level = {
        ErrorCode.INVALID_TOPIC,
        ErrorCode.INVALID_FILTER,
        ErrorCode.UNKNOWN_SUBSCRIPTION,
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.INVALID_ACK,
        ErrorCode.QUOTA_EXCEEDED,
        ErrorCode.SYNC_TIMEOUT,
        ErrorCode.NOT_AUTHORIZED,
        ErrorCode.RATE_LIMITED,
        ErrorCode.LIMIT_EXCEEDED,
        ErrorCode.STORE_FULL,  # that one publish is refused; the store may take the next
    }
    for code in ErrorCode:
        assert code.closes_connection is (code not in request_level), code
        assert code.description
        assert code.value == code.name


# -- properties ------------------------------------------------------------------------------


@settings(deadline=None)
@given(frame=ANY_FRAME, data=st.data())
def test_any_valid_frame_round_trips_for_any_split_of_its_bytes(
    frame: frames.Frame, data: st.DataObject
) -> None:
    stream = framed(frame)
    buf = FrameBuffer(max_frame=1 << 20)
    bodies = []
    for chunk in data.draw(splits(stream)):
        buf.feed(chunk)
        while (body := buf.next_frame()) is not None:
            bodies.append(body)
    assert [decode_frame(body) for body in bodies] == [frame]


FAST_PATHS = {
    "PUBACK": fast_puback,
    "SUBACK": fast_suback,
    "UNSUB": fast_unsub,
    "UNSUBACK": fast_unsuback,
}


@pytest.mark.parametrize("wire_type", FAST_PATHS)
@given(
    wire=st.dictionaries(
        st.sampled_from(["id", "sub", "type", "extra"]),
        st.one_of(st.integers(-5, 2**65), st.text(max_size=3), st.none(), st.booleans()),
    )
)
def test_the_fast_paths_of_id_only_frames_agree_with_the_full_decoder(
    wire_type: str, wire: dict[str, Any]
) -> None:
    wire = {**wire, "type": wire_type}
    try:
        expected: Any = build_frame(frames.FRAME_TYPES[wire_type], wire)
    except RemoteProtocolError as exc:
        expected = (exc.code, str(exc))
    try:
        got: Any = FAST_PATHS[wire_type](wire)
    except RemoteProtocolError as exc:
        got = (exc.code, str(exc))
    assert got == expected


@settings(max_examples=300)
@given(
    fields=st.dictionaries(
        st.sampled_from(["topic", "payload", "msg_id", "id", "headers", "retain", "extra"]),
        st.one_of(
            st.sampled_from(["a/b", "a//b", "/a", "a/*", "a/>", "", "é/x", "x" * 300]),
            st.text(max_size=4),
            st.binary(max_size=4),
            st.integers(-1, 2**65),
            st.none(),
            st.booleans(),
            st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=1),
        ),
    )
)
def test_a_plain_pub_map_stands_for_the_pub_the_full_decoder_builds(
    fields: dict[str, Any],
) -> None:
    """``plain_pub`` returns the map only for a PUB that decodes without error to a frame
    with no id, headers or retain flag, with the map's topic, payload and msg_id; anything
    else gets exactly what the full decoder gives."""
    pub = {**fields, "type": "PUB"}
    try:
        expected: Any = build_frame(frames.Pub, pub)
    except RemoteProtocolError as exc:
        expected = (exc.code, str(exc), exc.ref)
    try:
        got: Any = plain_pub(pub)
    except RemoteProtocolError as exc:
        got = (exc.code, str(exc), exc.ref)
    if got is pub:
        assert isinstance(expected, frames.Pub)
        assert expected == frames.Pub(
            topic=pub["topic"], payload=pub["payload"], msg_id=pub.get("msg_id")
        )
    else:
        assert got == expected
