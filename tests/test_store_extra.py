"""What the store keeps beyond topic, payload, headers and id (schema 3): a message's extra blob
(QoS, MQTT properties, expiry: ``broker.core.extra``) and the options of a session's filters."""

from __future__ import annotations

import sqlite3
import time
from functools import partial
from pathlib import Path

import msgpack
import pytest
import structlog
import trio
import trio.testing

import routing
from broker.core import Broker
from broker.core.extra import apply_extra, pack_extra
from broker.core.message import Message
from broker.store import DB_FILENAME, SCHEMA_VERSION, RetainedMessage, Store, StoredMessage
from broker.store.sqlite import SqliteBackend

EXTRA = msgpack.packb({"q": 2, "p": b"\x03\x00\x04text"})


def raw_rows(data_dir: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(data_dir / DB_FILENAME)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


# -- the store keeps the blob as it is ----------------------------------------------------------


async def test_an_extra_blob_comes_back_with_the_pending_delivery(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("c", None)
        await store.append(
            msg_id="m1", topic="t", payload=b"x", headers=None, deliveries=[("c", 1)], extra=EXTRA
        )
        handle = store.append_nowait("m2", "t", b"y", None, (("c", 2),), None, extra=b"\x80")
        await handle.wait()
        pending = await store.pending("c", 0, 10)
    assert [(m.msg_id, m.extra) for m in pending] == [("m1", EXTRA), ("m2", b"\x80")]


def test_the_one_at_a_time_append_stores_the_extra_blob_as_the_batched_one(tmp_path: Path) -> None:
    backend = SqliteBackend.open(tmp_path / DB_FILENAME, durable=False)
    try:
        backend.run(partial(SqliteBackend.create_session, client_id="c", group=None))
        backend.run(
            partial(
                SqliteBackend.append,
                msg_id="m1",
                topic="a",
                payload=b"x",
                headers=None,
                deliveries=[("c", 1)],
                publisher_msg_id=None,
                retain=True,
                extra=EXTRA,
            )
        )
        assert [m.extra for m in backend.pending("c", 0, 10)] == [EXTRA]
        assert [r.extra for r in backend.retained()] == [EXTRA]
    finally:
        backend.close()


async def test_a_retained_message_keeps_its_extra_blob_and_a_new_one_replaces_it(
    tmp_path: Path,
) -> None:
    async with Store.open(tmp_path) as store:
        await store.append(
            msg_id="m1", topic="a", payload=b"x", headers=None, deliveries=[], retain=True,
            extra=EXTRA,
        )  # fmt: skip
        assert await store.retained() == [RetainedMessage("a", "m1", b"x", None, EXTRA)]
        await store.append(
            msg_id="m2", topic="a", payload=b"y", headers=None, deliveries=[], retain=True
        )
        assert await store.retained() == [RetainedMessage("a", "m2", b"y", None, None)]


async def test_no_extra_is_stored_as_null(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("c", None)
        await store.append(
            msg_id="m1", topic="a", payload=b"x", headers=None, deliveries=[("c", 1)], retain=True
        )
        (stored,) = await store.pending("c", 0, 10)
        assert stored == StoredMessage(1, "m1", "a", b"x", None)
    assert raw_rows(tmp_path, "SELECT extra FROM messages") == [(None,)]
    assert raw_rows(tmp_path, "SELECT extra FROM retained") == [(None,)]


# -- filter options -----------------------------------------------------------------------------


async def test_filter_options_come_back_and_a_second_add_filter_replaces_them(
    tmp_path: Path,
) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("c", None)
        await store.add_filter("c", "a/+", "mqtt", b"\x01")
        await store.add_filter("c", "b/>", "native")
        await store.add_filter("c", "x/#", "mqtt", b"\x02")
        await store.add_filter("c", "a/+", "mqtt", b"\x11")  # replaces
        await store.add_filter("c", "x/#", "mqtt")  # None clears
    async with Store.open(tmp_path) as store:
        record = await store.session("c")
        (listed,) = await store.sessions()
    assert record is not None
    assert record.filters == (("a/+", "mqtt"), ("b/>", "native"), ("x/#", "mqtt"))
    assert record.filter_options == {("a/+", "mqtt"): b"\x11"}
    assert listed == record


async def test_the_registry_keeps_restored_filter_options_by_client_id(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("c", None)
        await store.create_session("plain", None)
        await store.add_filter("c", "a/+", "mqtt", b"\x01")
        await store.add_filter("plain", "a/>", "native")
    async with Store.open(tmp_path) as store:
        broker = Broker(store=store)
        assert await broker.load() == 2
    assert broker.registry.filter_options == {"c": {("a/+", "mqtt"): b"\x01"}}
    assert set(broker.registry.durable) == {"c", "plain"}


# -- migration ----------------------------------------------------------------------------------

#: What topiary wrote as schema version 2 (retained messages, no extra blobs nor options).
V2_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)",
    "CREATE TABLE messages (rowid INTEGER PRIMARY KEY, msg_id TEXT NOT NULL, topic TEXT NOT NULL,"
    " payload BLOB NOT NULL, headers BLOB NULL, stored_at REAL NOT NULL, refs INTEGER NOT NULL,"
    " retained INTEGER NOT NULL DEFAULT 0)",
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
    "CREATE TABLE retained (topic TEXT PRIMARY KEY, msg_id TEXT NOT NULL, payload BLOB NOT NULL,"
    " headers BLOB NULL)",
    "INSERT INTO meta (key, value) VALUES ('schema_version', 2)",
    "INSERT INTO sessions VALUES ('c', NULL, 0, 3, 0.0)",
    "INSERT INTO filters VALUES ('c', 'a/#', 'mqtt')",
    "INSERT INTO messages VALUES (1, 'm1', 'a/1', x'78', NULL, 0.0, 1, 0)",
    "INSERT INTO messages VALUES (2, 'm2', 'a/2', x'79', NULL, 0.0, 1, 1)",
    "INSERT INTO deliveries VALUES ('c', 1, 1)",
    "INSERT INTO deliveries VALUES ('c', 2, 2)",
    "INSERT INTO retained VALUES ('a/2', 'm2', x'79', NULL)",
)


async def test_a_version_2_file_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    with conn:
        for statement in V2_SCHEMA:
            conn.execute(statement)
    conn.close()
    async with Store.open(tmp_path) as store:
        assert await store.pending("c", 0, 10) == [
            StoredMessage(1, "m1", "a/1", b"x", None),
            StoredMessage(2, "m2", "a/2", b"y", None, retained=True),
        ]
        assert await store.retained() == [RetainedMessage("a/2", "m2", b"y", None)]
        record = await store.session("c")
        assert record is not None
        assert (record.filters, record.filter_options, record.next_seq) == (
            (("a/#", "mqtt"),),
            {},
            3,
        )
        await store.add_filter("c", "a/#", "mqtt", b"\x01")  # the new columns are usable
        await store.append(
            msg_id="m3", topic="a/3", payload=b"z", headers=None, deliveries=[("c", 3)],
            retain=True, extra=EXTRA,
        )  # fmt: skip
        assert [m.extra for m in await store.pending("c", 2, 10)] == [EXTRA]
    (version,) = raw_rows(tmp_path, "SELECT value FROM meta WHERE key = 'schema_version'")[0]
    assert version == SCHEMA_VERSION


# -- packing and applying -----------------------------------------------------------------------


async def test_a_native_message_packs_to_nothing() -> None:
    assert pack_extra(Message("t", b"x", None, "m")) is None
    message = Message("t", b"x", None, "m")
    apply_extra(message, None)
    assert (message.qos, message.mqtt_props, message.expires_at) == (1, None, 0.0)


async def test_qos_and_properties_round_trip() -> None:
    original = Message("t", b"x", None, "m", qos=0)
    original.mqtt_props = b"\x03\x00\x04text"
    restored = Message("t", b"x", None, "m")
    apply_extra(restored, pack_extra(original))
    assert (restored.qos, restored.mqtt_props, restored.expires_at) == (0, b"\x03\x00\x04text", 0.0)


@pytest.mark.parametrize(
    "blob",
    [
        b"\xc1",  # never valid msgpack
        b"\x93\x01",  # truncated
        msgpack.packb([1, 2]),  # not a map
        msgpack.packb({"q": 7}),  # no such QoS
        msgpack.packb({"q": 0, "p": "text"}),  # properties are bytes
        msgpack.packb({"e": "soon"}),
    ],
)
async def test_an_unreadable_extra_blob_is_ignored_with_a_warning(blob: bytes) -> None:
    message = Message("t", b"x", None, "m1")
    with structlog.testing.capture_logs() as logs:
        apply_extra(message, blob)
    assert (message.qos, message.mqtt_props, message.expires_at) == (1, None, 0.0)
    (line,) = logs
    assert (line["log_level"], line["msg_id"]) == ("warning", "m1")


async def test_an_expired_message_reads_back_as_expired() -> None:
    message = Message("t", b"x", None, "m")
    apply_extra(message, msgpack.packb({"e": time.time() - 10}))
    assert message.expires_at != 0.0
    assert trio.current_time() >= message.expires_at


def test_an_expiry_survives_a_restart_as_wall_clock_time(tmp_path: Path) -> None:
    """Two trio runs with clocks 10 000 s apart: what was left is what is left (less the
    wall-clock time in between, well under the bound)."""

    async def before() -> None:
        message = Message("t", b"x", None, "m1", qos=0)
        message.expires_at = trio.current_time() + 60.0
        async with Store.open(tmp_path) as store:
            await store.create_session("c", None)
            await store.append(
                msg_id="m1", topic="t", payload=b"x", headers=None, deliveries=[("c", 1)],
                retain=True, extra=pack_extra(message),
            )  # fmt: skip

    async def after() -> tuple[float, float]:
        async with Store.open(tmp_path) as store:
            (stored,) = await store.pending("c", 0, 10)
            (kept,) = await store.retained()
        left = []
        for blob in (stored.extra, kept.extra):
            message = Message("t", b"x", None, "m1")
            apply_extra(message, blob)
            assert message.qos == 0
            left.append(message.expires_at - trio.current_time())
        return left[0], left[1]

    trio.run(before, clock=trio.testing.MockClock())
    later = trio.testing.MockClock()
    later.jump(10_000.0)
    for left in trio.run(after, clock=later):
        assert 50.0 < left <= 60.0


# -- the broker stores and restores them --------------------------------------------------------


async def test_the_broker_stores_and_restores_qos_properties_and_expiry(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        broker = Broker(store=store)
        session, _ = await broker.open_durable("c")
        broker.subscribe(session, routing.parse_filter("a/#", "mqtt"))
        message = Message("a/1", b"x", None, "m1", qos=2, retain=True)
        message.mqtt_props = b"props"
        message.expires_at = trio.current_time() + 60.0
        work = broker.publish_message(message)
        assert work is not None
        handle = broker.persist_nowait(work)
        assert handle is not None
        await handle.wait()
        native = broker.publish("a/2", b"y")
        assert native is not None
        await (await broker.persist(native)).wait()
    async with Store.open(tmp_path) as store:
        broker = Broker(store=store)
        await broker.load()
        kept = broker.retained.get("a/1")
        assert kept is not None
        assert (kept.qos, kept.mqtt_props, kept.retain) == (2, b"props", True)
        assert 50.0 < kept.expires_at - trio.current_time() <= 60.0
        first, second = await store.pending("c", 0, 10)
    assert (first.msg_id, second.msg_id, second.extra) == ("m1", native.message.msg_id, None)
    replayed = Message(first.topic, first.payload, first.headers, first.msg_id)
    apply_extra(replayed, first.extra)
    assert (replayed.qos, replayed.mqtt_props) == (2, b"props")


async def test_a_corrupt_retained_blob_does_not_stop_the_broker(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.append(
            msg_id="m1", topic="a", payload=b"x", headers=None, deliveries=[], retain=True,
            extra=b"\xc1",
        )  # fmt: skip
    async with Store.open(tmp_path) as store:
        broker = Broker(store=store)
        with structlog.testing.capture_logs() as logs:
            await broker.load()
    kept = broker.retained.get("a")
    assert kept is not None
    assert (kept.payload, kept.qos, kept.mqtt_props) == (b"x", 1, None)
    assert [line["log_level"] for line in logs] == ["warning"]


async def test_a_restored_group_queue_keeps_qos_and_properties(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        group, _ = await Broker(store=store).open_group("g")
        await store.append(
            msg_id="m1", topic="a", payload=b"x", headers=None,
            deliveries=[(group.client_id, 1)], extra=EXTRA,
        )  # fmt: skip
    async with Store.open(tmp_path) as store:
        broker = Broker(store=store)
        await broker.load()
    restored = broker.registry.groups["g"]
    [(seq, message, _sub)] = list(restored.queue)
    assert (seq, message.qos, message.mqtt_props) == (1, 2, b"\x03\x00\x04text")
