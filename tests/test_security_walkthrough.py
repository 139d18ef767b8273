"""TLS, users and topic ACLs together, as an operator sets them up from scratch
(docs/security.md, "From scratch"): `topiary passwd` writes the users, `topiary serve
--config` reads exactly the documented keys ([tls], [auth], [acl]), and Eclipse Paho
connects over mqtts and wss with user names and passwords or a client certificate.

One broker process for the module; each test uses client ids and topics of its own.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.certs import Issued, Pki
from tests.mqttkit import Paho, nothing_more
from tests.test_cli import TOPIARY, free_port, wait_listening

PASSWORDS = {"alice": "alice-pw", "billing": "billing-pw"}

ACL = """
[[rule]]                      # everyone: a private tree of their own
who = "*"
allow = ["subscribe", "publish"]
filter = "user/%u/#"
dialect = "mqtt"

[[rule]]                      # ops sees all beacons
who = "group:ops"
allow = ["subscribe"]
filter = "beacon/#"
dialect = "mqtt"

[[rule]]                      # billing sees purchases ...
who = "user:billing"
allow = ["subscribe"]
filter = "beacon/*/*/*/*/purchase"

[[rule]]                      # ... and never the admin section
who = "user:billing"
deny = ["subscribe"]
filter = "beacon/*/*/*/admin/>"

[[rule]]                      # the device publishes beacons, nothing else
who = "cert:CN=sensor-7,O=example"
allow = ["publish"]
filter = "beacon/>"
"""


@dataclass(frozen=True)
class Broker:
    mqtts: int
    wss: int
    ca: str
    sensor: Issued


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki, server_cert: Issued
) -> Iterator[Broker]:
    directory = tmp_path_factory.mktemp("walkthrough")
    for name, groups in (("alice", ["ops"]), ("billing", ["finance"])):
        flags = [arg for group in groups for arg in ("--group", group)]
        subprocess.run(
            [*TOPIARY, "passwd", "users.toml", name, *flags],
            input=PASSWORDS[name] + "\n",
            text=True,
            cwd=directory,
            check=True,
            capture_output=True,
        )
    (directory / "acl.toml").write_text(ACL)
    native, mqtts, wss = free_port(), free_port(), free_port()
    (directory / "topiary.toml").write_text(
        f"""
