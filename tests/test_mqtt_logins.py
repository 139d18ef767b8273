"""Logins and durable-session ownership on the MQTT front end, with paho-mqtt clients:
CONNACK 0x86/0x87 (5.0) and 4/5 (3.1.1) as the specs say, identities for the ACLs, and
client ids another identity holds left alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.security import ANONYMOUS, Identity
from tests.certs import Issued, Pki
from tests.mqttkit import Paho, Running, broker_in_thread
from tests.mqttraw import Raw
from tests.test_users import make_users

# paho reports a 3.1.1 return code as the 5.0 reason code of the same meaning (4: 0x86,
# 5: 0x87); test_the_3_1_1_return_codes_on_the_wire checks the bytes themselves.
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    users = make_users(
        tmp_path_factory.mktemp("auth") / "users.toml", alice=("wonder", ["ops"]), bob=("b", [])
    )
    with broker_in_thread(auth_users=str(users), auth_failure_delay=0.05) as running:
        yield running


def connack(running: Running, version: int = 5, **kwargs: object) -> int:
    """Connect, and the CONNACK's reason code as paho reports it."""
    client = Paho(running.mqtt_port, version=version, **kwargs)  # type: ignore[arg-type]
    try:
        _flags, rc, _props = client.connect()
    finally:
        client.disconnect()
    return rc.value  # type: ignore[union-attr]


def identity_of(running: Running, client_id: str) -> Identity:
    def find() -> Identity:
        (conn,) = [
            c for c in running.server.mqtt.live.values() if c.accepted.client_id == client_id
        ]  # type: ignore[union-attr]
        return conn.identity

    return running.call(find)


@pytest.mark.parametrize("version", [5, 4])
def test_a_user_logs_in_and_has_an_identity_with_groups(running: Running, version: int) -> None:
    client = Paho(
        running.mqtt_port, f"alice-{version}", version=version, username="alice", password="wonder"
    )
    _flags, rc, _props = client.connect()
    try:
        assert rc.value == 0  # type: ignore[union-attr]
        client.ping()
        assert identity_of(running, f"alice-{version}") == Identity(
            user="alice", groups=frozenset({"ops"})
        )
    finally:
        client.disconnect()


@pytest.mark.parametrize("version", [5, 4])
@pytest.mark.parametrize(("username", "password"), [("alice", "guess"), ("mallory", "wonder")])
def test_a_wrong_password_or_unknown_user_is_bad_user_name_or_password(
    running: Running, version: int, username: str, password: str
) -> None:
    before = running.call(lambda: running.server.broker.counters.auth_failures)
    code = connack(running, version, username=username, password=password)
    assert code == BAD_USER_NAME_OR_PASSWORD
    assert running.call(lambda: running.server.broker.counters.auth_failures) == before + 1


@pytest.mark.parametrize("version", [5, 4])
def test_no_credentials_with_anonymous_off_is_not_authorized(
    running: Running, version: int
) -> None:
    assert connack(running, version) == NOT_AUTHORIZED


@pytest.mark.parametrize(
    ("login", "code"),
    [({"username": "alice", "password": b"guess"}, 4), ({}, 5)],
)
def test_the_3_1_1_return_codes_on_the_wire(running: Running, login: dict, code: int) -> None:
    with Raw(running.mqtt_port, version=4) as raw:
        assert raw.connect("raw", **login).reason_code == code
        raw.expect_closed()


def test_anonymous_on_lets_clients_without_credentials_in(tmp_path: Path) -> None:
    users = make_users(tmp_path / "users.toml", alice=("wonder", []))
    with broker_in_thread(auth_users=str(users), auth_anonymous=True) as running:
        client = Paho(running.mqtt_port, "anon")
        client.connect()
        try:
            client.ping()
            assert identity_of(running, "anon") == ANONYMOUS
        finally:
            client.disconnect()


@pytest.mark.parametrize("version", [5, 4])
def test_another_identity_cannot_take_over_a_connected_client_id(
    running: Running, version: int
) -> None:
    client_id = f"held-{version}"
    alice = Paho(running.mqtt_port, client_id, version=version, username="alice", password="wonder")
    alice.connect()
    try:
        bob = connack(running, version, client_id=client_id, username="bob", password="b")
        assert bob == NOT_AUTHORIZED
        alice.subscribe("held/#", qos=1)
        alice.publish("held/1", b"still here", qos=1)
        assert alice.receive().payload == b"still here"
    finally:
        alice.disconnect()


@pytest.mark.parametrize("version", [5, 4])
def test_another_identity_can_neither_resume_nor_clean_a_stored_session(
    running: Running, version: int
) -> None:
    client_id = f"stored-{version}"
    kept = {"clean": False, "expiry": 300} if version == 5 else {"clean": False}
    alice = Paho(
        running.mqtt_port, client_id, version=version, username="alice", password="wonder", **kept
    )
    alice.connect()
    alice.subscribe("stored/#", qos=1)
    alice.disconnect()
    for clean in (False, True):
        assert (
            connack(
                running, version, client_id=client_id, username="bob", password="b", clean=clean
            )
            == NOT_AUTHORIZED
        )
    owner = running.call(lambda: running.server.broker.durable[client_id].owner)
    assert owner == "user:alice"
    again = Paho(
        running.mqtt_port, client_id, version=version, username="alice", password="wonder", **kept
    )
    flags, rc, _props = again.connect()
    try:
        assert rc.value == 0  # type: ignore[union-attr]
        assert flags.session_present
    finally:
        again.disconnect()


@pytest.mark.parametrize("transport", ["mqtt", "websocket"])
def test_a_client_certificate_over_mqtts_or_wss_is_an_identity_when_anonymous_is_off(
    pki: Pki, server_cert: Issued, alice: Issued, tmp_path: Path, transport: str
) -> None:
    users = make_users(tmp_path / "users.toml", bob=("b", []))
    with broker_in_thread(
        auth_users=str(users),
        auth_failure_delay=0.05,
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tls_client_ca=pki.ca,
        tls_listen_mqtt="127.0.0.1:0",
        tls_listen_websocket="127.0.0.1:0",
    ) as running:
        port = running.server.tls_addresses[transport][0][1]
        kind = "websockets" if transport == "websocket" else "tcp"
        device = Paho(port, f"dev-{transport}", transport=kind)
        device.client.tls_set(ca_certs=pki.ca, certfile=alice.cert, keyfile=alice.key)
        stranger = Paho(port, f"anon-{transport}", transport=kind)
        stranger.client.tls_set(ca_certs=pki.ca)
        try:
            assert device.connect()[1].value == 0  # type: ignore[union-attr]
            device.ping()
            assert identity_of(running, f"dev-{transport}") == Identity(cert="CN=alice,O=example")
            assert stranger.connect()[1].value == NOT_AUTHORIZED  # type: ignore[union-attr]
        finally:
            device.disconnect()
            stranger.disconnect()
