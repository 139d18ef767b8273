"""Peer-link frames (PEER_HELLO ... FWD, ROUTES) and their place in the state machine."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import routing
from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from broker.wire import frames
from broker.wire.checks import MAX_BROKER_ID_BYTES, U64_MAX, valid_broker_id
from broker.wire.codec import build_frame, decode_frame, encode_frame, fast_fwd
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Event, Role, State
from tests.helpers import (
    DEFAULT_HELLO,
    DEFAULT_WELCOME,
    ProtocolPair,
    chunked,
    framed,
    headers,
    mqtt_filters,
    msg_ids,
    native_filters,
    open_client,
    open_server,
    plain_maps,
    seconds,
    splits,
    topics,
    uints,
    wire,
)

PEER_HELLO = frames.PeerHello(version=frames.PROTOCOL_VERSION, broker_id="broker-b", incarnation=7)
PEER_WELCOME = frames.PeerWelcome(
    version=frames.PROTOCOL_VERSION,
    broker_id="broker-a",
    incarnation=5,
    max_frame=1 << 20,
    keepalive=2.0,
)
FWD = frames.Fwd(
    topic="beacon/eu/de", payload=b"\x00x", msg_id="m-1", dests=["broker-c"], hops=0, source="a"
)
ROUTE = frames.Route.build(
    origin="broker-a",
    incarnation=5,
    seq=1,
    add=[routing.parse_filter("beacon/eu/>"), routing.parse_filter("a/+/#", "mqtt")],
)


# -- helpers ---------------------------------------------------------------------------------


def drain(conn: Connection) -> list[Event]:
    """Frames until NEED_DATA or ConnectionClosed, or until a listener has a handshake to
    answer (it may not read on before)."""
    events: list[Event] = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, ConnectionClosed) or (
            conn.role is Role.SERVER
            and conn.state in (State.AWAIT_WELCOME, State.AWAIT_PEER_WELCOME)
        ):
            return events


def feed(conn: Connection, chunks: list[bytes]) -> list[Event]:
    events: list[Event] = []
    for chunk in chunks:
        conn.receive_data(chunk)
        events += drain(conn)
    return events


class PeerPair:
    """A dialing broker (PEER) and a listener (SERVER) joined by a fake link."""

    def __init__(self, max_frame: int = 1 << 20) -> None:
        self.dialer = Connection(Role.PEER, max_frame)
        self.listener = Connection(Role.SERVER, max_frame)

    def send(self, src: Connection, *sent: frames.Frame, chunking: str = "whole") -> None:
        dst = self.listener if src is self.dialer else self.dialer
        data = src.send_many(sent)
        assert feed(dst, chunked(chunking, data)) == list(sent)
        assert src.state is dst.state, (src, dst)

    def dialer_sends(self, *sent: frames.Frame, chunking: str = "whole") -> None:
        self.send(self.dialer, *sent, chunking=chunking)

    def listener_sends(self, *sent: frames.Frame, chunking: str = "whole") -> None:
        self.send(self.listener, *sent, chunking=chunking)

    def handshake(self) -> None:
        self.dialer_sends(PEER_HELLO)
        self.listener_sends(PEER_WELCOME)
        assert self.dialer.state is self.listener.state is State.PEER_OPEN


def open_peer(role: Role, max_frame: int = 1 << 20) -> Connection:
    """One end of a peer link in PEER_OPEN."""
    pair = PeerPair(max_frame)
    pair.handshake()
    return pair.dialer if role is Role.PEER else pair.listener


def refused(conn: Connection, data: bytes) -> RemoteProtocolError:
    conn.receive_data(data)
    with pytest.raises(RemoteProtocolError) as info:
        drain(conn)
    return info.value


# -- strategies ------------------------------------------------------------------------------

ascii_ids = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=16
)
unicode_ids = st.text(
    alphabet=st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs")),
    min_size=1,
    max_size=16,
).filter(valid_broker_id)
broker_ids = ascii_ids | unicode_ids
id_lists = st.lists(broker_ids, unique=True, max_size=4)
digests = st.dictionaries(broker_ids, st.lists(uints, min_size=2, max_size=2), max_size=4)
filters = native_filters.map(routing.parse_filter) | mqtt_filters.map(
    lambda text: routing.parse_filter(text, "mqtt")
)


@st.composite
def routes(draw: st.DrawFn) -> frames.Route:
    snapshot = draw(st.booleans())
    return frames.Route(
        origin=draw(broker_ids),
        incarnation=draw(uints),
        seq=draw(uints),
        snapshot=snapshot,
        more=snapshot and draw(st.booleans()),
        neighbors=draw(id_lists if snapshot else st.none() | id_lists),
        add=[[f.text, f.dialect] for f in draw(st.lists(filters, max_size=4))],
        remove=[]
        if snapshot
        else [[f.text, f.dialect] for f in draw(st.lists(filters, max_size=4))],
    )


fwds = st.builds(
    frames.Fwd,
    topic=topics,
    payload=st.binary(max_size=64),
    headers=headers,
    msg_id=msg_ids,
    dedup=st.booleans(),
    dests=st.lists(broker_ids, unique=True, min_size=1, max_size=4),
    hops=uints,
    source=broker_ids,
)
LINK_FRAMES = st.one_of(
    routes(),
    st.builds(frames.RouteRequest, origin=broker_ids),
    st.builds(
        frames.RouteAck, origin=broker_ids, incarnation=uints, seq=uints, by=broker_ids, hops=uints
    ),
    fwds,
    st.builds(frames.Ping, id=uints),
    st.builds(frames.Pong, id=uints),
    st.builds(frames.Error, code=st.just("INVALID_TOPIC"), text=st.text(max_size=8)),
)
PEER_FRAMES = st.one_of(
    st.builds(
        frames.PeerHello,
        version=uints,
        broker_id=broker_ids,
        incarnation=uints,
        role=st.sampled_from(["broker", "observer"]),
        secret=st.none() | st.text(max_size=12),
        digest=digests,
        keepalive=st.none() | seconds,
    ),
    st.builds(
        frames.PeerWelcome,
        version=uints,
        broker_id=broker_ids,
        incarnation=uints,
        digest=digests,
        max_frame=st.integers(min_value=1, max_value=(1 << 32) - 1),
        keepalive=seconds,
    ),
    LINK_FRAMES,
    st.builds(frames.Routes, id=uints),
    st.builds(frames.RoutesReply, id=uints, routes=plain_maps),
)


# -- round trips -----------------------------------------------------------------------------


@settings(deadline=None)
@given(frame=PEER_FRAMES)
def test_every_peer_frame_round_trips(frame: frames.Frame) -> None:
    decoded = decode_frame(encode_frame(frame))
    assert decoded == frame
    assert type(decoded) is type(frame)


@settings(deadline=None)
@given(route=routes())
def test_route_keeps_its_filters_parsed(route: frames.Route) -> None:
    decoded = decode_frame(encode_frame(route))
    assert isinstance(decoded, frames.Route)
    assert decoded.added == tuple(routing.parse_filter(t, d) for t, d in route.add)
    assert decoded.removed == tuple(routing.parse_filter(t, d) for t, d in route.remove)
    header = ("origin", "incarnation", "seq", "snapshot", "more", "neighbors")  # all but filters
    built = frames.Route.build(
        **{name: getattr(route, name) for name in header},
        add=decoded.added,
        remove=decoded.removed,
    )
    assert built == decoded
    assert built.added == decoded.added and built.removed == decoded.removed


def test_route_build_keeps_the_filter_objects_without_parsing_again() -> None:
    native, mqtt = routing.parse_filter("beacon/eu/>"), routing.parse_filter("a/+/#", "mqtt")
    route = frames.Route.build(origin="a", incarnation=1, seq=2, add=[native], remove=[mqtt])
    assert route.add == [["beacon/eu/>", "native"]]
    assert route.remove == [["a/+/#", "mqtt"]]
    assert route.added[0] is native and route.removed[0] is mqtt
    assert msgpack.unpackb(encode_frame(route)) == {
        "type": "ROUTE",
        "origin": "a",
        "incarnation": 1,
        "seq": 2,
        "snapshot": False,
        "more": False,
        "add": [["beacon/eu/>", "native"]],
        "remove": [["a/+/#", "mqtt"]],
    }


def test_route_build_checks_the_other_fields_and_the_filter_type() -> None:
    with pytest.raises(LocalProtocolError, match="'more' is only allowed in a snapshot"):
        frames.Route.build(origin="a", incarnation=1, seq=1, more=True)
    with pytest.raises(LocalProtocolError, match="'origin' must be a broker id"):
        frames.Route.build(origin="a b", incarnation=1, seq=1)
    with pytest.raises(LocalProtocolError, match=r"takes routing\.Filter objects, got str"):
        frames.Route.build(origin="a", incarnation=1, seq=1, add=["a/>"])  # type: ignore[list-item]


def test_optional_fields_take_their_defaults() -> None:
    hello = decode_frame(encode_frame(PEER_HELLO))
    assert hello == frames.PeerHello(
        version=1, broker_id="broker-b", incarnation=7, role="broker", secret=None, digest={}
    )
    route = decode_frame(
        msgpack.packb({"type": "ROUTE", "origin": "a", "incarnation": 1, "seq": 1})
    )
    assert route == frames.Route(
        origin="a", incarnation=1, seq=1, add=[], remove=[], neighbors=None
    )
    assert isinstance(route, frames.Route) and route.added == route.removed == ()


def test_neighbors_none_and_empty_are_different_on_the_wire() -> None:
    unchanged = frames.Route(origin="a", incarnation=1, seq=2)
    alone = frames.Route(origin="a", incarnation=1, seq=2, neighbors=[])
    assert "neighbors" not in msgpack.unpackb(encode_frame(unchanged))
    assert decode_frame(encode_frame(alone)) == alone != unchanged


# -- broker ids and targeted rejections ------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["a", "broker-eu-1", "brøker-1", "節点", "x" * MAX_BROKER_ID_BYTES, "é" * 128, "a.b:c/d"],
)
def test_valid_broker_ids(text: str) -> None:
    assert valid_broker_id(text)
    assert frames.PeerHello(version=1, broker_id=text, incarnation=1).broker_id == text


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "a b",
        "a\tb",
        "a\nb",
        "a\x00",
        "a\x7f",
        "a\u00a0b",  # no-break space
        "a\u200bb",  # zero-width space (a format character)
        "\udcff",  # lone surrogate
        "x" * (MAX_BROKER_ID_BYTES + 1),
        "é" * 129,  # 258 bytes
        b"a",
        1,
        None,
    ],
)
def test_invalid_broker_ids(value: Any) -> None:
    assert not valid_broker_id(value)
    with pytest.raises(LocalProtocolError) as info:
        frames.RouteRequest(origin=value)
    assert info.value.code == ErrorCode.BAD_FRAME


def reject(fields: dict[str, Any]) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(msgpack.packb(fields, use_bin_type=True))
    return info.value


def test_bad_role_is_bad_frame() -> None:
    err = reject(
        {"type": "PEER_HELLO", "version": 1, "broker_id": "b", "incarnation": 1, "role": "client"}
    )
    assert err.code == ErrorCode.BAD_FRAME and err.closes_connection
    assert "'broker' or 'observer'" in err.text


@pytest.mark.parametrize(
    "digest",
    [
        {"a": [1, 2, 3]},
        {"a": [1]},
        {"a": (1, 2)},
        {"a": ["1", 2]},
        {"a": [1, 1 << 64]},
        {"a": 5},
        {"": [1, 2]},
        [["a", 1, 2]],
    ],
)
def test_digest_of_the_wrong_shape_is_bad_frame(digest: Any) -> None:
    with pytest.raises(LocalProtocolError) as info:
        frames.PeerWelcome(
            version=1, broker_id="a", incarnation=1, digest=digest, max_frame=1, keepalive=1
        )
    assert info.value.code == ErrorCode.BAD_FRAME
    assert "'digest'" in info.value.text


def test_invalid_filter_in_route_is_bad_frame_naming_the_filter() -> None:
    fields = {
        "type": "ROUTE",
        "origin": "a",
        "incarnation": 1,
        "seq": 1,
        "add": [["ok/>", "native"], ["a/>/b", "native"]],
    }
    err = reject(fields)
    assert (err.code, err.ref) == (ErrorCode.BAD_FRAME, None)
    assert err.closes_connection  # a peer that sends bad routes cannot be trusted
    assert "'a/>/b'" in err.text
    conn = open_peer(Role.SERVER)
    assert refused(conn, wire(fields)).code == ErrorCode.BAD_FRAME
    assert conn.state is State.ERROR


def test_more_without_snapshot_and_remove_in_a_snapshot_are_bad_frames() -> None:
    with pytest.raises(LocalProtocolError, match="only allowed in a snapshot"):
        frames.Route(origin="a", incarnation=1, seq=1, more=True)
    with pytest.raises(LocalProtocolError, match="must be empty in a snapshot"):
        frames.Route(origin="a", incarnation=1, seq=1, snapshot=True, remove=[["a", "native"]])
    frames.Route(origin="a", incarnation=1, seq=1, snapshot=True, more=True)  # fine


def test_fwd_needs_destinations_each_once() -> None:
    with pytest.raises(LocalProtocolError, match="'dests' must not be empty"):
        dataclasses.replace(FWD, dests=[])
    with pytest.raises(LocalProtocolError, match="must not name a broker twice"):
        dataclasses.replace(FWD, dests=["b", "c", "b"])


def test_invalid_fwd_topic_is_invalid_topic_and_the_link_goes_on() -> None:
    conn = open_peer(Role.PEER)
    bad = {
        "type": "FWD",
        "topic": "a/*/b",
        "payload": b"x",
        "msg_id": "m",
        "dests": ["c"],
        "hops": 1,
        "source": "a",
    }
    err = refused(conn, wire(bad) + framed(FWD))
    assert (err.code, err.ref) == (ErrorCode.INVALID_TOPIC, None)
    assert not err.closes_connection
    assert conn.state is State.PEER_OPEN
    conn.send(frames.Error.from_exception(err))
    assert drain(conn) == [FWD]


def test_fwd_that_is_malformed_as_well_is_bad_frame_not_invalid_topic() -> None:
    bad = {
        "type": "FWD",
        "topic": "a/*",
        "payload": b"x",
        "msg_id": "m",
        "dests": [],
        "hops": 1,
        "source": "a",
    }
    assert reject(bad).code == ErrorCode.BAD_FRAME


# -- the fast FWD decoder --------------------------------------------------------------------


@settings(deadline=None)
@given(frame=fwds)
def test_fast_fwd_gives_the_frame_build_frame_gives(frame: frames.Fwd) -> None:
    fields = msgpack.unpackb(encode_frame(frame), raw=False)
    assert fast_fwd(fields) == build_frame(frames.Fwd, fields) == frame


@pytest.mark.parametrize(
    "changes",
    [
        {},  # the common shape
        {"dedup": True},
        {"dests": ["c", "d", "e"]},
        {"headers": {"k": "v"}},  # not the common shape: falls back
        {"headers": None},
        {"msg_id": "é"},
        {"dests": ["brøker"]},
        {"source": "節点"},
    ],
)
def test_fast_fwd_agrees_with_build_frame(changes: dict[str, Any]) -> None:
    fields = {**msgpack.unpackb(encode_frame(FWD)), **changes}
    frame = fast_fwd(fields)
    assert type(frame) is frames.Fwd
    assert frame == build_frame(frames.Fwd, fields)


BAD_FWDS: list[dict[str, Any]] = [
    {"topic": "a/*"},  # (an empty level is a topic MQTT may publish: forwarded like any)
    {"topic": None},
    {"payload": "x"},
    {"msg_id": None},
    {"msg_id": "x" * 257},
    {"dedup": 1},
    {"dedup": None},
    {"dests": []},
    {"dests": ["c", "c"]},
    {"dests": ["c", "a b"]},
    {"dests": ["c", ""]},
    {"dests": "c"},
    {"hops": -1},
    {"hops": True},
    {"hops": None},
    {"source": ""},
    {"source": "a\x01"},
    {"source": "x" * 257},
]


@pytest.mark.parametrize("changes", BAD_FWDS, ids=[repr(c)[:30] for c in BAD_FWDS])
def test_fast_fwd_refuses_what_build_frame_refuses_with_the_same_error(
    changes: dict[str, Any],
) -> None:
    fields = {**msgpack.unpackb(encode_frame(FWD)), **changes}
    fields = {k: v for k, v in fields.items() if not (v is None and k in ("hops", "msg_id"))}
    with pytest.raises(RemoteProtocolError) as slow:
        build_frame(frames.Fwd, fields)
    with pytest.raises(RemoteProtocolError) as fast:
        fast_fwd(fields)
    assert (fast.value.code, fast.value.text, fast.value.ref) == (
        slow.value.code,
        slow.value.text,
        slow.value.ref,
    )


def test_connection_uses_the_fast_path_on_both_ends_of_a_link() -> None:
    for role in (Role.PEER, Role.SERVER):
        conn = open_peer(role)
        conn.receive_data(framed(FWD) + framed(dataclasses.replace(FWD, headers={"k": "v"})))
        assert drain(conn) == [FWD, dataclasses.replace(FWD, headers={"k": "v"})]
        assert conn.state is State.PEER_OPEN


# -- the state machine -----------------------------------------------------------------------


@pytest.mark.parametrize("chunking", ["whole", "bytewise"])
def test_peer_handshake_then_routes_and_events_both_ways(chunking: str) -> None:
    pair = PeerPair()
    assert pair.dialer.state is pair.listener.state is State.AWAIT_HELLO
    pair.dialer_sends(PEER_HELLO, chunking=chunking)
    assert pair.listener.state is State.AWAIT_PEER_WELCOME
    pair.listener_sends(PEER_WELCOME, chunking=chunking)
    assert pair.dialer.state is pair.listener.state is State.PEER_OPEN
    ack = frames.RouteAck(origin="broker-a", incarnation=5, seq=1, by="broker-b", hops=0)
    pair.listener_sends(ROUTE, frames.Ping(id=1), chunking=chunking)
    pair.dialer_sends(frames.Pong(id=1), ack, FWD, chunking=chunking)
    pair.dialer_sends(frames.RouteRequest(origin="broker-a"), frames.Ping(id=2), chunking=chunking)
    pair.listener_sends(frames.Pong(id=2), FWD, ack, chunking=chunking)
    pair.dialer_sends(dataclasses.replace(ROUTE, origin="broker-b"), chunking=chunking)
    assert pair.dialer.state is pair.listener.state is State.PEER_OPEN


def test_observer_handshake_is_the_same() -> None:
    pair = PeerPair()
    pair.dialer_sends(dataclasses.replace(PEER_HELLO, role="observer", secret="s"))
    pair.listener_sends(PEER_WELCOME)
    assert pair.dialer.state is State.PEER_OPEN


def test_dialer_learns_the_listeners_frame_limit_from_peer_welcome() -> None:
    pair = PeerPair()
    pair.dialer_sends(PEER_HELLO)
    pair.listener_sends(dataclasses.replace(PEER_WELCOME, max_frame=100))
    assert pair.dialer.peer_max_frame == 100
    with pytest.raises(LocalProtocolError) as info:
        pair.dialer.send(dataclasses.replace(FWD, payload=b"x" * 100))
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


def test_listener_answers_peer_hello_before_reading_on() -> None:
    listener = Connection(Role.SERVER)
    listener.receive_data(framed(PEER_HELLO) + framed(FWD))
    assert listener.next_event() == PEER_HELLO
    with pytest.raises(LocalProtocolError, match="may not read"):
        listener.next_event()
    with pytest.raises(LocalProtocolError, match="SERVER may not send WELCOME"):
        listener.send(DEFAULT_WELCOME)  # a broker gets PEER_WELCOME, not WELCOME
    with pytest.raises(LocalProtocolError):
        listener.send(FWD)
    listener.send(PEER_WELCOME)
    assert listener.next_event() == FWD  # the early frame waited in the buffer


def test_fwd_before_peer_welcome_is_refused() -> None:
    dialer = Connection(Role.PEER)
    with pytest.raises(LocalProtocolError):
        dialer.send(FWD)  # before PEER_HELLO
    dialer.send(PEER_HELLO)
    with pytest.raises(
        LocalProtocolError, match="PEER may not send FWD in state AWAIT_PEER_WELCOME"
    ):
        dialer.send(FWD)
    err = refused(dialer, framed(FWD))  # the listener sent one before PEER_WELCOME
    assert err.code == ErrorCode.UNEXPECTED_FRAME
    assert dialer.state is State.ERROR
    # A listener that gets FWD first: no handshake yet.
    assert refused(Connection(Role.SERVER), framed(FWD)).code == ErrorCode.HELLO_REQUIRED


def test_a_client_welcome_to_a_dialer_is_unexpected() -> None:
    dialer = Connection(Role.PEER)
    dialer.send(PEER_HELLO)
    assert refused(dialer, framed(DEFAULT_WELCOME)).code == ErrorCode.UNEXPECTED_FRAME


@pytest.mark.parametrize("role", [Role.SERVER, Role.PEER])
@pytest.mark.parametrize("hello", [DEFAULT_HELLO, PEER_HELLO], ids=["HELLO", "PEER_HELLO"])
def test_hello_on_an_open_link_is_duplicate_hello(role: Role, hello: frames.Frame) -> None:
    conn = open_peer(role)
    err = refused(conn, framed(hello))
    assert err.code == ErrorCode.DUPLICATE_HELLO and err.closes_connection
    assert conn.state is State.ERROR


def test_peer_hello_on_a_client_connection_is_duplicate_hello() -> None:
    assert refused(open_server(), framed(PEER_HELLO)).code == ErrorCode.DUPLICATE_HELLO


@pytest.mark.parametrize(
    "frame",
    [
        FWD,
        ROUTE,
        frames.RouteRequest(origin="a"),
        frames.RouteAck(origin="a", incarnation=1, seq=1, by="b", hops=0),
    ],
    ids=lambda f: f.TYPE,
)
def test_peer_frames_from_a_client_are_unexpected(frame: frames.Frame) -> None:
    client = open_client()
    with pytest.raises(LocalProtocolError, match=f"CLIENT may not send {frame.TYPE}"):
        client.send(frame)
    err = refused(open_server(), framed(frame))
    assert err.code == ErrorCode.UNEXPECTED_FRAME
    assert f"SERVER does not accept {frame.TYPE} in state OPEN" in err.text


@pytest.mark.parametrize("role", [Role.SERVER, Role.PEER])
@pytest.mark.parametrize(
    "frame",
    [
        frames.Pub(topic="a", payload=b""),
        frames.Sub(id=1, filter="a"),
        frames.Routes(id=1),
        DEFAULT_WELCOME,
    ],
    ids=lambda f: f.TYPE,
)
def test_client_frames_on_a_link_are_unexpected(role: Role, frame: frames.Frame) -> None:
    conn = open_peer(role)
    with pytest.raises(LocalProtocolError):
        conn.send(frame)
    assert refused(conn, framed(frame)).code == ErrorCode.UNEXPECTED_FRAME


def test_listener_refusal_moves_both_ends_to_closing() -> None:
    for code in (ErrorCode.BROKER_ID_CLASH, ErrorCode.AUTH_FAILED, ErrorCode.NOT_A_PEER):
        pair = PeerPair()
        pair.dialer_sends(PEER_HELLO)
        pair.listener_sends(frames.Error(code=code, text="no"))
        assert pair.dialer.state is pair.listener.state is State.CLOSING


def test_errors_on_an_open_link() -> None:
    pair = PeerPair()
    pair.handshake()
    pair.listener_sends(frames.Error(code=ErrorCode.INVALID_TOPIC, text="bad topic in FWD"))
    assert pair.dialer.state is pair.listener.state is State.PEER_OPEN
    pair.dialer_sends(frames.Error(code=ErrorCode.DUPLICATE_LINK, text="keep the other one"))
    assert pair.dialer.state is pair.listener.state is State.CLOSING


def test_dialer_in_error_may_send_only_the_error() -> None:
    conn = open_peer(Role.PEER)
    err = refused(conn, b"\x00\x00\x00\x01\xc1")
    assert conn.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        conn.send(frames.Ping())
    conn.send(frames.Error.from_exception(err))
    assert conn.state is State.CLOSING


def test_routes_request_on_a_client_connection() -> None:
    pair = ProtocolPair()
    pair.handshake()
    pair.client_sends(frames.Routes(id=4))
    pair.server_sends(
        frames.RoutesReply(id=4, routes={"links": ["b"], "origins": {"b": {"seq": 3}}})
    )
    assert pair.client.state is pair.server.state is State.OPEN


def test_new_error_codes() -> None:
    assert ErrorCode.BROKER_ID_CLASH.closes_connection
    assert ErrorCode.DUPLICATE_LINK.closes_connection
    assert ErrorCode.NOT_A_PEER.closes_connection
    assert not ErrorCode.SYNC_TIMEOUT.closes_connection


# -- properties ------------------------------------------------------------------------------


@settings(deadline=None)
@given(sent=st.lists(LINK_FRAMES, min_size=1, max_size=5), data=st.data(), dialer=st.booleans())
def test_link_frames_cross_unchanged_for_any_split(
    sent: list[frames.Frame], data: st.DataObject, dialer: bool
) -> None:
    src, dst = (open_peer(Role.PEER), open_peer(Role.SERVER))
    if not dialer:
        src, dst = dst, src
    stream = src.send_many(sent)
    assert feed(dst, data.draw(splits(stream))) == sent


SEED_FRAMES = [
    PEER_HELLO,
    PEER_WELCOME,
    ROUTE,
    FWD,
    frames.RouteAck(origin="a", incarnation=1, seq=1, by="b", hops=0),
    frames.Ping(id=1),
    frames.Error(code="INVALID_TOPIC", text="x"),
]
SEED_STREAM = b"".join(framed(f) for f in SEED_FRAMES)


def run_fuzz(conn: Connection, chunks: list[bytes]) -> None:
    """Only frames, NEED_DATA, ConnectionClosed or RemoteProtocolError may come out."""
    for chunk in [*chunks, b""]:
        conn.receive_data(chunk)
        for _ in range(10_000):
            try:
                event = conn.next_event()
            except RemoteProtocolError as exc:
                if exc.closes_connection:
                    assert conn.state is State.ERROR
                    return
                continue
            if event is NEED_DATA:
                assert conn.buffered < 4 + 200
                break
            if isinstance(event, ConnectionClosed):
                return
            assert isinstance(event, frames.Frame)
            if isinstance(event, frames.PeerHello):
                conn.send(PEER_WELCOME)
            elif isinstance(event, frames.Hello):
                conn.send(DEFAULT_WELCOME)
        else:
            raise AssertionError("next_event did not settle")


def fresh(kind: str) -> Connection:
    if kind == "listener":
        return Connection(Role.SERVER, 200)
    if kind == "dialer":
        conn = Connection(Role.PEER, 200)
        conn.send(PEER_HELLO)
        return conn
    return open_peer(Role.PEER if kind == "open-dialer" else Role.SERVER, 200)


KINDS = ["listener", "dialer", "open-dialer", "open-listener"]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_fuzzed_peer_streams_yield_frames_or_remote_errors_only(
    kind: str, data: st.DataObject
) -> None:
    stream = bytearray(data.draw(st.sampled_from([SEED_STREAM, SEED_STREAM[:90]])))
    for _ in range(data.draw(st.integers(min_value=0, max_value=4))):
        i = data.draw(st.integers(min_value=0, max_value=len(stream) - 1))
        stream[i] = data.draw(st.integers(min_value=0, max_value=255))
    run_fuzz(fresh(kind), data.draw(splits(bytes(stream))))


def test_fuzzed_peer_streams_with_a_fixed_seed() -> None:
    rng = random.Random(1)
    for _ in range(300):
        stream = bytearray(SEED_STREAM)
        for _ in range(rng.randint(1, 3)):
            stream[rng.randrange(len(stream))] = rng.randrange(256)
        cuts = sorted(rng.sample(range(1, len(stream)), 5))
        chunks = [bytes(stream[a:b]) for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        run_fuzz(fresh(rng.choice(KINDS)), chunks)


def test_u64_bounds_in_peer_frames() -> None:
    ack = frames.RouteAck(origin="a", incarnation=U64_MAX, seq=U64_MAX, by="b", hops=U64_MAX)
    assert decode_frame(encode_frame(ack)) == ack
    with pytest.raises(LocalProtocolError, match=r"must be in 0\.\.2\*\*64-1"):
        frames.RouteAck(origin="a", incarnation=U64_MAX + 1, seq=0, by="b", hops=0)


def test_an_event_on_a_topic_with_empty_levels_is_forwarded_as_mqtt_allows() -> None:
    fields = {**msgpack.unpackb(encode_frame(FWD)), "topic": "/TopicA"}
    assert fast_fwd(fields) == build_frame(frames.Fwd, fields)
