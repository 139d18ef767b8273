"""MQTT codec (broker/mqtt): packets <-> bytes for 3.1, 3.1.1 and 5.0, both ends.

Spec sections cited are MQTT 5.0's (OASIS, 2019) unless marked 3.1.1 (OASIS, 2014).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.mqtt import packets as p
from broker.mqtt import reasons as r
from broker.mqtt.codec import (
    Decoder,
    MqttError,
    PublishTemplate,
    encode,
    encode_properties,
    encode_publish,
    publish_parts,
)
from broker.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from broker.mqtt.properties import ALLOWED, PROPERTY_IDS

LEVELS = [3, 4, 5]
FUZZ = settings(max_examples=250, deadline=None)

# -- helpers -------------------------------------------------------------------------------


def drain(decoder: Decoder, chunks: Iterable[bytes]) -> list[p.Packet]:
    """Feed each chunk and take every whole packet available after it."""
    out = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        while (packet := decoder.next_packet()) is not None:
            out.append(packet)
    return out


def connect_bytes(level: int) -> bytes:
    return encode(Connect("c1", protocol_level=level), level)


def server_after_connect(level: int, **kwargs: int) -> Decoder:
    """A server-side decoder that has read a CONNECT at ``level``."""
    decoder = Decoder(**kwargs)
    decoder.receive_data(connect_bytes(level))
    assert isinstance(decoder.next_packet(), Connect)
    assert decoder.protocol_level == level
    return decoder


def decode_one(data: bytes, level: int = 5, *, server: bool = True) -> p.Packet:
    """The one packet ``data`` holds, read after a CONNECT (server) or as a client; the
    same whether ``data`` comes whole, byte by byte or followed by a partial packet."""
    results = []
    for chunks in chunkings(data):
        decoder = (
            server_after_connect(level) if server else Decoder(server=False, protocol_level=level)
        )
        results.append(drain(decoder, chunks))
    assert results[0] == results[1] == results[2]
    assert len(results[0]) == 1, results[0]
    return results[0][0]


def error_of(data: bytes, level: int = 5, *, server: bool = True) -> MqttError:
    """The MqttError ``data`` causes after a CONNECT (server) or as a client."""
    decoder = server_after_connect(level) if server else Decoder(server=False, protocol_level=level)
    decoder.receive_data(data)
    with pytest.raises(MqttError) as info:
        while decoder.next_packet() is not None:
            pass
    return info.value


def frame(first: int, body: bytes) -> bytes:
    """A fixed header (Remaining Length in one byte) and a body."""
    assert len(body) < 128
    return bytes((first, len(body))) + body


def s(text: str | bytes) -> bytes:
    """An MQTT string: two-byte length, then the bytes (1.5.4)."""
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


# The start of a PUBLISH: a packet that is not whole yet must not come out.
TRAILING = b"\x30\x05\x00"


def chunkings(data: bytes) -> list[list[bytes]]:
    """``data`` whole, byte by byte, and followed by the start of another packet."""
    return [[data], [data[i : i + 1] for i in range(len(data))], [data + TRAILING]]


# -- strategies ----------------------------------------------------------------------------

TOPIC_CHARS = "ab/é€😀 $"
FILTER_CHARS = TOPIC_CHARS + "+#"
topics = st.text(TOPIC_CHARS, min_size=1, max_size=12)
filters = st.text(FILTER_CHARS, min_size=1, max_size=12)
texts = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8)
small_bytes = st.binary(max_size=16)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
flag = st.integers(0, 1)

PROPERTY_VALUES: dict[str, st.SearchStrategy[object]] = {
    "payload_format_indicator": flag,
    "message_expiry_interval": u32,
    "content_type": texts,
    "response_topic": topics,
    "correlation_data": small_bytes,
    "session_expiry_interval": u32,
    "assigned_client_identifier": texts,
    "server_keep_alive": u16,
    "authentication_method": texts,
    "authentication_data": small_bytes,
    "request_problem_information": flag,
    "will_delay_interval": u32,
    "request_response_information": flag,
    "response_information": texts,
    "server_reference": texts,
    "reason_string": texts,
    "receive_maximum": st.integers(1, 0xFFFF),
    "topic_alias_maximum": u16,
    "topic_alias": st.integers(1, 0xFFFF),
    "maximum_qos": flag,
    "retain_available": flag,
    "maximum_packet_size": st.integers(1, 0xFFFF_FFFF),
    "wildcard_subscription_available": flag,
    "subscription_identifier_available": flag,
    "shared_subscription_available": flag,
}
sub_id = st.integers(1, 268_435_455)


@st.composite
def properties(draw: st.DrawFn, ptype: int, *, sub_ids: int = 1) -> Properties:
    """Any properties a ``ptype`` packet may carry; ``sub_ids`` caps Subscription
    Identifiers (0 in a PUBLISH from a client, several in one from the server)."""
    props = Properties()
    for name, pid in PROPERTY_IDS.items():
        if pid not in ALLOWED[ptype] or not draw(st.booleans()):
            continue
        if name == "user_properties":
            pair = st.tuples(st.sampled_from(["k", "ü", ""]), texts)
            props.user_properties = draw(st.lists(pair, min_size=1, max_size=4))
        elif name == "subscription_identifiers":
            props.subscription_identifiers = draw(st.lists(sub_id, max_size=sub_ids))
        else:
            setattr(props, name, draw(PROPERTY_VALUES[name]))
    if props.authentication_data is not None and props.authentication_method is None:
        props.authentication_method = "method"
    return props


def props_for(level: int, ptype: int, **kwargs: int) -> st.SearchStrategy[Properties]:
    return properties(ptype, **kwargs) if level == 5 else st.just(Properties())


packet_ids = st.integers(1, 0xFFFF)


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topics),
            draw(small_bytes),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(props_for(level, p.WILL_PROPERTIES)),
        )
    username = draw(st.none() | texts)
    password = draw(st.none() | small_bytes) if username is not None or level == 5 else None
    return Connect(
        draw(texts),
        level,
        draw(st.booleans()),
        draw(u16),
        username,
        password,
        will,
        draw(props_for(level, p.CONNECT)),
    )


@st.composite
def publishes(draw: st.DrawFn, level: int, *, from_server: bool) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(props_for(level, p.PUBLISH, sub_ids=3 if from_server else 0))
    topic = draw(topics)
    if level == 5 and props.topic_alias is not None and draw(st.booleans()):
        topic = ""  # 3.3.2.3.4: the alias names the topic
    return Publish(
        topic,
        draw(st.binary(max_size=64)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos or level != 5 else False,
        draw(packet_ids) if qos else None,
        props,
    )


def acks(level: int) -> st.SearchStrategy[p.Packet]:
    def one(cls: type, ptype: int, codes: frozenset[int]) -> st.SearchStrategy[p.Packet]:
        if level != 5:
            return st.builds(cls, packet_ids)
        return st.builds(cls, packet_ids, st.sampled_from(sorted(codes)), properties(ptype))

    return st.one_of(
        one(PubAck, p.PUBACK, r.PUBACK_CODES),
        one(PubRec, p.PUBREC, r.PUBACK_CODES),
        one(PubRel, p.PUBREL, r.PUBREL_CODES),
        one(PubComp, p.PUBCOMP, r.PUBREL_CODES),
    )


def subscriptions(level: int) -> st.SearchStrategy[Subscription]:
    if level != 5:
        return st.builds(Subscription, filters, st.integers(0, 2))
    return st.builds(
        Subscription, filters, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2)
    )


@st.composite
def auths(draw: st.DrawFn) -> Auth:
    """AUTH: empty, or with an Authentication Method (3.15.2.2.2)."""
    if draw(st.booleans()):
        return Auth()
    props = draw(properties(p.AUTH))
    if props.authentication_method is None:
        props.authentication_method = draw(texts)
    return Auth(draw(st.sampled_from(sorted(r.AUTH_CODES))), props)


def disconnects(level: int) -> st.SearchStrategy[Disconnect]:
    if level != 5:
        return st.just(Disconnect())
    codes = st.sampled_from(sorted(r.DISCONNECT_CODES))
    return st.builds(Disconnect, codes, properties(p.DISCONNECT))


def client_packets(level: int) -> st.SearchStrategy[p.Packet]:
    """What a client sends after CONNECT."""
    options = [
        publishes(level, from_server=False),
        acks(level),
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscriptions(level), min_size=1, max_size=3),
            props_for(level, p.SUBSCRIBE),
        ),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(filters, min_size=1, max_size=3),
            props_for(level, p.UNSUBSCRIBE),
        ),
        st.just(PingReq()),
        disconnects(level),
    ]
    if level == 5:
        options.append(auths())
    return st.one_of(options)


def server_packets(level: int) -> st.SearchStrategy[p.Packet]:
    """What a server sends."""
    v5 = level == 5
    options = [
        st.builds(
            ConnAck,
            st.booleans(),
            st.sampled_from(sorted(r.CONNACK_CODES if v5 else r.V3_CONNACK_CODES)),
            props_for(level, p.CONNACK),
        ),
        publishes(level, from_server=True),
        acks(level),
        st.builds(
            SubAck,
            packet_ids,
            st.lists(
                st.sampled_from(sorted(r.SUBACK_CODES if v5 else r.V3_SUBACK_CODES)),
                min_size=1,
                max_size=4,
            ),
            props_for(level, p.SUBACK),
        ),
        st.builds(
            UnsubAck,
            packet_ids,
            st.lists(st.sampled_from(sorted(r.UNSUBACK_CODES)), min_size=1, max_size=4)
            if v5
            else st.just([]),
            props_for(level, p.UNSUBACK),
        ),
        st.just(PingResp()),
    ]
    if v5:
        options.append(disconnects(level))
        options.append(auths())
    return st.one_of(options)


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at arbitrary points."""
    if len(data) <= 1:
        return [data]
    cuts = sorted(draw(st.sets(st.integers(1, len(data) - 1), max_size=12)))
    return [data[a:b] for a, b in pairwise([0, *cuts, len(data)])]


