"""The standby's side of replication: dial the primary, apply its records, acknowledge them.

The standby holds its store's backend itself (no clients use it: it serves nobody until it
is promoted, ``docs/ha.md``). It tells the primary its position (term, seq, chain digest);
the primary continues from there or sends a snapshot first. Every record is checked before
anything else happens to it (it follows our position: the next seq, the chained digest; its
operations are ones we can run): a mismatch means this store diverged from the primary's;
the standby disconnects, and the primary, finding a different digest at the standby's seq,
sends a snapshot.

Each arrival of records is appended to the journal (``broker.ha.journal``) with one
``fdatasync``, and then ``ACK(seq, withdraws)`` goes back: an acknowledged record survives a
power loss of the standby. The primary sends each record before its own commit
(``broker.ha.shipping``): a record is *pending* until the primary says it committed (the
committed seq each ``RECORD`` carries, or ``COMMITTED``), and only then applied; a pending
record the primary could not commit is withdrawn (``WITHDRAW``: taken out of the journal,
our position moved back, ``withdraws`` counted, which each ACK names so the primary knows
which ACKs are of records it still has). Stopping (promoted, or shut down), restarting and
dialling again apply every journaled record, pending or not: the primary may have
committed and confirmed it before it died. A second task, the applier, runs the committed
journaled records through the same
``SqliteBackend`` methods the primary ran (``broker.ha.records``), with each record's time
and dedupe-table pruning, up to ``MAX_RECORDS_PER_COMMIT`` records in ONE transaction ending
with the new position (fsynced, ``synchronous=FULL``), so the acknowledgement does not wait
for SQLite and a standby that falls behind catches up in bigger transactions. The journal
is applied in full before the store is used otherwise (opening, each new connection,
stopping); at most ``MAX_UNAPPLIED`` records wait for the applier before the standby reads
no more from the link (TCP's window then holds the primary back).

A snapshot is written beside the database, fsynced, checked (the position it holds must
be the one announced), and only then swapped in: until then the old store is intact. A
database that fails to open (damaged: SQLite's ``quick_check``) is moved aside to
``topiary.db.damaged-<time>`` and the standby starts empty, so it is rebuilt from a
snapshot, never served.

With ``tls`` (``[ha] ca``, ``cert``, ``key``) each connection is mutual TLS, the primary's
certificate checked against the pair's CA and for the host dialled. A handshake the
primary refuses (or that finds a certificate we refuse) is counted (``tls_failures``),
logged, and tried again with the backoff: only a connection that got past the
handshakes resets it, so a standby the primary keeps refusing dials at most once per
``RETRY_MAX``.

A standby whose disk refuses the records (full, a quota or file size limit) acknowledges
none of them: a journal append the disk refuses is not acknowledged; it tells the primary
(``FAULT``), which drops it as a lost standby and confirms alone under its lease
(docs/ha.md, "Disk full"), and dials again after ``RETRY_MAX``, catching up once the disk
takes the records again. Records already journaled (acknowledged) that the store then
cannot take stay in the journal, and are applied when the disk takes them again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from broker.ha.journal import Journal, RecordMismatch, apply_records, check_record, replay
from broker.ha.link import LinkError, LinkStream, LinkTlsError, dial_link, single_link_error
from broker.ha.records import BatchClock, Position, read_position
from broker.ha.tls import PairTls, TlsHandshakeFailed
from broker.log import get_logger
from broker.store.files import fsync_directory, lock_directory
from broker.store.records import StoreError, StoreFull
from broker.store.schema import DB_FILENAME
from broker.store.sqlite import SqliteBackend, Work

__all__ = ["Follower", "FollowerCounters", "StandbyFull"]

#: Seconds between the standby's ACKs when nothing new arrives (the primary's sign of life).
ACK_INTERVAL = 0.25
#: Most records applied in one transaction.
MAX_RECORDS_PER_COMMIT = 256
#: Seconds journaled records may wait to be applied with the next ones: one transaction
#: (and one fsync) for all that arrive meanwhile, instead of one per arrival. It bounds
#: what a promotion applies first, too (about this long of the primary's writes).
APPLY_DELAY = 0.05
#: Records journaled (acknowledged) and not applied yet, before the standby reads no more.
MAX_UNAPPLIED = 1024
#: Journal bytes past which it is emptied (after the applier caught up) rather than grown.
JOURNAL_LIMIT = 64 << 20
#: Journal bytes past which an arrival has the applier catch up at once (no APPLY_DELAY)
#: and waits for it, so the journal is written from its start again. Under steady load a
#: record is nearly always pending when the next arrives (its commit is learned from that
#: very frame), so the store rarely holds all the journal has by itself: without this the
#: file would grow to ``JOURNAL_LIMIT``, and a promotion would read all of it.
JOURNAL_RESTART = 1 << 20
RETRY_MIN, RETRY_MAX = 0.05, 1.0
#: Seconds a TLS handshake with the primary may take.
TLS_HANDSHAKE_TIMEOUT = 10.0

log = get_logger("topiary.ha.follower")
#: What a write refused by the disk fails with (full, quota, past RLIMIT_FSIZE).
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class StandbyFull(LinkError):
    """The standby's disk refused what the primary sent: nothing of it is acknowledged."""


