"""The store's retained table: written with an append, in its transaction; read at start-up."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from broker.store import DB_FILENAME, SCHEMA_VERSION, RetainedMessage, Store


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


async def test_a_version_1_file_is_migrated_and_keeps_its_sessions(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("c", None)
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    with conn:
        conn.execute("DROP TABLE retained")
        conn.execute("UPDATE meta SET value = 1 WHERE key = 'schema_version'")
    conn.close()
    async with Store.open(tmp_path) as store:
        assert await store.session("c") is not None
        await retain(store, "a", b"x", "m1")
        assert len(await store.retained()) == 1
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == SCHEMA_VERSION == 2