@st.composite
def client_streams(draw: st.DrawFn) -> tuple[int, list[p.Packet]]:
    """A protocol level and what a client sends at it: CONNECT, then other packets."""
    level = draw(st.sampled_from(LEVELS))
    rest = draw(st.lists(client_packets(level), max_size=6))
    return level, [draw(connects(level)), *rest]


@st.composite
def server_streams(draw: st.DrawFn) -> tuple[int, list[p.Packet]]:
    level = draw(st.sampled_from(LEVELS))
    return level, draw(st.lists(server_packets(level), min_size=1, max_size=6))


# -- round trips ---------------------------------------------------------------------------


@FUZZ
@given(stream=client_streams(), data=st.data())
def test_every_client_packet_round_trips_in_any_split(
    stream: tuple[int, list[p.Packet]], data: st.DataObject
) -> None:
    level, packets = stream
    wire = b"".join(encode(packet, level) for packet in packets)
    chunks = data.draw(splits(wire))
    decoder = Decoder()
    assert drain(decoder, chunks) == packets
    assert decoder.protocol_level == level
    assert decoder.buffered == 0


@FUZZ
@given(stream=server_streams(), data=st.data())
def test_every_server_packet_round_trips_in_any_split(
    stream: tuple[int, list[p.Packet]], data: st.DataObject
) -> None:
    level, packets = stream
    wire = b"".join(encode(packet, level) for packet in packets)
    chunks = data.draw(splits(wire))
    assert drain(Decoder(server=False, protocol_level=level), chunks) == packets


@pytest.mark.parametrize("level", LEVELS)
def test_large_payload_round_trips(level: int) -> None:
    packet = Publish("a/b", bytes(range(256)) * 300, 1, packet_id=9)
    assert decode_one(encode(packet, level), level) == packet


# -- fuzzing -------------------------------------------------------------------------------


def only_mqtt_errors(decoder: Decoder, chunks: list[bytes]) -> None:
    """Feed chunks, draining after each; the only exception allowed is MqttError, and then
    the decoder must keep raising it."""
    try:
        drain(decoder, chunks)
    except MqttError as exc:
        assert "decoder bug" not in exc.text, exc.text
        with pytest.raises(MqttError) as again:
            decoder.next_packet()
        assert again.value is exc


@FUZZ
@given(level=st.sampled_from(LEVELS), data=st.data(), junk=st.binary(max_size=200))
def test_any_bytes_after_connect_only_raise_mqtt_error(
    level: int, data: st.DataObject, junk: bytes
) -> None:
    only_mqtt_errors(server_after_connect(level), data.draw(splits(junk)))


