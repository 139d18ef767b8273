"""MQTT over TLS (mqtts) and over secure WebSocket (wss), with Eclipse Paho as the client:
real certificates (tests/certs.py), the broker in a thread (tests/mqttkit.py)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.mqtt.connection import MqttConnection
from broker.security import certificate_subject
from tests.certs import Issued, Pki
from tests.mqttkit import Paho, Running, broker_in_thread

WAIT = 10.0


@pytest.fixture
def running(pki: Pki, server_cert: Issued) -> Iterator[Running]:
    with broker_in_thread(
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tls_client_ca=pki.ca,  # optional client certificates, verified when offered
        tls_listen_mqtt="127.0.0.1:0",
        tls_listen_websocket="127.0.0.1:0",
    ) as running:
        yield running


def port(running: Running, kind: str) -> int:
    return running.server.tls_addresses[kind][0][1]


def secure(client: Paho, ca: str, cert: Issued | None = None) -> Paho:
    client.client.tls_set(
        ca_certs=ca,
        certfile=cert.cert if cert else None,
        keyfile=cert.key if cert else None,
    )
    return client


def test_paho_publishes_and_subscribes_over_mqtts(running: Running, pki: Pki) -> None:
    subscriber = secure(Paho(port(running, "mqtt"), "sub-tls"), pki.ca)
    publisher = secure(Paho(port(running, "mqtt"), "pub-tls"), pki.ca)
    assert subscriber.connect()[1] == 0
    assert publisher.connect()[1] == 0
    try:
        assert [code.value for code in subscriber.subscribe("sensors/+/t", qos=1)] == [1]
        publisher.publish("sensors/a/t", b"21.5", qos=1)
        message = subscriber.receive()
        assert (message.topic, message.payload) == ("sensors/a/t", b"21.5")
    finally:
        subscriber.disconnect()
        publisher.disconnect()


def test_paho_publishes_and_subscribes_over_wss(running: Running, pki: Pki) -> None:
    ws = port(running, "websocket")
    subscriber = secure(Paho(ws, "sub-wss", transport="websockets"), pki.ca)
    publisher = secure(Paho(ws, "pub-wss", transport="websockets", version=4), pki.ca)
    assert subscriber.connect()[1] == 0
    assert publisher.connect()[1] == 0
    try:
        subscriber.subscribe("ws/#", qos=1)
        publisher.publish("ws/x", b"secure websocket", qos=1)
        assert subscriber.receive().payload == b"secure websocket"
    finally:
        subscriber.disconnect()
        publisher.disconnect()


@pytest.mark.parametrize(("kind", "transport"), [("mqtt", "tcp"), ("websocket", "websockets")])
def test_an_mqtt_clients_certificate_subject_reaches_the_broker(
    running: Running, pki: Pki, alice: Issued, kind: str, transport: str
) -> None:
    client = secure(Paho(port(running, kind), "alice-mqtt", transport=transport), pki.ca, alice)
    assert client.connect()[1] == 0
    try:
        client.ping()

        def subjects() -> list[str | None]:
            return [
                certificate_subject(c.stream)
                for c in running.server.broker.connections
                if isinstance(c, MqttConnection)
            ]

        assert running.call(subjects) == ["CN=alice,O=example"]
    finally:
        client.disconnect()


def test_paho_trusting_another_ca_refuses_the_broker(running: Running, tmp_path: Path) -> None:
    other = Pki(tmp_path, "another CA")
    client = secure(Paho(port(running, "mqtt"), "doubtful"), other.ca)
    with pytest.raises(ssl.SSLCertVerificationError):
        client.connect()


def test_a_plain_mqtt_client_on_the_mqtts_port_costs_only_its_connection(
    running: Running, pki: Pki
) -> None:
    staying = secure(Paho(port(running, "mqtt"), "staying"), pki.ca)
    assert staying.connect()[1] == 0
    try:
        connect = bytes.fromhex("101100044d5154540402003c0005706c61696e")  # CONNECT "plain"
        with socket.create_connection(("127.0.0.1", port(running, "mqtt")), timeout=WAIT) as s:
            s.sendall(connect)
            while s.recv(4096):  # an alert at most, then the broker closes
                pass
        assert running.call(lambda: running.server.broker.counters.tls_handshake_failures) == 1
        staying.ping()
    finally:
        staying.disconnect()
