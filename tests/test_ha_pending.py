"""Records shipped before the primary's commit: pending on the standby until the primary
says it committed them, withdrawn when its commit fails (a real primary store, a real
standby store or a scripted standby on the real link, real TCP).

The primary's transaction is held up, or refused, by an SQLite authorizer on its BEGIN
(``_hold_begin``), after the batch's record was prepared and sent.
"""

from __future__ import annotations

import sqlite3
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.ha import follower as follower_module
from broker.ha.journal import JOURNAL_FILENAME
from broker.ha.link import LinkStream, dial_link
from broker.ha.records import decode_record
from broker.store import StoreError
from broker.store.sqlite import SqliteBackend
from tests.hapair import SECRET, Pair, dump, pair
from tests.test_ha_replication import _load, _same


def _hold_begin(
    backend: SqliteBackend, *, began: threading.Event, go: threading.Event, deny: bool
) -> None:
    """Make the primary's next BEGIN wait for ``go`` (then fail it when ``deny``): a
    transaction held up, or refused, after its record was sent."""
    once = [True]

    def authorizer(action: int, arg1: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and arg1 == "BEGIN" and once[0]:
            once[0] = False
            began.set()
            go.wait(30)
            backend.conn.set_authorizer(None)
            return sqlite3.SQLITE_DENY if deny else sqlite3.SQLITE_OK
        return sqlite3.SQLITE_OK

    backend.conn.set_authorizer(authorizer)


async def _hold(p: Pair, *, deny: bool) -> tuple[threading.Event, threading.Event]:
    began, go = threading.Event(), threading.Event()
    await p.store.read(partial(_hold_begin, began=began, go=go, deny=deny))
    return began, go


def _sessions(p: Pair) -> set[str]:
    return {row[0] for row in dump(p.standby_dir)["sessions"]}


async def test_a_record_is_journaled_on_the_standby_before_the_primary_commits_it_and_applied_after(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        follower = await p.start_standby()
        await p.in_sync()
        seq = p.shipper.position.seq
        began, go = await _hold(p, deny=False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.store.create_session, "early", None)
            with trio.fail_after(10):
                await trio.to_thread.run_sync(began.wait)  # the primary's BEGIN waits
                await follower.wait_journaled(seq + 1)  # yet the standby journaled it
            assert follower._ready() == 0  # pending: nothing the applier may take
            assert follower.applied.seq == seq  # not in its store
            go.set()
        assert (await p.store.session("early")) is not None
        await p.caught_up()  # COMMITTED: applied
        assert "early" in _sessions(p)
        assert dump(p.standby_dir) == dump(p.primary_dir)


async def test_a_withdrawn_record_never_reaches_the_standby_store_and_the_pair_stays_in_sync(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path) as p:
        follower = await p.start_standby()
        await p.in_sync()
        await _load(p.store, "before", count=5)
        await p.caught_up()
        snapshots = p.shipper.counters.snapshots_sent
        seq = p.shipper.position.seq
        _began, go = await _hold(p, deny=True)

        async def refused() -> None:
            with pytest.raises(StoreError, match="cannot start a transaction"):
                await p.store.create_session("lost", None)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(refused)
            with trio.fail_after(10):
                await follower.wait_journaled(seq + 1)  # journaled and acknowledged
            go.set()
        with trio.fail_after(10):
            while follower.counters.withdrawals < 1:
                await trio.sleep(0.005)
        assert follower.position.seq == seq == p.shipper.position.seq
        assert p.shipper.statistics()["withdrawals_sent"] == 1
        assert p.shipper.statistics()["records_discarded"] == 1
        assert p.shipper.in_sync and p.shipper.counters.standby_dropped == 0
        assert follower.counters.connections == 1
        # Stopped right after: its journal's withdrawn frame is not applied.
        await p.stop_standby()
        assert "lost" not in _sessions(p)
        assert dump(p.standby_dir) == dump(p.primary_dir)
        # Restarted: it continues from its position, no snapshot.
        await p.start_standby()
        await p.in_sync()
        await _load(p.store, "after", count=5)
        await _same(p)
        assert p.shipper.counters.snapshots_sent == snapshots
        assert await p.store.session("lost") is None
        assert "lost" not in _sessions(p)


async def test_a_withdrawn_record_then_more_load_leaves_both_stores_equal(tmp_path: Path) -> None:
    async with pair(tmp_path) as p:
        follower = await p.start_standby()
        await p.in_sync()
        for round_ in range(3):
            seq = p.shipper.position.seq
            _began, go = await _hold(p, deny=True)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(_refused_session, p, f"lost-{round_}"))
                with trio.fail_after(10):
                    await follower.wait_journaled(seq + 1)
                go.set()
            await _load(p.store, f"r{round_}", count=5)
        await _same(p)
        assert follower.counters.withdrawals == 3
        assert p.shipper.counters.snapshots_sent == 1  # the first one, of an empty store
        assert not any(name.startswith("lost") for name in _sessions(p))


async def _refused_session(p: Pair, name: str) -> None:
    with pytest.raises(StoreError):
        await p.store.create_session(name, None)


async def test_records_pending_on_a_stopped_standby_are_applied(tmp_path: Path) -> None:
    """Stopped (or promoted) with a record the primary has not said it committed: the
    primary may have committed and confirmed it before it died, so it is applied."""
    async with pair(tmp_path) as p:
        follower = await p.start_standby()
        await p.in_sync()
        seq = p.shipper.position.seq
        _began, go = await _hold(p, deny=False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.store.create_session, "pending", None)
            with trio.fail_after(10):
                await follower.wait_journaled(seq + 1)
            assert follower.applied.seq == seq
            await p.stop_standby()  # the primary is still inside its transaction
            assert "pending" in _sessions(p)
            go.set()


async def _next(link: LinkStream, kind: str) -> list[Any]:
    """The next frame of ``kind`` (BEATs and COMMITTEDs in between skipped)."""
    with trio.fail_after(10):
        while True:
            message = await link.receive()
            if message[0] == kind:
                return message
            assert message[0] in ("BEAT", "COMMITTED"), message[0]


async def test_a_stale_ack_of_a_withdrawn_record_confirms_nothing(tmp_path: Path) -> None:
    """A scripted standby on the real link: it acknowledges record N, N is withdrawn, the
    next batch's record is a different N; ACKs of N sent before the WITHDRAW was
    processed (withdraws = 0) must not confirm it; one after it (withdraws = 1) does."""
    async with pair(tmp_path, ack_timeout=30.0) as p:
        await p.store.create_session("first", None)  # confirmed alone
        stream = await trio.open_tcp_stream("127.0.0.1", p.port)
        link = await dial_link(stream, SECRET)
        top = p.shipper.position
        await link.send(["POSITION", top.term, top.seq, top.digest])
        with trio.fail_after(10):
            while not p.shipper.in_sync:
                await trio.sleep(0.005)
        seq = top.seq + 1
        _began, go = await _hold(p, deny=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(_refused_session, p, "lost"))
            record = await _next(link, "RECORD")
            assert decode_record(record[1])[1] == seq
            await link.send(["ACK", seq, 0])  # durable here, before the commit fails
            with trio.fail_after(10):
                while p.shipper._acked < seq:  # (the primary took it)
                    await trio.sleep(0.005)
            go.set()
        assert await _next(link, "WITHDRAW") == ["WITHDRAW", seq]
        await link.send(["ACK", seq, 0])  # in flight when the withdraw was decided

        confirmed = trio.Event()

        async def second() -> None:
            await p.store.create_session("second", None)
            confirmed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            record = await _next(link, "RECORD")
            assert decode_record(record[1])[1] == seq  # the same seq, another record
            heard = p.shipper.last_contact
            await link.send(["ACK", seq, 0])  # stale: of the withdrawn one
            with trio.fail_after(10):
                while p.shipper.last_contact == heard:  # (the primary read it)
                    await trio.sleep(0.005)
            assert p.shipper._acked < seq  # taken for nothing
            assert not confirmed.is_set()
            assert p.shipper.in_sync  # waited for, not dropped
            await link.send(["ACK", seq, 1])  # after the WITHDRAW: of this one
            with trio.fail_after(10):
                await confirmed.wait()
        assert p.shipper.counters.confirms_alone == 1  # only "first"
        await link.aclose()


async def test_under_load_the_journal_is_written_from_its_start_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record is nearly always pending when the next arrives: past JOURNAL_RESTART an
    arrival has the applier catch up first, so the journal does not grow with the load."""
    monkeypatch.setattr(follower_module, "JOURNAL_RESTART", 8 << 10)
    async with pair(tmp_path) as p:
        follower = await p.start_standby()
        await p.in_sync()
        for round_ in range(4):
            await _load(p.store, f"r{round_}")
        await _same(p)
        journal = (p.standby_dir / JOURNAL_FILENAME).stat().st_size
        assert follower.counters.bytes_received > 200 << 10
        assert journal < 64 << 10, (journal, follower.counters.bytes_received)