@FUZZ
@given(level=st.sampled_from(LEVELS), data=st.data(), junk=st.binary(max_size=200))
def test_any_bytes_to_a_client_only_raise_mqtt_error(
    level: int, data: st.DataObject, junk: bytes
) -> None:
    decoder = Decoder(server=False, protocol_level=level)
    only_mqtt_errors(decoder, data.draw(splits(junk)))


@st.composite
def mutated(draw: st.DrawFn, wire: bytes, keep: int = 0) -> bytes:
    """``wire`` with a few bytes changed, dropped or inserted, not in its first ``keep``
    bytes: bytes that get past the framing and deep into packet parsing, which random bytes
    rarely do."""
    data = bytearray(wire)
    for _ in range(draw(st.integers(1, 4))):
        if len(data) <= keep:
            break
        at = draw(st.integers(keep, len(data) - 1))
        action = draw(st.sampled_from(["set", "drop", "insert"]))
        if action == "set":
            data[at] = draw(st.integers(0, 255))
        elif action == "drop":
            del data[at]
        else:
            data.insert(at, draw(st.integers(0, 255)))
    return bytes(data)


@FUZZ
@given(stream=client_streams(), data=st.data())
def test_mutated_client_streams_only_raise_mqtt_error(
    stream: tuple[int, list[p.Packet]], data: st.DataObject
) -> None:
    level, packets = stream
    wire = b"".join(encode(packet, level) for packet in packets)
    keep = len(encode(packets[0], level)) if data.draw(st.booleans()) else 0  # the CONNECT
    only_mqtt_errors(Decoder(), data.draw(splits(data.draw(mutated(wire, keep)))))


@FUZZ
@given(stream=server_streams(), data=st.data())
def test_mutated_server_streams_only_raise_mqtt_error(
    stream: tuple[int, list[p.Packet]], data: st.DataObject
) -> None:
    level, packets = stream
    wire = data.draw(mutated(b"".join(encode(packet, level) for packet in packets)))
    only_mqtt_errors(Decoder(server=False, protocol_level=level), data.draw(splits(wire)))


# -- known bytes ---------------------------------------------------------------------------

# 3.1.1 3.1.2.10: the spec's example CONNECT variable header (name "MQTT", level 4, flags
# 0xCE: user name, password, Will QoS 1, Will, Clean Session; keep alive 10), with a payload
# in the order of 3.1.1 3.1.3: client id, Will topic, Will message, user name, password.
V311_CONNECT = (
    b"\x10\x31"  # Remaining Length 49
    + s("MQTT")
    + b"\x04\xce\x00\x0a"
    + s("paho/12ab")
    + s("will/t")
    + s(b"gone")
    + s("user")
    + s(b"secret")
)
# 5.0 3.1.2.12: the spec's example variable header (level 5, Clean Start, keep alive 10,
# Session Expiry Interval 10), then client id "abc".
V5_CONNECT = b"\x10\x15" + s("MQTT") + b"\x05\x02\x00\x0a\x05\x11\x00\x00\x00\x0a" + s("abc")
# 3.1 (MQIsdp, level 3), as old clients send it: clean session, keep alive 60.
V31_CONNECT = b"\x10\x11" + s("MQIsdp") + b"\x03\x02\x00\x3c" + s("old")


def test_a_3_1_1_connect_with_will_and_credentials_decodes() -> None:
    decoder = Decoder()
    assert drain(decoder, [V311_CONNECT]) == [
        Connect(
            "paho/12ab",
            4,
            clean_start=True,
            keepalive=10,
            username="user",
            password=b"secret",
            will=Will("will/t", b"gone", qos=1),
        )
    ]
    assert decoder.protocol_level == 4


def test_a_5_0_connect_with_session_expiry_decodes() -> None:
    decoder = Decoder()
    expected = Connect("abc", 5, True, 10, properties=Properties(session_expiry_interval=10))
    assert drain(decoder, [V5_CONNECT]) == [expected]
    assert decoder.protocol_level == 5
    assert encode(expected, 5) == V5_CONNECT


def test_a_3_1_connect_decodes_and_encodes() -> None:
    decoder = Decoder()
    assert drain(decoder, [V31_CONNECT]) == [Connect("old", 3, True, 60)]
    assert decoder.protocol_level == 3
    assert encode(Connect("old", 3, True, 60), 3) == V31_CONNECT


def test_the_3_1_1_connect_re_encodes_to_the_same_bytes() -> None:
    packet = drain(Decoder(), [V311_CONNECT])[0]
    assert encode(packet, 4) == V311_CONNECT


# 3.1.1 3.3.2.3 example: topic "a/b", packet identifier 10; payload "hello".
V311_PUBLISH_QOS1 = b"\x32\x0c" + s("a/b") + b"\x00\x0ahello"
# 5.0: the same with an empty property section (3.3.2.3), and with DUP and RETAIN.
V5_PUBLISH_QOS1 = b"\x3b\x0d" + s("a/b") + b"\x00\x0a\x00hello"


@pytest.mark.parametrize("chunks", chunkings(V311_PUBLISH_QOS1))
def test_a_3_1_1_qos1_publish_decodes(chunks: list[bytes]) -> None:
    decoder = server_after_connect(4)
    assert drain(decoder, chunks) == [Publish("a/b", b"hello", 1, packet_id=10)]
    assert encode(Publish("a/b", b"hello", 1, packet_id=10), 4) == V311_PUBLISH_QOS1


@pytest.mark.parametrize("chunks", chunkings(V5_PUBLISH_QOS1))
def test_a_5_0_qos1_publish_with_dup_and_retain_decodes(chunks: list[bytes]) -> None:
    expected = Publish("a/b", b"hello", 1, retain=True, dup=True, packet_id=10)
    assert drain(server_after_connect(5), chunks) == [expected]
    assert encode(expected, 5) == V5_PUBLISH_QOS1


def test_a_5_0_publish_with_properties_decodes() -> None:
    # 3.3.2.3: Message Expiry Interval 60 (0x02), Content Type "t" (0x03), a User Property.
    props = b"\x02\x00\x00\x00\x3c\x03" + s("t") + b"\x26" + s("k") + s("v")
    body = s("x/y") + bytes((len(props),)) + props + b"{}"
    expected = Publish(
        "x/y",
        b"{}",
        properties=Properties(
            message_expiry_interval=60, content_type="t", user_properties=[("k", "v")]
        ),
    )
    assert decode_one(frame(0x30, body)) == expected
    assert encode(expected, 5) == frame(0x30, body)


