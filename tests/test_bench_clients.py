"""The benchmarks' lean clients (bench/harness/clients): codecs, topic mapping, the trio shell.

Every decoder test feeds the bytes whole, split at every byte boundary and with a packet
cut off at the end; hypothesis checks that whatever an encoder writes decodes back to
itself under any split. The shell runs against an in-process topiary, and against Mosquitto
and nats-server when they are installed (each such test checks for its broker; the rest
runs without them).
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bench import workload
from bench.harness import peers
from bench.harness.clients import mqtt, native, nats
from bench.harness.clients.shell import LeanClient
from bench.harness.clients.topics import (
    NotPortable,
    check_topic,
    portable,
    wire_filter,
    wire_topic,
)
from bench.harness.crossload import Expectation, brief, portable_subscriptions, split
from broker.server import Server
from broker.wire.codec import decode_frame
from broker.wire.frames import Ping, Pong, Sub, SubAck, Unsub, UnsubAck
from routing import MQTT, NATIVE, SubscriptionTable
from tests.conftest import running_broker


def feed_whole_and_split(make: Callable[[], object], data: bytes) -> list:
    """The events of ``data`` fed whole; asserts that every two-piece split and a byte at
    a time give the same, and that a cut-off end stays buffered."""
    whole = make().feed(data)  # type: ignore[attr-defined]
    for cut in range(len(data) + 1):
        parser = make()
        got = parser.feed(data[:cut]) + parser.feed(data[cut:])  # type: ignore[attr-defined]
        assert got == whole, cut
        assert parser.buffered == 0  # type: ignore[attr-defined]
    parser = make()
    one_by_one = [event for i in range(len(data)) for event in parser.feed(data[i : i + 1])]  # type: ignore[attr-defined]
    assert one_by_one == whole
    if data:
        parser = make()
        assert parser.feed(data[:-1]) == whole[:-1]  # type: ignore[attr-defined]
        assert parser.buffered > 0  # type: ignore[attr-defined]
    return whole


# -- MQTT -------------------------------------------------------------------------------------


def test_mqtt_every_packet_round_trips() -> None:
    data = b"".join(
        (
            mqtt.encode_connect("bench-1", keepalive=0),
            mqtt.encode_connack(0, session_present=False),
            mqtt.encode_subscribe(1, ["beacon/+/de/#", "a/b"]),
            mqtt.encode_suback(1, [0, mqtt.SUBACK_FAILURE]),
            mqtt.encode_publish("beacon/eu/de/s1/home/view", b"\x00" * 10),
            mqtt.encode_publish("t", b"x" * 300),  # a two-byte remaining length
            mqtt.encode_publish("t", b"y" * 20_000),  # three bytes
            mqtt.encode_unsubscribe(65535, ["a/b"]),
            mqtt.encode_unsuback(65535),
            mqtt.PINGREQ,
            mqtt.PINGRESP,
            mqtt.DISCONNECT,
        )
    )
    events = feed_whole_and_split(mqtt.Parser, data)
    assert events == [
        mqtt.Connect("bench-1", 0, True),
        mqtt.ConnAck(False, 0),
        mqtt.Subscribe(1, (("beacon/+/de/#", 0), ("a/b", 0))),
        mqtt.SubAck(1, (0, 0x80)),
        ("beacon/eu/de/s1/home/view", b"\x00" * 10),
        ("t", b"x" * 300),
        ("t", b"y" * 20_000),
        mqtt.Unsubscribe(65535, ("a/b",)),
        mqtt.UnsubAck(65535),
        mqtt.PingReq(),
        mqtt.PingResp(),
        mqtt.Disconnect(),
    ]


def test_mqtt_publish_at_qos1_skips_its_packet_id() -> None:
    body = b"\x00\x01t" + b"\x00\x07" + b"payload"
    packet = bytes((mqtt.PUBLISH | 0x02, len(body))) + body
    assert mqtt.Parser().feed(packet) == [("t", b"payload")]


@pytest.mark.parametrize(
    ("n", "encoded"),
    [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
     (16_384, b"\x80\x80\x01"), (268_435_455, b"\xff\xff\xff\x7f")],
)  # fmt: skip
def test_mqtt_remaining_length_matches_the_spec_table(n: int, encoded: bytes) -> None:
    assert mqtt.remaining_length(n) == encoded


@given(
    topic=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60),
    payload=st.binary(max_size=40_000),
    cuts=st.lists(st.integers(min_value=0), max_size=4),
)
def test_mqtt_any_publish_round_trips_under_any_split(
    topic: str, payload: bytes, cuts: list[int]
) -> None:
    data = mqtt.encode_publish(topic, payload) * 2
    parser = mqtt.Parser()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    events = [e for a, b in itertools.pairwise(points) for e in parser.feed(data[a:b])]
    assert events == [(topic, payload), (topic, payload)]
    assert parser.buffered == 0


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x30\xff\xff\xff\xff\x01", "longer than 4 bytes"),
        (b"\x30\x81\x80\x80\x08", "more than"),  # 16 MiB + 1: refused before its body
        (b"\x30\x04\x00\x05ab", "past the end"),
        (b"\x30\x04\x00\x02\xff\xfe", "UTF-8"),
        (b"\xf0\x00", "unexpected packet type"),
        (b"\xd0\x01\x00", "with a body"),
    ],
)
def test_mqtt_parser_refuses_what_is_not_mqtt(data: bytes, why: str) -> None:
    with pytest.raises(mqtt.MqttError, match=why):
        mqtt.Parser().feed(data)


# -- NATS -------------------------------------------------------------------------------------


def test_nats_every_operation_round_trips() -> None:
    data = b"".join(
        (
            nats.encode_info({"server_id": "x", "max_payload": 1048576}),
            nats.encode_connect(),
            nats.encode_sub("beacon.*.de.>", 1),
            nats.encode_pub("beacon.eu.de.s1.home.view", b"a\r\nb"),
            nats.encode_msg("beacon.eu.de.s1.home.view", "1", b"a\r\nb"),
            nats.encode_msg("x", "22", b"", reply="_INBOX.1"),
            nats.encode_unsub(1),
            nats.PING,
            nats.PONG,
            b"+OK\r\n",
            nats.encode_err("Unknown Protocol Operation"),
            b"pub x.y 2\r\nhi\r\n",  # operation names are case-insensitive
            b"MSG\tx\t3\t0\r\n\r\n",  # tabs separate as well
            b"UNSUB 7 10\r\n",
        )
    )
    events = feed_whole_and_split(nats.Parser, data)
    assert events == [
        nats.Info({"server_id": "x", "max_payload": 1048576}),
        nats.Connect(nats.CONNECT_OPTIONS),
        nats.Sub("beacon.*.de.>", None, "1"),
        nats.Pub("beacon.eu.de.s1.home.view", None, b"a\r\nb"),
        ("beacon.eu.de.s1.home.view", b"a\r\nb"),
        ("x", b""),
        nats.Unsub("1", None),
        nats.Ping(),
        nats.Pong(),
        nats.Ok(),
        nats.Err("Unknown Protocol Operation"),
        nats.Pub("x.y", None, b"hi"),
        ("x", b""),
        nats.Unsub("7", 10),
    ]


@given(
    subject=st.from_regex(r"[A-Za-z0-9_-]{1,8}(\.[A-Za-z0-9_-]{1,8}){0,5}", fullmatch=True),
    payload=st.binary(max_size=5_000),
    cuts=st.lists(st.integers(min_value=0), max_size=4),
)
def test_nats_any_msg_round_trips_under_any_split(
    subject: str, payload: bytes, cuts: list[int]
) -> None:
    data = nats.encode_msg(subject, "9", payload) + nats.encode_pub(subject, payload)
    parser = nats.Parser()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    events = [e for a, b in itertools.pairwise(points) for e in parser.feed(data[a:b])]
    assert events == [(subject, payload), nats.Pub(subject, None, payload)]
    assert parser.buffered == 0


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"MSG x 1 z\r\n", "bad payload size"),
        (b"MSG x 2\r\n", "bad MSG line"),
        (b"MSG x 1 2\r\nabXY", "not followed by CRLF"),
        (b"MSG x 1 99999999999\r\n", "more than"),
        (b"HELLO\r\n", "unknown operation"),
        (b"INFO [1]\r\n", "not an object"),
        (b"X" * 70_000, "control line longer"),
    ],
)
def test_nats_parser_refuses_what_is_not_nats(data: bytes, why: str) -> None:
    with pytest.raises(nats.NatsError, match=why):
        nats.Parser().feed(data)


def test_nats_subjects_are_checked() -> None:
    assert nats.check_subject("beacon.eu.de") == "beacon.eu.de"
    assert nats.check_subject("beacon.*.>", wildcards=True)
    for bad in ("a..b", "a b", "a.*", "a.>.b", ""):
        with pytest.raises(nats.NatsError):
            nats.check_subject(bad, wildcards=bad != "a.*")


# -- native -----------------------------------------------------------------------------------


def test_native_reader_gives_messages_as_tuples_and_frames_as_frames() -> None:
    from broker.core.message import Message
    from broker.wire.codec import encode_msg

    message = Message("beacon/eu/de/s1/home/view", b"\x01" * 40, None, "m-1")
    data = b"".join(
        (
            native.frame_bytes(SubAck(id=1, sub=7)),
            encode_msg(message, 7, 1),
            native.frame_bytes(Ping(id=3)),
            native.frame_bytes(UnsubAck(id=2)),
            native.frame_bytes(Pong(id=4)),
        )
    )
    events = feed_whole_and_split(native.Parser, data)
    assert events == [
        SubAck(id=1, sub=7),
        ("beacon/eu/de/s1/home/view", b"\x01" * 40),
        Ping(id=3),
        UnsubAck(id=2),
        Pong(id=4),
    ]


def test_native_sub_and_unsub_are_the_brokers_own_frames() -> None:
    assert decode_frame(native.encode_sub(3, "a/*/>")[4:]) == Sub(id=3, filter="a/*/>")
    assert decode_frame(native.encode_unsub(4, 9)[4:]) == Unsub(id=4, sub=9)


def test_native_reader_refuses_a_frame_over_its_limit_before_buffering_it() -> None:
    with pytest.raises(native.NativeError, match="more than"):
        native.Parser(max_frame=100).feed((101).to_bytes(4, "big"))


# -- topics -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "dialect", "expected"),
    [
        ("beacon/eu/>", NATIVE, "beacon/eu/>"),
        ("beacon/*/*/s1/*/view", NATIVE, "beacon/*/*/s1/*/view"),
        ("beacon/+/de/#", MQTT, "beacon/*/de/>"),
        ("beacon/eu/de/s1/check*/>", NATIVE, None),  # a prefix wildcard
        ("beacon/*/x/sign*", NATIVE, None),
        ("beacon/a.b/>", NATIVE, None),  # NATS' separator in a level
        ("beacon/a+b", NATIVE, None),  # an MQTT wildcard character
        ("beacon/*/x", MQTT, None),  # `*` is a literal in MQTT, a wildcard elsewhere
        ("beacon/>/x", NATIVE, None),
        ("$SYS/x", NATIVE, None),
        ("#", MQTT, None),
    ],
)
def test_portable_filters(text: str, dialect: str, expected: str | None) -> None:
    assert portable(text, dialect) == expected


def test_filters_and_topics_on_the_wire() -> None:
    assert wire_filter("mqtt", "beacon/*/de/>") == "beacon/+/de/#"
    assert wire_filter("nats", "beacon/*/de/>") == "beacon.*.de.>"
    assert wire_filter("native", "beacon/*/de/>") == "beacon/*/de/>"
    assert wire_topic("nats", "bench/control/done") == "bench.control.done"
    assert wire_topic("mqtt", "bench/control/done") == "bench/control/done"
    with pytest.raises(NotPortable):
        check_topic("beacon/a.b/c")


def _nats_match(subject_filter: str, subject: str) -> bool:
    """NATS' rules, written out: ``*`` one token, ``>`` one or more remaining tokens."""
    want, have = subject_filter.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def test_portable_workload_filters_mean_the_same_in_all_three_protocols() -> None:
    """On the benchmarks' topics, a portable filter matches the same topics read as native,
    as MQTT (``+``/``#``, where ``#`` also matches the parent level) and as NATS."""
    filters, counts = portable_subscriptions(2_000, seed=3)
    assert counts["dropped"] > 0 and counts["mapped"] > 0  # the workload has both kinds
    assert len(set(filters)) == 2_000
    topics = sorted(set(workload.topics(3_000, seed=3)))
    for topic in topics:
        check_topic(topic)
    as_native, as_mqtt = SubscriptionTable(cache_size=0), SubscriptionTable(cache_size=0)
    for index, text in enumerate(filters):
        as_native.add(text, index, NATIVE)
        as_mqtt.add(wire_filter("mqtt", text), index, MQTT)
    sample = filters[:: max(1, len(filters) // 200)]
    for topic in topics:
        native_match = set(as_native.match_uncached(topic))
        assert native_match == set(as_mqtt.match_uncached(topic)), topic
        subject = wire_topic("nats", topic)
        for index in range(0, len(filters), len(filters) // len(sample)):
            assert _nats_match(wire_filter("nats", filters[index]), subject) == (
                index in native_match
            ), (filters[index], topic)


# -- exactness --------------------------------------------------------------------------------


def test_expectation_counts_copies_per_connection_or_per_subscription() -> None:
    connections = [["a/>", "a/b", "c/*"], ["x/y"]]
    topics = ["a/b", "c/d", "x/y", "q/r"]
    built = Expectation.build(connections, topics, ["connection", "subscription"])
    per_conn, per_sub = built["connection"], built["subscription"]
    assert per_conn.per_position == [[1, 1, 0, 0], [0, 0, 1, 0]]
    assert per_sub.per_position == [[2, 1, 0, 0], [0, 0, 1, 0]]
    # 6 messages: topics a/b c/d x/y q/r a/b c/d.
    assert per_conn.expected(0, 6) == 4 and per_sub.expected(0, 6) == 6
    exact = per_conn.check(0, [0, 1, 4, 5], 6)
    assert exact == {"expected": 4, "received": 4, "missing": 0, "duplicates": 0, "unexpected": 0}
    # Same total, wrong copies: one duplicate and one missing are both seen.
    wrong = per_conn.check(0, [0, 0, 1, 5], 6)
    assert (wrong["missing"], wrong["duplicates"], wrong["unexpected"]) == (1, 1, 0)
    assert per_conn.check(1, [2, 3, 99], 6)["unexpected"] == 2
    assert per_sub.check(0, [100, 100, 101, 104, 104, 105], 6, offset=100)["missing"] == 0


def test_brief_keeps_a_worker_traceback_to_its_first_and_last_words() -> None:
    error = (
        "BenchError: w-storm failed:\n  | ExceptionGroup: x (1 sub-exception)\n"
        "  +-+---- 1 ----\nTraceback (most recent call last):\n"
        '  File "a.py", line 1, in f\n    g()\n  | ConnectionLost: EOF\n  +------\n'
    )
    assert brief(error) == "BenchError: w-storm failed: ... ConnectionLost: EOF"
    assert brief("one line") == "one line"


def test_split_is_round_robin() -> None:
    assert split(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]


# -- the shell, against real brokers ----------------------------------------------------------


async def exercise(protocol: str, port: int) -> None:
    """Subscribe (overlapping filters), publish, barrier, receive, unsubscribe."""
    with trio.fail_after(20):
        sub = await LeanClient.connect(protocol, port, "t-sub")
        pub = await LeanClient.connect(protocol, port, "t-pub")
        try:
            timing = await sub.subscribe(["beacon/>", "beacon/*/de/>", "bench/done"])
            assert timing.count == 3 and timing.refused == 0 and timing.seconds > 0
            assert sub.subscriptions == 3
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pub.read_forever)
                for i in range(100):
                    pub.publish(
                        pub.wire_topic(f"beacon/eu/{'de' if i % 2 else 'fr'}/s/h/v"), b"%d" % i
                    )
                pub.publish(pub.wire_topic("bench/done"), b"done")
                await pub.flush()
                assert await pub.ping() > 0
                got: list[tuple[str, bytes]] = []
                while not got or got[-1][1] != b"done":
                    _, messages = await sub.receive()
                    got.extend(messages)
                per_message = 2 if protocol == "nats" else 1  # NATS: per matching filter
                assert len(got) == 50 + 50 * per_message + 1
                assert [p for _, p in got if p != b"done"][: 1 + per_message] == [b"0"] + [
                    b"1"
                ] * per_message
                timing = await sub.unsubscribe_all()
                assert timing.count == 3 and sub.subscriptions == 0
                pub.publish(pub.wire_topic("bench/done"), b"gone")
                await pub.flush()
                await pub.ping()
                await sub.ping()  # nothing came for the filters dropped
                assert sub.stray_messages == 0
                nursery.cancel_scope.cancel()
        finally:
            await sub.aclose()
            await pub.aclose()


async def test_shell_against_topiary(server: Server) -> None:
    await exercise("native", server.addresses[0][1])


async def test_shell_counts_refused_subscriptions() -> None:
    async with running_broker() as running:
        client = await LeanClient.connect("native", running.addresses[0][1], "t")
        try:
            timing = await client.subscribe(["a/b*c", "a/b"])  # the first is invalid
            assert timing.refused == 1 and client.first_refusal
        finally:
            await client.aclose()


@pytest.mark.parametrize("kind", ["mosquitto", "nats"])
def test_shell_against_installed_peers(kind: str) -> None:
    if not peers.installed(kind):
        pytest.skip(f"{kind} is not installed ({peers.INSTALL_HINT})")
    with tempfile.TemporaryDirectory() as log_dir:
        broker = peers.start(kind, Path(log_dir), kind)
        try:
            trio.run(exercise, broker.protocol, broker.port)
        finally:
            stopped = peers.stop(broker)
        assert stopped["killed"] is False
        assert peers.log_summary(broker)["problem_count"] == 0