[server]
host = "127.0.0.1"
port = {native}
[tls]
cert = "{server_cert.cert}"
key = "{server_cert.key}"
client_ca = "{pki.ca}"
require_client_cert = false
listen_mqtt = "127.0.0.1:{mqtts}"
listen_websocket = "127.0.0.1:{wss}"
[auth]
users = "users.toml"
anonymous = false
failure_delay = 0.1
[acl]
file = "acl.toml"
"""
    )
    proc = subprocess.Popen(
        [*TOPIARY, "serve", "--config", "topiary.toml", "--log-format", "json"],
        cwd=directory,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(native, proc)
        wait_listening(wss, proc)
        yield Broker(mqtts, wss, pki.ca, pki.client("sensor-7", "example"))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def client(
    broker: Broker,
    client_id: str,
    user: str | None = None,
    *,
    password: str | None = None,
    version: int = 5,
    websocket: bool = False,
    cert: Issued | None = None,
) -> Paho:
    paho = Paho(
        broker.wss if websocket else broker.mqtts,
        client_id,
        version=version,
        transport="websockets" if websocket else "tcp",
        username=user,
        password=password if password is not None else PASSWORDS.get(user or ""),
    )
    paho.client.tls_set(
        ca_certs=broker.ca,
        certfile=cert.cert if cert else None,
        keyfile=cert.key if cert else None,
    )
    return paho


@pytest.fixture
def sensor(broker: Broker) -> Iterator[Paho]:
    device = client(broker, "sensor-7", cert=broker.sensor)
    assert device.connect()[1] == 0
    yield device
    device.disconnect()


def test_a_user_in_a_group_follows_what_a_device_publishes_with_its_certificate(
    broker: Broker, sensor: Paho
) -> None:
    alice = client(broker, "alice-1", "alice")
    assert alice.connect()[1] == 0
    try:
        assert [code.value for code in alice.subscribe("beacon/#", qos=1)] == [1]
        sensor.publish("beacon/eu/de/s1/checkout/purchase", b'{"amount": 12}', qos=1)
        message = alice.receive()
        assert (message.topic, message.payload) == (
            "beacon/eu/de/s1/checkout/purchase",
            b'{"amount": 12}',
        )
    finally:
        alice.disconnect()


def test_the_same_holds_over_secure_websocket(broker: Broker, sensor: Paho) -> None:
    alice = client(broker, "alice-ws", "alice", websocket=True)
    assert alice.connect()[1] == 0
    try:
        alice.subscribe("beacon/+/+/ws/#", qos=1)
        sensor.publish("beacon/eu/fr/ws/home/view", b"{}", qos=1)
        assert alice.receive().topic == "beacon/eu/fr/ws/home/view"
    finally:
        alice.disconnect()


@pytest.mark.parametrize(("version", "refused"), [(5, 0x87), (4, 0x80)])
def test_a_subscription_no_rule_covers_is_refused_in_the_suback(
    broker: Broker, version: int, refused: int
) -> None:
    billing = client(broker, f"billing-refused-{version}", "billing", version=version)
    assert billing.connect()[1] == 0
    try:
        codes = billing.subscribe([("beacon/#", 1), ("beacon/+/+/+/+/purchase", 1)])
        assert [code.value for code in codes] == [refused, 1]
    finally:
        billing.disconnect()


def test_a_deny_rule_withholds_matching_topics_from_a_granted_subscription(
    broker: Broker, sensor: Paho
) -> None:
    billing = client(broker, "billing-deny", "billing")
    assert billing.connect()[1] == 0
    try:
        billing.subscribe("beacon/*/*/*/*/purchase".replace("*", "+"), qos=1)
        sensor.publish("beacon/eu/de/deny/admin/purchase", b"withheld", qos=1)
        sensor.publish("beacon/eu/de/deny/checkout/purchase", b"delivered", qos=1)
        assert billing.receive().payload == b"delivered"  # in order: the first was withheld
        assert nothing_more(billing)
    finally:
        billing.disconnect()


def test_a_device_may_not_publish_outside_its_rules(broker: Broker, sensor: Paho) -> None:
    alice = client(broker, "alice-watch", "alice")
    assert alice.connect()[1] == 0
    try:
        alice.subscribe("user/alice/#", qos=1)
        sensor.publish("user/alice/forged", b"refused", qos=1)  # acknowledged, not routed
        alice.publish("user/alice/own", b"allowed", qos=1)
        assert alice.receive().payload == b"allowed"
        assert nothing_more(alice)
    finally:
        alice.disconnect()


BAD = "Bad user name or password"  # 5.0: 0x86; 3.1.1: return code 4 (paho names both)
NOT_AUTHORIZED = "Not authorized"  # 5.0: 0x87; 3.1.1: return code 5


@pytest.mark.parametrize("version", [5, 4])
@pytest.mark.parametrize(
    ("user", "password", "refused"),
    [("alice", "wrong", BAD), ("nobody", "x", BAD), (None, None, NOT_AUTHORIZED)],
)
def test_bad_or_missing_credentials_are_refused_in_the_connack(
    broker: Broker, user: str | None, password: str | None, version: int, refused: str
) -> None:
    stranger = client(broker, "stranger", user, password=password, version=version)
    try:
        assert stranger.connect()[1].getName() == refused
    finally:
        stranger.disconnect()


def test_passwd_wrote_a_private_users_file_without_the_passwords(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> None:
    users = next(Path(tmp_path_factory.getbasetemp()).glob("walkthrough*/users.toml"))
    text = users.read_text()
    assert users.stat().st_mode & 0o777 == 0o600
    assert "scrypt$" in text and not any(p in text for p in PASSWORDS.values())
