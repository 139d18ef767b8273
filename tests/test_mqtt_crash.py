"""kill -9 a broker with MQTT QoS 1 publishers and persistent sessions: nothing PUBACKed is lost.

A real `topiary serve --mqtt --data-dir D` process; a paho subscriber with a persistent
session (MQTT 5 Session Expiry, and 3.1.1 without Clean Session) subscribes at QoS 1,
goes away, and a paho publisher sends QoS 1 messages until the broker is killed with
SIGKILL part-way. The broker restarts on the same data dir, the subscribers come back
without clean start, and each must receive every message whose PUBACK the publisher got.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.mqttkit import WAIT, Paho
from tests.test_crash import free_port, start_broker

MESSAGES = 3000  # sent in all; the kill comes after KILL_AFTER were acknowledged
KILL_AFTER = 400


def start(port: int, mqtt_port: int, data_dir: Path) -> subprocess.Popen:
    return start_broker(port, data_dir, "--mqtt", f"127.0.0.1:{mqtt_port}", wait_port=mqtt_port)


def test_nothing_pubacked_is_lost_when_the_broker_is_killed(tmp_path: Path) -> None:
    port, mqtt_port = free_port(), free_port()
    broker = start(port, mqtt_port, tmp_path)
    try:
        subscribers = {
            "keep-v5": Paho(mqtt_port, "keep-v5", version=5, clean=True, expiry=3600),
            "keep-v3": Paho(mqtt_port, "keep-v3", version=4, clean=False),
        }
        for sub in subscribers.values():
            sub.connect()
            sub.subscribe("crash/#", qos=1)
            sub.disconnect()

        acked_mids: set[int] = set()  # paho's callback thread adds; read after it stopped
        sent: dict[int, bytes] = {}
        enough = threading.Event()

        def on_publish(client: object, data: object, mid: int, rc: object, props: object) -> None:
            acked_mids.add(mid)
            if len(acked_mids) >= KILL_AFTER:
                enough.set()

        publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="pub", protocol=paho.MQTTv5)
        publisher.max_inflight_messages_set(50)
        publisher.max_queued_messages_set(0)
        publisher.on_publish = on_publish
        publisher.connect("127.0.0.1", mqtt_port)
        publisher.loop_start()
        for i in range(MESSAGES):
            payload = str(i).encode()
            sent[publisher.publish("crash/n", payload, qos=1).mid] = payload
        assert enough.wait(WAIT * 3), f"only {len(acked_mids)} PUBACKs came"
        broker.send_signal(signal.SIGKILL)
        broker.wait(timeout=WAIT)
        publisher.loop_stop()
        confirmed = {sent[mid] for mid in acked_mids}
        assert len(confirmed) >= KILL_AFTER

        broker = start(port, mqtt_port, tmp_path)
        for name, old in subscribers.items():
            again = Paho(mqtt_port, name, version=old.version, clean=False, expiry=3600)
            flags, reason, _props = again.connect()
            assert reason == 0
            assert flags.session_present
            got: set[bytes] = set()
            deadline = time.monotonic() + WAIT * 3
            while not confirmed <= got and time.monotonic() < deadline:
                got.add(again.receive().payload)
            missing = confirmed - got
            assert not missing, f"{name}: {len(missing)} PUBACKed messages lost"
            again.disconnect()
    finally:
        if broker.poll() is None:
            os.kill(broker.pid, signal.SIGTERM)
            broker.wait(timeout=WAIT)


def test_a_persistent_session_keeps_its_options_and_its_messages_properties_across_a_kill(
    tmp_path: Path,
) -> None:
    port, mqtt_port = free_port(), free_port()
    broker = start(port, mqtt_port, tmp_path)
    try:
        sub = Paho(mqtt_port, "keeper", version=5, clean=True, expiry=3600)
        sub.connect()
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = 4
        sub.subscribe("keep/#", options=SubscribeOptions(qos=2), properties=props)
        sub.disconnect()
        pub = Paho(mqtt_port, "pub", version=5)
        pub.connect()
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("k", "v")]
        props.CorrelationData = b"corr"
        props.MessageExpiryInterval = 600
        pub.publish("keep/1", b"kept", qos=2, properties=props)  # PUBREC came: it is stored
        pub.disconnect()
        broker.send_signal(signal.SIGKILL)
        broker.wait(timeout=WAIT)

        broker = start(port, mqtt_port, tmp_path)
        again = Paho(mqtt_port, "keeper", version=5, clean=False, expiry=3600)
        flags, _reason, _props = again.connect()
        assert flags.session_present
        message = again.receive()
        assert (message.topic, message.payload, message.qos) == ("keep/1", b"kept", 2)
        got = message.properties
        assert got.UserProperty == [("k", "v")]
        assert got.CorrelationData == b"corr"
        assert 0 < got.MessageExpiryInterval <= 600
        assert got.SubscriptionIdentifier == [4]
        again.disconnect()
    finally:
        if broker.poll() is None:
            os.kill(broker.pid, signal.SIGTERM)
            broker.wait(timeout=WAIT)
