"""A disk that refuses the store's writes: the confirmed publishes it hit are refused with
a clear error (native STORE_FULL, MQTT 5.0 0x97, 3.1.1 a closed connection), never
acknowledged, while the broker serves everyone else, and they succeed again once the disk
takes writes.

The disk is "full" here through SQLite's own limit on the database's pages
(``PRAGMA max_page_count``): past it SQLite answers SQLITE_FULL, "database or disk is
full", as it does for ENOSPC; no root, no special filesystem. The hot-spare pair with a
really full disk (a file size limit on a broker process) is tests/test_ha_disk_full.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, connect
from broker.mqtt.packets import ConnAck, PubAck, Publish
from broker.store import Store, StoreError, StoreFull
from broker.store.records import write_refused
from tests.mqttkit import Running, broker_in_thread
from tests.mqttraw import Closed, Raw
from tests.streams import quiet, take

BIG = b"x" * 64_000  # more than a page: every one needs new pages
TRIES = 200  # appends until the database is past its page limit (bounded)


async def _cap(store: Store, lift: bool = False) -> None:
    """Cap the database at its current number of pages, or lift the cap."""
    pages = "4294967294" if lift else "1"  # a cap below the size is raised to the size

    def run(backend: object) -> None:
        backend.conn.execute(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]

    await store.read(run)


def test_sqlite_errors_of_a_refused_write_are_told_apart_from_other_errors() -> None:
    def error(code: int) -> sqlite3.Error:
        exc = sqlite3.OperationalError("...")
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
        return exc

    for code in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_WRITE, sqlite3.SQLITE_IOERR_FSYNC):
        assert write_refused(error(code))
        wrapped = StoreError("not stored")
        wrapped.__cause__ = error(code)
        assert write_refused(wrapped)  # through the chain of causes
    for code in (sqlite3.SQLITE_ERROR, sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_IOERR_READ):
        assert not write_refused(error(code))
    assert not write_refused(ValueError("no sqlite error")) and not write_refused(None)


async def test_a_batch_the_disk_refuses_fails_whole_with_store_full_and_the_store_recovers(
    tmp_path: Path,
) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("s", None)
        await _cap(store)
        refused = None
        for seq in range(1, TRIES):
            try:
                await store.append(
                    msg_id=f"m{seq}", topic="t", payload=BIG, headers=None, deliveries=[("s", seq)]
                )
            except StoreFull as exc:
                refused = (seq, exc)
                break
        assert refused is not None, f"the capped store took {TRIES} appends"
        seq, exc = refused
        assert "database or disk is full" in str(exc)
        assert [m.seq for m in await store.pending("s", 0, TRIES)] == list(range(1, seq))
        await _cap(store, lift=True)  # space freed: the same append is taken
        await store.append(
            msg_id=f"m{seq}", topic="t", payload=BIG, headers=None, deliveries=[("s", seq)]
        )
        assert [m.seq for m in await store.pending("s", 0, TRIES)] == list(range(1, seq + 1))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Running]:
    with broker_in_thread(data_dir=str(tmp_path)) as running:
        yield running


def _store(running: Running) -> Store:
    store = running.server.broker.store
    assert store is not None
    return store


async def _keep(address: tuple[str, int]) -> None:
    """A durable session on ``f/>``: every publish there must be stored to be confirmed."""
    async with connect(address, client_id="keeper", durable=True) as c:
        async with c.subscribe("f/>"):
            await c.ping()


async def _kept(address: tuple[str, int], count: int) -> list[bytes]:
    """The ``count`` messages the durable session holds, and that there are no more."""
    async with connect(address, client_id="keeper", durable=True) as c:
        async with c.subscribe("f/>") as sub:
            got = [message.payload for message in await take(sub, count)]
            assert await quiet(sub), "more messages than were confirmed"
            return got


def test_a_confirmed_publish_the_disk_refuses_gets_store_full_and_the_broker_serves_the_rest(
    broker: Running,
) -> None:
    store = _store(broker)
    address = broker.native

    async def main() -> None:
        await _keep(address)
        await trio.to_thread.run_sync(broker.run, _cap, store)
        async with connect(address) as p, connect(address) as other:
            taken = 0
            with pytest.raises(BrokerError) as refused:
                for taken in range(TRIES):  # (taken: how many before the refusal)
                    await p.publish("f/1", BIG + str(taken).encode(), confirm=True)
            assert refused.value.code == "STORE_FULL"
            assert "database or disk is full" in refused.value.text
            await p.ping()  # one request refused: the connection goes on
            async with other.subscribe("g/>") as sub:  # the others are served
                await other.publish("g/1", b"live", confirm=True)
                assert (await sub.get()).payload == b"live"
            stats = await other.stats()
            assert stats["store_full"] >= 1 and stats["store_errors"] >= stats["store_full"]
            await trio.to_thread.run_sync(broker.run, partial(_cap, store, lift=True))
            await p.publish("f/1", b"after", confirm=True)  # space again: taken
        kept = await _kept(address, taken + 1)
        assert kept == [BIG + str(i).encode() for i in range(taken)] + [b"after"]

    trio.run(main)


def _fill_mqtt(raw: Raw, broker: Running) -> PubAck | None:
    """Cap the store, then QoS 1 PUBLISHes to ``f/1`` until one is not acknowledged: its
    refusal (5.0), or None when the connection was closed instead (3.1.1)."""
    broker.run(_cap, _store(broker))
    for packet_id in range(1, TRIES):
        raw.send(Publish("f/1", BIG, qos=1, packet_id=packet_id))
        try:
            answer = raw.expect()
        except (Closed, ConnectionResetError):
            return None
        assert isinstance(answer, PubAck) and answer.packet_id == packet_id, answer
        if answer.reason_code != 0:
            return answer
    raise AssertionError(f"the capped store took {TRIES} publishes")


def test_mqtt_5_gets_puback_0x97_quota_exceeded_with_the_reason_when_the_disk_refuses(
    broker: Running,
) -> None:
    trio.run(_keep, broker.native)
    with Raw(broker.mqtt_port, version=5) as raw:
        connack = raw.connect("full5")
        assert isinstance(connack, ConnAck) and connack.reason_code == 0
        refused = _fill_mqtt(raw, broker)
        assert refused is not None and refused.reason_code == 0x97
        assert "database or disk is full" in (refused.properties.reason_string or "")
        broker.run(partial(_cap, _store(broker), lift=True))
        raw.send(Publish("f/1", b"after", qos=1, packet_id=TRIES + 1))
        answer = raw.expect()  # the same connection, space again: taken
        assert isinstance(answer, PubAck) and answer.reason_code == 0


def test_mqtt_3_1_1_is_closed_rather_than_acknowledged_when_the_disk_refuses(
    broker: Running,
) -> None:
    trio.run(_keep, broker.native)
    with Raw(broker.mqtt_port, version=4) as raw:
        raw.connect("full4")
        assert _fill_mqtt(raw, broker) is None  # no PUBACK: closed, the client sends it again
    broker.run(partial(_cap, _store(broker), lift=True))
    with Raw(broker.mqtt_port, version=4) as raw:
        raw.connect("full4")
        raw.send(Publish("f/1", b"again", qos=1, packet_id=1))
        answer = raw.expect()
        assert isinstance(answer, PubAck) and answer.packet_id == 1
