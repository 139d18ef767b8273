"""Whose topic ACL rules a durable session has while away, as the store keeps it (schema 5:
``sessions.cert`` beside ``sessions.owner``), and the migration from schema 4."""

from __future__ import annotations

import sqlite3
import tempfile
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store import DB_FILENAME, SCHEMA_VERSION, Store, StoredPrincipal
from broker.store.sqlite import SqliteBackend


@pytest.mark.parametrize(
    ("owner", "cert", "principal"),
    [
        ("user:alice", "CN=alice,O=example", StoredPrincipal("alice", "CN=alice,O=example")),
        ("user:alice", None, StoredPrincipal("alice", None)),
        ("cert:CN=dev1,O=Acme", "CN=dev1,O=Acme", StoredPrincipal(None, "CN=dev1,O=Acme")),
        ("anonymous", None, StoredPrincipal(None, None)),
    ],
)
async def test_a_new_session_keeps_whose_it_is(
    tmp_path: Path, owner: str, cert: str | None, principal: StoredPrincipal
) -> None:
    async with Store.open(tmp_path) as store:
        created = await store.create_session("d", None, owner, cert)
        assert created.principal == principal
    async with Store.open(tmp_path) as store:  # read back after a restart
        (record,) = await store.sessions()
        assert (record.owner, record.principal) == (owner, principal)


async def test_a_shared_group_has_no_principal(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("$group:g", "g")
        (record,) = await store.sessions()
        assert record.principal is None


async def test_the_owners_latest_certificate_replaces_the_stored_one(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("d", None, "user:alice", "CN=alice")
        await store.set_principal("d", None)
        assert (await store.session("d")).principal == StoredPrincipal("alice", None)  # type: ignore[union-attr]
        await store.set_principal("d", "CN=alice,O=new")
        assert (await store.session("d")).principal == StoredPrincipal("alice", "CN=alice,O=new")  # type: ignore[union-attr]


_names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["user", "cert", "anonymous"]),
    name=_names,
    cert=st.none() | _names,
    came_back=st.booleans(),
    latest=st.none() | _names,
)
def test_what_is_stored_is_what_is_read_back(
    kind: str, name: str, cert: str | None, came_back: bool, latest: str | None
) -> None:
    """Any user name and certificate subjects: the principal read back is the owner's user
    (none for a certificate or anonymous owner) with the certificate last stored."""
    if kind == "cert":
        owner, user, cert = f"cert:{name}", None, name
    elif kind == "anonymous":
        owner, user, cert = "anonymous", None, None
    else:
        owner, user = f"user:{name}", name
    with tempfile.TemporaryDirectory(prefix="topiary-principal-") as directory:
        backend = SqliteBackend.open(Path(directory) / DB_FILENAME, durable=False)
        try:
            backend.run(
                partial(
                    SqliteBackend.create_session, client_id="d", group=None, owner=owner, cert=cert
                )
            )
            if came_back and kind == "user":  # its latest connection (None: no certificate)
                cert = latest
                backend.run(partial(SqliteBackend.set_principal, client_id="d", cert=cert))
            record = backend.session("d")
        finally:
            backend.close()
    assert record is not None
    assert record.principal == StoredPrincipal(user, cert)


# -- migration from schema 4 ----------------------------------------------------------------

#: A version 4 file: owners, no certificates (its schema as that version created it).
V4_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)",
    "CREATE TABLE messages (rowid INTEGER PRIMARY KEY, msg_id TEXT NOT NULL, topic TEXT NOT NULL,"
    " payload BLOB NOT NULL, headers BLOB NULL, stored_at REAL NOT NULL, refs INTEGER NOT NULL,"
    " retained INTEGER NOT NULL DEFAULT 0, extra BLOB NULL)",
    "CREATE INDEX messages_unreferenced ON messages (stored_at) WHERE refs <= 0",
    "CREATE TABLE sessions (client_id TEXT PRIMARY KEY, grp TEXT NULL, last_ack INTEGER NOT NULL,"
    " next_seq INTEGER NOT NULL, created_at REAL NOT NULL, owner TEXT NULL)",
    "CREATE TABLE filters (client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE"
    " CASCADE, filter TEXT NOT NULL, dialect TEXT NOT NULL, options BLOB NULL,"
    " PRIMARY KEY (client_id, filter, dialect))",
    "CREATE TABLE deliveries (client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE"
    " CASCADE, seq INTEGER NOT NULL, message INTEGER NOT NULL, PRIMARY KEY (client_id, seq))"
    " WITHOUT ROWID",
    "CREATE TABLE published (msg_id TEXT PRIMARY KEY, at REAL NOT NULL)",
    "CREATE TABLE retained (topic TEXT PRIMARY KEY, msg_id TEXT NOT NULL, payload BLOB NOT NULL,"
    " headers BLOB NULL, extra BLOB NULL)",
    "INSERT INTO meta (key, value) VALUES ('schema_version', 4)",
    "INSERT INTO sessions VALUES ('user', NULL, 0, 2, 0.0, 'user:alice')",
    "INSERT INTO sessions VALUES ('device', NULL, 0, 1, 0.0, 'cert:CN=dev1,O=Acme')",
    "INSERT INTO sessions VALUES ('anon', NULL, 0, 1, 0.0, 'anonymous')",
    "INSERT INTO sessions VALUES ('old', NULL, 0, 1, 0.0, NULL)",
    "INSERT INTO sessions VALUES ('$group:g', 'g', 0, 1, 0.0, NULL)",
    "INSERT INTO filters VALUES ('user', 'a/>', 'native', NULL)",
    "INSERT INTO messages VALUES (1, 'm1', 'a/1', x'78', NULL, 0.0, 1, 0, NULL)",
    "INSERT INTO deliveries VALUES ('user', 1, 1)",
)


def write_v4(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(data_dir / DB_FILENAME)
    with conn:
        for statement in V4_SCHEMA:
            conn.execute(statement)
    conn.close()


async def test_a_version_4_file_is_migrated_and_knows_the_principals_its_owners_name(
    tmp_path: Path,
) -> None:
    write_v4(tmp_path)
    async with Store.open(tmp_path) as store:
        records = {r.client_id: r for r in await store.sessions()}
        assert {k: r.principal for k, r in records.items()} == {
            "user": None,  # had alice a certificate? not known until she comes back
            "device": StoredPrincipal(None, "CN=dev1,O=Acme"),
            "anon": StoredPrincipal(None, None),
            "old": None,
            "$group:g": None,
        }
        user = records["user"]
        assert (user.owner, user.filters, user.pending) == ("user:alice", (("a/>", "native"),), 1)
        await store.set_principal("user", None)  # the new column is usable
        assert (await store.session("user")).principal == StoredPrincipal("alice", None)  # type: ignore[union-attr]
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == SCHEMA_VERSION == 5
