"""Logins on the native front end: users file, anonymous access, client certificates, the
failure delay and counters, reloads. Real sockets, real TLS, real files."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, connect, tls_context
from broker.config import BrokerConfig, ConfigError
from broker.core import Broker
from broker.security import ANONYMOUS, Identity
from broker.server import Server
from tests.certs import Issued, Pki
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


# -- client certificates (the broker's TLS listener; tests/certs.py) -------------------------


def tls_settings(pki: Pki, server_cert: Issued, **more: object) -> dict[str, object]:
    return {
        "tls_cert": server_cert.cert,
        "tls_key": server_cert.key,
        "tls_client_ca": pki.ca,
        "tls_listen_native": "127.0.0.1:0",
        **more,
    }


async def test_a_verified_client_certificate_is_an_identity_when_anonymous_is_off(
    pki: Pki, server_cert: Issued, alice: Issued, users_file: Path
) -> None:
    settings = tls_settings(pki, server_cert, auth_users=str(users_file), auth_failure_delay=FAST)
    async with running_broker(**settings) as server:
        address = server.tls_addresses["native"][0]
        with_cert = tls_context(pki.ca, alice.cert, alice.key)
        async with connect(address, client_id="dev", tls=with_cert) as client:
            await client.ping()
            assert identity_of(server, "dev") == Identity(cert="CN=alice,O=example")
        error = await refusal_over(address, tls_context(pki.ca))
        assert error.code == "AUTH_FAILED" and "anonymous access is off" in error.text


async def test_a_certificate_and_a_password_make_one_identity_with_both(
    pki: Pki, server_cert: Issued, alice: Issued, users_file: Path
) -> None:
    async with running_broker(**tls_settings(pki, server_cert, auth_users=str(users_file))) as (
        server
    ):
        address = server.tls_addresses["native"][0]
        context = tls_context(pki.ca, alice.cert, alice.key)
        async with connect(address, client_id="b", tls=context, username="bob", password="b") as c:
            await c.ping()
            identity = identity_of(server, "b")
    assert identity == Identity(user="bob", cert="CN=alice,O=example")
    assert identity.owner == "user:bob"


async def refusal_over(address: Address, context: ssl.SSLContext) -> BrokerError:
    with pytest.raises(BrokerError) as info:
        async with connect(address, tls=context):
            pass
    return info.value
