"""The replication link in-process: a real primary store, a real standby store, real TCP.

Each test ends by comparing the two SQLite files row by row (``tests.hapair.dump``).
"""

from __future__ import annotations

import random
import sqlite3
from functools import partial
from pathlib import Path

import msgpack
import pytest
import trio
import trio.testing

from broker.ha.journal import JOURNAL_FILENAME, Journal
from broker.ha.records import Position, write_position
from broker.ha.shipping import Shipper
from broker.store import Store, StoreError
from broker.store.schema import DB_FILENAME
from broker.store.sqlite import SqliteBackend
from tests.hapair import Pair, dump, pair

PUBLISHERS = 6
PER_PUBLISHER = 40


async def _load(store: Store, tag: str, count: int = PER_PUBLISHER) -> None:
    """Sessions, filters, confirmed appends from several publishers, acks, retained, drops."""
    for name in ("a", "b", "c"):
        await store.create_session(f"{tag}-{name}", None, owner=f"user:{name}", cert="")
        await store.add_filter(f"{tag}-{name}", "t/#", "native", b"opts")
    seqs = {name: 0 for name in ("a", "b", "c")}

    async def publisher(number: int) -> None:
        rng = random.Random(number)
        for i in range(count):
            targets = rng.sample(sorted(seqs), rng.randint(0, 3))
            deliveries = []
            for name in targets:  # no await between assigning and queueing: seq order
                seqs[name] += 1
                deliveries.append((f"{tag}-{name}", seqs[name]))
            await store.append(
                msg_id=f"{tag}-{number}-{i}",
                topic=f"t/{number}",
                payload=b"x" * rng.randint(0, 300),
                headers={"n": str(i)} if i % 3 == 0 else None,
                deliveries=deliveries,
                publisher_msg_id=f"{tag}-p{number}-{i % (count - 3)}",  # a few duplicates
                retain=i % 7 == 0,
            )

    async with trio.open_nursery() as nursery:
        for number in range(PUBLISHERS):
            nursery.start_soon(publisher, number)
    await store.ack(f"{tag}-a", seqs["a"] // 2)
    await store.ack_one(f"{tag}-b", 1)
    await store.trim(f"{tag}-b", 5)
    await store.set_filters(f"{tag}-c", [("u/+", "native"), ("v", "mqtt")])
    await store.drop_session(f"{tag}-c")


async def _same(p: Pair) -> None:
    await p.caught_up()
    primary, standby = dump(p.primary_dir), dump(p.standby_dir)
    assert primary["deliveries"], "the load stored nothing"
    for table in primary:
        assert standby[table] == primary[table], table


async def test_the_standby_store_equals_the_primary_after_confirmed_load(tmp_path: Path) -> None:
    async with pair(tmp_path) as p:
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "s")
        await _same(p)
        assert p.shipper.counters.confirms_waited > 0


async def test_with_sync_a_confirmed_append_is_on_the_standby_when_it_returns(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        follower = await p.start_standby()
        await p.in_sync()
        await p.store.create_session("c", None)
        for i in range(20):
            await p.store.append(
                msg_id=f"m{i}", topic="t", payload=b"p", headers=None, deliveries=[("c", i + 1)]
            )
            assert follower.position == p.shipper.position  # applied and fsynced there too
        assert p.shipper.counters.confirms_alone == 0


async def test_without_sync_the_standby_follows_after_the_confirmation(tmp_path: Path) -> None:
    async with pair(tmp_path, sync=False) as p:
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "n", count=10)
        await _same(p)
        assert p.shipper.counters.confirms_waited == 0


async def test_a_new_standby_of_a_primary_with_data_starts_from_a_snapshot(tmp_path: Path) -> None:
    (tmp_path / "primary").mkdir()
    async with Store.open(tmp_path / "primary") as store:  # stored before it shipped anything
        await _load(store, "before", count=10)
    async with pair(tmp_path) as p:
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "after", count=10)
        await _same(p)
        assert p.shipper.counters.snapshots_sent == 1


async def test_a_restarted_standby_continues_from_its_position_without_a_snapshot(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "one", count=10)
        snapshots = p.shipper.counters.snapshots_sent  # the first: the primary's origin
        await p.stop_standby()
        await _load(p.store, "two", count=10)  # confirmed alone meanwhile
        assert p.shipper.counters.confirms_alone > 0
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "three", count=10)
        await _same(p)
        assert p.shipper.counters.snapshots_sent == snapshots


async def test_a_standby_behind_the_backlog_gets_a_snapshot(tmp_path: Path) -> None:
    async with pair(tmp_path, backlog_bytes=2_000) as p:
        await p.start_standby()
        await p.in_sync()
        await p.store.create_session("first", None)
        await p.caught_up()
        snapshots = p.shipper.counters.snapshots_sent
        await p.stop_standby()
        await _load(p.store, "gap", count=20)
        await p.start_standby()
        await p.in_sync()
        await _same(p)
        assert p.shipper.counters.snapshots_sent == snapshots + 1


async def test_a_tampered_standby_position_is_detected_and_rebuilt(tmp_path: Path) -> None:
    async with pair(tmp_path) as p:
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "x", count=10)
        await p.caught_up()
        snapshots = p.shipper.counters.snapshots_sent
        await p.stop_standby()
        conn = sqlite3.connect(p.standby_dir / DB_FILENAME)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'ha_digest'", (b"\x01" * 16,))
        conn.execute("DELETE FROM deliveries WHERE seq = 1")  # and the data differs
        conn.commit()
        conn.close()
        await p.start_standby()
        await p.in_sync()
        await _same(p)
        assert p.shipper.counters.snapshots_sent == snapshots + 1


