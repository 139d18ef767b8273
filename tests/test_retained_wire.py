"""The retained flags on the wire: PUB ``retain``, SUB ``retained``, MSG ``retained``."""

from __future__ import annotations

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from broker.core.message import Message
from broker.wire import codec
from broker.wire.codec import decode_frame, encode_frame
from broker.wire.frames import Msg, Pub, Sub


def body(raw: bytes) -> bytes:
    return raw[4:]  # without the length prefix


@given(
    headers=st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
    discarded=st.integers(0, 3),
    sub=st.integers(0, 2**40),
    seq=st.integers(0, 2**40),
)
def test_a_msg_from_the_retained_store_decodes_with_retained_true(
    headers: dict[str, str] | None, discarded: int, sub: int, seq: int
) -> None:
    message = Message("a/b", b"x", headers, "m1", retain=True, from_retained=True)
    parts: list[bytes | memoryview] = []
    codec.append_msg(parts, message, sub, seq, discarded=discarded)
    frame = decode_frame(body(b"".join(parts)))
    assert frame == Msg(
        sub=sub,
        seq=seq,
        topic="a/b",
        payload=b"x",
        headers=headers,
        msg_id="m1",
        discarded=discarded,
        retained=True,
    )


def test_a_live_retained_publish_is_an_msg_without_the_flag() -> None:
    message = Message("a/b", b"x", None, "m1", retain=True)
    wire = msgpack.unpackb(body(codec.encode_msg(message, 1, 2)))
    assert "retained" not in wire


def test_pub_retain_is_left_off_the_wire_when_false_and_read_back_when_true() -> None:
    assert "retain" not in msgpack.unpackb(encode_frame(Pub(topic="a", payload=b"x")))
    retained = Pub(topic="a", payload=b"x", retain=True)
    assert decode_frame(encode_frame(retained)) == retained


def test_the_fast_pub_decoder_reads_the_retain_flag() -> None:
    assert codec.fast_pub({"type": "PUB", "topic": "a", "payload": b"x"}).retain is False
    assert codec.fast_pub({"type": "PUB", "topic": "a", "payload": b"x", "retain": True}).retain


def test_the_fast_sub_decoder_defaults_retained_to_true() -> None:
    assert codec.fast_sub({"type": "SUB", "id": 1, "filter": "a/>"}).retained is True
    wire = {"type": "SUB", "id": 1, "filter": "a/>", "retained": False}
    assert codec.fast_sub(wire) == Sub(id=1, filter="a/>", retained=False)
