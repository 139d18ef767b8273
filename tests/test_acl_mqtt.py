"""Topic ACLs through the MQTT front end, with paho-mqtt clients (3.1.1 and 5.0)."""

from __future__ import annotations

import queue
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.mqtt.codec import encode
from broker.mqtt.packets import Connect, Will
from tests.mqttkit import WAIT, Paho, Running, broker_in_thread, nothing_more

RULES = """
[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "open/#"
dialect = "mqtt"

[[rule]]
who = "*"
deny = ["subscribe"]
filter = "open/secret/#"
dialect = "mqtt"

[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "dev/%c/#"
dialect = "mqtt"

[[rule]]
who = "*"
allow = ["publish"]
filter = "barrier/#"
dialect = "mqtt"
"""

VERSIONS = [4, 5]


@pytest.fixture
def acl_path(tmp_path: Path) -> Path:
    path = tmp_path / "acl.toml"
    path.write_text(RULES)
    return path


@pytest.fixture
def broker(acl_path: Path) -> Iterator[Running]:
    with broker_in_thread(acl_file=str(acl_path)) as running:
        yield running


def stats(broker: Running) -> dict:
    return broker.call(broker.server.broker.stats)


@pytest.mark.parametrize(("version", "refusal"), [(4, 0x80), (5, 0x87)])
def test_a_filter_no_rule_covers_gets_the_refusal_code_and_is_not_subscribed(
    broker: Running, version: int, refusal: int
) -> None:
    client = Paho(broker.mqtt_port, "c", version=version)
    client.connect()
    codes = client.subscribe([("open/+/x", 1), ("#", 1), ("closed/x", 0)])
    assert [int(getattr(c, "value", c)) for c in codes] == [1, refusal, refusal]
    other = Paho(broker.mqtt_port, "p", version=5)
    other.connect()
    other.publish("open/a/x", b"granted", qos=1)
    assert client.receive().topic == "open/a/x"
    client.ping()
    assert nothing_more(client)
    assert stats(broker)["acl_denied_subscribe"] == 2
    client.disconnect()
    other.disconnect()


def test_a_v5_publish_the_rules_refuse_gets_puback_0x87_and_is_not_routed(
    broker: Running,
) -> None:
    watcher = Paho(broker.mqtt_port, "w", version=5)
    watcher.connect()
    watcher.subscribe("dev/w/#", qos=1)
    client = Paho(broker.mqtt_port, "c", version=5)
    reasons: queue.Queue[int] = queue.Queue()
    client.client.on_publish = lambda c, u, mid, rc, props: reasons.put(int(rc.value))
    client.connect()
    client.publish("dev/w/x", b"not mine", qos=1)  # allowed only to client "w"
    assert reasons.get(timeout=WAIT) == 0x87
    client.publish("open/ok", b"mine", qos=1)
    assert reasons.get(timeout=WAIT) == 0
    watcher.ping()
    assert nothing_more(watcher)
    assert stats(broker)["acl_denied_publish"] == 1
    watcher.disconnect()
    client.disconnect()


