"""Retained messages over real sockets: kept per topic, sent to new subscriptions after SUBACK.

To show that a subscriber got nothing (more), each test publishes a live marker after the
subscription and reads up to it: whatever the broker sent for the subscription came first.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

import routing
from broker.client import connect
from broker.core import Broker
from broker.store import DB_FILENAME
from tests.conftest import running_broker
from tests.streams import take
from tests.wire import RawClient, frame

MARKER = b"-- marker --"


async def retain(address, topic: str, payload: bytes | str) -> None:
    async with connect(address) as publisher:
        await publisher.publish(topic, payload, confirm=True, retain=True)


async def up_to_marker(sub, address, topic: str) -> list:
    """What ``sub`` gets before a live marker published on ``topic`` now."""
    async with connect(address) as publisher:
        await publisher.publish(topic, MARKER, confirm=True)
    got = []
    with trio.fail_after(10):
        while (message := await sub.get()).payload != MARKER:
            got.append(message)
    return got


def by_topic(messages: list) -> dict[str, bytes]:
    return {m.topic: m.payload for m in messages}


async def test_a_new_subscriber_gets_the_last_retained_message_of_each_matching_topic() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        for topic, payload in [("a/1", "old"), ("a/1", "new"), ("a/2", "x"), ("b/1", "no")]:
            await retain(address, topic, payload)
        async with connect(address) as c, c.subscribe("a/>") as sub:
            got = await up_to_marker(sub, address, "a/marker")
    assert by_topic(got) == {"a/1": b"new", "a/2": b"x"}
    assert all(m.retained for m in got) and len(got) == 2


async def test_a_live_subscriber_gets_a_retained_publish_as_an_ordinary_message() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        async with connect(address) as c, c.subscribe("a/>") as sub:
            await retain(address, "a/1", "live")
            (message,) = await take(sub, 1)
    assert (message.payload, message.retained) == (b"live", False)


async def test_an_empty_retained_payload_deletes_it_and_is_still_routed() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        await retain(address, "a/1", "kept")
        async with connect(address) as c, c.subscribe("a/>", retained=False) as live:
            await retain(address, "a/1", b"")
            (routed,) = await take(live, 1)
        async with connect(address) as c, c.subscribe("a/>") as sub:
            assert await up_to_marker(sub, address, "a/marker") == []
    assert (routed.payload, routed.retained) == (b"", False)


async def test_native_wildcards_find_retained_messages() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        for topic in ("s/ab/t", "s/b/t", "s/ab/u", "s/ax/t/deep"):
            await retain(address, topic, topic)
        async with connect(address) as c:
            async with c.subscribe("s/*/t") as sub:
                assert set(by_topic(await up_to_marker(sub, address, "s/m/t"))) == {
                    "s/ab/t",
                    "s/b/t",
                }
            async with c.subscribe("s/a*/>") as sub:
                assert set(by_topic(await up_to_marker(sub, address, "s/am/t"))) == {
                    "s/ab/t",
                    "s/ab/u",
                    "s/ax/t/deep",
                }


async def test_mqtt_wildcards_find_retained_messages() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        for topic in ("s", "s/a/t", "s/b/t", "s/a/u"):
            await retain(address, topic, topic)
        async with connect(address) as c:
            async with c.subscribe("s/+/t", dialect="mqtt") as sub:
                assert set(by_topic(await up_to_marker(sub, address, "s/m/t"))) == {
                    "s/a/t",
                    "s/b/t",
                }
            async with c.subscribe("s/#", dialect="mqtt") as sub:  # '#' matches "s" itself
                assert set(by_topic(await up_to_marker(sub, address, "s/m"))) == {
                    "s",
                    "s/a/t",
                    "s/b/t",
                    "s/a/u",
                }


async def test_first_level_wildcards_do_not_get_retained_system_topics() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        await retain(address, "$SYS/x", "sys")
        await retain(address, "a/x", "app")
        async with connect(address) as c:
            async with c.subscribe(">") as sub:
                assert set(by_topic(await up_to_marker(sub, address, "m"))) == {"a/x"}
            async with c.subscribe("#", dialect="mqtt") as sub:
                assert set(by_topic(await up_to_marker(sub, address, "m"))) == {"a/x"}
            async with c.subscribe("$SYS/>") as sub:
                assert set(by_topic(await up_to_marker(sub, address, "$SYS/m"))) == {"$SYS/x"}


async def test_a_sub_with_retained_false_gets_none() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        await retain(address, "a/1", "x")
        async with connect(address) as c, c.subscribe("a/>", retained=False) as sub:
            assert await up_to_marker(sub, address, "a/marker") == []


async def test_a_shared_group_gets_no_retained_messages(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await retain(address, "a/1", "x")
        async with connect(address, client_id="m1", group="g") as c, c.subscribe("a/>") as sub:
            got = await up_to_marker(sub, address, "a/marker")
    assert got == []


async def test_a_durable_session_gets_retained_messages_again_until_acked(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await retain(address, "a/1", "x")
        async with connect(address, client_id="d", durable=True) as c:
            async with c.subscribe("a/>") as sub:
                (first,) = await take(sub, 1)
                await c.ping()
        async with connect(address, client_id="d", durable=True) as c:
            async with c.subscribe("a/>", retained=False) as sub:  # none anew: the stored one
                again = await up_to_marker(sub, address, "a/marker")
    assert (first.payload, first.retained, first.seq) == (b"x", True, 1)
    assert [(m.payload, m.seq, m.id) for m in again] == [(b"x", 1, first.id)]


async def test_retained_messages_survive_a_restart(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await retain(address, "a/1", "old")
        await retain(address, "a/1", "kept")
        await retain(address, "a/2", "gone")
        await retain(address, "a/2", b"")
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address) as c, c.subscribe("a/>") as sub:
            got = await up_to_marker(sub, address, "a/marker")
    assert by_topic(got) == {"a/1": b"kept"}


async def test_a_confirmed_retained_publish_is_acked_once_committed(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await retain(address, "a/1", "x")  # returns with the PUBACK
        conn = sqlite3.connect(tmp_path / DB_FILENAME)  # a second reader sees commits only
        try:
            rows = conn.execute("SELECT topic, payload FROM retained").fetchall()
        finally:
            conn.close()
    assert rows == [("a/1", b"x")]


async def test_stats_count_retained_messages_bytes_and_sends() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        await retain(address, "a/1", "xyz")
        await retain(address, "a/2", "ab")
        async with connect(address) as c:
            async with c.subscribe("a/>") as sub:
                await up_to_marker(sub, address, "a/m")
            stats = await c.stats()
    assert (stats["retained_messages"], stats["retained_bytes"]) == (2, 5)
    assert stats["retained_sent"] == 2


def test_the_store_holds_its_own_message_objects_flagged_from_retained() -> None:
    """A live delivery's shared encoding never says 'retained': the store's copy is apart."""
    broker = Broker()
    assert broker.publish("a/1", b"x", retain=True) is None  # no store: nothing to persist
    (kept,) = broker.retained_matching(routing.parse_filter("a/>"))
    assert (kept.topic, kept.payload, kept.retain, kept.from_retained) == ("a/1", b"x", True, True)


async def test_pipelined_subs_each_get_their_retained_messages_after_their_subacks() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        await retain(address, "a/1", "x")
        await retain(address, "b/1", "y")
        raw = await RawClient.open(address)
        try:
            await raw.send(
                frame({"type": "SUB", "id": 1, "filter": "a/>"})
                + frame({"type": "SUB", "id": 2, "filter": "b/>"})
                + frame({"type": "SUB", "id": 3, "filter": "a/>", "retained": False})
            )
            with trio.fail_after(10):
                got = [await raw.read_frame() for _ in range(5)]
        finally:
            await raw.aclose()
    assert [f["type"] for f in got] == ["SUBACK", "SUBACK", "SUBACK", "MSG", "MSG"]
    msgs = {f["topic"]: (f["payload"], f["retained"]) for f in got[3:]}
    assert msgs == {"a/1": (b"x", True), "b/1": (b"y", True)}