def test_a_3_1_1_subscribe_decodes() -> None:
    # 3.1.1 3.8.3.2 example: packet identifier 10, "a/b" QoS 1, "c/d" QoS 2.
    data = b"\x82\x0e\x00\x0a" + s("a/b") + b"\x01" + s("c/d") + b"\x02"
    expected = Subscribe(10, [Subscription("a/b", 1), Subscription("c/d", 2)])
    assert decode_one(data, 4) == expected
    assert encode(expected, 4) == data


def test_a_5_0_subscribe_with_options_and_identifier_decodes() -> None:
    # 3.8.2.1.2 Subscription Identifier 3; 3.8.3.1 options: QoS 1, No Local, Retain As
    # Published, Retain Handling 2 = 0b0010_1101.
    data = frame(0x82, b"\x00\x05\x02\x0b\x03" + s("a/+") + b"\x2d")
    expected = Subscribe(
        5,
        [Subscription("a/+", 1, no_local=True, retain_as_published=True, retain_handling=2)],
        Properties(subscription_identifiers=[3]),
    )
    assert decode_one(data) == expected
    assert encode(expected, 5) == data


@pytest.mark.parametrize(
    ("data", "level", "expected"),
    [
        (b"\xc0\x00", 4, PingReq()),
        (b"\xe0\x00", 4, Disconnect()),
        (b"\xe0\x00", 5, Disconnect()),
        (b"\xe0\x01\x04", 5, Disconnect(r.DISCONNECT_WITH_WILL)),
        (b"\x40\x02\x00\x07", 4, PubAck(7)),
        (b"\x40\x02\x00\x07", 5, PubAck(7)),
        (b"\x50\x03\x00\x07\x10", 5, PubRec(7, r.NO_MATCHING_SUBSCRIBERS)),
        (b"\x62\x02\x00\x07", 4, PubRel(7)),
        (b"\x70\x04\x00\x07\x92\x00", 5, PubComp(7, r.PACKET_IDENTIFIER_NOT_FOUND)),
        (b"\xa2\x05\x00\x03" + s("a")[:2] + b"a", 4, Unsubscribe(3, ["a"])),
        (b"\xf0\x00", 5, Auth()),
    ],
)
def test_short_client_packets_decode(data: bytes, level: int, expected: p.Packet) -> None:
    assert decode_one(data, level) == expected


@pytest.mark.parametrize(
    ("data", "level", "expected"),
    [
        (b"\x20\x02\x01\x00", 4, ConnAck(session_present=True)),
        (b"\x20\x02\x00\x05", 4, ConnAck(reason_code=r.V3_NOT_AUTHORIZED)),
        (b"\x20\x03\x00\x00\x00", 5, ConnAck()),
        (b"\x90\x05\x00\x0a\x00\x02\x80", 4, SubAck(10, [0, 2, 0x80])),
        (b"\xb0\x02\x00\x0a", 4, UnsubAck(10)),
        (b"\xb0\x04\x00\x0a\x00\x11", 5, UnsubAck(10, [r.NO_SUBSCRIPTION_EXISTED])),
        (b"\xd0\x00", 4, PingResp()),
        (b"\xe0\x01\x8b", 5, Disconnect(r.SERVER_SHUTTING_DOWN)),
    ],
)
def test_short_server_packets_decode(data: bytes, level: int, expected: p.Packet) -> None:
    assert decode_one(data, level, server=False) == expected
    assert encode(expected, level) == data


# -- size limit ----------------------------------------------------------------------------


def test_a_remaining_length_over_the_limit_is_refused_from_the_fixed_header_alone() -> None:
    decoder = server_after_connect(5, max_packet=1000)
    decoder.receive_data(b"\x30\xff\xff\xff\x7f")  # 5 bytes: Remaining Length 268,435,455
    with pytest.raises(MqttError) as info:
        decoder.next_packet()
    assert info.value.reason_code == r.PACKET_TOO_LARGE
    assert "exceeds the maximum packet size of 1000" in info.value.text
    assert decoder.buffered == 0


def test_body_bytes_after_an_oversized_header_are_never_kept() -> None:
    decoder = server_after_connect(4, max_packet=1000)
    decoder.receive_data(b"\x30\xe9\x07" + b"x" * 500)  # 1001 + 3 bytes announced
    assert decoder.buffered == 0
    decoder.receive_data(b"x" * 5000)
    assert decoder.buffered == 0
    with pytest.raises(MqttError, match="exceeds"):
        decoder.next_packet()


def test_the_limit_counts_the_fixed_header() -> None:
    at_limit = encode(Publish("t", b"x" * 93), 4)  # 2 + 2 + 1 + 93 = 98 bytes
    assert len(at_limit) == 98
    assert drain(server_after_connect(4, max_packet=98), [at_limit])[0].payload == b"x" * 93
    decoder = server_after_connect(4, max_packet=97)
    decoder.receive_data(at_limit)
    with pytest.raises(MqttError) as info:
        decoder.next_packet()
    assert info.value.reason_code == r.PACKET_TOO_LARGE


def test_packets_before_an_oversized_one_are_still_handed_out() -> None:
    decoder = server_after_connect(4, max_packet=100)
    decoder.receive_data(b"\xc0\x00\xc0\x00\x30\xff\x01")
    assert decoder.next_packet() == PingReq()
    assert decoder.next_packet() == PingReq()
    with pytest.raises(MqttError):
        decoder.next_packet()


def test_an_oversized_connect_is_refused() -> None:
    decoder = Decoder(max_packet=64)
    decoder.receive_data(b"\x10\x80\x01")
    with pytest.raises(MqttError) as info:
        decoder.next_packet()
    assert info.value.reason_code == r.PACKET_TOO_LARGE


def test_the_buffer_is_emptied_once_everything_was_handed_out() -> None:
    decoder = server_after_connect(5)
    many = encode(Publish("a", b"y" * 100), 5) * 2000
    assert len(drain(decoder, [many[:150_001], many[150_001:]])) == 2000
    assert decoder.buffered == 0


