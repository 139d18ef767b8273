"""The store's retained table: written with an append, in its transaction; read at start-up."""

from __future__ import annotations

import sqlite3
from functools import partial
from pathlib import Path

from broker.store import DB_FILENAME, SCHEMA_VERSION, RetainedMessage, Store
from broker.store.sqlite import SqliteBackend


async def retain(
    store: Store, topic: str, payload: bytes, msg_id: str, publisher: str | None = None
) -> bool:
    return await store.append(
        msg_id=msg_id,
        topic=topic,
        payload=payload,
        headers=None,
        deliveries=[],
        publisher_msg_id=publisher,
        retain=True,
    )


async def test_a_retained_append_is_read_back_with_its_headers(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.append(
            msg_id="m1",
            topic="a/b",
            payload=b"x",
            headers={"k": "v"},
            deliveries=[],
            retain=True,
        )
        assert await store.retained() == [RetainedMessage("a/b", "m1", b"x", {"k": "v"})]


async def test_a_later_retained_append_replaces_the_topics_message(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await retain(store, "a", b"old", "m1")
        await retain(store, "a", b"new", "m2")
        assert await store.retained() == [RetainedMessage("a", "m2", b"new", None)]


async def test_an_empty_retained_payload_deletes_the_topics_message(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await retain(store, "a", b"old", "m1")
        await retain(store, "b", b"kept", "m2")
        await retain(store, "a", b"", "m3")
        assert [r.topic for r in await store.retained()] == ["b"]


async def test_an_append_without_retain_leaves_the_retained_message(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await retain(store, "a", b"kept", "m1")
        await store.append(msg_id="m2", topic="a", payload=b"live", headers=None, deliveries=[])
        assert [r.payload for r in await store.retained()] == [b"kept"]


async def test_a_duplicate_retained_publish_changes_nothing(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        assert await retain(store, "a", b"first", "m1", publisher="p1")
        await retain(store, "a", b"second", "m2", publisher="p2")
        assert not await retain(store, "a", b"first", "m1", publisher="p1")
        assert [r.payload for r in await store.retained()] == [b"second"]


async def test_retained_appends_of_one_batch_apply_in_order(tmp_path: Path) -> None:
    """Many appends of one group commit take the multi-row path: the last one still wins."""
    async with Store.open(tmp_path) as store:
        pendings = [
            await store.begin_append(
                msg_id=f"m{i}",
                topic="a",
                payload=b"%d" % i,
                headers=None,
                deliveries=[],
                retain=True,
            )
            for i in range(1, 50)
        ]
        for pending in pendings:
            await pending.wait()
        assert [r.payload for r in await store.retained()] == [b"49"]


async def test_retained_messages_survive_closing_and_reopening(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await retain(store, "a/b", b"x", "m1")
    async with Store.open(tmp_path) as store:
        assert [r.topic for r in await store.retained()] == ["a/b"]


#: What topiary wrote as schema version 1 (before retained messages).
V1_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)",
    "CREATE TABLE messages (rowid INTEGER PRIMARY KEY, msg_id TEXT NOT NULL, topic TEXT NOT NULL,"
    " payload BLOB NOT NULL, headers BLOB NULL, stored_at REAL NOT NULL, refs INTEGER NOT NULL)",
    "CREATE INDEX messages_unreferenced ON messages (stored_at) WHERE refs <= 0",
    "CREATE TABLE sessions (client_id TEXT PRIMARY KEY, grp TEXT NULL, last_ack INTEGER NOT NULL,"
    " next_seq INTEGER NOT NULL, created_at REAL NOT NULL)",
    "CREATE TABLE filters (client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE"
    " CASCADE, filter TEXT NOT NULL, dialect TEXT NOT NULL, PRIMARY KEY (client_id, filter,"
    " dialect))",
    "CREATE TABLE deliveries (client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE"
    " CASCADE, seq INTEGER NOT NULL, message INTEGER NOT NULL, PRIMARY KEY (client_id, seq))"
    " WITHOUT ROWID",
    "CREATE TABLE published (msg_id TEXT PRIMARY KEY, at REAL NOT NULL)",
    "INSERT INTO meta (key, value) VALUES ('schema_version', 1)",
    "INSERT INTO sessions VALUES ('c', NULL, 0, 2, 0.0)",
    "INSERT INTO messages VALUES (1, 'm1', 't/1', x'78', NULL, 0.0, 1)",
    "INSERT INTO deliveries VALUES ('c', 1, 1)",
)


async def test_a_version_1_file_is_migrated_and_keeps_its_sessions(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    with conn:
        for statement in V1_SCHEMA:
            conn.execute(statement)
    conn.close()
    async with Store.open(tmp_path) as store:
        assert [(m.seq, m.payload, m.retained) for m in await store.pending("c", 0, 10)] == [
            (1, b"x", False)
        ]
        await retain(store, "a", b"x", "m2")
        assert len(await store.retained()) == 1
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == SCHEMA_VERSION


async def test_a_stored_copy_of_a_retained_message_is_flagged_when_read_back(
    tmp_path: Path,
) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("c", None)
        pendings = [
            await store.begin_append(
                msg_id=f"m{seq}",
                topic="a",
                payload=b"x",
                headers=None,
                deliveries=[("c", seq)],
                from_retained=seq % 2 == 0,
            )
            for seq in (1, 2, 3, 4)
        ]
        for pending in pendings:
            await pending.wait()
        flags = [(m.seq, m.retained) for m in await store.pending("c", 0, 10)]
    assert flags == [(1, False), (2, True), (3, False), (4, True)]


def test_the_one_at_a_time_append_flags_copies_and_retains_as_the_batched_one(
    tmp_path: Path,
) -> None:
    """``SqliteBackend.append`` (a batch run again one operation at a time) does what
    ``_append_run`` does."""
    backend = SqliteBackend.open(tmp_path / DB_FILENAME, durable=False)
    try:
        backend.run(partial(SqliteBackend.create_session, client_id="c", group=None))
        for seq, retain, copy in ((1, True, False), (2, False, True)):
            backend.run(
                partial(
                    SqliteBackend.append,
                    msg_id=f"m{seq}",
                    topic="a",
                    payload=b"x",
                    headers=None,
                    deliveries=[("c", seq)],
                    publisher_msg_id=None,
                    retain=retain,
                    from_retained=copy,
                )
            )
        assert [m.retained for m in backend.pending("c", 0, 10)] == [False, True]
        assert [r.msg_id for r in backend.retained()] == ["m1"]
    finally:
        backend.close()
