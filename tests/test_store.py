"""broker/store through its async API, on real SQLite files under tmp_path.

The SQL rules themselves are also checked against a model in tests/test_store_model.py; this
file covers what only the async store has (group commit, failures, shutdown, cancellation),
what the files look like on disk, and durability across a real SIGKILL.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio
import trio.testing

from broker.store import DB_FILENAME, SCHEMA_VERSION, Store, StoredMessage, StoreError
from broker.store.sqlite import SqliteBackend

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with Store.open(tmp_path) as opened:
        yield opened


def query(data_dir: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows from a second, short-lived connection to the store's file (WAL allows it)."""
    conn = sqlite3.connect(data_dir / DB_FILENAME)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def count(data_dir: Path, table: str) -> int:
    return query(data_dir, f"SELECT count(*) FROM {table}")[0][0]


async def append(
    store: Store,
    seq: int,
    *clients: str,
    payload: bytes | None = None,
    publisher_msg_id: str | None = None,
) -> bool:
    """Append message ``m<seq>`` with delivery seq ``seq`` for each of ``clients``."""
    return await store.append(
        msg_id=f"m{seq}",
        topic=f"t/{seq}",
        payload=payload if payload is not None else f"payload {seq}".encode(),
        headers={"n": str(seq)},
        deliveries=[(client, seq) for client in clients],
        publisher_msg_id=publisher_msg_id,
    )


async def seqs(store: Store, client_id: str) -> list[int]:
    return [m.seq for m in await store.pending(client_id, 0, 10_000)]


# -- the file ----------------------------------------------------------------------------------


async def test_open_creates_a_wal_database_with_the_schema_version(tmp_path: Path) -> None:
    async with Store.open(tmp_path / "new" / "dir"):
        pass
    data_dir = tmp_path / "new" / "dir"
    assert query(data_dir, "PRAGMA journal_mode") == [("wal",)]
    assert query(data_dir, "SELECT value FROM meta WHERE key = 'schema_version'") == [
        (SCHEMA_VERSION,)
    ]


async def test_data_survives_closing_and_reopening(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("a", "grp")
        await store.add_filter("a", "t/>", "native")
        await append(store, 1, "a")
    async with Store.open(tmp_path) as store:
        record = await store.session("a")
        assert record is not None
        assert (record.group, record.next_seq, record.filters) == ("grp", 2, (("t/>", "native"),))
        assert await seqs(store, "a") == [1]


async def test_newer_schema_version_raises_store_error_saying_newer(tmp_path: Path) -> None:
    async with Store.open(tmp_path):
        pass
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    with conn:
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,)
        )
    conn.close()
    with pytest.raises(StoreError, match="newer") as info:
        async with Store.open(tmp_path):
            pass
    assert str(tmp_path / DB_FILENAME) in str(info.value)


async def test_garbage_file_raises_a_one_line_store_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / DB_FILENAME).write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(StoreError) as info:
        async with Store.open(tmp_path):
            pass
    message = str(info.value)
    assert str(tmp_path / DB_FILENAME) in message
    assert "not a SQLite database" in message
    assert "\n" not in message
    # No sqlite3 traceback chained to it.
    assert info.value.__cause__ is None and info.value.__suppress_context__