def test_a_lowered_limit_applies_to_the_packets_that_follow() -> None:
    # E.g. after CONNECT, to a limit the front end advertised in CONNACK.
    decoder = server_after_connect(5)
    decoder.max_packet = 50
    decoder.receive_data(encode(Publish("a", b"x" * 45), 5))  # 2 + 2 + 1 + 1 + 45 bytes
    with pytest.raises(MqttError) as info:
        decoder.next_packet()
    assert info.value.reason_code == r.PACKET_TOO_LARGE


def test_a_packet_fed_in_pieces_is_kept_once() -> None:
    decoder = server_after_connect(4)
    data = encode(Publish("a/b", b"z" * 50_000), 4)
    for i in range(0, len(data) - 1000, 1000):
        decoder.receive_data(data[i : i + 1000])
        assert decoder.next_packet() is None
        assert decoder.buffered == i + 1000
    decoder.receive_data(data[decoder.buffered :])
    assert decoder.next_packet() == Publish("a/b", b"z" * 50_000)
    assert decoder.buffered == 0


# -- malformed input -----------------------------------------------------------------------

MALFORMED = r.MALFORMED_PACKET
PROTOCOL = r.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("data", "level", "code", "text"),
    [
        # 1.5.5: a Variable Byte Integer is at most 4 bytes, in the fewest bytes.
        (b"\x30\xff\xff\xff\xff\x01", 5, MALFORMED, "longer than 4 bytes"),
        (b"\xc0\x80\x00", 4, MALFORMED, "not minimal"),
        # 2.1.3: reserved flags.
        (b"\x80\x06\x00\x01" + s("a") + b"\x00", 4, MALFORMED, "SUBSCRIBE: reserved flags"),
        (b"\xa0\x05\x00\x01" + s("a"), 5, MALFORMED, "UNSUBSCRIBE: reserved flags"),
        (b"\x60\x02\x00\x01", 4, MALFORMED, "PUBREL: reserved flags"),
        (b"\x42\x02\x00\x01", 5, MALFORMED, "PUBACK: reserved flags"),
        (b"\xc1\x00", 4, MALFORMED, "PINGREQ: reserved flags"),
        # 3.3.1.2: QoS 3; 3.3.1.1: DUP on QoS 0 (5.0 only).
        (frame(0x36, s("a") + b"\x00\x01"), 4, MALFORMED, "PUBLISH: QoS 3 is not valid"),
        (frame(0x38, s("a") + b"\x00"), 5, MALFORMED, "DUP is set on a QoS 0"),
        # 2.2.1: Packet Identifier 0.
        (frame(0x32, s("a") + b"\x00\x00"), 4, PROTOCOL, "PUBLISH: packet identifier 0"),
        (b"\x40\x02\x00\x00", 5, PROTOCOL, "PUBACK: packet identifier 0"),
        (frame(0x82, b"\x00\x00" + s("a") + b"\x00"), 4, PROTOCOL, "SUBSCRIBE: packet ident"),
        (frame(0xA2, b"\x00\x00\x00" + s("a")), 5, PROTOCOL, "UNSUBSCRIBE: packet ident"),
        # 1.5.4: strings are well-formed UTF-8 without U+0000 (surrogates are ill-formed).
        (frame(0x30, s(b"a\xff") + b"x"), 4, MALFORMED, "not valid UTF-8"),
        (frame(0x30, s(b"a\x00") + b"x"), 4, MALFORMED, "U+0000"),
        (frame(0x30, s(b"\xed\xa0\x80")), 5, MALFORMED, "not valid UTF-8"),
        (frame(0x82, b"\x00\x01" + s(b"\xc3") + b"\x00"), 4, MALFORMED, "SUBSCRIBE: topic"),
        (frame(0xA2, b"\x00\x01\x00" + s(b"\x00")), 5, MALFORMED, "U+0000"),
        (frame(0x40, b"\x00\x01\x00\x07\x26" + s("k") + s(b"\xff")), 5, MALFORMED, "UTF-8"),
        # 3.8.3: an empty SUBSCRIBE or UNSUBSCRIBE.
        (b"\x82\x02\x00\x01", 4, PROTOCOL, "SUBSCRIBE: no topic filter"),
        (b"\x82\x03\x00\x01\x00", 5, PROTOCOL, "SUBSCRIBE: no topic filter"),
        (b"\xa2\x02\x00\x01", 4, PROTOCOL, "UNSUBSCRIBE: no topic filter"),
        # 3.8.3.1: subscription options.
        (frame(0x82, b"\x00\x01\x00" + s("a") + b"\x40"), 5, MALFORMED, "reserved bits"),
        (frame(0x82, b"\x00\x01" + s("a") + b"\x04"), 4, MALFORMED, "options 0x04"),
        (frame(0x82, b"\x00\x01" + s("a") + b"\x03"), 4, MALFORMED, "options 0x03"),
        (frame(0x82, b"\x00\x01\x00" + s("a") + b"\x03"), 5, PROTOCOL, "QoS 3"),
        (frame(0x82, b"\x00\x01\x00" + s("a") + b"\x30"), 5, PROTOCOL, "Retain Handling 3"),
        (frame(0x82, b"\x00\x01\x00" + s("a")), 5, MALFORMED, "truncated (subscription opt"),
        # 2.2.2.2: a property twice, not allowed in the packet, or unknown.
        (
            frame(0x30, s("a") + b"\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02"),
            5,
            PROTOCOL,
            "message_expiry_interval appears more than once",
        ),
        (
            frame(0x82, b"\x00\x01\x04\x0b\x01\x0b\x02" + s("a") + b"\x00"),
            5,
            PROTOCOL,
            "subscription_identifiers appears more than once",
        ),
        (
            frame(0x30, s("a") + b"\x05\x11\x00\x00\x00\x01"),
            5,
            MALFORMED,
            "session_expiry_interval is not allowed",
        ),
        (frame(0x30, s("a") + b"\x02\x7f\x00"), 5, MALFORMED, "unknown property 0x7F"),
        # 1.5.5 inside a packet: a Subscription Identifier or Property Length over 4 bytes.
        (
            frame(0x82, b"\x00\x01\x06\x0b\xff\xff\xff\xff\x01" + s("a") + b"\x00"),
            5,
            MALFORMED,
            "subscription_identifiers: variable byte integer longer than 4 bytes",
        ),
        (frame(0x30, s("a") + b"\x80\x00"), 5, MALFORMED, "property length: variable byte"),
        (frame(0x30, s("a") + b"\x02\x80\x01"), 5, MALFORMED, "unknown property 0x80"),
        # Property values the spec rules out.
        (frame(0x30, s("a") + b"\x02\x01\x02"), 5, PROTOCOL, "payload_format_indicator is 2"),
        (frame(0x30, s("a") + b"\x03\x23\x00\x00"), 5, r.TOPIC_ALIAS_INVALID, "topic_alias is 0"),
        (frame(0x82, b"\x00\x01\x02\x0b\x00" + s("a") + b"\x00"), 5, PROTOCOL, "identifiers is 0"),
        (frame(0xF0, b"\x18\x04\x16" + s(b"d")[:2] + b"d"), 5, PROTOCOL, "without auth"),
        (b"\xf0\x01\x18", 5, PROTOCOL, "AUTH: no Authentication Method"),
        (frame(0xF0, b"\x19\x04\x1f" + s("r")), 5, PROTOCOL, "AUTH: no Authentication Method"),
        # 3.3.4: a client may not send a Subscription Identifier.
        (frame(0x30, s("a") + b"\x02\x0b\x01"), 5, PROTOCOL, "Subscription Identifier"),
        # 3.3.2.1 / 3.3.2.3.4: no wildcard in a topic name; no empty topic without an alias.
        (frame(0x30, s("a/+") + b"x"), 4, r.TOPIC_NAME_INVALID, "has a wildcard"),
        (frame(0x30, s("a/#") + b"\x00"), 5, r.TOPIC_NAME_INVALID, "has a wildcard"),
        (frame(0x30, s("") + b"\x00"), 5, PROTOCOL, "empty topic and no Topic Alias"),
        (frame(0x30, s("") + b"x"), 4, PROTOCOL, "empty topic"),
        # The Remaining Length does not match the content.
        (b"\x40\x03\x00\x01\x00", 4, MALFORMED, "PUBACK: Remaining Length is 3"),
        (b"\x40\x01\x00", 5, MALFORMED, "PUBACK: truncated"),
        (b"\x40\x05\x00\x01\x00\x00\x00", 5, MALFORMED, "PUBACK: 1 bytes after the end"),
        (b"\x40\x05\x00\x01\x00\x05\x00", 5, MALFORMED, "properties run past the packet"),
        (b"\xc0\x01\x00", 4, MALFORMED, "PINGREQ: Remaining Length is 1"),
        (b"\xe0\x01\x00", 4, MALFORMED, "DISCONNECT: Remaining Length is 1"),
        (b"\xe0\x03\x00\x00\x00", 5, MALFORMED, "DISCONNECT: 1 bytes after"),
        (frame(0x30, b"\x00\x05ab"), 4, MALFORMED, "topic runs past the packet"),
        (frame(0x32, s("a") + b"\x00"), 4, MALFORMED, "truncated (packet identifier)"),
        (frame(0x30, s("a")), 5, MALFORMED, "truncated (property length)"),
        (frame(0x30, s("a") + b"\x03\x03\x00\x05a"), 5, MALFORMED, "content_type runs past"),
        (frame(0x30, s("a") + b"\x01\x02"), 5, MALFORMED, "message_expiry_interval is trunc"),
        # Reason codes the packet may not carry (3.4.2.1, 3.14.2.1).
        (b"\x40\x03\x00\x01\x05", 5, MALFORMED, "PUBACK: reason code 0x05"),
        (b"\x62\x03\x00\x01\x10", 5, MALFORMED, "PUBREL: reason code 0x10"),
        (b"\xe0\x01\x01", 5, MALFORMED, "DISCONNECT: reason code 0x01"),
        # Packet types: reserved, 5.0 only, or only sent the other way.
        (b"\x00\x00", 4, MALFORMED, "packet type 0 is reserved"),
        (b"\xf0\x00", 4, MALFORMED, "packet type 15 is reserved"),
        (b"\x20\x02\x00\x00", 4, PROTOCOL, "CONNACK: a server never receives"),
        (b"\x90\x03\x00\x01\x00", 5, PROTOCOL, "SUBACK: a server never receives"),
        (b"\xb0\x02\x00\x01", 4, PROTOCOL, "UNSUBACK: a server never receives"),
        (b"\xd0\x00", 5, PROTOCOL, "PINGRESP: a server never receives"),
        (connect_bytes(4), 4, PROTOCOL, "a second CONNECT"),
    ],
)
def test_malformed_input_to_a_server_raises_with_its_reason_code(
    data: bytes, level: int, code: int, text: str
) -> None:
    error = error_of(data, level)
    assert error.reason_code == code
    assert text in error.text


