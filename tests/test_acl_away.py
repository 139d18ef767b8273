"""Durable sessions whose owner is away have their owner's topic ACL rules: after a restart
(rebuilt from what the store says of the owner, with the groups of the users file in force)
and after a reload; native clients with real logins, a real SQLite file, restarted brokers.
(MQTT: tests/test_acl_away_mqtt.py; the store's side: tests/test_store_principal.py.)"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from broker.client import connect, tls_context
from broker.security import ANONYMOUS, Identity
from broker.security.principals import away_identity
from broker.security.users import Users
from broker.server import Server
from broker.store import Store
from tests.certs import Issued, Pki
from tests.conftest import running_broker
from tests.test_crash import free_port, start_broker
from tests.test_store_principal import write_v4
from tests.test_tls import native_tls, tls_settings
from tests.test_users import make_users

WAIT = 15.0  # seconds a whole test may take on a loaded machine

RULES = """
[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "open/>"

[[rule]]
who = "*"
allow = ["subscribe"]
filter = "home/%u/>"

[[rule]]
who = "*"
deny = ["subscribe"]
filter = "open/%c/private/>"

[[rule]]
who = "group:ops"
allow = ["subscribe"]
filter = "ops/>"

[[rule]]
who = "user:pub"
allow = ["publish"]
filter = ">"

[[rule]]
who = "user:alice"
deny = ["subscribe"]
filter = "open/hidden/>"
"""

ALICE = {"username": "alice", "password": "a"}
PUB = {"username": "pub", "password": "p"}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, object]:
    users = make_users(tmp_path / "users.toml", alice=("a", ["ops"]), pub=("p", []))
    acl = tmp_path / "acl.toml"
    acl.write_text(RULES)
    return {
        "auth_users": str(users),
        "auth_anonymous": True,
        "auth_failure_delay": 0.01,
        "acl_file": str(acl),
        "data_dir": str(tmp_path / "data"),
    }


@asynccontextmanager
async def broker(files: dict[str, object]) -> AsyncIterator[Server]:
    with trio.fail_after(WAIT):  # every test's waits, bounded
        async with running_broker(**files) as server:
            yield server


async def leave(server: Server, filters: list[str], **login: str) -> None:
    """Open durable session ``d`` subscribed to ``filters`` and go away."""
    async with connect(server.addresses[0], client_id="d", durable=True, **login) as client:
        for flt in filters:
            await client.subscribe(flt).__aenter__()  # (the session keeps it when we go)
        await client.ping()


def filters_of(server: Server, client_id: str = "d") -> list[list[str]]:
    (info,) = [s for s in server.broker.sessions_info() if s["client_id"] == client_id]
    return info["filters"]


async def stored_filters(files: dict[str, object]) -> tuple[tuple[str, str], ...]:
    """What the store holds for ``d`` (read with the broker stopped)."""
    async with Store.open(str(files["data_dir"])) as store:
        record = await store.session("d")
    assert record is not None
    return record.filters


async def test_after_a_restart_a_user_deny_rule_keeps_messages_from_the_away_session(
    files: dict[str, object],
) -> None:
    async with broker(files) as server:
        await leave(server, ["open/>"], **ALICE)
    async with broker(files) as server:
        async with connect(server.addresses[0], **PUB) as pub:
            await pub.publish("open/hidden/plan", b"denied", confirm=True)
            await pub.publish("open/news", b"allowed", confirm=True)
        (info,) = [s for s in server.broker.sessions_info() if s["client_id"] == "d"]
        assert info["pending"] == 1
        assert server.broker.counters.acl_denied_deliveries == 1
        async with connect(server.addresses[0], client_id="d", durable=True, **ALICE) as alice:
            async with alice.subscribe("open/>") as sub:
                # the denied one was published first: had it been stored, it would come first
                assert (await sub.get()).payload == b"allowed"


async def test_after_a_restart_a_client_id_deny_rule_applies_to_the_away_session(
    files: dict[str, object],
) -> None:
    async with broker(files) as server:
        await leave(server, ["open/>"])  # anonymous: %c is the session's client id
    async with broker(files) as server:
        async with connect(server.addresses[0], **PUB) as pub:
            await pub.publish("open/d/private/x", b"denied", confirm=True)
            await pub.publish("open/e/private/x", b"someone else's", confirm=True)
        async with connect(server.addresses[0], client_id="d", durable=True) as again:
            async with again.subscribe("open/>") as sub:
                assert (await sub.get()).payload == b"someone else's"


async def test_a_user_taken_out_of_a_group_loses_that_groups_filters_at_the_restart(
    files: dict[str, object], tmp_path: Path
) -> None:
    async with broker(files) as server:
        await leave(server, ["ops/>", "open/>"], **ALICE)
    make_users(tmp_path / "users.toml", alice=("a", []), pub=("p", []))
    async with broker(files) as server:
        assert filters_of(server) == [["open/>", "native"]]  # before alice is back
        async with connect(server.addresses[0], **PUB) as pub:
            await pub.publish("ops/x", b"not for alice now", confirm=True)
        assert server.broker.counters.acl_denied_subscribe == 1
        assert [s["pending"] for s in server.broker.sessions_info()] == [0]
    assert await stored_filters(files) == (("open/>", "native"),)


async def test_a_user_no_longer_in_the_users_file_keeps_only_what_everyone_may_have(
    files: dict[str, object], tmp_path: Path
) -> None:
    async with broker(files) as server:
        await leave(server, ["open/>", "home/alice/>", "ops/>"], **ALICE)
    make_users(tmp_path / "users.toml", pub=("p", []))
    async with broker(files) as server:
        # `*` rules only, and not those with %u: an anonymous client's share
        assert filters_of(server) == [["open/>", "native"]]
        async with connect(server.addresses[0], **PUB) as pub:
            await pub.publish("open/hidden/x", b"alice's deny rule is gone too", confirm=True)
        assert [s["pending"] for s in server.broker.sessions_info()] == [1]


async def test_a_reload_that_takes_a_rule_away_removes_a_restored_sessions_filter(
    files: dict[str, object], tmp_path: Path
) -> None:
    async with broker(files) as server:
        await leave(server, ["ops/>", "open/>"], **ALICE)
    async with broker(files) as server:
        assert filters_of(server) == [["open/>", "native"], ["ops/>", "native"]]
        (tmp_path / "acl.toml").write_text(RULES.replace('filter = "ops/>"', 'filter = "x/>"'))
        assert server.reload() == {"acl": None, "users": None}
        assert filters_of(server) == [["open/>", "native"]]
        async with connect(server.addresses[0], **PUB) as pub:
            await pub.publish("ops/x", b"no longer routed to d", confirm=True)
        assert [s["pending"] for s in server.broker.sessions_info()] == [0]
    assert await stored_filters(files) == (("open/>", "native"),)


async def test_a_reload_adding_a_deny_rule_applies_it_to_a_restored_session(
    files: dict[str, object], tmp_path: Path
) -> None:
    async with broker(files) as server:
        await leave(server, ["open/>"], **ALICE)
    async with broker(files) as server:
        extra = '\n[[rule]]\nwho = "group:ops"\ndeny = ["subscribe"]\nfilter = "open/ops-only/>"\n'
        (tmp_path / "acl.toml").write_text(RULES + extra)
        assert server.reload() == {"acl": None, "users": None}
        async with connect(server.addresses[0], **PUB) as pub:
            await pub.publish("open/ops-only/x", b"denied by the new rule", confirm=True)
            await pub.publish("open/y", b"allowed", confirm=True)
        async with connect(server.addresses[0], client_id="d", durable=True, **ALICE) as alice:
            async with alice.subscribe("open/>") as sub:
                assert (await sub.get()).payload == b"allowed"


async def away(server: Server, client_id: str = "d") -> None:
    """Until the broker has seen the session's connection go (it has no event of its own:
    a bounded poll)."""
    session = server.broker.durable[client_id]
    with trio.fail_after(WAIT):
        while session.connection is not None:
            await trio.sleep(0.01)


async def test_a_reload_gives_an_away_session_its_owners_groups_from_the_new_users_file(
    files: dict[str, object], tmp_path: Path
) -> None:
    async with broker(files) as server:
        await leave(server, ["ops/>", "open/>"], **ALICE)
        await away(server)  # away, in this run
        make_users(tmp_path / "users.toml", alice=("a", []), pub=("p", []))
        assert server.reload() == {"acl": None, "users": None}
        assert filters_of(server) == [["open/>", "native"]]
    assert await stored_filters(files) == (("open/>", "native"),)


CERT_DENY = """
[[rule]]
who = "cert:CN=alice,O=example"
deny = ["subscribe"]
filter = "open/by-cert/>"
"""


async def test_the_owners_certificate_is_stored_and_its_latest_connection_replaces_it(
    files: dict[str, object], tmp_path: Path, pki: Pki, server_cert: Issued, alice: Issued
) -> None:
    (tmp_path / "acl.toml").write_text(RULES + CERT_DENY)
    files = {**files, **tls_settings(server_cert, tls_client_ca=pki.ca)}
    with_cert = tls_context(pki.ca, alice.cert, alice.key)
    async with broker(files) as server:  # alice logs in with a password and a certificate
        async with connect(
            native_tls(server), client_id="d", durable=True, tls=with_cert, **ALICE
        ) as client:
            await client.subscribe("open/>").__aenter__()
    async with broker(files) as server:  # away: the certificate's deny rule holds
        async with connect(server.addresses[0], **PUB) as pub:
            await pub.publish("open/by-cert/1", b"denied", confirm=True)
            await pub.publish("open/x", b"allowed", confirm=True)
        async with connect(  # back without the certificate: the live identity rules
            native_tls(server), client_id="d", durable=True, tls=tls_context(pki.ca), **ALICE
        ) as client:
            async with client.subscribe("open/>") as sub:
                assert (await sub.get()).payload == b"allowed"
                await pub_once(server, "open/by-cert/2", b"no certificate now")
                live = await sub.get()
                assert live.payload == b"no certificate now"
                await client.ack(live.seq)
                await client.ping()
    async with broker(files) as server:  # and the store says so: no certificate
        await pub_once(server, "open/by-cert/3", b"stored")
        assert [s["pending"] for s in server.broker.sessions_info()] == [1]


async def pub_once(server: Server, topic: str, payload: bytes) -> None:
    async with connect(server.addresses[0], **PUB) as pub:
        await pub.publish(topic, payload, confirm=True)


async def test_a_session_whose_owner_the_store_does_not_know_is_checked_when_its_owner_is_back(
    files: dict[str, object],
) -> None:
    write_v4(Path(str(files["data_dir"])))  # "user": alice's, with a/> (no rule grants it)
    async with broker(files) as server:
        assert filters_of(server, "user") == [["a/>", "native"]]  # no rules yet
        async with connect(server.addresses[0], client_id="user", durable=True, **ALICE) as c:
            await c.ping()
            assert [e.code for e in c.errors] == ["NOT_AUTHORIZED"]  # told, as it is back
        assert filters_of(server, "user") == []
    async with broker(files) as server:  # its certificate (none) is stored now
        assert server.broker.durable["user"].principal is not None


# -- whose rules, decided without a broker --------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        (
            Identity(user="alice", groups=frozenset({"old"}), cert="CN=a"),
            ("alice", {"ops"}, "CN=a"),
        ),
        (Identity(user="gone", cert="CN=g"), (None, set(), None)),
        (Identity(cert="CN=dev1"), (None, set(), "CN=dev1")),
        (Identity(), (None, set(), None)),
    ],
)
def test_an_away_owner_has_the_groups_of_the_users_file_or_nothing_when_it_is_gone(
    tmp_path: Path, owner: Identity, expected: tuple[str | None, set[str], str | None]
) -> None:
    users = Users(make_users(tmp_path / "users.toml", alice=("a", ["ops"])))
    identity = away_identity(owner, users)
    assert (identity.user, set(identity.groups), identity.cert) == expected


def test_without_a_users_file_no_user_can_own_rules_while_away() -> None:
    assert away_identity(Identity(user="alice", groups=frozenset({"ops"})), None) == ANONYMOUS


# -- a real process, killed ------------------------------------------------------------------


def test_a_topiary_serve_killed_and_started_again_applies_an_away_sessions_deny_rule(
    files: dict[str, object], tmp_path: Path
) -> None:
    config = tmp_path / "topiary.toml"
    config.write_text(
        f'[auth]\nusers = "{files["auth_users"]}"\nfailure_delay = 0.01\n'
        f'[acl]\nfile = "{files["acl_file"]}"\n'
    )
    port = free_port()
    address = ("127.0.0.1", port)

    async def go_away() -> None:
        with trio.fail_after(WAIT):
            async with connect(address, client_id="d", durable=True, **ALICE) as client:
                await client.subscribe("open/>").__aenter__()
                await client.ping()

    async def come_back() -> None:
        with trio.fail_after(WAIT):
            async with connect(address, **PUB) as pub:
                await pub.publish("open/hidden/plan", b"denied", confirm=True)
                await pub.publish("open/news", b"allowed", confirm=True)
            async with connect(address, client_id="d", durable=True, **ALICE) as alice:
                async with alice.subscribe("open/>") as sub:
                    assert (await sub.get()).payload == b"allowed"

    data = tmp_path / "data"
    proc = start_broker(port, data, "--config", str(config))
    try:
        trio.run(go_away)
    finally:
        proc.kill()  # kill -9: nothing flushed at exit
        proc.wait(timeout=WAIT)
    proc = start_broker(port, data, "--config", str(config))
    try:
        trio.run(come_back)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=WAIT) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
