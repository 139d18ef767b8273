"""Logins on the native front end: users file, anonymous access, client certificates, the
failure delay and counters, reloads. Real sockets, real TLS, real files."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker.client import BrokerError, connect
from broker.config import BrokerConfig, ConfigError
from broker.core import Broker
from broker.security import ANONYMOUS, Identity
from broker.server import Server
from tests.conftest import running_broker
from tests.test_users import make_users
from tests.wire import RawClient, frame

Address = tuple[str, int]
FAST = 0.05  # failure_delay for the tests that do not measure it


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    return make_users(tmp_path / "users.toml", alice=("wonder", ["ops", "billing"]), bob=("b", []))


def identity_of(server: Server, client_id: str) -> Identity:
    """The identity the broker holds for the connection of ``client_id``."""
    (connection,) = [
        c for c in server.broker.connections if c.session and c.session.client_id == client_id
    ]
    return connection.identity


async def refusal(address: Address, **login: str) -> BrokerError:
    with pytest.raises(BrokerError) as info:
        async with connect(address, **login):
            pass
    return info.value


async def test_a_user_logs_in_with_the_right_password_and_has_their_groups(
    users_file: Path,
) -> None:
    async with running_broker(auth_users=str(users_file), auth_failure_delay=FAST) as server:
        async with connect(
            server.addresses[0], client_id="a", username="alice", password="wonder"
        ) as client:
            await client.ping()
            assert identity_of(server, "a") == Identity(
                user="alice", groups=frozenset({"ops", "billing"})
            )
        stats = server.broker.counters.snapshot()
        assert (stats["logins"], stats["auth_failures"]) == (1, 0)


async def test_a_wrong_password_and_an_unknown_user_get_the_same_refusal(
    users_file: Path,
) -> None:
    async with running_broker(auth_users=str(users_file), auth_failure_delay=FAST) as server:
        address = server.addresses[0]
        wrong = await refusal(address, username="alice", password="wander")
        unknown = await refusal(address, username="mallory", password="wonder")
        assert (
            (wrong.code, wrong.text)
            == (unknown.code, unknown.text)
            == (
                "AUTH_FAILED",
                "bad user name or password",
            )
        )
        counters = server.broker.counters
        assert (counters.auth_failures, counters.logins, counters.connections_refused) == (2, 0, 2)
        assert counters.errors["AUTH_FAILED"] == 2


async def test_credentials_that_are_not_strings_are_a_failed_login(users_file: Path) -> None:
    async with running_broker(auth_users=str(users_file), auth_failure_delay=FAST) as server:
        raw = await RawClient.open(server.addresses[0], hello=False)
        await raw.send(
            frame({"type": "HELLO", "version": 1, "credentials": {"username": 7, "password": []}})
        )
        with trio.fail_after(5):
            error = await raw.read_until("ERROR")
        assert (error["code"], error["text"]) == (
            "AUTH_FAILED",
            "username and password must be strings",
        )
        assert server.broker.counters.auth_failures == 1


async def test_anonymous_access_is_off_with_a_users_file(users_file: Path) -> None:
    async with running_broker(auth_users=str(users_file), auth_failure_delay=FAST) as server:
        error = await refusal(server.addresses[0])
        assert error.code == "AUTH_FAILED" and "anonymous access is off" in error.text
        assert server.broker.counters.auth_failures == 1


async def test_anonymous_true_lets_clients_without_credentials_in_beside_users(
    users_file: Path,
) -> None:
    async with running_broker(auth_users=str(users_file), auth_anonymous=True) as server:
        async with (
            connect(server.addresses[0], client_id="anon") as anonymous,
            connect(server.addresses[0], client_id="a", username="bob", password="b") as bob,
        ):
            await anonymous.ping()
            await bob.ping()
            assert identity_of(server, "anon") == ANONYMOUS
            assert identity_of(server, "a") == Identity(user="bob")


async def test_without_a_users_file_a_user_name_proves_nothing() -> None:
    async with running_broker() as server:
        async with connect(server.addresses[0], client_id="c", username="x", password="y") as c:
            await c.ping()
            assert identity_of(server, "c") == ANONYMOUS


async def test_anonymous_false_without_users_refuses_clients_without_a_certificate() -> None:
    async with running_broker(auth_anonymous=False, auth_failure_delay=FAST) as server:
        error = await refusal(server.addresses[0])
        assert error.code == "AUTH_FAILED"


async def test_a_failed_login_waits_the_failure_delay_without_holding_up_others(
    users_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    delay = 2.0
    async with running_broker(auth_users=str(users_file), auth_failure_delay=delay) as server:
        address = server.addresses[0]
        logins = server.broker.logins
        failing = trio.Event()
        fail = logins._fail

        async def noted(*args: object) -> None:
            failing.set()  # the barrier: the refusal's wait has begun
            await fail(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(logins, "_fail", noted)
        refused_at: list[float] = []

        async def guess() -> None:
            await refusal(address, username="alice", password="guess")
            refused_at.append(trio.current_time())

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(guess)
                await failing.wait()
                began = trio.current_time()
                async with connect(address, username="alice", password="wonder") as alice:
                    await alice.ping()
                assert refused_at == []  # alice was served while the guess waited
                assert trio.current_time() - began < delay
        assert refused_at[0] - began >= delay * 0.99
        assert server.broker.counters.auth_failures == 1


async def test_reload_switches_users_and_keeps_connections(tmp_path: Path) -> None:
    path = make_users(tmp_path / "users.toml", alice=("a", []))
    async with running_broker(auth_users=str(path), auth_failure_delay=FAST) as server:
        address = server.addresses[0]
        async with connect(address, username="alice", password="a") as alice:
            make_users(path, carol=("c", ["ops"]))
            assert server.reload() == {"users": None}
            await alice.ping()  # still connected
            assert (await refusal(address, username="alice", password="a")).code == "AUTH_FAILED"
            async with connect(address, username="carol", password="c") as carol:
                await carol.ping()
            await alice.ping()


async def test_a_bad_users_file_at_reload_keeps_the_old_users(tmp_path: Path) -> None:
    path = make_users(tmp_path / "users.toml", alice=("a", []))
    async with running_broker(auth_users=str(path), auth_failure_delay=FAST) as server:
        path.write_text('[users.alice]\nhash = "plain"\n')
        outcome = server.reload()
        assert outcome["users"] == f"users file {path}: user 'alice': bad hash: " + (
            "not a scrypt$n=N,r=R,p=P$SALT$HASH string"
        )
        async with connect(server.addresses[0], username="alice", password="a") as alice:
            await alice.ping()


def test_a_bad_users_file_stops_start_up_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text("[users\n")
    with pytest.raises(ConfigError, match=rf"^users file {path}: not valid TOML"):
        Broker(BrokerConfig(auth_users=str(path)))


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"auth_users": "u.toml", "auth_token": "t"}, "cannot both be set"),
        ({"auth_failure_delay": -1}, "failure_delay must be in [0, 60]"),
        ({"auth_failure_delay": 61}, "failure_delay must be in [0, 60]"),
        ({"auth_anonymous": "no"}, "anonymous must be true or false"),
        ({"auth_users": ""}, "must name a file"),
    ],
)
def test_bad_auth_settings_are_refused(settings: dict, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[")):
        BrokerConfig(**settings)


def test_auth_keys_load_from_a_config_file(tmp_path: Path) -> None:
    from broker.config import build_config

    path = tmp_path / "topiary.toml"
    path.write_text('[auth]\nusers = "users.toml"\nanonymous = true\nfailure_delay = 0.5\n')
    config = build_config(path)
    assert (config.auth_users, config.auth_anonymous, config.auth_failure_delay) == (
        "users.toml",
        True,
        0.5,
    )


# -- client certificates --------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "topiary tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, object] | None
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if subject == "localhost":
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())  # type: ignore[arg-type]


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA, a server certificate for localhost and a client certificate for device-1."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key, None)
    _write(tmp_path / "ca", ca, ca_key)
    for name, file in (("localhost", "server"), ("device-1", "client")):
        key = ec.generate_private_key(ec.SECP256R1())
        _write(tmp_path / file, _certificate(name, key, (ca.subject, ca_key)), key)
    return tmp_path


@asynccontextmanager
async def tls_broker(pki: Path, **settings: object) -> AsyncIterator[tuple[Server, Address]]:
    """A broker whose native listener speaks TLS and asks for (optional) client
    certificates verified against the test CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    context.load_verify_locations(pki / "ca.crt")
    context.verify_mode = ssl.CERT_OPTIONAL
    broker = Broker(BrokerConfig(port=0, **settings))  # type: ignore[arg-type]
    server = Server(broker)
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, [trio.SSLListener(listener, context)])
        try:
            yield server, listener.socket.getsockname()[:2]
        finally:
            server.shutdown()