@pytest.mark.parametrize(
    ("data", "level", "code", "text"),
    [
        (connect_bytes(5), 5, PROTOCOL, "CONNECT: a client never receives"),
        (b"\x82\x06\x00\x01" + s("a") + b"\x00", 4, PROTOCOL, "SUBSCRIBE: a client never"),
        (b"\xa2\x05\x00\x01" + s("a"), 4, PROTOCOL, "UNSUBSCRIBE: a client never"),
        (b"\xc0\x00", 5, PROTOCOL, "PINGREQ: a client never"),
        (b"\xe0\x00", 4, PROTOCOL, "DISCONNECT: a client never"),  # 3.1.1 has none this way
        (b"\x20\x02\x02\x00", 4, MALFORMED, "reserved acknowledge flags"),
        (b"\x20\x02\x00\x06", 4, MALFORMED, "CONNACK: reason code 0x06"),
        (b"\x20\x03\x00\x00\x00", 4, MALFORMED, "CONNACK: Remaining Length 3"),
        (b"\x20\x03\x00\x01\x00", 5, MALFORMED, "CONNACK: reason code 0x01"),
        (b"\x90\x03\x00\x01\x03", 4, MALFORMED, "SUBACK: reason code 0x03"),
        (b"\x90\x02\x00\x01", 4, PROTOCOL, "SUBACK: no reason code"),
        (b"\xb0\x03\x00\x01\x00", 5, PROTOCOL, "UNSUBACK: no reason code"),
        (b"\xb0\x03\x00\x01\x00", 4, MALFORMED, "UNSUBACK: 1 bytes after"),
    ],
)
def test_malformed_input_to_a_client_raises_with_its_reason_code(
    data: bytes, level: int, code: int, text: str
) -> None:
    error = error_of(data, level, server=False)
    assert error.reason_code == code
    assert text in error.text


