"""The fast MSG encoder says exactly what the Msg frame says."""

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from broker.core.message import Message
from broker.wire.codec import decode_frame, encode_frame, encode_msg, shared_fields
from broker.wire.frames import Msg

headers = st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)


@given(
    st.sampled_from(["a", "beacon/eu/de/site42/checkout/purchase", "x/\u00e9/y"]),
    st.binary(max_size=300),
    headers,
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
def test_fast_msg_encoding_decodes_to_the_msg_frame(
    topic: str, payload: bytes, hdrs: dict | None, msg_id: str, sub: int, seq: int
) -> None:
    wire = encode_msg(Message(topic, payload, hdrs, msg_id), sub, seq)
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    expected = Msg(sub=sub, seq=seq, topic=topic, payload=payload, headers=hdrs, msg_id=msg_id)
    assert decode_frame(wire[4:]) == expected
    assert decode_frame(encode_frame(expected)) == expected


@given(st.integers(1, 2**64 - 1), st.booleans())
def test_a_msg_after_drops_says_how_many_in_discarded(discarded: int, with_headers: bool) -> None:
    from broker.wire.codec import append_msg

    message = Message("a/b", b"p", {"k": "v"} if with_headers else None, "id")
    parts: list[bytes | memoryview] = []
    size = append_msg(parts, message, 3, 9, discarded=discarded)
    wire = b"".join(parts)
    assert size == len(wire)
    frame = decode_frame(wire[4:])
    assert isinstance(frame, Msg)
    assert (frame.discarded, frame.seq, frame.sub, frame.payload) == (discarded, 9, 3, b"p")
    assert decode_frame(encode_msg(message, 3, 10)[4:]).discarded == 0  # (left out: 0)


def test_shared_part_is_encoded_once() -> None:
    message = Message("a", b"p", None, "id")
    first = shared_fields(message)
    assert shared_fields(message)[0] is first[0]


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_fast_replies_decode_to_their_frames(request_id: int, sub_id: int) -> None:
    from broker.wire.codec import encode_puback, encode_suback, encode_unsuback
    from broker.wire.frames import PubAck, SubAck, UnsubAck

    for wire, expected in [
        (encode_puback(request_id), PubAck(id=request_id)),
        (encode_suback(request_id, sub_id), SubAck(id=request_id, sub=sub_id)),
        (encode_unsuback(request_id), UnsubAck(id=request_id)),
    ]:
        assert int.from_bytes(wire[:4], "big") == len(wire) - 4
        assert decode_frame(wire[4:]) == expected


def test_every_width_of_sub_and_seq_packs_as_the_generic_encoder_does() -> None:
    """``append_msg`` packs its head by the widths of sub and seq: every pair of widths,
    at both ends, gives the generic encoder's frame, and the smallest msgpack form."""
    from broker.wire.codec import append_msg

    edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1]
    message = Message("a/b", b"payload", None, "id")
    for sub in edges:
        for seq in edges:
            parts: list[bytes | memoryview] = []
            size = append_msg(parts, message, sub, seq)
            wire = b"".join(parts)
            assert size == len(wire) == int.from_bytes(wire[:4], "big") + 4
            frame = Msg(sub=sub, seq=seq, topic="a/b", payload=b"payload", msg_id="id")
            assert decode_frame(wire[4:]) == frame
            fields = {"type": "MSG", "sub": sub, "seq": seq, "topic": "a/b"}
            fields.update(payload=b"payload", msg_id="id")
            assert len(wire) - 4 == len(msgpack.packb(fields))  # no wider than needed


def test_long_fields_pack_as_the_generic_encoder_does() -> None:
    """Payloads of every bin width, and a msg_id of the longest allowed length, through
    ``append_msg``'s hand-written shared fields; a topic longer than a valid one too (a
    message built in the broker is not checked again)."""
    for payload_size, topic in [(0, "x/\u00e9/y"), (255, "t" * 255), (256, "t" * 256)] + [
        (size, "x/\u00e9/y") for size in (65535, 65536, 70_000)
    ]:
        for msg_id in ("m", "i" * 31, "i" * 32, "i" * 255, "i" * 256, "\u00e9" * 128):
            for hdrs in (None, {"k": "v"}):
                message = Message(topic, b"p" * payload_size, hdrs, msg_id)
                wire = encode_msg(message, 1, 2)
                assert int.from_bytes(wire[:4], "big") == len(wire) - 4
                fields = {"type": "MSG", "sub": 1, "seq": 2, "topic": topic}
                fields.update(payload=message.payload, msg_id=msg_id)
                if hdrs is not None:
                    fields["headers"] = hdrs
                assert msgpack.unpackb(wire[4:]) == fields
