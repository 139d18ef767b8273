"""Durable sessions belong to the identity that created them (native front end): another
identity can neither take one over nor drop it; the owner survives a restart; sessions
stored before owners existed go to the first identity that opens them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, connect
from broker.store import DB_FILENAME, SCHEMA_VERSION, Store
from tests.conftest import running_broker
from tests.test_users import make_users

Address = tuple[str, int]
ALICE = {"username": "alice", "password": "a"}
BOB = {"username": "bob", "password": "b"}


@pytest.fixture
def settings(tmp_path: Path) -> dict[str, object]:
    users = make_users(tmp_path / "users.toml", alice=("a", []), bob=("b", []))
    return {
        "auth_users": str(users),
        "auth_anonymous": True,
        "auth_failure_delay": 0.05,
        "data_dir": str(tmp_path / "data"),
    }


async def refused(address: Address, client_id: str, **login: str) -> BrokerError:
    with pytest.raises(BrokerError) as info:
        async with connect(address, client_id=client_id, durable=True, **login):
            pass
    return info.value


async def test_another_identity_cannot_take_over_a_connected_durable_session(
    settings: dict,
) -> None:
    async with running_broker(**settings) as server:
        address = server.addresses[0]
        async with connect(address, client_id="d", durable=True, **ALICE) as alice:
            async with alice.subscribe("t/>") as sub:
                error = await refused(address, "d", **BOB)
                assert error.code == "NOT_AUTHORIZED" and "another identity" in error.text
                await alice.publish("t/1", b"still mine", confirm=True)
                with trio.fail_after(5):
                    assert (await sub.get()).payload == b"still mine"
        assert server.broker.counters.errors["NOT_AUTHORIZED"] == 1


async def test_the_owner_takes_its_own_session_back(settings: dict) -> None:
    async with running_broker(**settings) as server:
        address = server.addresses[0]
        async with connect(address, client_id="d", durable=True, **ALICE):
            pass
        assert (await refused(address, "d", **BOB)).code == "NOT_AUTHORIZED"
        assert (await refused(address, "d")).code == "NOT_AUTHORIZED"  # anonymous
        async with connect(address, client_id="d", durable=True, **ALICE) as again:
            assert again.session_present


async def test_another_identity_cannot_drop_a_session_but_its_owner_can(settings: dict) -> None:
    async with running_broker(**settings) as server:
        address = server.addresses[0]
        async with connect(address, client_id="d", durable=True, **ALICE):
            pass
        async with connect(address, **BOB) as bob:
            with pytest.raises(BrokerError) as info:
                await bob.drop_session("d")
            assert info.value.code == "NOT_AUTHORIZED"
            await bob.ping()  # a refused request: the connection carries on
        assert "d" in server.broker.durable
        async with connect(address, **ALICE) as alice:
            assert await alice.drop_session("d")
        assert "d" not in server.broker.durable


async def test_anonymous_clients_own_what_they_create(settings: dict) -> None:
    async with running_broker(**settings) as server:
        address = server.addresses[0]
        async with connect(address, client_id="anon", durable=True):
            pass
        assert (await refused(address, "anon", **ALICE)).code == "NOT_AUTHORIZED"
        async with connect(address, client_id="anon", durable=True) as again:
            assert again.session_present


async def test_a_shared_group_is_shared_between_identities(settings: dict) -> None:
    async with running_broker(**settings) as server:
        address = server.addresses[0]
        async with (
            connect(address, group="workers", **ALICE) as alice,
            connect(address, group="workers", **BOB) as bob,
        ):
            await alice.ping()
            await bob.ping()
        info = {s["client_id"]: s for s in server.broker.sessions_info()}
        assert [s["owner"] for s in info.values() if s.get("group") == "workers"] == [None]


async def test_the_owner_survives_a_restart(settings: dict) -> None:
    async with running_broker(**settings) as server:
        async with connect(server.addresses[0], client_id="d", durable=True, **ALICE):
            pass
    async with running_broker(**settings) as server:
        address = server.addresses[0]
        async with connect(address, **BOB) as bob:
            (session,) = await bob.sessions()
            assert (session["client_id"], session["owner"]) == ("d", "user:alice")
        assert (await refused(address, "d", **BOB)).code == "NOT_AUTHORIZED"
        async with connect(address, client_id="d", durable=True, **ALICE) as alice:
            assert alice.session_present


# A version 3 file (before owners): its schema as that version created it.
V3_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)",
    "CREATE TABLE messages (rowid INTEGER PRIMARY KEY, msg_id TEXT NOT NULL, topic TEXT NOT NULL,"
    " payload BLOB NOT NULL, headers BLOB NULL, stored_at REAL NOT NULL, refs INTEGER NOT NULL,"
    " retained INTEGER NOT NULL DEFAULT 0, extra BLOB NULL)",
    "CREATE INDEX messages_unreferenced ON messages (stored_at) WHERE refs <= 0",
    "CREATE TABLE sessions (client_id TEXT PRIMARY KEY, grp TEXT NULL, last_ack INTEGER NOT NULL,"
    " next_seq INTEGER NOT NULL, created_at REAL NOT NULL)",
    "CREATE TABLE filters (client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE"
    " CASCADE, filter TEXT NOT NULL, dialect TEXT NOT NULL, options BLOB NULL,"
    " PRIMARY KEY (client_id, filter, dialect))",
    "CREATE TABLE deliveries (client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE"
    " CASCADE, seq INTEGER NOT NULL, message INTEGER NOT NULL, PRIMARY KEY (client_id, seq))"
    " WITHOUT ROWID",
    "CREATE TABLE published (msg_id TEXT PRIMARY KEY, at REAL NOT NULL)",
    "CREATE TABLE retained (topic TEXT PRIMARY KEY, msg_id TEXT NOT NULL, payload BLOB NOT NULL,"
    " headers BLOB NULL, extra BLOB NULL)",
    "INSERT INTO meta (key, value) VALUES ('schema_version', 3)",
    "INSERT INTO sessions VALUES ('old', NULL, 0, 2, 0.0)",
    "INSERT INTO filters VALUES ('old', 'a/>', 'native', NULL)",
    "INSERT INTO messages VALUES (1, 'm1', 'a/1', x'78', NULL, 0.0, 1, 0, NULL)",
    "INSERT INTO deliveries VALUES ('old', 1, 1)",
)


def write_v3(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(data_dir / DB_FILENAME)
    with conn:
        for statement in V3_SCHEMA:
            conn.execute(statement)
    conn.close()


async def test_a_version_3_file_is_migrated_with_sessions_that_have_no_owner(
    tmp_path: Path,
) -> None:
    write_v3(tmp_path)
    async with Store.open(tmp_path) as store:
        record = await store.session("old")
        assert record is not None
        assert (record.owner, record.filters, record.pending) == (None, (("a/>", "native"),), 1)
        assert await store.claim_session("old", "user:bob") == "user:bob"
        assert await store.claim_session("old", "user:alice") == "user:bob"  # taken already
        await store.create_session("new", None, "anonymous")
        assert (await store.session("new")).owner == "anonymous"  # type: ignore[union-attr]
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == SCHEMA_VERSION == 5


async def test_a_session_stored_before_owners_goes_to_the_first_identity_to_open_it(
    settings: dict,
) -> None:
    write_v3(Path(str(settings["data_dir"])))
    async with running_broker(**settings) as server:
        address = server.addresses[0]
        async with connect(address, client_id="old", durable=True, **BOB) as bob:
            assert bob.session_present
            async with bob.subscribe("a/>") as sub:
                with trio.fail_after(5):
                    assert (await sub.get()).payload == b"x"  # its stored message
        assert (await refused(address, "old", **ALICE)).code == "NOT_AUTHORIZED"
    async with running_broker(**settings) as server:  # the claim was stored
        assert server.broker.durable["old"].owner == "user:bob"