def test_a_311_publish_the_rules_refuse_is_acknowledged_and_dropped(broker: Running) -> None:
    watcher = Paho(broker.mqtt_port, "w", version=4)
    watcher.connect()
    watcher.subscribe("dev/w/#", qos=1)
    client = Paho(broker.mqtt_port, "c", version=4)
    client.connect()
    client.publish("dev/w/x", b"not mine", qos=1)  # PUBACK as usual (MQTT-3.3.5-2)
    client.publish("dev/w/y", b"not mine", qos=2)
    client.publish("open/x", b"still connected", qos=1)
    watcher.ping()
    assert nothing_more(watcher)
    assert stats(broker)["acl_denied_publish"] == 2
    assert client.disconnects.empty()
    watcher.disconnect()
    client.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_client_id_substitution_lets_each_client_use_its_own_tree(
    broker: Running, version: int
) -> None:
    client = Paho(broker.mqtt_port, "dev1", version=version)
    client.connect()
    codes = client.subscribe([("dev/dev1/#", 1), ("dev/dev2/#", 1)])
    granted, refused = (int(getattr(c, "value", c)) for c in codes)
    assert (granted, refused >= 0x80) == (1, True)
    client.publish("dev/dev1/t", b"mine", qos=1)
    assert client.receive().payload == b"mine"
    client.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_deny_subscribe_drops_live_and_retained_messages_per_message(
    broker: Running, version: int
) -> None:
    publisher = Paho(broker.mqtt_port, "p", version=5)
    publisher.connect()
    publisher.publish("open/secret/kept", b"hidden", qos=1, retain=True)
    publisher.publish("open/plain/kept", b"shown", qos=1, retain=True)
    client = Paho(broker.mqtt_port, "c", version=version)
    client.connect()
    client.subscribe("open/#", qos=1)  # granted: open/# is allowed
    assert client.receive().topic == "open/plain/kept"
    publisher.publish("open/secret/live", b"hidden", qos=1)
    publisher.publish("open/plain/live", b"shown", qos=1)
    assert client.receive().topic == "open/plain/live"  # in order: the secret came not
    assert nothing_more(client)
    assert stats(broker)["acl_denied_deliveries"] == 2
    client.disconnect()
    publisher.disconnect()


def test_a_shared_subscription_is_checked_with_the_subscribers_rules(broker: Running) -> None:
    client = Paho(broker.mqtt_port, "c", version=5)
    client.connect()
    codes = client.subscribe([("$share/g/open/#", 1), ("$share/g/closed/#", 1)])
    assert [int(c.value) for c in codes] == [1, 0x87]
    client.disconnect()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_will_on_a_topic_the_client_may_not_publish_to_is_dropped(
    broker: Running, version: int
) -> None:
    watcher = Paho(broker.mqtt_port, "w", version=5)
    watcher.connect()
    watcher.subscribe("dev/w/#", qos=1)
    watcher.subscribe("open/#", qos=1)
    for client_id, topic in (("doomed", "dev/w/will"), ("fine", "open/will")):
        connect = Connect(client_id, protocol_level=version, will=Will(topic, b"gone", qos=1))
        with socket.create_connection(("127.0.0.1", broker.mqtt_port), timeout=WAIT) as sock:
            sock.sendall(encode(connect, version))
            assert sock.recv(64)[:1] == b"\x20"  # CONNACK: accepted; then the socket closes
    message = watcher.receive()  # "fine"'s will; "doomed"'s, closed first, came not
    assert message.topic == "open/will"
    assert stats(broker)["acl_denied_publish"] == 1
    watcher.disconnect()


def test_a_reload_removes_subscriptions_the_new_rules_do_not_grant(
    broker: Running, acl_path: Path
) -> None:
    client = Paho(broker.mqtt_port, "c", version=5)
    client.connect()
    client.subscribe([("open/a/#", 1), ("dev/c/#", 1)])
    acl_path.write_text(RULES.replace('filter = "open/#"', 'filter = "x/#"'))
    assert broker.call(broker.server.reload) == {"acl": None}
    client.publish("dev/c/x", b"kept", qos=1)
    assert client.receive().topic == "dev/c/x"  # connected, and this one still granted
    client.publish("open/a/b", b"now refused", qos=1)  # (and no longer delivered)
    client.ping()
    assert nothing_more(client)
    state = broker.call(lambda: broker.server.mqtt.clients["c"].subscriptions.by_filter)
    assert set(state) == {"dev/c/#"}
    client.disconnect()


def test_a_bad_acl_file_at_reload_keeps_the_old_rules(broker: Running, acl_path: Path) -> None:
    client = Paho(broker.mqtt_port, "c", version=5)
    client.connect()
    client.subscribe("open/#", qos=1)
    acl_path.write_text('[[rule]]\nwho = "*"\nallow = ["publish"]\nfilter = "a/>/b"\n')
    outcome = broker.call(broker.server.reload)
    assert "rule 1" in outcome["acl"] and str(acl_path) in outcome["acl"]
    client.publish("open/x", b"still", qos=1)
    assert client.receive().topic == "open/x"
    client.disconnect()
