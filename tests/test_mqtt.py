"""The MQTT front end with a real client (paho-mqtt), both protocol versions.

Each test runs a broker in a thread (tests/mqttkit.py) and talks to it over 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket

import pytest
import trio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from broker.client import connect as native_connect
from broker.mqtt.codec import encode
from broker.mqtt.packets import Connect, SubAck, Subscribe, Subscription, Will
from broker.mqtt.packets import Properties as Properties5
from tests.mqttkit import Paho, Running, broker_in_thread, nothing_more, receive_from_any
from tests.mqttraw import Raw

VERSIONS = [4, 5]


@pytest.fixture
def broker() -> Running:
    with broker_in_thread() as running:
        yield running


@pytest.mark.parametrize("version", VERSIONS)
def test_a_wildcard_subscriber_receives_what_matches_and_nothing_else(
    broker: Running, version: int
) -> None:
    sub = Paho(broker.mqtt_port, "sub", version=version)
    sub.connect()
    sub.subscribe("beacon/+/de/#", qos=0)
    pub = Paho(broker.mqtt_port, "pub", version=version)
    pub.connect()
    pub.publish("beacon/eu/fr/site1", b"no", qos=1)
    pub.publish("beacon/eu/de/site1/checkout", b"yes", qos=1)
    pub.publish("beacon/eu/de", b"also", qos=1)
    got = [sub.receive(), sub.receive()]
    assert [(m.topic, m.payload) for m in got] == [
        ("beacon/eu/de/site1/checkout", b"yes"),
        ("beacon/eu/de", b"also"),
    ]
    assert nothing_more(sub)
    sub.disconnect()
    pub.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_every_qos_is_delivered_at_the_lower_of_publish_and_subscription(
    broker: Running, version: int, qos: int
) -> None:
    sub = Paho(broker.mqtt_port, "sub", version=version)
    sub.connect()
    sub.subscribe("q/#", qos=1)
    pub = Paho(broker.mqtt_port, "pub", version=version)
    pub.connect()
    pub.publish("q/x", b"payload", qos=qos)
    message = sub.receive()
    assert (message.topic, message.payload, message.qos) == ("q/x", b"payload", min(qos, 1))
    sub.disconnect()
    pub.disconnect()


def test_mqtt_and_native_clients_share_one_topic_namespace(broker: Running) -> None:
    sub = Paho(broker.mqtt_port, "sub")
    sub.connect()
    sub.subscribe("a/#", qos=1)
    received: list[tuple[str, bytes]] = []

    async def native() -> None:
        async with native_connect(broker.native) as client:
            async with client.subscribe("x/>") as subscription:
                pub = Paho(broker.mqtt_port, "pub")
                await trio.to_thread.run_sync(pub.connect)
                await trio.to_thread.run_sync(pub.publish, "x/y", b"from mqtt", 1)
                message = await subscription.__anext__()
                received.append((message.topic, message.payload))
                await trio.to_thread.run_sync(pub.disconnect)
            await client.publish("a/b", b"from native", confirm=True)

    trio.run(native)
    assert received == [("x/y", b"from mqtt")]
    message = sub.receive()
    assert (message.topic, message.payload) == ("a/b", b"from native")
    sub.disconnect()


def test_user_properties_and_request_response_fields_pass_through(broker: Running) -> None:
    sub = Paho(broker.mqtt_port, "sub")
    sub.connect()
    sub.subscribe("rr/#", qos=1)
    pub = Paho(broker.mqtt_port, "pub")
    pub.connect()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v"), ("trace", "42")]
    props.ResponseTopic = "rr/reply"
    props.CorrelationData = b"\x00\x01corr"
    props.ContentType = "text/plain"
    pub.publish("rr/ask", b"?", qos=1, properties=props)
    got = sub.receive().properties
    assert got.UserProperty == [("k", "v"), ("trace", "42")]
    assert got.ResponseTopic == "rr/reply"
    assert got.CorrelationData == b"\x00\x01corr"
    assert got.ContentType == "text/plain"
    sub.disconnect()
    pub.disconnect()


def test_native_headers_arrive_as_user_properties(broker: Running) -> None:
    sub = Paho(broker.mqtt_port, "sub")
    sub.connect()
    sub.subscribe("h/#", qos=0)

    async def native() -> None:
        async with native_connect(broker.native) as client:
            await client.publish("h/1", b"x", headers={"region": "eu"}, confirm=True)

    trio.run(native)
    assert sub.receive().properties.UserProperty == [("region", "eu")]
    sub.disconnect()


def test_an_empty_client_id_gets_one_assigned(broker: Running) -> None:
    client = Paho(broker.mqtt_port, "")
    _flags, reason, props = client.connect()
    assert reason == 0
    assert props.AssignedClientIdentifier.startswith("auto-")
    client.disconnect()


def test_a_second_connection_with_the_same_client_id_takes_over(broker: Running) -> None:
    first = Paho(broker.mqtt_port, "same")
    first.connect()
    second = Paho(broker.mqtt_port, "same")
    second.connect()
    reason = first.disconnects.get(timeout=10)
    assert reason == 0x8E  # Session taken over
    second.subscribe("t/#")
    second.ping()
    second.disconnect()


def test_no_local_keeps_a_clients_own_messages_from_it(broker: Running) -> None:
    client = Paho(broker.mqtt_port, "self")
    client.connect()
    client.subscribe("loop/#", options=SubscribeOptions(qos=1, noLocal=True))
    other = Paho(broker.mqtt_port, "other")
    other.connect()
    client.publish("loop/mine", b"own", qos=1)
    other.publish("loop/theirs", b"theirs", qos=1)
    message = client.receive()
    assert message.payload == b"theirs"
    assert nothing_more(client)
    client.disconnect()
    other.disconnect()


def test_subscription_identifiers_of_every_matching_subscription_come_in_one_publish(
    broker: Running,
) -> None:
    client = Paho(broker.mqtt_port, "ids")
    client.connect()
    for sid, flt in ((7, "s/+"), (9, "s/#")):
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = sid
        client.subscribe(flt, qos=1, properties=props)
    pub = Paho(broker.mqtt_port, "pub")
    pub.connect()
    pub.publish("s/x", b"1", qos=1)
    pub.publish("s/x/y", b"2", qos=1)
    first, second = client.receive(), client.receive()
    assert sorted(first.properties.SubscriptionIdentifier) == [7, 9]
    assert second.properties.SubscriptionIdentifier == [9]
    client.ping()
    assert nothing_more(client)  # one copy per connection, whatever matched
    client.disconnect()
    pub.disconnect()


def test_a_message_past_its_expiry_is_not_delivered_and_is_counted(broker: Running) -> None:
    pub = Paho(broker.mqtt_port, "pub")
    pub.connect()
    # a durable subscriber that is away: the message waits in the store past its expiry?
    # Simplest observable case: a transient subscriber gets the remaining interval.
    sub = Paho(broker.mqtt_port, "sub")
    sub.connect()
    sub.subscribe("exp/#", qos=1)
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 60
    pub.publish("exp/a", b"fresh", qos=1, properties=props)
    got = sub.receive()
    assert got.payload == b"fresh"
    assert 0 < got.properties.MessageExpiryInterval <= 60
    sub.disconnect()
    pub.disconnect()


def test_topic_aliases_from_the_client_are_resolved(broker: Running) -> None:
    sub = Paho(broker.mqtt_port, "sub")
    sub.connect()
    sub.subscribe("alias/#", qos=1)
    pub = Paho(broker.mqtt_port, "pub")
    pub.connect()
    props = Properties(PacketTypes.PUBLISH)
    props.TopicAlias = 3
    pub.publish("alias/long/topic", b"1", qos=1, properties=props)
    props = Properties(PacketTypes.PUBLISH)
    props.TopicAlias = 3
    pub.publish("", b"2", qos=1, properties=props)
    assert [(m.topic, m.payload) for m in (sub.receive(), sub.receive())] == [
        ("alias/long/topic", b"1"),
        ("alias/long/topic", b"2"),
    ]
    sub.disconnect()
    pub.disconnect()


def test_an_invalid_filter_is_refused_in_the_suback_and_the_rest_granted(broker: Running) -> None:
    client = Paho(broker.mqtt_port, "c")
    client.connect()
    too_long = "x/" * 130 + "#"  # topiary's limit: 128 levels (paho checks only wildcards)
    codes = client.subscribe([("ok/#", 1), (too_long, 0)])
    assert [int(c.value) for c in codes] == [1, 0x8F]
    client.disconnect()


def test_unsubscribe_stops_delivery_and_reports_unknown_filters(broker: Running) -> None:
    client = Paho(broker.mqtt_port, "c")
    client.connect()
    client.subscribe("u/#", qos=1)
    codes = client.unsubscribe(["u/#", "never/subscribed"])
    assert [int(c.value) for c in codes] == [0, 0x11]
    client.publish("u/x", b"after", qos=1)
    client.publish("barrier/mine", b"", qos=1)
    assert nothing_more(client)
    client.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_will_is_published_when_a_client_vanishes(broker: Running, version: int) -> None:
    watcher = Paho(broker.mqtt_port, "watcher", version=version)
    watcher.connect()
    watcher.subscribe("wills/#", qos=1)
    connect = Connect("doomed", protocol_level=version, will=Will("wills/doomed", b"gone", qos=1))
    with socket.create_connection(("127.0.0.1", broker.mqtt_port), timeout=10) as doomed:
        doomed.sendall(encode(connect, version))
        assert doomed.recv(64)[:1] == b"\x20"  # CONNACK; then the socket closes, no DISCONNECT
    message = watcher.receive()
    assert (message.topic, message.payload) == ("wills/doomed", b"gone")
    watcher.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_clean_disconnect_discards_the_will(broker: Running, version: int) -> None:
    watcher = Paho(broker.mqtt_port, "watcher", version=version)
    watcher.connect()
    watcher.subscribe("wills/#", qos=1)
    polite = Paho(
        broker.mqtt_port, "polite", version=version, will=("wills/polite", b"gone", 1, False)
    )
    polite.connect()
    polite.disconnect()
    assert polite.disconnects.get(timeout=10) == 0
    # the broker handled the DISCONNECT before this CONNECT with the same id takes over
    again = Paho(broker.mqtt_port, "polite", version=version)
    again.connect()
    again.publish("wills/marker", b"after", qos=1)
    assert watcher.receive().topic == "wills/marker"
    watcher.disconnect()
    again.disconnect()


def test_a_wrong_password_is_refused_when_a_token_is_set() -> None:
    with broker_in_thread(auth_token="sesame") as running:
        bad = Paho(running.mqtt_port, "c", username="u", password="wrong")
        _flags, reason, _props = bad.connect()
        assert reason == 0x86
        good = Paho(running.mqtt_port, "c", username="u", password="sesame")
        assert good.connect()[1] == 0
        good.disconnect()


def test_a_malformed_packet_closes_only_that_connection(broker: Running) -> None:
    healthy = Paho(broker.mqtt_port, "healthy")
    healthy.connect()
    healthy.subscribe("ok/#", qos=1)
    with socket.create_connection(("127.0.0.1", broker.mqtt_port), timeout=10) as raw:
        # a CONNECT cut short in its protocol name, then garbage, in one write
        raw.sendall(b"\x10\x03\x00\x04MQ" + b"\xff" * 8)
        with contextlib.suppress(ConnectionResetError):
            while raw.recv(4096):
                pass  # until the broker closes it
    healthy.publish("ok/still", b"served", qos=1)
    assert healthy.receive().payload == b"served"
    healthy.disconnect()


def test_websocket_clients_speak_mqtt_too(broker: Running) -> None:
    sub = Paho(broker.ws_port, "ws-sub", transport="websockets")
    sub.connect()
    sub.subscribe("web/#", qos=1)
    pub = Paho(broker.mqtt_port, "tcp-pub")
    pub.connect()
    pub.publish("web/page", b"live", qos=1)
    assert sub.receive().payload == b"live"
    sub.disconnect()
    pub.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_shared_subscription_gives_each_message_to_one_of_its_subscribers(
    broker: Running, version: int
) -> None:
    workers = [Paho(broker.mqtt_port, f"worker{i}", version=version) for i in range(2)]
    for worker in workers:
        worker.connect()
        codes = worker.subscribe("$share/pool/jobs/#", 1)
        assert [int(getattr(code, "value", code)) for code in codes] == [1]
    pub = Paho(broker.mqtt_port, "pub", version=version)
    pub.connect()
    for i in range(20):
        pub.publish(f"jobs/{i}", str(i).encode(), qos=1)
    shares = receive_from_any(workers, 20)
    everything = sorted((m.payload for share in shares for m in share), key=int)
    assert everything == [str(i).encode() for i in range(20)]
    assert all(shares), "round robin: each subscriber gets a share"
    for worker in workers:
        worker.ping()
        assert nothing_more(worker)
        worker.disconnect()
    pub.disconnect()


def test_shutdown_delivers_what_was_acknowledged_then_says_why() -> None:
    with broker_in_thread() as running:
        sub = Paho(running.mqtt_port, "sub")
        sub.connect()
        sub.subscribe("bye/#", qos=0)
        pub = Paho(running.mqtt_port, "pub")
        pub.connect()
        for i in range(200):
            pub.publish(f"bye/{i}", b"x" * 100, qos=1)
        running.call(running.server.shutdown)
        got = [sub.receive().topic for _ in range(200)]
        assert got == [f"bye/{i}" for i in range(200)]
        assert sub.disconnects.get(timeout=10) == 0x8B  # Server shutting down


def test_topics_sent_again_go_as_topic_aliases_up_to_the_clients_maximum(
    broker: Running,
) -> None:
    client = Raw(broker.mqtt_port)
    assert client.connect("aliased", properties=Properties5(topic_alias_maximum=1)).reason_code == 0
    client.send(Subscribe(1, [Subscription("al/#", qos=0)]))
    assert isinstance(client.expect(), SubAck)
    pub = Paho(broker.mqtt_port, "pub")
    pub.connect()
    for topic in ("al/x", "al/x", "al/y", "al/x"):
        pub.publish(topic, topic.encode(), qos=1)
    got = [client.expect() for _ in range(4)]
    assert [(p.topic, p.properties.topic_alias, p.payload) for p in got] == [
        ("al/x", 1, b"al/x"),  # defines alias 1
        ("", 1, b"al/x"),  # uses it
        ("al/y", None, b"al/y"),  # the client takes one alias only
        ("", 1, b"al/x"),
    ]
    client.close()
    pub.disconnect()


def test_a_resumed_session_is_still_in_its_shared_subscription(tmp_path) -> None:
    with broker_in_thread(data_dir=str(tmp_path)) as running:
        worker = Paho(running.mqtt_port, "worker", clean=True, expiry=600)
        worker.connect()
        worker.subscribe("$share/pool/work/#", qos=1)
        worker.disconnect()
        pub = Paho(running.mqtt_port, "pub")
        pub.connect()
        pub.publish("work/1", b"while away", qos=1)  # the group keeps it for its member
        back = Paho(running.mqtt_port, "worker", clean=False, expiry=600)
        assert back.connect()[0].session_present
        pub.publish("work/2", b"back", qos=1)
        assert [back.receive().payload for _ in range(2)] == [b"while away", b"back"]
        back.disconnect()
        pub.disconnect()


def test_topics_with_empty_levels_work_as_mqtt_allows_and_reach_native_subscribers(
    broker: Running,
) -> None:
    sub = Paho(broker.mqtt_port, "sub")
    sub.connect()
    sub.subscribe([("/#", 1), ("a//b", 1)])
    received: list[str] = []

    async def native() -> None:
        async with native_connect(broker.native) as client:
            async with client.subscribe(">") as everything:
                pub = Paho(broker.mqtt_port, "pub")
                await trio.to_thread.run_sync(pub.connect)
                for topic in ("/TopicA", "a//b"):
                    await trio.to_thread.run_sync(pub.publish, topic, b"x", 1)
                for _ in range(2):
                    received.append((await everything.get()).topic)
                await trio.to_thread.run_sync(pub.disconnect)

    trio.run(native)
    assert received == ["/TopicA", "a//b"]
    assert sorted(sub.receive().topic for _ in range(2)) == ["/TopicA", "a//b"]
    sub.disconnect()


def test_without_a_data_dir_a_persistent_session_still_gets_what_came_while_it_was_away(
    broker: Running,
) -> None:
    away = Paho(broker.mqtt_port, "away", version=4, clean=False)
    away.connect()
    away.subscribe("later/#", qos=1)
    away.disconnect()
    pub = Paho(broker.mqtt_port, "pub", version=4)
    pub.connect()
    pub.publish("later/1", b"kept", qos=1)
    back = Paho(broker.mqtt_port, "away", version=4, clean=False)
    assert back.connect()[0].session_present
    assert back.receive().payload == b"kept"
    back.disconnect()
    pub.disconnect()
