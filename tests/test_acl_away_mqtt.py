"""Durable MQTT sessions whose client is away have its topic ACL rules, after a restart of
the broker and after a reload; paho-mqtt clients (3.1.1 and 5.0), a real SQLite file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.mqttkit import WAIT, Paho, Running, broker_in_thread

RULES = """
[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "open/#"
dialect = "mqtt"

[[rule]]
who = "*"
deny = ["subscribe"]
filter = "open/%c/private/#"
dialect = "mqtt"

[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "+/x"
dialect = "mqtt"

[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "both/+"
dialect = "mqtt"
"""


@pytest.fixture
def settings(tmp_path: Path) -> dict[str, Any]:
    acl = tmp_path / "acl.toml"
    acl.write_text(RULES)
    return {"acl_file": str(acl), "data_dir": str(tmp_path / "data")}


def durable(broker: Running, version: int) -> Paho:
    """Client ``d`` with a session that outlives its connection (3.1.1: no Clean Session)."""
    if version == 5:
        return Paho(broker.mqtt_port, "d", version=5, clean=False, expiry=3600)
    return Paho(broker.mqtt_port, "d", version=4, clean=False)


def away(broker: Running, client_id: str = "d") -> None:
    """Until the broker has let go of the session's connection (it has no event of its
    own: a bounded poll)."""
    session = broker.call(lambda: broker.server.broker.durable[client_id])
    deadline = time.monotonic() + WAIT
    while broker.call(lambda: session.connection is not None):
        assert time.monotonic() < deadline, "the broker kept the connection"
        time.sleep(0.01)


@pytest.mark.parametrize("version", [4, 5])
def test_after_a_restart_a_deny_rule_keeps_messages_from_the_away_session(
    settings: dict[str, Any], version: int
) -> None:
    with broker_in_thread(**settings) as broker:
        client = durable(broker, version)
        client.connect()
        assert client.subscribe("open/#", qos=1)
        client.disconnect()
    with broker_in_thread(**settings) as broker:
        publisher = Paho(broker.mqtt_port, "p", version=5)
        publisher.connect()
        publisher.publish("open/d/private/x", b"denied", qos=1)
        publisher.publish("open/news", b"allowed", qos=1)
        publisher.disconnect()
        client = durable(broker, version)
        flags, _rc, _props = client.connect()
        assert flags.session_present
        # the denied one was published first: had it been stored, it would come first
        assert client.receive().payload == b"allowed"
        client.disconnect()


def test_a_reload_while_away_removes_a_filter_and_its_options_are_forgotten_on_return(
    settings: dict[str, Any], tmp_path: Path
) -> None:
    with broker_in_thread(**settings) as broker:
        client = durable(broker, 5)
        client.connect()
        assert client.subscribe([("+/x", 0), ("both/+", 1)])
        client.disconnect()
        away(broker)
        (tmp_path / "acl.toml").write_text(RULES.replace('filter = "both/+"', 'filter = "no/+"'))
        assert broker.call(broker.server.reload) == {"acl": None}
        client = durable(broker, 5)
        assert client.connect()[0].session_present
        client.publish("both/x", b"by +/x alone", qos=1)
        message = client.receive()
        # delivered by +/x (QoS 0) alone: the removed both/+ (QoS 1) no longer counts
        assert (message.payload, message.qos) == (b"by +/x alone", 0)
        state = broker.call(lambda: broker.server.mqtt.clients["d"].subscriptions.by_filter)
        assert set(state) == {"+/x"}
        client.disconnect()
