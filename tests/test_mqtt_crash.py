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
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from tests.mqttkit import WAIT, Paho
from tests.test_crash import free_port

MESSAGES = 3000  # sent in all; the kill comes after KILL_AFTER were acknowledged
KILL_AFTER = 400


def start(port: int, mqtt_port: int, data_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker.cli",
            "serve",
            "--port",
            str(port),
            "--mqtt",
            f"127.0.0.1:{mqtt_port}",
            "--data-dir",
            str(data_dir),
        ],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    import socket

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", mqtt_port), timeout=0.2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise AssertionError("the broker exited at start-up") from None
            time.sleep(0.05)  # a real process: poll its port (bounded) until it listens
    proc.kill()
    raise AssertionError("the broker did not start")


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

        # No lock shared with paho's thread: holding one across publish() while on_publish
        # waits for it deadlocks (paho holds its own lock while calling on_publish). The
        # packet ids (mids) of the PUBACKs are kept, their payloads looked up at the end.
        acked_mids: list[int] = []  # appended by paho's thread only
        sent: dict[int, bytes] = {}
        enough = threading.Event()

        def on_publish(
            client: object, userdata: object, mid: int, rc: object, props: object
        ) -> None:
            acked_mids.append(mid)
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
            info = publisher.publish("crash/n", payload, qos=1)
            sent[info.mid] = payload  # MESSAGES < 65535: no mid is used twice
        assert enough.wait(WAIT * 3), f"only {len(acked_mids)} PUBACKs came"
        broker.send_signal(signal.SIGKILL)
        broker.wait(timeout=WAIT)
        publisher.loop_stop()
        confirmed = {sent[mid] for mid in list(acked_mids)}
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
