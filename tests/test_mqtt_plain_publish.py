"""The MQTT fan-out path's plain PUBLISH (``Decoder.plain_publishes``): a QoS 0 PUBLISH without
DUP, RETAIN or properties comes out as ``(topic, payload, head)``, and that stands for exactly
the ``Publish`` the general path reads, with the same errors, whatever else the stream holds
and however it is split; its head is the PUBLISH head the message's subscribers of that
version get (``publish.plain_head``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import Message
from broker.mqtt import packets as p
from broker.mqtt.codec import Decoder, MqttError, encode
from broker.mqtt.packets import Publish
from broker.mqtt.publish import plain_head
from tests.test_mqtt_codec import LEVELS, TOPIC_CHARS, client_packets, connects, splits

FUZZ = settings(max_examples=300, deadline=None)

#: Plain PUBLISHes, some with a long payload (Remaining Length of 2-3 bytes, a memoryview copy)
plain = st.builds(
    Publish,
    st.text(TOPIC_CHARS, min_size=1, max_size=12),
    st.binary(max_size=40) | st.binary(min_size=4090, max_size=20_000),
)


def _read(decoder: Decoder, chunks: list[bytes]) -> tuple[list, MqttError | None]:
    """Every packet the chunks give, fed one at a time, and the error that ended them."""
    out: list = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (packet := decoder.next_packet()) is not None:
                out.append(packet)
    except MqttError as exc:
        return out, exc
    return out, None


def _general(packet: p.Packet | p.PlainPublish, level: int) -> p.Packet:
    """What the general path reads for ``packet``; a plain one's head checked on the way."""
    if packet.__class__ is not tuple:
        return packet  # type: ignore[return-value]
    topic, payload, head = packet  # type: ignore[misc]
    message = Message(topic, payload, None, "m", 0)
    assert head == plain_head(message, level == 5)
    return Publish(topic, payload)


@FUZZ
@given(level=st.sampled_from(LEVELS), data=st.data())
def test_a_plain_publish_reads_as_the_general_path_reads_it_in_any_split(
    level: int, data: st.DataObject
) -> None:
    packets = [
        data.draw(connects(level)),
        *data.draw(st.lists(plain | client_packets(level), max_size=8)),
    ]
    wire = b"".join(encode(packet, level) for packet in packets)
    chunks = data.draw(splits(wire))
    fast = Decoder()
    fast.plain_publishes = True
    got, error = _read(fast, chunks)
    assert error is None
    assert [_general(packet, level) for packet in got] == packets
    plain_ones = [
        x
        for x in packets
        if isinstance(x, Publish) and x == Publish(x.topic, x.payload) and x.topic
    ]
    assert sum(packet.__class__ is tuple for packet in got) == len(plain_ones)


@FUZZ
@given(level=st.sampled_from(LEVELS), data=st.data(), junk=st.binary(max_size=120))
def test_a_plain_decoder_raises_what_the_general_one_raises_on_any_bytes(
    level: int, data: st.DataObject, junk: bytes
) -> None:
    # Junk after a plain-looking first byte, so that the plain path is where it is read.
    wire = encode(p.Connect("c", level), level) + data.draw(
        st.sampled_from([b"", b"\x30", b"\x30\x05\x00\x01", b"\x30\x04\x00\x02+a"])
    )
    chunks = data.draw(splits(wire + junk))
    general, general_error = _read(Decoder(), chunks)
    fast = Decoder()
    fast.plain_publishes = True
    got, error = _read(fast, chunks)
    assert [_general(packet, level) for packet in got] == general
    assert (error is None) == (general_error is None)
    if error is not None and general_error is not None:
        assert (error.reason_code, error.text) == (general_error.reason_code, general_error.text)