def connect_with(flags: int, rest: bytes = b"", level: int = 4) -> bytes:
    """A CONNECT with the given flags byte; ``rest`` follows keep alive (props in 5.0)."""
    name = s("MQIsdp" if level == 3 else "MQTT")
    return frame(0x10, name + bytes((level, flags)) + b"\x00\x3c" + rest)


@pytest.mark.parametrize(
    ("data", "code", "text"),
    [
        (frame(0x30, s("a")), PROTOCOL, "PUBLISH: the first packet must be CONNECT"),
        (b"\xc0\x00", PROTOCOL, "PINGREQ: the first packet must be CONNECT"),
        (b"\x00\x00", MALFORMED, "packet type 0 is reserved"),
        (b"\x11\x00", MALFORMED, "CONNECT: reserved flags"),
        # 3.1.2.3: the reserved bit of the Connect Flags.
        (connect_with(0x03, s("c")), MALFORMED, "the reserved flag is set"),
        # 3.1.2.6 and 3.1.2.7: Will QoS 3; Will QoS or Retain without a Will.
        (connect_with(0x1C, s("c") + s("t") + s("m")), MALFORMED, "Will QoS 3"),
        (connect_with(0x08, s("c")), MALFORMED, "without a Will"),
        (connect_with(0x20, s("c")), MALFORMED, "without a Will"),
        # 3.1.1 3.1.2.9: a password needs a user name (not so in 5.0).
        (connect_with(0x42, s("c") + s(b"pw")), PROTOCOL, "a password without a user name"),
        # 3.1.3.3: no wildcard in the Will topic.
        (connect_with(0x06, s("c") + s("t/#") + s("m")), r.TOPIC_NAME_INVALID, "Will topic"),
        (connect_with(0x02, s("c") + b"x"), MALFORMED, "CONNECT: 1 bytes after the end"),
        (connect_with(0x02, b"\x00\x05ab"), MALFORMED, "CONNECT: client identifier"),
        (connect_with(0x82, s("c")), MALFORMED, "CONNECT: user name: truncated"),
        (frame(0x10, s("MQTT") + b"\x04\x02"), MALFORMED, "truncated (level, flags"),
        (frame(0x10, b"\x00\x05MQ"), MALFORMED, "CONNECT: protocol name"),
    ],
)
def test_a_bad_connect_raises_with_its_reason_code(data: bytes, code: int, text: str) -> None:
    decoder = Decoder()
    decoder.receive_data(data)
    with pytest.raises(MqttError) as info:
        decoder.next_packet()
    assert info.value.reason_code == code
    assert text in info.value.text


@pytest.mark.parametrize(
    ("name", "level"), [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("MQTX", 4), ("mqtt", 5)]
)
def test_an_unsupported_protocol_leaves_the_level_unknown(name: str, level: int) -> None:
    decoder = Decoder()
    decoder.receive_data(frame(0x10, s(name) + bytes((level,)) + b"\x02\x00\x3c" + s("c")))
    with pytest.raises(MqttError) as info:
        decoder.next_packet()
    assert info.value.reason_code == r.UNSUPPORTED_PROTOCOL_VERSION
    assert decoder.protocol_level is None


def test_a_bad_connect_at_a_known_level_still_sets_the_level() -> None:
    # So the front end can answer a 5.0 client with a 5.0 CONNACK (0x81).
    decoder = Decoder()
    decoder.receive_data(connect_with(0x03, b"\x00" + s("c"), level=5))
    with pytest.raises(MqttError, match="reserved flag"):
        decoder.next_packet()
    assert decoder.protocol_level == 5


def test_a_5_0_connect_may_carry_a_password_without_a_user_name() -> None:
    packet = drain(Decoder(), [connect_with(0x42, b"\x00" + s("c") + s(b"pw"), level=5)])[0]
    assert packet == Connect("c", 5, keepalive=60, password=b"pw")


def test_connect_properties_with_bad_values_are_protocol_errors() -> None:
    for props in (b"\x02\x17\x02", b"\x03\x21\x00\x00", b"\x05\x27\x00\x00\x00\x00"):
        decoder = Decoder()
        decoder.receive_data(connect_with(0x02, props + s("c"), level=5))
        with pytest.raises(MqttError) as info:
            decoder.next_packet()
        assert info.value.reason_code == PROTOCOL


def test_dup_on_qos_0_is_accepted_in_3_1_1() -> None:
    # 3.1.1 3.3.1.1 says DUP MUST be 0 for QoS 0 but does not call it malformed.
    assert decode_one(frame(0x38, s("a") + b"x"), 4) == Publish("a", b"x", dup=True)


def test_an_empty_topic_with_a_topic_alias_is_accepted() -> None:
    packet = decode_one(frame(0x30, s("") + b"\x03\x23\x00\x07x"))
    assert packet == Publish("", b"x", properties=Properties(topic_alias=7))


def test_a_server_may_send_several_subscription_identifiers() -> None:
    packet = decode_one(frame(0x30, s("a") + b"\x04\x0b\x01\x0b\x02x"), server=False)
    assert packet == Publish("a", b"x", properties=Properties(subscription_identifiers=[1, 2]))


def test_user_properties_keep_order_and_repeats() -> None:
    props = b"\x26" + s("k") + s("1") + b"\x26" + s("a") + s("2") + b"\x26" + s("k") + s("3")
    packet = decode_one(frame(0x40, b"\x00\x01\x00" + bytes((len(props),)) + props))
    assert packet == PubAck(
        1, properties=Properties(user_properties=[("k", "1"), ("a", "2"), ("k", "3")])
    )


def test_after_an_error_every_call_raises_it_again() -> None:
    decoder = server_after_connect(4)
    decoder.receive_data(b"\xc0\x00" + frame(0x36, s("a") + b"\x00\x01") + b"\xc0\x00")
    assert decoder.next_packet() == PingReq()
    with pytest.raises(MqttError) as first:
        decoder.next_packet()
    decoder.receive_data(b"\xc0\x00")
    with pytest.raises(MqttError) as second:
        decoder.next_packet()
    assert second.value is first.value
    assert decoder.buffered == 0


def test_an_error_names_the_packet_and_the_reason_code() -> None:
    error = error_of(frame(0x36, s("a") + b"\x00\x01"), 5)
    assert str(error) == "PUBLISH: QoS 3 is not valid (reason code 0x81, Malformed Packet)"


