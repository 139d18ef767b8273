"""The fan-out PUBLISH encoder (broker/mqtt/publish.py) writes what the codec reads back.

Every delivery of one message shares its encoded topic and properties; whatever varies
per delivery (QoS, RETAIN, DUP, packet id, expiry, subscription ids, version), a client-side
decoder reads the packet the encoder meant.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.core import Message
from broker.mqtt.codec import Decoder
from broker.mqtt.packets import Publish
from broker.mqtt.publish import append_publish, delivery_properties, pass_through_properties

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00+#/"), min_size=1, max_size=8)


@given(
    topic=st.lists(TEXT, min_size=1, max_size=4).map("/".join),
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    version=st.sampled_from([4, 5]),
    user=st.lists(st.tuples(TEXT, TEXT), max_size=3),
    correlation=st.none() | st.binary(max_size=10),
    expiry=st.none() | st.integers(1, 10_000),
    ids=st.lists(st.integers(1, 268_435_455), max_size=3),
    deliveries=st.integers(1, 3),
)
def test_every_delivery_of_a_message_decodes_to_the_publish_meant(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    version: int,
    user: list[tuple[str, str]],
    correlation: bytes | None,
    expiry: int | None,
    ids: list[int],
    deliveries: int,
) -> None:
    message = Message(topic, payload, None, "m1")
    message.mqtt_props = pass_through_properties(correlation_data=correlation, user=user)
    dup = dup and qos > 0
    v5 = version == 5
    extra = delivery_properties(expiry, ids) if v5 else b""
    for packet_id in range(1, deliveries + 1):  # the shared parts are made once, then reused
        parts: list[bytes | memoryview] = []
        size = append_publish(
            parts, message, qos=qos, retain=retain, dup=dup, packet_id=packet_id, v5=v5, extra=extra
        )
        data = b"".join(parts)
        assert size == len(data)
        decoder = Decoder(server=False, protocol_level=version)
        decoder.receive_data(data)
        got = decoder.next_packet()
        assert isinstance(got, Publish)
        assert (got.topic, got.payload, got.qos, got.retain, got.dup) == (
            topic,
            payload,
            qos,
            retain,
            dup,
        )
        assert got.packet_id == (packet_id if qos else None)
        if v5:
            assert got.properties.user_properties == user
            assert got.properties.correlation_data == correlation
            assert got.properties.message_expiry_interval == expiry
            assert got.properties.subscription_identifiers == ids
        assert decoder.next_packet() is None