class FollowGate(Protocol):
    """The election's side of a standby (``broker.ha.elector.Elector``)."""

    @property
    def term(self) -> int: ...
    def on_primary_contact(self, term: int) -> bool: ...
    def may_acknowledge(self) -> bool: ...


@dataclass(slots=True)
class FollowerCounters:
    connections: int = 0  # sessions with the primary that got past the handshake
    link_failures: int = 0  # connections that failed or ended (the standby dials again)
    tls_failures: int = 0  # TLS handshakes that failed, or TLS refusals right after one
    records_applied: int = 0
    commits: int = 0  # store transactions (each applies one or more records)
    journal_syncs: int = 0  # journal appends (one fdatasync each) before an ACK
    bytes_received: int = 0
    snapshots_installed: int = 0
    divergences: int = 0  # records whose digest did not follow ours: a snapshot follows
    damaged_rebuilt: int = 0  # a store that failed to open, moved aside and rebuilt
    store_full: int = 0  # records or snapshots the disk refused (none acknowledged)
    withdrawals: int = 0  # pending records the primary withdrew (its commit failed)

    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class _Pending:
    """A journaled record not applied yet."""

    position: Position
    works: list[Work]
    offset: int  # of its frame in the journal
    before: Position  # the position it follows


class Follower:
    """The standby's replication; ``run`` follows the primary at ``host:port`` until cancelled."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        secret: bytes,
        *,
        retention_seconds: float = 0.0,
        dedup_window: int = 100_000,
        tls: PairTls | None = None,
    ) -> None:
        # Both shape what a record does (pruning, keeping messages): the primary's values.
        self._options = {"retention_seconds": retention_seconds, "dedup_window": dedup_window}
        self.directory = Path(data_dir)
        self.path = self.directory / DB_FILENAME
        self.secret = secret
        self.tls = tls
        self.counters = FollowerCounters()
        #: The newest record durable here (journaled or in the store): what ACKs name.
        self.position = Position()
        #: The newest record in the store.
        self.applied = Position()
        self.connected = False
        self.last_contact: float | None = None
        self._backend: SqliteBackend | None = None
        self._journal: Journal | None = None
        self._limiter = trio.CapacityLimiter(1)  # the store's connection
        self._journal_limiter = trio.CapacityLimiter(1)  # the journal file
        self._unapplied: deque[_Pending] = deque()
        self._committed = 0  # the primary's newest committed seq, as it told us
        self._withdraws = 0  # WITHDRAWs processed on this connection (what ACKs name)
        self._hurry = False  # an arrival waits for the applier: apply without APPLY_DELAY
        self._gathering: trio.CancelScope | None = None  # the applier's APPLY_DELAY wait
        self._arrived = trio.Event()  # set (and replaced) when records are journaled
        self._changed = trio.Event()  # set (and replaced) when records are applied
        #: The election (witness failover): told of the primary's frames, asked before ACKs.
        self.gate: FollowGate | None = None
        self._beat = 0  # the last BEAT number heard on this connection

    async def wait_for(self, seq: int) -> None:
        """Return once records up to ``seq`` are applied to the store (for tests)."""
        while self.applied.seq < seq:
            await self._changed.wait()

    async def wait_journaled(self, seq: int) -> None:
        """Return once records up to ``seq`` are in the journal, acknowledged (for tests)."""
        while self.position.seq < seq:
            await self._arrived.wait()

    async def run(
        self, host: str, port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the store (rebuilding a damaged one), then follow the primary, dialling again
        after every failure (backoff up to ``RETRY_MAX``). The store closes on the way out."""
        lock = lock_directory(self.directory)
        try:
            await self._thread(self._open)
            task_status.started()
            delay = RETRY_MIN
            while True:
                stream = await self._connect(host, port)
                if stream is not None:
                    linked = self.counters.connections
                    full = False
                    try:
                        await self._follow(stream)
                    except LinkTlsError as exc:
                        self._tls_failed(host, port, str(exc))
                    except StandbyFull as exc:
                        self.counters.store_full += 1
                        log.error("standby store full: nothing acknowledged, dialling again",
                                  reason=str(exc), retry=RETRY_MAX)  # fmt: skip
                        full = True  # the primary goes on alone meanwhile
                    except LinkError as exc:
                        log.warning("replication link lost", reason=str(exc))
                    finally:
                        self.connected = False
                        await trio.aclose_forcefully(stream)
                    self.counters.link_failures += 1
                    if full:
                        delay = RETRY_MAX
                    elif self.counters.connections > linked:  # it got past the handshakes
                        delay = RETRY_MIN
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
        finally:
            with trio.CancelScope(shield=True):
                await self._thread(self._close)
            lock.close()

    async def _connect(self, host: str, port: int) -> trio.abc.Stream | None:
        """A connection to the primary (over TLS with ``tls``), or None (logged, counted)."""
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            log.debug("primary unreachable", address=f"{host}:{port}", reason=str(exc))
            return None
        if self.tls is None:
            return stream
        try:
            return await self.tls.dial(stream, host, TLS_HANDSHAKE_TIMEOUT)
        except TlsHandshakeFailed as exc:
            self._tls_failed(host, port, str(exc))
            return None

    def _tls_failed(self, host: str, port: int, reason: str) -> None:
        self.counters.tls_failures += 1
        log.warning("replication link: TLS handshake failed", address=f"{host}:{port}",
                    reason=reason, tls_failures=self.counters.tls_failures)  # fmt: skip

    # -- the store, in the worker thread -------------------------------------------------------

    async def _thread(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _open(self) -> None:
        try:
            backend = SqliteBackend.open(self.path, **self._options)
        except StoreError as exc:
            aside = self.path.with_name(f"{DB_FILENAME}.damaged-{int(time.time())}")
            log.error("standby store damaged: moved aside, rebuilding", reason=str(exc))
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    os.replace(source, f"{aside}{suffix}")
            self.counters.damaged_rebuilt += 1
            backend = SqliteBackend.open(self.path, **self._options)
        backend.clock = BatchClock()
        self._backend = backend
        self._journal = Journal(self.directory)
        try:
            self._replay()
        except LinkError as exc:  # (the store's position is ours; the primary sends the rest)
            log.error("standby journal not applied", reason=str(exc))

    def _replay(self) -> Position:
        """Apply the journal in full and empty it (the store's connection is ours). When the
        store refuses (``StandbyFull`` for a full disk, else ``LinkError``), our position is
        the store's and the journal keeps the rest: the next records received replace it."""
        assert self._backend is not None and self._journal is not None
        self._unapplied.clear()
        try:
            self.applied = self.position = replay(
                self._backend, self.directory, MAX_RECORDS_PER_COMMIT
            )
        except StoreError as exc:
            self.applied = self.position = read_position(self._backend.conn)
            why = f"cannot apply the journal after seq {self.position.seq}: {exc}"
            raise (StandbyFull(why) if isinstance(exc, StoreFull) else LinkError(why)) from None
        self._journal.size = 0
        return self.position

    def _close(self) -> None:
        if self._backend is not None:
            try:
                self._replay()  # promoted or stopped: the store holds all we acknowledged
            except LinkError as exc:  # (the journal stays: Shipper.attach replays it again)
                log.error("standby journal not applied", reason=str(exc))
            finally:
                self._backend.close()
                self._backend = None
                if self._journal is not None:
                    self._journal.close()
                    self._journal = None

    def _journal_records(
        self, position: Position, records: list[tuple[bytes, bytes]], empty_first: bool
    ) -> list[_Pending]:
        """Check ``records`` ((body, digest) pairs) against ``position``, then journal them
        durably; each record's position and works."""
        checked: list[tuple[Position, Position, list[Work]]] = []
        for body, digest in records:
            before = position
            try:
                position, works = check_record(position, body, digest)
            except RecordMismatch as exc:
                self.counters.divergences += exc.diverged
                raise LinkError(str(exc)) from None
            except ValueError as exc:
                raise LinkError(f"bad record from the primary: {exc}") from None
            checked.append((position, before, works))
        assert self._journal is not None
        try:
            offsets = self._journal.append(records, empty_first=empty_first)
        except OSError as exc:  # nothing of it kept (Journal.append), nothing acknowledged
            why = f"cannot journal records up to {checked[-1][0].seq}: {exc}"
            raise (StandbyFull(why) if exc.errno in _FULL_ERRNOS else LinkError(why)) from None
        return [
            _Pending(position, works, offset, before)
            for (position, before, works), offset in zip(checked, offsets, strict=True)
        ]

    def _apply(self, group: list[_Pending]) -> Position:
        assert self._backend is not None
        try:
            return apply_records(self._backend, [(p.position, p.works) for p in group])
        except StoreFull as exc:  # (the records stay in the journal)
            raise StandbyFull(str(exc)) from None
        except StoreError as exc:
            raise LinkError(str(exc)) from None

    def _install(self, snapshot: Path, expected: Position) -> Position:
        """Swap the received snapshot in for the store (closing and reopening it)."""
        with snapshot.open("rb+") as file:
            os.fsync(file.fileno())
        conn = sqlite3.connect(f"file:{snapshot}?mode=ro", uri=True)
        try:
            found = read_position(conn)
        finally:
            conn.close()
        if found != expected:
            raise LinkError(f"snapshot holds seq {found.seq}, announced {expected.seq}")
        self._close()  # (the journal is empty: a snapshot comes before any record)
        for suffix in ("-wal", "-shm"):  # never let an old WAL meet the new file
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        os.replace(snapshot, self.path)
        fsync_directory(str(self.directory))
        self._open()
        return self.position

    # -- the link ------------------------------------------------------------------------------

    async def _follow(self, stream: trio.abc.Stream) -> None:
        link = await dial_link(stream, self.secret)
        try:
            p = await self._thread(self._replay)  # what the last connection left unapplied
        except StandbyFull as exc:
            await _tell_fault(link, str(exc))
            raise
        await link.send(["POSITION", p.term, p.seq, p.digest])
        self.counters.connections += 1
        self.connected = True
        self._beat = 0
        self._committed = p.seq
        self._withdraws = 0
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat, link)
                nursery.start_soon(self._apply_loop, link)
                await self._receive(link)
        except BaseExceptionGroup as group:
            raise single_link_error(group) from None

    def _ready(self) -> int:
        """How many journaled records the primary committed (the first ones)."""
        if not self._unapplied:
            return 0
        return max(
            0, min(len(self._unapplied), self._committed - self._unapplied[0].position.seq + 1)
        )

    async def _apply_loop(self, link: LinkStream) -> None:
        """Apply committed journaled records to the store: once ``MAX_RECORDS_PER_COMMIT``
        wait, or ``APPLY_DELAY`` after the first of them was ready, all of them in one
        transaction. Pending ones (the primary did not say it committed them) wait."""
        while True:
            while not self._ready():
                await self._arrived.wait()
            with trio.move_on_after(0 if self._hurry else APPLY_DELAY) as gathering:
                self._gathering = gathering
                while self._ready() < MAX_RECORDS_PER_COMMIT:
                    await self._arrived.wait()
            self._gathering = None
            count = min(self._ready(), MAX_RECORDS_PER_COMMIT)
            group = [self._unapplied.popleft() for _ in range(count)]
            try:
                self.applied = await self._thread(self._apply, group)
            except StandbyFull as exc:
                await _tell_fault(link, str(exc))
                raise
            self.counters.records_applied += count
            self.counters.commits += 1
            self._changed.set()
            self._changed = trio.Event()

    async def _heartbeat(self, link: LinkStream) -> None:
        while True:
            await trio.sleep(ACK_INTERVAL)
            await self._ack(link)

    async def _ack(self, link: LinkStream) -> None:
        """``ACK seq withdraws`` (with the election: ``ACK seq withdraws term beat``, and
        none while this
        standby is a candidate: the old primary must stop counting on it)."""
        gate = self.gate
        if gate is None:
            await link.send(["ACK", self.position.seq, self._withdraws])
        elif gate.may_acknowledge():
            await link.send(["ACK", self.position.seq, self._withdraws, gate.term, self._beat])

    def _contact(self, term: int) -> None:
        gate = self.gate
        if gate is not None and not gate.on_primary_contact(term) and term < gate.term:
            raise LinkError(f"the primary is of term {term}, older than ours ({gate.term})")

    async def _receive(self, link: LinkStream) -> None:
        while True:
            message = await link.receive()
            self.last_contact = trio.current_time()
            kind = message[0]
            if kind == "BEAT":
                self._heard_beat(message)
                if self.gate is not None:  # answered at once: the primary's trust in us
                    await self._ack(link)  # lasts failure_timeout from the BEAT's sending
                continue
            if kind == "RECORD":
                records = [self._record(message)]
                while len(records) < MAX_RECORDS_PER_COMMIT:
                    more = link.receive_buffered()
                    if more is None:
                        break
                    if more[0] == "BEAT":  # (the ACK after the commit names it)
                        self._heard_beat(more)
                        continue
                    if more[0] == "COMMITTED":
                        self._heard_committed(more)
                        continue
                    if more[0] != "RECORD":
                        await self._commit(link, records)
                        records = []
                        await self._other(link, more)
                        break
                    records.append(self._record(more))
                if records:
                    await self._commit(link, records)
            elif kind == "COMMITTED":
                self._heard_committed(message)
            else:
                await self._other(link, message)

    def _record(self, message: list[Any]) -> tuple[bytes, bytes]:
        """(body, digest) of a ``["RECORD", body, digest, committed]``; ``committed`` (the
        primary's newest committed seq when it sent it) is noted."""
        if (
            len(message) != 4
            or not isinstance(message[1], bytes)
            or not isinstance(message[2], bytes)
            or not isinstance(message[3], int)
        ):
            raise LinkError("RECORD is [body, digest, committed]")
        self._mark(message[3])
        return message[1], message[2]

    def _heard_committed(self, message: list[Any]) -> None:
        if len(message) != 2 or not isinstance(message[1], int):
            raise LinkError("COMMITTED is [seq]")
        self._mark(message[1])

    def _mark(self, committed: int) -> None:
        if committed > self._committed:
            self._committed = committed
            self._arrived.set()
            self._arrived = trio.Event()

    async def _withdraw(self, link: LinkStream, message: list[Any]) -> None:
        """``["WITHDRAW", seq]``: the primary did not commit record ``seq`` (pending here):
        it and any after it leave the journal, our position goes back to before it."""
        if len(message) != 2 or not isinstance(message[1], int):
            raise LinkError("WITHDRAW is [seq]")
        seq = message[1]
        index = next((i for i, p in enumerate(self._unapplied) if p.position.seq == seq), None)
        if index is None or seq <= self._committed:
            raise LinkError(f"WITHDRAW of seq {seq}, not pending here")
        pending = self._unapplied[index]
        assert self._journal is not None
        try:
            await trio.to_thread.run_sync(
                self._journal.withdraw, pending.offset, limiter=self._journal_limiter
            )
        except OSError as exc:
            raise LinkError(f"cannot withdraw record {seq} from the journal: {exc}") from None
        # (not by ``index``: the applier may have taken committed records off the front
        # while the journal was written; it never takes this one, which is not committed)
        while self._unapplied and self._unapplied[-1].position.seq >= seq:
            self._unapplied.pop()
        self.position = pending.before
        self._withdraws += 1
        self.counters.withdrawals += 1
        log.info("record withdrawn by the primary", seq=seq)
        await self._ack(link)

    def _heard_beat(self, message: list[Any]) -> None:
        if len(message) != 3 or not all(isinstance(v, int) for v in message[1:]):
            raise LinkError("BEAT is [term, n]")
        self._beat = message[2]
        self._contact(message[1])

    async def _commit(self, link: LinkStream, records: list[tuple[bytes, bytes]]) -> None:
        """Journal ``records`` durably, acknowledge them, hand them to the applier."""
        self.counters.bytes_received += sum(len(body) for body, _ in records)
        assert self._journal is not None
        while len(self._unapplied) >= MAX_UNAPPLIED or (
            self._journal.size > JOURNAL_LIMIT and self.applied != self.position
        ):
            await self._changed.wait()  # the applier is behind: wait, then empty the journal
        if (
            self._journal.size > JOURNAL_RESTART
            and self.applied != self.position
            and self._committed >= self.position.seq
        ):
            self._hurry = True  # (the applier can reach our position: all of it committed)
            if self._gathering is not None:
                self._gathering.cancel()
            try:
                while self.applied != self.position:
                    await self._changed.wait()
            finally:
                self._hurry = False
        empty_first = self.applied == self.position  # the store holds all the journal has
        try:
            checked = await trio.to_thread.run_sync(
                self._journal_records,
                self.position,
                records,
                empty_first,
                limiter=self._journal_limiter,
            )
        except StandbyFull as exc:
            await _tell_fault(link, str(exc))
            raise
        self.position = checked[-1].position
        self.counters.journal_syncs += 1
        self._unapplied.extend(checked)
        self._arrived.set()
        self._arrived = trio.Event()
        await self._ack(link)

    async def _other(self, link: LinkStream, message: list[Any]) -> None:
        if message[0] == "WITHDRAW":
            await self._withdraw(link, message)
            return
        if message[0] != "SNAPSHOT" or len(message) != 2 or not isinstance(message[1], int):
            raise LinkError(f"unexpected {message[0]!r:.40} from the primary")
        size = message[1]
        target = self.path.with_name(f"{DB_FILENAME}.incoming")
        try:
            expected = await self._receive_snapshot(link, target, size)
            self.position = await self._thread(self._install, target, expected)
        except OSError as exc:
            target.unlink(missing_ok=True)  # (what the disk took of it, back)
            if exc.errno not in _FULL_ERRNOS:
                raise LinkError(f"cannot write the snapshot: {exc}") from exc
            failure = StandbyFull(f"cannot write the snapshot: {exc}")
            await _tell_fault(link, str(failure))
            raise failure from exc
        self.counters.snapshots_installed += 1
        log.info("snapshot installed", seq=self.position.seq, size=size)
        self._changed.set()
        self._changed = trio.Event()
        await self._ack(link)

    async def _receive_snapshot(self, link: LinkStream, target: Path, size: int) -> Position:
        """The snapshot's chunks into ``target``; the position it announces."""
        received = 0
        with target.open("wb") as file:
            while True:
                part = await link.receive()
                if part[0] == "CHUNK" and len(part) == 2 and isinstance(part[1], bytes):
                    received += len(part[1])
                    if received > size:
                        raise LinkError("snapshot longer than announced")
                    await trio.to_thread.run_sync(file.write, part[1])
                    continue
                if part[0] == "SNAPSHOT_END" and len(part) == 4 and received == size:
                    expected = Position(int(part[1]), int(part[2]), bytes(part[3]))
                    break
                raise LinkError(f"bad snapshot frame {part[0]!r:.40} at byte {received}")
        self.counters.bytes_received += received
        return expected


async def _tell_fault(link: LinkStream, why: str) -> None:
    """``["FAULT", why]``: the primary drops this standby for that reason (bounded: the
    link is being closed anyway)."""
    with trio.move_on_after(1.0), contextlib.suppress(LinkError):
        await link.send(["FAULT", why[:500]])