def test_a_client_decoder_needs_a_protocol_level() -> None:
    with pytest.raises(ValueError, match="protocol_level"):
        Decoder(server=False)


# -- encoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [3, 4])
def test_3_x_drops_reason_codes_and_properties(level: int) -> None:
    props = Properties(reason_string="why")
    assert encode(PubAck(5, r.QUOTA_EXCEEDED, props), level) == b"\x40\x02\x00\x05"
    assert encode(PubRel(5, r.PACKET_IDENTIFIER_NOT_FOUND), level) == b"\x62\x02\x00\x05"
    assert encode(Disconnect(r.SERVER_SHUTTING_DOWN, props), level) == b"\xe0\x00"
    assert encode(UnsubAck(5, [r.SUCCESS]), level) == b"\xb0\x02\x00\x05"
    assert encode(SubAck(5, [0, 1, 2, 0x80]), level) == b"\x90\x06\x00\x05\x00\x01\x02\x80"
    # A 5.0 failure code becomes 3.1.1's one failure code.
    assert encode(SubAck(5, [r.NOT_AUTHORIZED]), level) == b"\x90\x03\x00\x05\x80"
    sub = Subscription("a", 1, no_local=True, retain_handling=2)
    assert encode(Subscribe(5, [sub]), level) == b"\x82\x06\x00\x05" + s("a") + b"\x01"


def test_5_0_leaves_out_a_success_code_and_empty_properties() -> None:
    assert encode(PubAck(5), 5) == b"\x40\x02\x00\x05"
    assert encode(PubRec(5, r.NO_MATCHING_SUBSCRIBERS), 5) == b"\x50\x03\x00\x05\x10"
    props = Properties(reason_string="r")
    assert encode(PubComp(5, 0, props), 5) == b"\x70\x08\x00\x05\x00\x04\x1f" + s("r")
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert encode(Disconnect(r.SESSION_TAKEN_OVER), 5) == b"\xe0\x01\x8e"
    assert encode(Auth(0, props), 5) == b"\xf0\x06\x00\x04\x1f" + s("r")
    assert encode(Auth(), 5) == b"\xf0\x00"


def test_a_connect_is_encoded_at_its_own_level_only() -> None:
    with pytest.raises(ValueError, match="level 4 CONNECT"):
        encode(Connect("c"), 5)


def test_auth_cannot_be_encoded_before_5_0() -> None:
    with pytest.raises(ValueError, match="AUTH"):
        encode(Auth(), 4)


def test_a_property_the_packet_may_not_carry_is_refused() -> None:
    with pytest.raises(ValueError, match="PUBACK may not carry the property topic_alias"):
        encode(PubAck(1, properties=Properties(topic_alias=3)), 5)


def test_encode_properties_leaves_out_the_length() -> None:
    assert encode_properties(Properties(), p.PUBLISH) == b""
    assert encode_properties(Properties(subscription_identifiers=[1, 200]), p.PUBLISH) == (
        b"\x0b\x01\x0b\xc8\x01"
    )


@FUZZ
@given(
    level=st.sampled_from(LEVELS),
    topic=topics,
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    packet_id=packet_ids,
    shared=properties(p.PUBLISH, sub_ids=0),
    sub_ids=st.lists(sub_id, max_size=2),
)
def test_a_publish_template_renders_what_encode_writes(
    level: int,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int,
    shared: Properties,
    sub_ids: list[int],
) -> None:
    pid = packet_id if qos else None
    dup = dup and qos > 0  # 5.0 refuses DUP on QoS 0 (3.3.1.1)
    template = PublishTemplate(topic, payload, level, encode_properties(shared, p.PUBLISH))
    extra = encode_properties(Properties(subscription_identifiers=sub_ids), p.PUBLISH)
    parts = template.render(qos, retain, dup, pid, extra)
    assert parts[-1] is payload  # passed through, not copied
    full = Properties(**{name: getattr(shared, name) for name in PROPERTY_IDS})
    full.subscription_identifiers = sub_ids
    packet = Publish(topic, payload, qos, retain, dup, pid, full if level == 5 else Properties())
    wire = b"".join(parts)
    assert template.size(qos, extra) == len(wire)
    assert drain(Decoder(server=False, protocol_level=level), [wire]) == [packet]
    if not sub_ids:  # with extras, the properties come in another (equally valid) order
        assert wire == encode(packet, level)
        assert wire == encode_publish(topic, payload, qos, retain, dup, pid, level, shared)


def test_publish_parts_renders_one_delivery() -> None:
    parts = publish_parts(b"a/b", b"hello", 1, False, False, 10, 4)
    assert b"".join(parts) == V311_PUBLISH_QOS1


def test_a_qos_1_delivery_needs_a_packet_identifier() -> None:
    with pytest.raises(ValueError, match="packet identifier"):
        PublishTemplate("a", b"", 4).render(1)


# -- reason codes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("v5", "v3"),
    [
        (r.SUCCESS, r.V3_ACCEPTED),
        (r.UNSUPPORTED_PROTOCOL_VERSION, r.V3_UNACCEPTABLE_PROTOCOL_VERSION),
        (r.CLIENT_IDENTIFIER_NOT_VALID, r.V3_IDENTIFIER_REJECTED),
        (r.SERVER_UNAVAILABLE, r.V3_SERVER_UNAVAILABLE),
        (r.SERVER_BUSY, r.V3_SERVER_UNAVAILABLE),
        (r.BAD_USER_NAME_OR_PASSWORD, r.V3_BAD_USER_NAME_OR_PASSWORD),
        (r.BAD_AUTHENTICATION_METHOD, r.V3_BAD_USER_NAME_OR_PASSWORD),
        (r.NOT_AUTHORIZED, r.V3_NOT_AUTHORIZED),
        (r.BANNED, r.V3_NOT_AUTHORIZED),
        (r.QUOTA_EXCEEDED, r.V3_SERVER_UNAVAILABLE),
    ],
)
def test_a_5_0_refusal_maps_to_the_closest_3_1_1_return_code(v5: int, v3: int) -> None:
    assert r.v3_connack_code(v5) == v3


def test_every_reason_code_has_a_name() -> None:
    values = (getattr(r, name) for name in r.__all__)
    codes = {value for value in values if isinstance(value, int)}
    v3_only = {r.V3_SUBACK_FAILURE} | set(range(6))
    assert codes - set(r.NAMES) <= v3_only