async def tls_hello(address: Address, pki: Path, *, certificate: bool, **hello: object) -> dict:
    context = ssl.create_default_context(cafile=pki / "ca.crt")
    if certificate:
        context.load_cert_chain(pki / "client.crt", pki / "client.key")
    tcp = await trio.open_tcp_stream(*address)
    raw = RawClient(trio.SSLStream(tcp, context, server_hostname="localhost"))  # type: ignore[arg-type]
    await raw.send(frame({"type": "HELLO", "version": 1, **hello}))
    with trio.fail_after(5):
        reply = await raw.read_frame()
    await raw.aclose()
    return reply


async def test_a_verified_client_certificate_is_an_identity_when_anonymous_is_off(
    pki: Path, users_file: Path
) -> None:
    async with tls_broker(pki, auth_users=str(users_file), auth_failure_delay=FAST) as (
        _server,
        address,
    ):
        reply = await tls_hello(address, pki, certificate=True, client_id="dev")
        assert reply["type"] == "WELCOME"
        refused = await tls_hello(address, pki, certificate=False)
        assert (refused["type"], refused["code"]) == ("ERROR", "AUTH_FAILED")


async def test_a_certificate_and_a_password_make_one_identity_with_both(
    pki: Path, users_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Identity] = []
    async with tls_broker(pki, auth_users=str(users_file)) as (server, address):
        login = server.broker.logins.login

        async def noted(**kwargs: object) -> Identity:
            identity = await login(**kwargs)  # type: ignore[arg-type]
            seen.append(identity)
            return identity

        monkeypatch.setattr(server.broker.logins, "login", noted)
        await tls_hello(address, pki, certificate=True)
        await tls_hello(
            address, pki, certificate=True, credentials={"username": "bob", "password": "b"}
        )
    subject = "CN=device-1,O=topiary tests"
    assert seen == [Identity(cert=subject), Identity(user="bob", cert=subject)]
    assert [identity.owner for identity in seen] == [f"cert:{subject}", "user:bob"]