async def test_a_damaged_standby_file_is_moved_aside_and_rebuilt(tmp_path: Path) -> None:
    async with pair(tmp_path) as p:
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "d", count=10)
        await p.caught_up()
        await p.stop_standby()
        path = p.standby_dir / DB_FILENAME
        data = bytearray(path.read_bytes())
        data[4096:8192] = b"\xa5" * 4096  # a page of garbage
        path.write_bytes(bytes(data))
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        follower = await p.start_standby()
        await p.in_sync()
        await _same(p)
        assert follower.counters.damaged_rebuilt == 1
        assert list(p.standby_dir.glob(f"{DB_FILENAME}.damaged-*"))


async def test_a_standby_without_the_secret_is_refused(tmp_path: Path) -> None:
    async with pair(tmp_path) as p:
        await p.store.create_session("c", None)
        follower = await p.start_standby(secret=b"wrong")
        with trio.fail_after(10):
            while p.shipper.counters.auth_failures == 0:
                await trio.sleep(0.01)
        assert follower.position.seq == 0
        assert not p.shipper.in_sync


async def test_a_standby_of_another_link_version_is_refused_before_any_record(
    tmp_path: Path,
) -> None:
    """Version 1 had another append layout and chain: its HELLO gets ERROR, never records."""
    async with pair(tmp_path) as p:
        await p.store.create_session("c", None)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", p.port)
            body = msgpack.packb(["HELLO", 1, bytes(16)], use_bin_type=True)
            await stream.send_all(len(body).to_bytes(4, "big") + body)
            data = b""
            while chunk := await stream.receive_some(4096):  # the primary closes after ERROR
                data += chunk
            await stream.aclose()
        answer = msgpack.unpackb(data[4:], raw=False)
        assert answer[0] == "ERROR" and "unsupported replication version 1" in answer[1]
        assert p.shipper.counters.standby_connections == 0
        assert p.shipper.counters.records_sent == 0


async def test_the_primary_reports_its_lag_and_the_standby_in_its_statistics(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        follower = await p.start_standby()
        await p.in_sync()
        await p.store.create_session("c", None)
        await p.caught_up()
        stats = p.store.replication_statistics()
        assert stats is not None
        assert stats["in_sync"] == 1 and stats["lag_records"] == 0 and stats["lag_bytes"] == 0
        assert stats["seq"] == follower.position.seq == stats["standby_acked_seq"]
        assert stats["term"] == 1 and stats["fenced"] == 0
        assert stats["standby_connections"] == 1 and stats["records"] >= 1


async def test_a_standby_restarted_under_load_catches_up(tmp_path: Path) -> None:
    async with pair(tmp_path) as p:
        await p.start_standby()
        await p.in_sync()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_load, p.store, "busy", 60)
            await trio.testing.wait_all_tasks_blocked()  # the load has begun
            await p.stop_standby()
            await _load(p.store, "away", 5)  # written while it is away (the load may be done)
            await p.start_standby()
        assert p.shipper.counters.confirms_alone > 0  # the load went on while it was away
        await p.in_sync()
        await _same(p)


async def test_a_primary_that_meets_a_standby_of_a_newer_term_refuses_writes(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        newer = SqliteBackend.open(p.standby_dir / DB_FILENAME)
        newer.run(partial(write_position, Position(5, 1, b"\x02" * 16)))
        newer.close()
        await p.start_standby()
        with trio.fail_after(10):
            while p.shipper.fenced is None:
                await trio.sleep(0.01)
        with pytest.raises(StoreError, match="replaced"):
            await p.store.create_session("late", None)
        assert await p.store.session("late") is None
        assert p.store.replication_statistics()["fenced"] == 1  # type: ignore[index]


async def _journaled_but_not_applied(p: Pair) -> list[tuple[bytes, bytes]]:
    """Stop the standby in sync, load the primary alone, and write those records into the
    standby's journal as the standby would have before its ACKs: what a standby killed
    before its applier ran holds."""
    await p.start_standby()
    await p.in_sync()
    await _load(p.store, "one", count=5)
    await p.caught_up()
    await p.stop_standby()
    await _load(p.store, "two", count=5)
    backlog = p.shipper._backlog
    since = p.follower.position.seq if p.follower is not None else 0
    records = [(body, position.digest) for position, body in backlog if position.seq > since]
    assert records
    journal = Journal(p.standby_dir)
    journal.append(records, empty_first=False)
    journal.close()
    return records


async def test_records_journaled_but_not_applied_are_applied_when_the_standby_is_promoted(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        await _journaled_but_not_applied(p)
        primary = dump(p.primary_dir)
        async with Store.open(p.standby_dir) as promoted:  # as _serve opens it, then ships
            shipper = Shipper(term=2, secret=b"s")
            await shipper.attach(promoted)
            assert shipper.position == p.shipper.position
        assert dump(p.standby_dir) == primary
        async with Store.open(p.standby_dir) as again:  # applied once: nothing left to apply
            await Shipper(term=2, secret=b"s").attach(again)
        assert dump(p.standby_dir) == primary


async def test_a_torn_journal_frame_ends_the_replay_and_the_standby_catches_up(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        records = await _journaled_but_not_applied(p)
        with (p.standby_dir / JOURNAL_FILENAME).open("ab") as file:
            file.write(len(records[0][0]).to_bytes(4, "big") + records[0][0][:10])  # torn
        follower = await p.start_standby()  # replays the journal, then follows
        await p.in_sync()
        assert follower.counters.snapshots_installed == 0  # continued from the journal
        await _load(p.store, "three", count=5)
        await _same(p)