async def test_truncated_database_raises_store_error(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    async with Store.open(good) as store:
        await store.create_session("a", None)
        for seq in range(1, 101):
            await append(store, seq, "a", payload=bytes(1000))
    bad.mkdir()
    shutil.copy(good / DB_FILENAME, bad / DB_FILENAME)
    os.truncate(bad / DB_FILENAME, (bad / DB_FILENAME).stat().st_size // 2)
    with pytest.raises(StoreError, match="damaged") as info:
        async with Store.open(bad):
            pass
    assert str(bad / DB_FILENAME) in str(info.value)


async def test_data_dir_that_cannot_be_created_raises_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="data directory"):
        async with Store.open(tmp_path / "file" / "sub"):
            pass


# -- sessions and filters ----------------------------------------------------------------------


async def test_create_session_is_idempotent_and_keeps_the_first_group(store: Store) -> None:
    first = await store.create_session("a", "g1")
    again = await store.create_session("a", "g2")
    assert first == again
    assert (first.client_id, first.group, first.last_ack, first.next_seq) == ("a", "g1", 0, 1)
    assert (first.filters, first.pending, first.pending_bytes) == ((), 0, 0)


async def test_filters_can_be_replaced_added_and_removed(store: Store) -> None:
    await store.create_session("a", None)
    await store.set_filters("a", [("x/>", "native"), ("y/#", "mqtt")])
    await store.add_filter("a", "z/*", "native")
    await store.add_filter("a", "z/*", "native")  # already there: no change
    await store.remove_filter("a", "x/>", "native")
    record = await store.session("a")
    assert record is not None and record.filters == (("y/#", "mqtt"), ("z/*", "native"))
    await store.set_filters("a", [("q", "native")])
    record = await store.session("a")
    assert record is not None and record.filters == (("q", "native"),)


async def test_filters_of_an_unknown_session_raise_store_error(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown session"):
        await store.add_filter("nobody", "x", "native")
    with pytest.raises(StoreError, match="unknown session"):
        await store.set_filters("nobody", [("x", "native")])


async def test_sessions_lists_every_session_with_its_pending_count_and_bytes(store: Store) -> None:
    await store.create_session("b", None)
    await store.create_session("a", "g")
    await store.add_filter("a", "t/>", "native")
    await append(store, 1, "a", "b", payload=b"12345")
    await append(store, 2, "a", payload=b"123")
    records = await store.sessions()
    assert [(r.client_id, r.pending, r.pending_bytes) for r in records] == [
        ("a", 2, 8),
        ("b", 1, 5),
    ]
    assert records[0].filters == (("t/>", "native"),)
    assert records[0] == await store.session("a")
    assert await store.session("nobody") is None


# -- append, pending, ack ----------------------------------------------------------------------


async def test_append_then_pending_returns_the_messages_in_seq_order(store: Store) -> None:
    await store.create_session("a", None)
    for seq in (3, 1, 2, 5, 4):  # committed in any order, read back in seq order
        assert await append(store, seq, "a")
    await store.append(
        msg_id="bare", topic="t/bare", payload=b"", headers=None, deliveries=[("a", 6)]
    )
    messages = await store.pending("a", 0, 100)
    assert [m.seq for m in messages] == [1, 2, 3, 4, 5, 6]
    assert messages[0] == StoredMessage(1, "m1", "t/1", b"payload 1", {"n": "1"})
    assert messages[-1] == StoredMessage(6, "bare", "t/bare", b"", None)
    assert [m.seq for m in await store.pending("a", 2, 2)] == [3, 4]
    assert await store.pending("nobody", 0, 10) == []


async def test_append_moves_next_seq_past_every_stored_seq(store: Store) -> None:
    await store.create_session("a", None)
    await append(store, 7, "a")
    await append(store, 3, "a")
    record = await store.session("a")
    assert record is not None and record.next_seq == 8


async def test_a_message_for_two_sessions_is_stored_once(tmp_path: Path, store: Store) -> None:
    await store.create_session("a", None)
    await store.create_session("b", None)
    await append(store, 1, "a", "b")
    assert query(tmp_path, "SELECT msg_id, refs FROM messages") == [("m1", 2)]
    assert count(tmp_path, "deliveries") == 2
    assert (await store.pending("a", 0, 10)) == (await store.pending("b", 0, 10))


async def test_ack_deletes_deliveries_and_the_message_once_no_session_needs_it(
    tmp_path: Path, store: Store
) -> None:
    await store.create_session("a", None)
    await store.create_session("b", None)
    await append(store, 1, "a", "b")
    await append(store, 2, "a")
    assert await store.ack("a", 2) == 2
    assert await seqs(store, "a") == []
    assert query(tmp_path, "SELECT msg_id, refs FROM messages") == [("m1", 1)]  # b needs it
    assert await store.ack("b", 1) == 1
    assert count(tmp_path, "messages") == 0
    assert count(tmp_path, "deliveries") == 0
    record = await store.session("a")
    assert record is not None and record.last_ack == 2


async def test_ack_removes_what_is_at_or_below_seq_and_keeps_next_seq_above_last_ack(
    store: Store,
) -> None:
    await store.create_session("a", None)
    for seq in (1, 2, 3):
        await append(store, seq, "a")
    assert await store.ack("a", 2) == 2
    assert await store.ack("a", 1) == 0  # below last_ack: nothing left, last_ack stays
    record = await store.session("a")
    assert record is not None and (record.last_ack, record.next_seq) == (2, 4)
    assert await store.ack("a", 10) == 1  # beyond next_seq: the broker's business
    record = await store.session("a")
    assert record is not None and (record.last_ack, record.next_seq) == (10, 11)


async def test_ack_on_an_unknown_session_raises_store_error(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown session 'nobody'"):
        await store.ack("nobody", 1)


async def test_ack_one_removes_exactly_that_delivery(tmp_path: Path, store: Store) -> None:
    await store.create_session("a", "group")
    for seq in (1, 2, 3):
        await append(store, seq, "a")
    assert await store.ack_one("a", 2) is True
    assert await store.ack_one("a", 2) is False
    assert await seqs(store, "a") == [1, 3]
    assert count(tmp_path, "messages") == 2
    record = await store.session("a")
    assert record is not None and record.last_ack == 0  # 1 is still pending


async def test_ack_one_of_the_lowest_moves_last_ack_up_to_the_next_pending(store: Store) -> None:
    await store.create_session("a", "group")
    for seq in (1, 2, 3, 4):
        await append(store, seq, "a")
    await store.ack_one("a", 2)
    await store.ack_one("a", 1)
    record = await store.session("a")
    assert record is not None and record.last_ack == 2  # just below 3, still pending
    await store.ack_one("a", 4)  # not the lowest: last_ack stays
    record = await store.session("a")
    assert record is not None and record.last_ack == 2
    await store.ack_one("a", 3)  # nothing left: everything below next_seq is done
    record = await store.session("a")
    assert record is not None and (record.last_ack, record.next_seq) == (4, 5)


async def test_trim_drops_the_oldest_deliveries(tmp_path: Path, store: Store) -> None:
    await store.create_session("a", None)
    for seq in range(1, 6):
        await append(store, seq, "a")
    assert await store.trim("a", 2) == 3
    assert await seqs(store, "a") == [4, 5]
    assert count(tmp_path, "messages") == 2
    assert await store.trim("a", 2) == 0
    assert await store.trim("a", 0) == 2
    record = await store.session("a")
    assert record is not None and (record.pending, record.last_ack) == (0, 0)
    with pytest.raises(StoreError, match="unknown session"):
        await store.trim("nobody", 1)


async def test_drop_session_cascades_and_dereferences_its_messages(
    tmp_path: Path, store: Store
) -> None:
    await store.create_session("a", None)
    await store.create_session("b", None)
    await store.set_filters("a", [("t/>", "native")])
    await append(store, 1, "a", "b")
    await append(store, 2, "a")
    assert await store.drop_session("a") is True
    assert await store.session("a") is None
    assert query(tmp_path, "SELECT client_id FROM filters") == []
    assert query(tmp_path, "SELECT client_id, seq FROM deliveries") == [("b", 1)]
    assert query(tmp_path, "SELECT msg_id, refs FROM messages") == [("m1", 1)]
    assert await store.drop_session("a") is False


async def test_duplicate_publisher_msg_id_returns_false_and_stores_nothing(
    tmp_path: Path, store: Store
) -> None:
    await store.create_session("a", None)
    assert await append(store, 1, "a", publisher_msg_id="pub-1") is True
    assert await append(store, 2, "a", publisher_msg_id="pub-1") is False
    assert await seqs(store, "a") == [1]
    assert count(tmp_path, "messages") == 1
    record = await store.session("a")
    assert record is not None and record.next_seq == 2
    assert store.statistics().duplicates == 1


async def test_duplicates_are_recognised_after_reopening(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("a", None)
        assert await append(store, 1, "a", publisher_msg_id="pub-1")
    async with Store.open(tmp_path) as store:
        assert await append(store, 2, "a", publisher_msg_id="pub-1") is False


async def test_dedup_window_is_bounded(tmp_path: Path) -> None:
    async with Store.open(tmp_path, dedup_window=10) as store:
        await store.create_session("a", None)
        for seq in range(1, 51):
            assert await append(store, seq, "a", publisher_msg_id=f"pub-{seq}")
        assert count(tmp_path, "published") <= 11  # the window plus one prune batch
        assert store.statistics().dedup_ids == count(tmp_path, "published")
        assert await append(store, 51, "a", publisher_msg_id="pub-50") is False  # newest: kept
        assert await append(store, 52, "a", publisher_msg_id="pub-1") is True  # oldest: gone


async def test_dedup_window_zero_turns_duplicate_filtering_off(tmp_path: Path) -> None:
    async with Store.open(tmp_path, dedup_window=0) as store:
        await store.create_session("a", None)
        assert await append(store, 1, "a", publisher_msg_id="pub-1")
        assert await append(store, 2, "a", publisher_msg_id="pub-1")
        assert count(tmp_path, "published") == 0


async def test_a_message_with_no_deliveries_is_not_kept(tmp_path: Path, store: Store) -> None:
    assert await store.append(
        msg_id="m", topic="t", payload=b"x", headers=None, deliveries=[], publisher_msg_id="p"
    )
    assert count(tmp_path, "messages") == 0
    assert count(tmp_path, "published") == 1


async def test_unreferenced_messages_are_swept_after_the_retention_window(tmp_path: Path) -> None:
    async with Store.open(tmp_path, retention_seconds=0.1) as store:
        await store.create_session("a", None)
        await append(store, 1, "a")
        await store.ack("a", 1)
        assert count(tmp_path, "messages") == 1  # unreferenced, but kept for now
        with trio.fail_after(3):
            while store.statistics().messages:  # the sweep has no event: poll, bounded
                await trio.sleep(0.02)
        assert count(tmp_path, "messages") == 0


class Clock:
    """A clock the test moves by hand: ``now`` is what the backend reads."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@contextmanager
def backend_holding_one_message(tmp_path: Path, clock: Clock) -> Iterator[SqliteBackend]:
    """A backend with 60 s retention on ``clock``, holding message "m" for session "a"."""
    backend = SqliteBackend.open(
        tmp_path / DB_FILENAME, retention_seconds=60, durable=False, clock=clock
    )
    try:
        backend.run(lambda b: b.create_session("a", None))
        backend.run(
            lambda b: b.append(
                msg_id="m",
                topic="t",
                payload=b"x",
                headers=None,
                deliveries=[("a", 1)],
                publisher_msg_id=None,
            )
        )
        yield backend
    finally:
        backend.close()


def test_retention_keeps_an_unreferenced_message_until_it_is_that_old(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    with backend_holding_one_message(tmp_path, clock) as backend:
        clock.now = 1030.0
        backend.run(lambda b: b.ack("a", 1))
        clock.now = 1059.9  # unreferenced, but stored less than 60 s ago
        assert backend.run(SqliteBackend.sweep) == 0
        clock.now = 1060.0
        assert backend.run(SqliteBackend.sweep) == 1
        assert backend.messages == 0


def test_retention_never_sweeps_a_message_a_session_still_needs(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    with backend_holding_one_message(tmp_path, clock) as backend:
        clock.now = 5000.0
        assert backend.run(SqliteBackend.sweep) == 0
        assert [m.msg_id for m in backend.pending("a", 0, 10)] == ["m"]


async def test_group_commit_puts_concurrent_appends_in_few_transactions(store: Store) -> None:
    await store.create_session("a", None)
    before = store.statistics()
    results: list[bool] = []

    async def one(seq: int) -> None:
        results.append(await append(store, seq, "a"))

    async with trio.open_nursery() as nursery:
        for seq in range(1, 201):
            nursery.start_soon(one, seq)
    after = store.statistics()
    assert results == [True] * 200
    assert after.operations - before.operations == 200
    assert after.batches_committed - before.batches_committed <= 20
    assert after.max_batch_size >= 10
    assert await seqs(store, "a") == list(range(1, 201))
    assert (after.messages, after.deliveries) == (200, 200)


async def test_one_failing_operation_fails_only_its_caller(store: Store) -> None:
    await store.create_session("a", None)
    before = store.statistics()
    errors: dict[int, Exception] = {}

    async def one(seq: int) -> None:
        client = "nobody" if seq == 15 else "a"
        try:
            await append(store, seq, client)
        except StoreError as exc:
            errors[seq] = exc

    async with trio.open_nursery() as nursery:
        for seq in range(1, 31):
            nursery.start_soon(one, seq)
    after = store.statistics()
    assert list(errors) == [15]
    assert "unknown session(s) nobody" in str(errors[15])
    assert await seqs(store, "a") == [s for s in range(1, 31) if s != 15]
    # The failing append shared its transaction with others.
    assert after.batches_committed - before.batches_committed <= 2
    assert after.max_batch_size >= 15
    assert after.operations_failed - before.operations_failed == 1
    assert after.messages == 29


async def test_a_repeated_seq_fails_that_append_only(store: Store) -> None:
    await store.create_session("a", None)
    await append(store, 1, "a")
    with pytest.raises(StoreError, match="already stored"):
        await store.append(
            msg_id="again", topic="t", payload=b"", headers=None, deliveries=[("a", 1)]
        )
    assert [m.msg_id for m in await store.pending("a", 0, 10)] == ["m1"]
    assert store.statistics().messages == 1


async def test_a_batch_holds_at_most_max_batch_operations(tmp_path: Path) -> None:
    async with Store.open(tmp_path, max_batch=8) as store:
        await store.create_session("a", None)
        async with trio.open_nursery() as nursery:
            for seq in range(1, 101):
                nursery.start_soon(append, store, seq, "a")
        stats = store.statistics()
        assert stats.max_batch_size == 8
        assert stats.batches_committed >= 100 // 8
        assert len(await seqs(store, "a")) == 100


async def test_callers_wait_for_room_when_the_queue_is_full(tmp_path: Path) -> None:
    async with Store.open(tmp_path, max_queued=3) as store:
        await store.create_session("a", None)
        # Holding the limiter, the writer cannot start a transaction; released before the
        # nursery waits for the appends.
        async with trio.open_nursery() as nursery, store._limiter:
            nursery.start_soon(append, store, 1, "a")
            await trio.testing.wait_all_tasks_blocked()  # the writer holds it, stuck
            for seq in range(2, 21):
                nursery.start_soon(append, store, seq, "a")
            await trio.testing.wait_all_tasks_blocked()
            stats = store.statistics()
            assert stats.queued_operations == 3
            assert stats.callers_waiting_for_room == 16
        assert len(await seqs(store, "a")) == 20
        assert store.statistics().callers_waiting_for_room == 0


async def test_an_append_with_trims_is_queued_whole_or_not_at_all(tmp_path: Path) -> None:
    async with Store.open(tmp_path, max_queued=3) as store:
        await store.create_session("a", None)
        async with trio.open_nursery() as nursery, store._limiter:
            nursery.start_soon(append, store, 1, "a")
            await trio.testing.wait_all_tasks_blocked()  # the writer holds it, stuck
            store.append_nowait("m2", "t", b"x", None, (("a", 2),), None)
            with pytest.raises(trio.WouldBlock):  # room for 2: not the append and 2 trims
                store.append_nowait("m3", "t", b"x", None, (("a", 3),), None, trims=[("a", 1)] * 2)
            assert store.statistics().queued_operations == 1
            handle = store.append_nowait("m3", "t", b"x", None, (("a", 3),), None, trims=[("a", 2)])
            assert store.statistics().queued_operations == 3
        assert await handle.wait() is True
        assert await seqs(store, "a") == [3]


# -- shutdown and cancellation -----------------------------------------------------------------


async def test_leaving_the_store_commits_what_is_still_queued(tmp_path: Path) -> None:
    results: list[bool] = []

    async def one(store: Store, seq: int) -> None:
        results.append(await append(store, seq, "a"))

    async with trio.open_nursery() as nursery, Store.open(tmp_path) as store:
        await store.create_session("a", None)
        async with store._limiter:  # hold the writer back while they enqueue
            nursery.start_soon(one, store, 1)
            await trio.testing.wait_all_tasks_blocked()  # the writer holds it, stuck
            for seq in range(2, 51):
                nursery.start_soon(one, store, seq)
            await trio.testing.wait_all_tasks_blocked()
            assert store.statistics().queued_operations == 49
        # Leaving now: the store stops taking operations and commits the queued ones.
    assert results == [True] * 50
    async with Store.open(tmp_path) as store:
        assert await seqs(store, "a") == list(range(1, 51))


async def test_operations_after_close_raise_store_error(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("a", None)
    with pytest.raises(StoreError, match="closed"):
        await append(store, 1, "a")
    with pytest.raises(StoreError, match="closed"):
        await store.pending("a", 0, 10)


async def test_aclose_before_leaving_stops_the_store(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("a", None)
        await store.aclose()
        await store.aclose()
        with pytest.raises(StoreError, match="closed"):
            await store.ack("a", 1)


async def test_an_exception_in_the_body_propagates_unwrapped(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        async with Store.open(tmp_path):
            raise KeyError("mine")


async def test_a_failing_writer_fails_its_waiters_and_propagates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors: list[StoreError] = []

    def broken(*args: object) -> NoReturn:
        raise RuntimeError("writer bug")

    async def caller(store: Store) -> None:
        try:
            await store.ack("a", 1)
        except StoreError as exc:
            errors.append(exc)

    # The store's own nursery does not wrap the error; the test's nursery does.
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="writer bug")):
        async with trio.open_nursery() as nursery, Store.open(tmp_path) as store:
            await store.create_session("a", None)
            monkeypatch.setattr(store, "_run_in_thread", broken)
            nursery.start_soon(caller, store)
            await trio.sleep_forever()
    assert len(errors) == 1 and "not committed" in str(errors[0])


async def test_cancelled_appends_are_stored_whole_or_not_at_all(
    tmp_path: Path, store: Store
) -> None:
    await store.create_session("a", None)
    await store.create_session("b", None)
    rng = random.Random(0)

    async def cancelled_soon(seq: int) -> None:
        with trio.move_on_after(rng.uniform(0, 0.004)):
            await append(store, seq, "a", "b")

    async with trio.open_nursery() as nursery:
        for seq in range(1, 101):
            nursery.start_soon(cancelled_soon, seq)
    assert await append(store, 101, "a")  # the store still works
    stored_a = await seqs(store, "a")
    assert stored_a[-1] == 101
    assert await seqs(store, "b") == stored_a[:-1]  # both deliveries of a message, or neither
    assert query(tmp_path, "SELECT count(*) FROM messages WHERE refs != 2") == [(1,)]
    assert store.statistics().messages == len(stored_a)


async def test_statistics_follow_the_database(tmp_path: Path, store: Store) -> None:
    await store.create_session("a", None)
    await append(store, 1, "a", publisher_msg_id="p1")
    stats = store.statistics()
    assert (stats.sessions, stats.messages, stats.deliveries, stats.dedup_ids) == (1, 1, 1, 1)
    assert stats.batches_committed >= 2 and stats.operations >= 2
    assert stats.mean_batch_size >= 1 and stats.last_commit_ms > 0
    assert stats.db_size_bytes > 0 and stats.queued_operations == 0


# -- a real crash ------------------------------------------------------------------------------

# Appends with 20 concurrent tasks and prints each seq once its append has returned; a second
# task acks session "b" up to confirmed seqs and prints "ack N" after each ack returned.
CRASH_CHILD = """
import os, sys, trio
sys.path.insert(0, sys.argv[2])
from broker.store import Store

def say(text):
    os.write(1, (text + "\\n").encode())  # one write: a line is whole or absent

async def main(data_dir):
    async with Store.open(data_dir) as store:
        next_seq = (await store.create_session("a", None)).next_seq
        await store.create_session("b", None)
        confirmed = []
        say("ready")

        async def appender():
            nonlocal next_seq
            while True:
                seq = next_seq
                next_seq += 1
                deliveries = [("a", seq), ("b", seq)] if seq % 2 else [("a", seq)]
                await store.append(msg_id=f"m{seq}", topic="crash", headers={"seq": str(seq)},
                                   payload=f"payload {seq} ".encode() * 20,
                                   deliveries=deliveries)
                confirmed.append(seq)
                say(str(seq))

        async def acker():
            while True:
                await trio.sleep(0.01)  # the workload's pace (a child that gets killed)
                if confirmed:
                    upto = min(confirmed[-20:])
                    await store.ack("b", upto)
                    say(f"ack {upto}")

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(appender)
            nursery.start_soon(acker)

trio.run(main, sys.argv[1])
"""


def assert_references_are_exact(data_dir: Path) -> None:
    """refs equals the deliveries pointing at each message; none dangles, none is unreferenced."""
    wrong_refs = query(
        data_dir,
        "SELECT count(*) FROM messages AS m LEFT JOIN (SELECT message, count(*) AS n "
        "FROM deliveries GROUP BY message) AS d ON d.message = m.rowid "
        "WHERE m.refs != coalesce(d.n, 0) OR m.refs <= 0",
    )
    dangling = query(
        data_dir,
        "SELECT count(*) FROM deliveries WHERE message NOT IN (SELECT rowid FROM messages)",
    )
    assert (wrong_refs, dangling) == ([(0,)], [(0,)])


async def run_and_kill(data_dir: Path, delay: float) -> tuple[list[int], list[int]]:
    """Run the child, SIGKILL it ``delay`` s after it is ready; its confirmed seqs and acks."""
    command = [sys.executable, "-c", CRASH_CHILD, str(data_dir), str(ROOT)]
    proc = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    output = bytearray()
    try:
        with trio.fail_after(15):
            while b"ready\n" not in output:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the child exited before it was ready"
                output += chunk
        with trio.move_on_after(delay):
            while chunk := await proc.stdout.receive_some():
                output += chunk
    finally:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
    while chunk := await proc.stdout.receive_some():  # what was written before the kill
        output += chunk
    await proc.stdout.aclose()
    assert proc.returncode == -signal.SIGKILL
    lines = bytes(output).split(b"\n")[:-1]  # whole lines only
    assert lines[0] == b"ready"
    appended = [int(line) for line in lines[1:] if not line.startswith(b"ack")]
    acked = [int(line.split()[1]) for line in lines[1:] if line.startswith(b"ack")]
    return appended, acked


async def test_confirmed_appends_and_acks_survive_sigkill(tmp_path: Path) -> None:
    rng = random.Random(4)
    confirmed: set[int] = set()
    acked = 0
    for _ in range(5):
        appended, acks = await run_and_kill(tmp_path, rng.uniform(0.3, 0.8))
        assert appended, "nothing was confirmed before the kill"
        confirmed.update(appended)
        acked = max([acked, *acks])
        async with Store.open(tmp_path) as store:  # quick_check runs here
            a = await store.session("a")
            b = await store.session("b")
            assert a is not None and b is not None
            pending_a = {m.seq: m for m in await store.pending("a", 0, 1_000_000)}
            pending_b = {m.seq for m in await store.pending("b", 0, 1_000_000)}
        assert confirmed <= pending_a.keys()
        for seq in confirmed:
            message = pending_a[seq]
            assert message.payload == f"payload {seq} ".encode() * 20
            assert message.headers == {"seq": str(seq)}
        assert a.next_seq > max(pending_a)
        assert b.last_ack >= acked
        assert not {s for s in pending_b if s <= b.last_ack}
        assert {s for s in confirmed if s % 2 and s > b.last_ack} <= pending_b
        assert_references_are_exact(tmp_path)


# -- the benchmark script ----------------------------------------------------------------------


def test_bench_store_runs_at_a_tiny_size(tmp_path: Path) -> None:
    from bench import store as bench_store

    path = tmp_path / "store.json"
    argv = ["--quick", "--seconds", "0.1", "--replay-messages", "300", "--json", str(path)]
    assert bench_store.main([*argv, "--data-dir", str(tmp_path / "data")]) == 0
    import json

    report = json.loads(path.read_text())
    assert report["benchmark"] == "store"
    rows = {(r["case"], r["concurrency"]): r for r in report["results"]}
    assert {("append", 1), ("append", 10), ("append", 100), ("replay", None)} <= rows.keys()
    assert all(r["per_second"] > 0 for r in rows.values())
    assert rows[("replay", None)]["operations"] == 300
    assert {g["status"] for g in report["goals"]} <= {"PASS", "FAIL"}


async def test_begin_append_queues_without_waiting_and_commits_in_call_order(tmp_path) -> None:
    from broker.store import Store

    async with Store.open(tmp_path) as store:
        await store.create_session("s", None)
        handles = [
            await store.begin_append(
                msg_id=f"m{i}", topic="t", payload=b"x", headers=None, deliveries=[("s", i)]
            )
            for i in range(1, 51)
        ]
        ack = await store.begin_ack("s", 10)
        assert all(h.done is False for h in handles[-1:])  # nothing waited for a commit
        assert [await h.wait() for h in handles] == [True] * 50
        assert await ack.wait() == 10
        assert [m.seq for m in await store.pending("s", 0, 100)] == list(range(11, 51))


async def test_a_lazy_ack_shares_the_commit_of_the_append_queued_after_it(
    store: Store, mock_clock: trio.testing.MockClock
) -> None:
    # The clock stands still, so the lazy wait cannot run out before the append comes
    # (with a real clock a 10 ms nap raced LAZY_COMMIT_DELAY on a loaded machine).
    await store.create_session("s", None)
    for seq in range(1, 11):
        await append(store, seq, "s")
    before = store.statistics().batches_committed
    ack = await store.begin_ack("s", 5)
    await trio.testing.wait_all_tasks_blocked()  # the writer has the ack, waits for company
    assert not ack.done
    assert await append(store, 11, "s")
    assert ack.done and ack.result() == 5
    assert store.statistics().batches_committed == before + 1  # one commit for both
    assert await seqs(store, "s") == list(range(6, 12))


async def test_a_lone_lazy_ack_commits_after_the_delay(store: Store) -> None:
    from broker.store.group_commit import LAZY_COMMIT_DELAY

    await store.create_session("s", None)
    for seq in range(1, 4):
        await append(store, seq, "s")
    ack = await store.begin_ack_one("s", 2)
    with trio.fail_after(LAZY_COMMIT_DELAY + 5):
        while not ack.done:  # nobody waits for it, nothing else comes: it commits alone
            await trio.sleep(0.005)  # poll: waiting on the handle would hurry the commit
    assert ack.result() is True
    assert await seqs(store, "s") == [1, 3]


async def test_waiting_for_a_lazy_ack_commits_it_without_the_delay(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The clock stands still: the lazy wait would never end; waiting for the handle ends it.
    async with Store.open(tmp_path) as store:
        await store.create_session("s", None)
        await append(store, 1, "s")
        ack = await store.begin_ack("s", 1)
        await trio.sleep(0)
        assert await ack.wait() == 1
        second = await store.begin_ack("s", 1)  # hurried before the writer even took it
        assert await second.wait() == 0


async def test_leaving_the_store_commits_a_waiting_lazy_ack(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        await store.create_session("s", None)
        await append(store, 1, "s")
        ack = await store.begin_ack("s", 1)
    assert ack.done and ack.result() == 1
    assert count(tmp_path, "deliveries") == 0


async def test_a_second_store_on_the_same_directory_is_refused(tmp_path) -> None:
    from broker.store import Store, StoreError

    async with Store.open(tmp_path) as store:
        await store.create_session("s", None)
        with pytest.raises(StoreError, match="in use by pid"):
            async with Store.open(tmp_path):
                pass
    async with Store.open(tmp_path) as again:  # released on close
        assert await again.session("s") is not None
