"""The store's SQL: a synchronous backend on one sqlite3 connection, run in a worker thread.

Everything SQL lives in ``SqliteBackend``, a plain class with no trio in it (the model test in
tests/test_store_model.py drives it directly); ``Store`` calls it in a worker thread, one call
at a time. trio's thread cache may run two calls on two different OS threads, which is why the
connection is opened with ``check_same_thread=False``; it is still never used by two threads
at once. On first creation the data directory is fsynced too, so the new file's directory
entry is durable.

Batches. ``run_batch`` runs the operations of one group commit in ONE transaction:
``BEGIN IMMEDIATE``, the operations, ``COMMIT``. A run of consecutive appends is stored with a
few multi-row INSERTs (``_append_run``): each statement is a round through the sqlite3 module
that needs the GIL the broker's trio thread is using, so 3 statements per append were costly
for both threads. A session at its quota (drop-oldest) follows each append with a
``trim_through``; such a run of appends and trims is stored the same way, each session's
trims coalesced into one (``_mixed_run``, which says why that is the same). If any operation
fails, the transaction is rolled back and run again with
each operation in its own ``SAVEPOINT`` (a failing one is rolled back alone and only its
caller gets the error).

Sequence numbers are the broker's: it assigns them from ``SessionRecord.next_seq`` upwards.
The backend keeps ``next_seq = max(next_seq, seq + 1)`` for every stored delivery and
``last_ack < next_seq`` always, so after a restart ``next_seq`` is past every seq it ever
stored. It does not check that a delivery's seq is above ``last_ack``; such a row stays
pending until a cumulative ack covers it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import cache, partial
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import msgpack

from broker.store.files import fsync_directory
from broker.store.pragmas import configure
from broker.store.records import (
    RetainedMessage,
    SessionRecord,
    StoredMessage,
    StoreError,
    StoreFull,
    open_failure,
    stored_principal,
    write_refused,
)
from broker.store.schema import check_or_create_schema

if TYPE_CHECKING:  # the outcomes of a batch are in the shape the group-commit queue resolves
    from broker.store.group_commit import Outcome

__all__ = ["Append", "RowCounts", "SqliteBackend", "Work"]

#: How long a statement waits for a lock held by another connection (an operator's shell).
BUSY_TIMEOUT_SECONDS = 5.0
#: The dedup table is pruned back to ``dedup_window`` ids once it holds this many more.
DEDUP_PRUNE_BATCH = 1_000
#: Rows per multi-row INSERT of a run of appends (8 parameters each, far below SQLite's limit).
INSERT_CHUNK = 64
#: Prepared statements the connection keeps: every multi-row INSERT size (1..INSERT_CHUNK) of
#: the two tables plus the rest, so that none is prepared again per batch.
STATEMENT_CACHE = 256


#: One operation of a batch: a backend method with its arguments bound (or an ``Append``).
Work = Callable[["SqliteBackend"], Any]
#: (sessions, messages, deliveries, dedup ids, duplicates refused): see ``SqliteBackend.counts``.
RowCounts = tuple[int, int, int, int, int]


class SqliteBackend:
    """The SQL work, synchronous, on one sqlite3 connection in autocommit mode.

    Mutating methods expect to run inside ``run_batch`` (a transaction with a savepoint per
    operation); read methods run anywhere. Counts of rows (``messages``, ``deliveries``, ...)
    are kept in memory so that ``Store.statistics()`` never touches the database; a rolled
    back operation or batch restores them.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: str,
        *,
        retention_seconds: float,
        dedup_window: int,
        clock: Callable[[], float],
    ) -> None:
        self.conn = conn
        self.path = path
        self.retention_seconds = retention_seconds
        self.dedup_window = dedup_window
        self.dedup_slack = min(DEDUP_PRUNE_BATCH, max(1, dedup_window // 10))
        self.clock = clock
        self.closed = False
        count = self._scalar
        self.sessions_count: int = count("SELECT count(*) FROM sessions")
        self.messages: int = count("SELECT count(*) FROM messages")
        self.deliveries: int = count("SELECT count(*) FROM deliveries")
        self.published: int = count("SELECT count(*) FROM published")
        self.duplicates = 0

    # -- opening and closing -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        retention_seconds: float = 0.0,
        dedup_window: int = 100_000,
        durable: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> SqliteBackend:
        """Open (creating if needed) and check the database at ``path``.

        ``durable=False`` (synchronous=OFF) is for tests that do not crash the machine.
        """
        path = os.fspath(path)
        created = not os.path.exists(path) or os.path.getsize(path) == 0
        try:
            conn = sqlite3.connect(
                path,
                timeout=BUSY_TIMEOUT_SECONDS,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=STATEMENT_CACHE,
            )
        except sqlite3.Error as exc:
            raise open_failure(path, "SQLite cannot open it", exc) from None
        try:
            configure(conn, path, durable=durable)
            check_or_create_schema(conn, path)
            backend = cls(
                conn,
                path,
                retention_seconds=retention_seconds,
                dedup_window=dedup_window,
                clock=clock,
            )
        except sqlite3.Error as exc:
            conn.close()
            raise open_failure(path, "database error", exc) from None
        except BaseException:
            conn.close()
            raise
        if created:
            fsync_directory(os.path.dirname(os.path.abspath(path)))
        return backend

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.close()

    # -- batches -------------------------------------------------------------------------------

    def run_batch(self, works: Sequence[Work]) -> tuple[bool, list[Outcome]]:
        """Run ``works`` in one transaction and commit; a failing operation is rolled back
        alone (the batch runs again with a savepoint per operation).

        Returns whether the transaction committed, and one outcome per operation. If the
        transaction itself fails (BEGIN or COMMIT, or SQLite rolled everything back after an
        I/O error), or the disk refused any write, every operation fails (``StoreFull``
        when the disk refused).
        """
        if self.closed:
            return self._fail_all(works, "the store is closed")
        conn = self.conn
        before = self.counts()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            return self._fail_all(works, f"cannot start a transaction ({exc})", exc)
        outcomes = self._run_optimistically(works, before)
        if outcomes is None:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                return self._fail_all(works, f"cannot restart the transaction ({exc})", exc)
            outcomes = self._run_isolated(works, before)
            if isinstance(outcomes, BaseException):
                return self._fail_all(works, f"transaction rolled back ({outcomes})", outcomes)
            full = next((v for ok, v in outcomes if not ok and isinstance(v, StoreFull)), None)
            if full is not None:
                # The disk refused one write: none of the batch is kept, so a failure that
                # depends on the disk is never in a record (a standby would replay it, and
                # its disk might take it).
                conn.execute("ROLLBACK")
                self._restore(before)
                return self._fail_all(works, f"transaction rolled back ({full})", full)
        try:
            self._prune_published()
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._restore(before)
            return self._fail_all(works, f"commit failed ({exc})", exc)
        return True, outcomes

    def _run_optimistically(self, works: Sequence[Work], before: RowCounts) -> list[Outcome] | None:
        """Run the batch without a savepoint per operation: nearly always nothing fails,
        and two statements per operation are a third of an append. If one fails, undo
        the whole batch and return None so that it runs again, isolated."""
        conn = self.conn
        outcomes: list[Outcome] = []
        try:
            index, count = 0, len(works)
            while index < count:
                if works[index].__class__ is not Append:
                    outcomes.append((True, works[index](self)))
                    index += 1
                    continue
                end = index + 1
                mixed = False
                while end < count:
                    work = works[end]
                    if work.__class__ is not Append:
                        if _trim_through_args(work) is None:
                            break
                        mixed = True
                    end += 1
                run = works[index:end]
                outcomes.extend(self._mixed_run(run) if mixed else self._append_run(run))  # type: ignore[arg-type]
                index = end
        except Exception:
            self._restore(before)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return None
        return outcomes

    def _run_isolated(
        self, works: Sequence[Work], before: RowCounts
    ) -> list[Outcome] | BaseException:
        """Each operation in its own savepoint, so a failing one is rolled back alone; when
        the whole transaction was lost (SQLite rolls back after a disk full or I/O error),
        the error that lost it."""
        conn = self.conn
        outcomes: list[Outcome] = []
        for work in works:
            counts = self.counts()
            try:
                conn.execute("SAVEPOINT op")
                value = work(self)
            except Exception as exc:
                self._restore(counts)
                if not self._rollback_savepoint():
                    self._restore(before)
                    return exc
                outcomes.append((False, _as_store_error(exc)))
            else:
                conn.execute("RELEASE op")
                outcomes.append((True, value))
        return outcomes

    def run(self, work: Work) -> Any:
        """Run one operation in its own transaction; return its value or raise its error."""
        _, ((ok, value),) = self.run_batch([work])
        if not ok:
            raise value
        return value

    def _rollback_savepoint(self) -> bool:
        """Undo the failed operation; False when the whole transaction is gone."""
        if not self.conn.in_transaction:
            return False
        try:
            self.conn.execute("ROLLBACK TO op")
            self.conn.execute("RELEASE op")
        except sqlite3.Error:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            return False
        return True

    def _fail_all(
        self, works: Sequence[Work], why: str, cause: BaseException | None = None
    ) -> tuple[bool, list[Outcome]]:
        """Every operation fails; with ``StoreFull`` when the disk refused the write."""
        kind = StoreFull if write_refused(cause) else StoreError
        return False, [(False, kind(f"{self.path}: not stored: {why}")) for _ in works]

    def counts(self) -> RowCounts:
        """(sessions, messages, deliveries, dedup ids, duplicates refused) as of now."""
        return (
            self.sessions_count,
            self.messages,
            self.deliveries,
            self.published,
            self.duplicates,
        )

    def _restore(self, counts: RowCounts) -> None:
        (
            self.sessions_count,
            self.messages,
            self.deliveries,
            self.published,
            self.duplicates,
        ) = counts

    def _prune_published(self) -> None:
        """Keep the newest ``dedup_window`` publisher ids, pruning ``dedup_slack`` at a time.

        Rows are only ever deleted from the oldest end, so rowids are consecutive and
        "rowid <= newest - window" leaves exactly the newest ``window`` ids.
        """
        if self.published <= self.dedup_window + self.dedup_slack:
            return
        cur = self.conn.execute(
            "DELETE FROM published WHERE rowid <= (SELECT max(rowid) FROM published) - ?",
            (self.dedup_window,),
        )
        self.published -= cur.rowcount

    def file_size(self) -> int:
        """Bytes of the database file and its WAL."""
        total = 0
        for name in (self.path, self.path + "-wal"):
            with suppress(OSError):
                total += os.stat(name).st_size
        return total

    # -- helpers -------------------------------------------------------------------------------

    def _scalar(self, sql: str, args: Sequence[Any] = ()) -> Any:
        row = self.conn.execute(sql, args).fetchone()
        return None if row is None else row[0]

    def _session_row(self, client_id: str, what: str) -> tuple[int, int]:
        row = self.conn.execute(
            "SELECT last_ack, next_seq FROM sessions WHERE client_id = ?", (client_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"{what}: unknown session {client_id!r}")
        return row

    def _remove_deliveries(self, client_id: str, condition: str, args: Sequence[Any]) -> int:
        """Delete the session's deliveries matching ``condition``, dereferencing their messages."""
        where = f"client_id = ?{condition}"
        params = (client_id, *args)
        self._dereference(where, params)
        removed = self.conn.execute(f"DELETE FROM deliveries WHERE {where}", params).rowcount
        self.deliveries -= removed
        return removed

    def _trim_seqs(self, client_id: str, seq: int) -> list[int]:
        """``trim_through``'s removal, returning the seqs it removed (in no order)."""
        where = "client_id = ? AND seq <= ?"
        params = (client_id, seq)
        self._dereference(where, params)
        rows = self.conn.execute(f"DELETE FROM deliveries WHERE {where} RETURNING seq", params)
        seqs = [removed for (removed,) in rows]
        self.deliveries -= len(seqs)
        return seqs

    def _dereference(self, where: str, params: Sequence[Any]) -> None:
        """The messages' side of deleting the deliveries ``where`` selects (before they go):
        ``refs`` down by how many of them point at each, deleted at 0 (without retention)."""
        execute = self.conn.execute
        counted = (
            f"(SELECT message, count(*) AS n FROM deliveries WHERE {where} GROUP BY message) AS d"
        )
        if self.retention_seconds <= 0:
            # Messages that lose their last reference go first, so that the UPDATE below
            # touches only the ones still needed (none, with one session): setting refs to 0
            # first would put each row into messages_unreferenced just before deleting it
            # (that UPDATE was half of an ack's cost).
            cur = execute(
                f"DELETE FROM messages WHERE rowid IN (SELECT d.message FROM {counted} "
                "JOIN messages AS m ON m.rowid = d.message WHERE m.refs <= d.n)",
                params,
            )
            self.messages -= cur.rowcount
        execute(
            f"UPDATE messages SET refs = refs - d.n FROM {counted} "
            "WHERE messages.rowid = d.message",
            params,
        )

    # -- sessions and filters ------------------------------------------------------------------

    def create_session(
        self, client_id: str, group: str | None, owner: str | None = None, cert: str | None = None
    ) -> SessionRecord:
        """The session ``client_id``, created (owned by ``owner``, whose connection presented
        the certificate ``cert``) unless it exists."""
        cur = self.conn.execute(
            "INSERT INTO sessions (client_id, grp, last_ack, next_seq, created_at, owner, cert) "
            "VALUES (?, ?, 0, 1, ?, ?, ?) ON CONFLICT (client_id) DO NOTHING",
            (client_id, group, self.clock(), owner, None if owner is None else cert or ""),
        )
        self.sessions_count += cur.rowcount
        record = self.session(client_id)
        assert record is not None
        return record

    def claim_session(self, client_id: str, owner: str) -> str | None:
        """Give an unowned session (stored before owners existed) to ``owner``; the owner
        it has afterwards (another one if it had one already)."""
        self._session_row(client_id, "claim_session")
        self.conn.execute(
            "UPDATE sessions SET owner = ? WHERE client_id = ? AND owner IS NULL",
            (owner, client_id),
        )
        return self._scalar("SELECT owner FROM sessions WHERE client_id = ?", (client_id,))

    def set_principal(self, client_id: str, cert: str | None) -> None:
        """The owner's latest connection presented the certificate ``cert`` (None: none)."""
        self._session_row(client_id, "set_principal")
        self.conn.execute(
            "UPDATE sessions SET cert = ? WHERE client_id = ?", (cert or "", client_id)
        )

    def drop_session(self, client_id: str) -> bool:
        if self._scalar("SELECT 1 FROM sessions WHERE client_id = ?", (client_id,)) is None:
            return False
        self._remove_deliveries(client_id, "", ())
        self.conn.execute("DELETE FROM sessions WHERE client_id = ?", (client_id,))  # cascades
        self.sessions_count -= 1
        return True

    def set_filters(self, client_id: str, filters: Sequence[tuple[str, str]]) -> None:
        self._session_row(client_id, "set_filters")
        self.conn.execute("DELETE FROM filters WHERE client_id = ?", (client_id,))
        self.conn.executemany(
            "INSERT OR IGNORE INTO filters (client_id, filter, dialect) VALUES (?, ?, ?)",
            [(client_id, flt, dialect) for flt, dialect in filters],
        )

    def add_filter(
        self, client_id: str, filter: str, dialect: str, options: bytes | None = None
    ) -> None:
        """Add the filter, or replace the options of the same (filter, dialect)."""
        self._session_row(client_id, "add_filter")
        self.conn.execute(
            "INSERT INTO filters (client_id, filter, dialect, options) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (client_id, filter, dialect) DO UPDATE SET options = excluded.options",
            (client_id, filter, dialect, options),
        )

    def remove_filter(self, client_id: str, filter: str, dialect: str) -> None:
        self._session_row(client_id, "remove_filter")
        self.conn.execute(
            "DELETE FROM filters WHERE client_id = ? AND filter = ? AND dialect = ?",
            (client_id, filter, dialect),
        )

    # -- messages ------------------------------------------------------------------------------

    def append(
        self,
        *,
        msg_id: str,
        topic: str,
        payload: bytes,
        headers: bytes | None,
        deliveries: Sequence[tuple[str, int]],
        publisher_msg_id: str | None,
        retain: bool = False,
        from_retained: bool = False,
        extra: bytes | None = None,
    ) -> bool:
        """Store the message once plus a delivery row each; False for a duplicate publish.

        ``headers`` arrives msgpack-encoded already (encoded in the caller's task). With
        ``retain`` the message also becomes its topic's retained message (an empty payload
        deletes that instead); a duplicate changes nothing. ``from_retained`` marks the stored
        message as a copy of a retained message (``StoredMessage.retained``). ``extra`` is
        stored as it is, with the message and with the retained copy.
        """
        execute = self.conn.execute
        now = self.clock()
        if publisher_msg_id is not None and self.dedup_window > 0:
            cur = execute(
                "INSERT INTO published (msg_id, at) VALUES (?, ?) ON CONFLICT (msg_id) DO NOTHING",
                (publisher_msg_id, now),
            )
            if cur.rowcount == 0:
                self.duplicates += 1
                return False
            self.published += 1
        if retain:
            self._retain(topic, msg_id, payload, headers, extra)
        if not deliveries and self.retention_seconds <= 0:
            return True  # nobody needs it: nothing to keep
        rowid = execute(
            "INSERT INTO messages "
            "(msg_id, topic, payload, headers, stored_at, refs, retained, extra) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (msg_id, topic, payload, headers, now, len(deliveries), int(from_retained), extra),
        ).lastrowid
        self.messages += 1
        try:
            if len(deliveries) == 1:
                ((client_id, seq),) = deliveries
                execute(
                    "INSERT INTO deliveries (client_id, seq, message) VALUES (?, ?, ?)",
                    (client_id, seq, rowid),
                )
            else:
                self.conn.executemany(
                    "INSERT INTO deliveries (client_id, seq, message) VALUES (?, ?, ?)",
                    [(client_id, seq, rowid) for client_id, seq in deliveries],
                )
        except sqlite3.IntegrityError as exc:
            raise self._append_failure(msg_id, deliveries, exc) from exc
        self.deliveries += len(deliveries)
        self.conn.executemany(
            "UPDATE sessions SET next_seq = ? WHERE client_id = ? AND next_seq < ?",
            [(seq + 1, client_id, seq + 1) for client_id, seq in deliveries],
        )
        return True

    def _append_run(self, run: Sequence[Append]) -> list[Outcome]:
        """``append`` for consecutive appends of a batch, with a few multi-row statements.

        Every statement is a round through the sqlite3 module that takes the GIL from the
        broker's trio thread; a run of N appends costs ~6 statements instead of 3 N. The
        outcome is the same as N ``append`` calls in order: duplicates are checked one by one
        first, rowids are assigned here (the write lock is ours), each session's ``next_seq``
        moves once to its maximum. Any error (unknown session, a seq stored twice) raises,
        and the caller runs the batch again one operation at a time.
        """
        now = self.clock()
        outcomes: list[Outcome] = []
        stored: list[Append] = []
        keep_all = self.retention_seconds > 0
        for op in run:
            if not self._admit(op, now):
                outcomes.append((True, False))
                continue
            outcomes.append((True, True))
            if op.deliveries or keep_all:
                stored.append(op)
        if stored:
            self._store_messages(stored, now)
        return outcomes

    def _admit(self, op: Append, now: float) -> bool:
        """An append's first half: False for a duplicate publish (nothing else done); else
        its publisher id is remembered and, with ``retain``, its topic's retained message
        set. Neither touches messages or deliveries."""
        if op.publisher_msg_id is not None and self.dedup_window > 0:
            cur = self.conn.execute(
                "INSERT INTO published (msg_id, at) VALUES (?, ?) ON CONFLICT (msg_id) DO NOTHING",
                (op.publisher_msg_id, now),
            )
            if cur.rowcount == 0:
                self.duplicates += 1
                return False
            self.published += 1
        if op.retain:
            self._retain(op.topic, op.msg_id, op.payload, op.headers, op.extra)
        return True

    def _store_messages(self, stored: Sequence[Append], now: float) -> None:
        """An append's second half for admitted appends in order: their messages (rowids
        from max(rowid) + 1 up, as one INSERT each would take), deliveries and next_seqs."""
        execute = self.conn.execute
        rowid = (self._scalar("SELECT max(rowid) FROM messages") or 0) + 1
        messages: list[Any] = []
        deliveries: list[Any] = []
        next_seqs: dict[str, int] = {}
        copies: list[int] = []  # rowids of copies of retained messages (rare: flagged apart)
        for op in stored:
            refs = len(op.deliveries)
            messages += (rowid, op.msg_id, op.topic, op.payload, op.headers, now, refs, op.extra)
            if op.from_retained:
                copies.append(rowid)
            for client_id, seq in op.deliveries:
                deliveries += (client_id, seq, rowid)
                if next_seqs.get(client_id, 0) <= seq:
                    next_seqs[client_id] = seq + 1
            rowid += 1
        self._insert_rows(
            "INSERT INTO messages (rowid, msg_id, topic, payload, headers, stored_at, refs, extra) "
            "VALUES ",
            8,
            messages,
        )
        self.messages += len(stored)
        if copies:
            execute(
                f"UPDATE messages SET retained = 1 WHERE rowid IN ({','.join('?' * len(copies))})",
                copies,
            )
        self._insert_rows("INSERT INTO deliveries (client_id, seq, message) VALUES ", 3, deliveries)
        self.deliveries += len(deliveries) // 3
        execute_many = self.conn.executemany
        execute_many(
            "UPDATE sessions SET next_seq = ? WHERE client_id = ? AND next_seq < ?",
            [(next_seq, client_id, next_seq) for client_id, next_seq in next_seqs.items()],
        )

    def _mixed_run(self, run: Sequence[Work]) -> list[Outcome]:
        """``_append_run`` for a run of appends and ``trim_through`` works (a session at its
        quota, drop-oldest: each append is followed by a trim of each full session).

        The run is cut into segments; a segment's stored appends are inserted together
        (``_store_messages``), then each session's trims of the segment as ONE removal
        through the highest seq they name. The same rows as running the works one by one:

        - Deliveries: one by one, a delivery (c, s) goes iff some trim of c at or above s
          runs while it is there; coalesced, iff s <= the highest trim of c. The same for
          the deliveries there before the segment; for one appended in it, a segment is cut
          before an append that has (c, s) with s <= a trim of c earlier in the segment, so
          the highest trim of c at or above s comes after the append either way.
        - Messages: a removal lowers a message's refs by the deliveries it removes that
          point at it and deletes the message at 0 (without retention); refs only go down
          and no work brings a deleted message back, so only the total matters.
        - Rowids: one by one, an append takes max(rowid) + 1; ``_store_messages`` numbers a
          segment's messages on from max(rowid) + 1 in order. That agrees as long as no
          trim deletes the newest message before a later append: a trim joins the segment
          only when the segment's newest stored append has no delivery of its session at or
          below its seq (so that message keeps a reference); any other trim ends the segment
          and runs alone, in its place.
        - Other works: ``_admit`` (publisher ids, retained messages) touches no table a trim
          does, so it runs in order as the run is read; trims of different sessions touch
          different deliveries and only lower refs, so their order does not matter.

        Outcomes are per work, as one by one: a trim's count is the number of removed seqs
        its session's first trim at or above them would have removed (``_flush``). An error
        (unknown session, a seq stored twice) raises: the batch runs again one by one.
        """
        now = self.clock()
        keep_all = self.retention_seconds > 0
        outcomes: list[Outcome] = [(True, None)] * len(run)
        stored: list[Append] = []  # the segment's appends that store a message, in order
        trims: dict[str, list[tuple[int, int]]] = {}  # session -> its (index, seq) trims
        reach: dict[str, int] = {}  # session -> the highest seq its trims in ``trims`` name
        for index, work in enumerate(run):
            if work.__class__ is Append:
                op: Append = work  # type: ignore[assignment]
                if not self._admit(op, now):
                    outcomes[index] = (True, False)
                    continue
                outcomes[index] = (True, True)
                if not (op.deliveries or keep_all):
                    continue
                if reach and any(
                    client_id in reach and seq <= reach[client_id]
                    for client_id, seq in op.deliveries
                ):
                    self._flush(stored, trims, now, outcomes)
                    stored, trims, reach = [], {}, {}
                stored.append(op)
                continue
            client_id, seq = _trim_through_args(work)  # type: ignore[misc]
            if not stored or any(
                client == client_id and kept <= seq for client, kept in stored[-1].deliveries
            ):
                self._flush(stored, trims, now, outcomes)
                stored, trims, reach = [], {}, {}
                outcomes[index] = (True, self.trim_through(client_id, seq))
                continue
            trims.setdefault(client_id, []).append((index, seq))
            if client_id not in reach or seq > reach[client_id]:
                reach[client_id] = seq
        self._flush(stored, trims, now, outcomes)
        return outcomes

    def _flush(
        self,
        stored: list[Append],
        trims: dict[str, list[tuple[int, int]]],
        now: float,
        outcomes: list[Outcome],
    ) -> None:
        """Store a segment of ``_mixed_run``: its messages, then each session's trims as one
        removal, each trim's outcome (at its index) the count it removes one by one."""
        if stored:
            self._store_messages(stored, now)
        for client_id, marks in trims.items():
            self._session_row(client_id, "trim")
            # highest[k]: the highest seq trimmed by the session's first k + 1 trims. A seq
            # goes with its session's first trim at or above it: the first k with
            # highest[k] >= seq (that trim comes after the seq's append: see _mixed_run).
            highest = list(accumulate((seq for _, seq in marks), max))
            removed = self._trim_seqs(client_id, highest[-1])
            if len(marks) == 1:
                outcomes[marks[0][0]] = (True, len(removed))
                continue
            counts = [0] * len(marks)
            for seq in removed:
                counts[bisect_left(highest, seq)] += 1
            for (index, _), count in zip(marks, counts, strict=True):
                outcomes[index] = (True, count)

    def _retain(
        self, topic: str, msg_id: str, payload: bytes, headers: bytes | None, extra: bytes | None
    ) -> None:
        """Make this the retained message of ``topic``; an empty payload deletes it."""
        if payload:
            self.conn.execute(
                "INSERT INTO retained (topic, msg_id, payload, headers, extra) "
                "VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (topic) DO UPDATE SET msg_id = excluded.msg_id, "
                "payload = excluded.payload, headers = excluded.headers, extra = excluded.extra",
                (topic, msg_id, payload, headers, extra),
            )
        else:
            self.conn.execute("DELETE FROM retained WHERE topic = ?", (topic,))

    def _insert_rows(self, insert: str, width: int, values: list[Any]) -> None:
        """Insert ``values`` (rows of ``width`` flattened) with multi-row INSERTs."""
        execute = self.conn.execute
        step = width * INSERT_CHUNK
        for start in range(0, len(values), step):
            chunk = values[start : start + step]
            execute(_values_sql(insert, width, len(chunk) // width), chunk)

    def _append_failure(
        self, msg_id: str, deliveries: Sequence[tuple[str, int]], exc: sqlite3.IntegrityError
    ) -> StoreError:
        clients = sorted({client_id for client_id, _ in deliveries})
        known = {
            client_id
            for client_id in clients
            if self._scalar("SELECT 1 FROM sessions WHERE client_id = ?", (client_id,))
        }
        unknown = [client_id for client_id in clients if client_id not in known]
        if unknown:
            return StoreError(f"append {msg_id!r}: unknown session(s) {', '.join(unknown)}")
        if "UNIQUE" in str(exc):
            return StoreError(f"append {msg_id!r}: a (client_id, seq) is already stored ({exc})")
        return StoreError(f"append {msg_id!r}: {exc}")

    def ack(self, client_id: str, seq: int) -> int:
        last_ack, next_seq = self._session_row(client_id, "ack")
        removed = self._remove_deliveries(client_id, " AND seq <= ?", (seq,))
        if seq > last_ack:
            self.conn.execute(
                "UPDATE sessions SET last_ack = ?, next_seq = ? WHERE client_id = ?",
                (seq, max(next_seq, seq + 1), client_id),
            )
        return removed

    def ack_one(self, client_id: str, seq: int) -> bool:
        last_ack, next_seq = self._session_row(client_id, "ack_one")
        query_lowest = "SELECT min(seq) FROM deliveries WHERE client_id = ?"
        lowest = self._scalar(query_lowest, (client_id,))
        if not self._remove_deliveries(client_id, " AND seq = ?", (seq,)):
            return False
        if seq == lowest:
            # Everything below the lowest delivery still pending is done (every seq the broker
            # assigned is below next_seq, and stored in order).
            following = self._scalar(query_lowest, (client_id,))
            watermark = next_seq - 1 if following is None else following - 1
            if watermark > last_ack:
                self.conn.execute(
                    "UPDATE sessions SET last_ack = ? WHERE client_id = ?", (watermark, client_id)
                )
        return True

    def trim(self, client_id: str, keep_messages: int) -> int:
        if keep_messages < 0:
            raise ValueError(f"keep_messages must be >= 0, got {keep_messages}")
        self._session_row(client_id, "trim")
        newest_dropped = self._scalar(
            "SELECT seq FROM deliveries WHERE client_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
            (client_id, keep_messages),
        )
        if newest_dropped is None:
            return 0
        return self._remove_deliveries(client_id, " AND seq <= ?", (newest_dropped,))

    def trim_through(self, client_id: str, seq: int) -> int:
        self._session_row(client_id, "trim")
        return self._remove_deliveries(client_id, " AND seq <= ?", (seq,))

    def sweep(self) -> int:
        """Delete unreferenced messages older than ``retention_seconds``; how many."""
        cur = self.conn.execute(
            "DELETE FROM messages WHERE refs <= 0 AND stored_at <= ?",
            (self.clock() - self.retention_seconds,),
        )
        self.messages -= cur.rowcount
        return cur.rowcount

    # -- reads ---------------------------------------------------------------------------------

    def session(self, client_id: str) -> SessionRecord | None:
        row = self.conn.execute(
            "SELECT client_id, grp, last_ack, next_seq, owner, cert FROM sessions "
            "WHERE client_id = ?",
            (client_id,),
        ).fetchone()
        if row is None:
            return None
        *row, owner, cert = row
        pending, pending_bytes = self.conn.execute(
            "SELECT count(*), coalesce(sum(length(m.payload)), 0) FROM deliveries AS d "
            "LEFT JOIN messages AS m ON m.rowid = d.message WHERE d.client_id = ?",
            (client_id,),
        ).fetchone()
        filters = []
        options = {}
        for flt, dialect, opts in self.conn.execute(
            "SELECT filter, dialect, options FROM filters WHERE client_id = ? "
            "ORDER BY filter, dialect",
            (client_id,),
        ):
            filters.append((flt, dialect))
            if opts is not None:
                options[flt, dialect] = opts
        return SessionRecord(
            *row,
            tuple(filters),
            pending,
            pending_bytes,
            options,
            owner,
            stored_principal(owner, cert),
        )

    def sessions(self) -> list[SessionRecord]:
        filters: dict[str, list[tuple[str, str]]] = {}
        options: dict[str, dict[tuple[str, str], bytes]] = {}
        for client_id, flt, dialect, opts in self.conn.execute(
            "SELECT client_id, filter, dialect, options FROM filters "
            "ORDER BY client_id, filter, dialect"
        ):
            filters.setdefault(client_id, []).append((flt, dialect))
            if opts is not None:
                options.setdefault(client_id, {})[flt, dialect] = opts
        rows = self.conn.execute(
            "SELECT s.client_id, s.grp, s.last_ack, s.next_seq, count(d.seq), "
            "coalesce(sum(length(m.payload)), 0), s.owner, s.cert FROM sessions AS s "
            "LEFT JOIN deliveries AS d ON d.client_id = s.client_id "
            "LEFT JOIN messages AS m ON m.rowid = d.message "
            "GROUP BY s.client_id ORDER BY s.client_id"
        )
        return [
            SessionRecord(
                client_id,
                group,
                last_ack,
                next_seq,
                tuple(filters.get(client_id, ())),
                n,
                size,
                options.get(client_id, {}),
                owner,
                stored_principal(owner, cert),
            )
            for client_id, group, last_ack, next_seq, n, size, owner, cert in rows
        ]

    def pending(self, client_id: str, after_seq: int, limit: int) -> list[StoredMessage]:
        if limit <= 0:
            return []
        rows = self.conn.execute(
            "SELECT d.seq, m.msg_id, m.topic, m.payload, m.headers, m.retained, m.extra "
            "FROM deliveries AS d JOIN messages AS m ON m.rowid = d.message "
            "WHERE d.client_id = ? AND d.seq > ? ORDER BY d.seq LIMIT ?",
            (client_id, after_seq, limit),
        )
        unpack = msgpack.unpackb
        return [
            StoredMessage(
                seq,
                msg_id,
                topic,
                payload,
                None if headers is None else unpack(headers),
                bool(retained),
                extra,
            )
            for seq, msg_id, topic, payload, headers, retained, extra in rows
        ]

    def recent_publisher_ids(self, limit: int) -> list[str]:
        """The newest ``limit`` publisher message ids stored, oldest first."""
        rows = self.conn.execute(
            "SELECT msg_id FROM published ORDER BY rowid DESC LIMIT ?", (limit,)
        ).fetchall()
        return [row[0] for row in reversed(rows)]

    def retained(self) -> list[RetainedMessage]:
        """Every retained message, by topic."""
        rows = self.conn.execute(
            "SELECT topic, msg_id, payload, headers, extra FROM retained ORDER BY topic"
        )
        unpack = msgpack.unpackb
        return [
            RetainedMessage(
                topic, msg_id, payload, None if headers is None else unpack(headers), extra
            )
            for topic, msg_id, payload, headers, extra in rows
        ]


@cache
def _values_sql(insert: str, width: int, rows: int) -> str:
    row = "(" + ",".join("?" * width) + ")"
    return insert + ",".join([row] * rows)


class Append:
    """One queued ``append``: a plain object rather than a partial, so that a batch can
    recognise a run of them and store it with multi-row statements (``_append_run``)."""

    __slots__ = (
        "deliveries",
        "extra",
        "from_retained",
        "headers",
        "msg_id",
        "payload",
        "publisher_msg_id",
        "retain",
        "topic",
    )

    def __init__(
        self,
        msg_id: str,
        topic: str,
        payload: bytes,
        headers: bytes | None,
        deliveries: Sequence[tuple[str, int]],
        publisher_msg_id: str | None,
        retain: bool = False,
        from_retained: bool = False,
        extra: bytes | None = None,
    ) -> None:
        self.msg_id = msg_id
        self.topic = topic
        self.payload = payload
        self.headers = headers  # msgpack-encoded already
        self.deliveries = deliveries
        self.publisher_msg_id = publisher_msg_id
        self.retain = retain  # also the topic's retained message (empty payload: delete it)
        self.from_retained = from_retained  # a copy of a retained message, for a subscriber
        self.extra = extra  # stored as it is (broker.core.extra), None for nothing

    def __call__(self, backend: SqliteBackend) -> bool:
        return backend.append(
            msg_id=self.msg_id,
            topic=self.topic,
            payload=self.payload,
            headers=self.headers,
            deliveries=self.deliveries,
            publisher_msg_id=self.publisher_msg_id,
            retain=self.retain,
            from_retained=self.from_retained,
            extra=self.extra,
        )


def _trim_through_args(work: Work) -> tuple[str, int] | None:
    """(client_id, seq) of a queued ``trim_through`` (the store's and a record's partial),
    None for any other work."""
    if work.__class__ is not partial:
        return None
    if work.func is not SqliteBackend.trim_through or work.args:  # type: ignore[attr-defined]
        return None
    keywords = work.keywords  # type: ignore[attr-defined]
    if len(keywords) != 2:
        return None
    try:
        return keywords["client_id"], keywords["seq"]
    except KeyError:
        return None


def _as_store_error(exc: Exception) -> Exception:
    """sqlite3 errors become StoreError (chained); our own and programming errors pass as is."""
    if isinstance(exc, sqlite3.Error):
        kind = StoreFull if write_refused(exc) else StoreError
        error = kind(f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error
    return exc
