"""The trio face of the store: ``Store`` opens the data directory and queues every change.

``Store`` reaches the SQLite backend (sqlite.py) only in a worker thread holding one
``CapacityLimiter(1)``, so exactly one call touches the connection at any time and the
limiter's hand-over orders one call after the other. Reads go through
``trio.to_thread.run_sync(..., limiter=...)``. Every change is an operation on one
group-commit queue (group_commit.py): its writer commits a batch as one transaction, taking
the limiter without a checkpoint when it is free and starting the thread at once
(threads.py). Acks are lazy operations: no caller waits for them, so a batch of nothing but
acks waits a moment for the next appends and shares their fsync. With ``retention_seconds``
the same writer sweeps old unreferenced messages, with a batch or alone when nothing else is
queued.

A cancelled ``append`` may have been stored (its operation stays queued); the broker must treat
that as at-least-once (the publisher gets no confirmation and may resend; the publisher
message id drops the copy).

Shutdown. Leaving ``async with Store.open(...)`` (or calling ``aclose``) stops accepting
operations, lets the writer commit everything already queued within a shielded
``move_on_after(CLEANUP_TIMEOUT)`` (group_commit.py), fails whatever is left with
``StoreError`` and closes the connection (which checkpoints the WAL into the main file).
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, NoReturn, Protocol

import msgpack
import trio

from broker.histogram import Histogram
from broker.store.files import lock_directory
from broker.store.group_commit import GroupCommit, OnDone, Outcome, Pending, Settle
from broker.store.records import (
    NotConfirmed,
    RetainedMessage,
    SessionRecord,
    StoredMessage,
    StoreError,
    StoreStatistics,
)
from broker.store.schema import DB_FILENAME
from broker.store.sqlite import Append, RowCounts, SqliteBackend, Work
from broker.store.threads import run_sync_at_once

__all__ = ["MAX_BATCH", "MAX_QUEUED", "Replication", "Store"]

#: Most operations in one transaction: bounds how long one commit (and a reader behind it) takes.
MAX_BATCH = 5_000
#: Operations that may wait for the writer before callers wait for room.
MAX_QUEUED = 10_000


class Replication(Protocol):
    """What the store asks of a replication stream (``broker.ha.shipping.Shipper``)."""

    def prepare(self, works: list[Work]) -> Any: ...

    def adopt(self, record: Any) -> None: ...

    def discard(self, record: Any) -> None: ...

    async def durable(self, record: Any) -> str | None: ...

    def statistics(self) -> dict[str, int | float]: ...


def _raise_single(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Re-raise the one exception in ``group`` as itself (keeping its context), else the group.

    The store's nursery wraps whatever leaves the ``async with`` body; a caller that wrote
    ``except ValueError`` around it should still catch its own ValueError. ``Cancelled`` only
    counts when nothing else is there (if the writer task failed, the body was cancelled
    because of it; the failure is the news), as in trio's own ``as_safe_channel``.
    """
    others = [exc for exc in group.exceptions if not isinstance(exc, trio.Cancelled)]
    if len(others) > 1:
        raise group
    only = others[0] if others else group.exceptions[0]
    context = only.__context__
    try:
        raise only
    finally:
        only.__context__ = context
        del only, context


class Store:
    """Durable sessions on SQLite; see the module docstring. Create with ``Store.open``.

    Every async method may be called from many tasks at once. Mutations return once the
    transaction holding them has committed (durably); reads see everything committed before
    they started. Mutations naming an unknown session raise ``StoreError`` (``drop_session``
    returns False); reads of an unknown session return ``None`` / ``[]``.
    """

    def __init__(
        self,
        backend: SqliteBackend,
        limiter: trio.CapacityLimiter,
        *,
        max_batch: int,
        max_queued: int,
    ) -> None:
        self._backend = backend
        self._limiter = limiter
        retention = backend.retention_seconds
        self._sweep_interval = min(max(retention / 2, 0.05), 60.0) if retention > 0 else math.inf
        self._next_sweep = 0.0
        self._queue = GroupCommit(
            self._run_batch,
            name=backend.path,
            noun="store",
            error=StoreError,
            max_batch=max_batch,
            max_queued=max_queued,
            idle_interval=self._sweep_interval,
            refused=NotConfirmed,
        )
        # append_nowait is the broker's hot path (one call per PUB): bound once, not per call.
        self._enqueue_nowait = self._queue.enqueue_nowait
        # statistics
        self._last_commit_ms = 0.0
        #: Seconds each batch took to commit in the worker thread (one observation per batch).
        self.commit_seconds = Histogram()
        self._db_size = backend.file_size()
        # Row counts as of the last commit (the backend's own move during a batch).
        self._rows = backend.counts()
        #: The primary's replication (broker/ha/shipping.py), None for a store of its own.
        self._replication: Replication | None = None

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        retention_seconds: float = 0.0,
        dedup_window: int = 100_000,
        max_batch: int = MAX_BATCH,
        max_queued: int = MAX_QUEUED,
    ) -> AsyncIterator[Store]:
        """``async with Store.open(data_dir) as store:`` opens ``<data_dir>/topiary.db``.

        The store's writer task lives in a nursery owned by this context manager; leaving it
        flushes what is queued (shielded, at most ``CLEANUP_TIMEOUT`` seconds) and closes.
        ``retention_seconds`` keeps unreferenced messages that long; ``dedup_window`` is how
        many publisher message ids are remembered (0: no duplicate filtering).
        """
        if retention_seconds < 0 or not math.isfinite(retention_seconds):
            raise ValueError(f"retention_seconds must be finite and >= 0: {retention_seconds}")
        if dedup_window < 0:
            raise ValueError(f"dedup_window must be >= 0, got {dedup_window}")
        if max_batch < 1 or max_queued < 1:
            raise ValueError("max_batch and max_queued must be >= 1")
        directory = Path(data_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create data directory {directory}: {exc.strerror}") from None
        lock = lock_directory(directory)
        try:
            async with cls._open_locked(
                directory, retention_seconds, dedup_window, max_batch, max_queued
            ) as store:
                yield store
        finally:
            lock.close()  # closing the file releases the lock

    @classmethod
    @asynccontextmanager
    async def _open_locked(
        cls,
        directory: Path,
        retention_seconds: float,
        dedup_window: int,
        max_batch: int,
        max_queued: int,
    ) -> AsyncIterator[Store]:
        limiter = trio.CapacityLimiter(1)
        backend = await trio.to_thread.run_sync(
            partial(
                SqliteBackend.open,
                directory / DB_FILENAME,
                retention_seconds=retention_seconds,
                dedup_window=dedup_window,
            ),
            limiter=limiter,
        )
        try:
            store = cls(backend, limiter, max_batch=max_batch, max_queued=max_queued)
            try:
                async with trio.open_nursery() as nursery:
                    store._queue.start(nursery)
                    try:
                        yield store
                    finally:
                        await store.aclose()
            except BaseExceptionGroup as group:
                _raise_single(group)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(backend.close, limiter=limiter)

    async def aclose(self) -> None:
        """Stop taking operations, commit what is queued (bounded, shielded), stop the writer.

        Leaving ``async with Store.open(...)`` calls this; calling it earlier is allowed, and
        calling it twice is harmless. Operations still queued after ``CLEANUP_TIMEOUT`` seconds
        fail with ``StoreError``. The connection itself closes when the ``async with`` ends.
        """
        await self._queue.aclose()

    # -- committing ----------------------------------------------------------------------------

    async def _run_batch(
        self, works: list[Work]
    ) -> tuple[bool, list[Outcome]] | tuple[bool, list[Outcome], Settle] | None:
        """The queue's ``run``: commit ``works`` (plus a sweep when one is due) in one
        transaction in the worker thread; None when there is nothing to do."""
        if math.isfinite(self._sweep_interval) and trio.current_time() >= self._next_sweep:
            self._next_sweep = trio.current_time() + self._sweep_interval
            works.append(SqliteBackend.sweep)
        if not works:
            return None
        replication = self._replication
        committed, outcomes, elapsed, size, rows, record = await run_sync_at_once(
            self._run_in_thread, works, replication, limiter=self._limiter, borrower=self
        )
        self._last_commit_ms = elapsed * 1000.0
        self.commit_seconds.observe(elapsed)
        self._db_size = size
        self._rows = rows
        if replication is not None and record is not None and not committed:
            replication.discard(record)  # prepared (maybe sent), not in our store
        if replication is not None and committed:
            # No checkpoint before adopt: the record is the newest before anyone can look.
            replication.adopt(record)
            # The outcomes go out once the standby has the batch (sync), while the writer
            # commits the next batches (group_commit.py, "Settling").
            return committed, outcomes, partial(replication.durable, record)
        return committed, outcomes

    def _run_in_thread(
        self, works: list[Work], replication: Replication | None
    ) -> tuple[bool, list[Outcome], float, int, RowCounts, Any]:
        start = time.perf_counter()
        record = None
        if replication is not None:
            try:
                record = replication.prepare(works)
            except StoreError as exc:  # e.g. a fenced primary: nothing of the batch is stored
                outcomes: list[Outcome] = [(False, exc) for _ in works]
                return False, outcomes, 0.0, self._db_size, self._rows, None
        committed, outcomes = self._backend.run_batch(works)
        elapsed = time.perf_counter() - start
        size, counts = self._backend.file_size(), self._backend.counts()
        return committed, outcomes, elapsed, size, counts, record

    # -- replication (broker/ha) ---------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The data directory."""
        return Path(self._backend.path).parent

    def attach_replication(self, replication: Replication, clock: Callable[[], float]) -> None:
        """Give every later batch to ``replication`` (``prepare`` in the worker thread before
        the transaction, ``adopt`` and ``durable`` after the commit, before the batch's
        outcomes are delivered, ``discard`` instead when the transaction failed); ``clock``
        stamps the batch's rows (one time per batch, which the record carries, so a standby
        stores the same values)."""
        self._backend.clock = clock
        self._replication = replication

    def replication_statistics(self) -> dict[str, int | float] | None:
        """The replication's counters (``broker.ha.shipping.HELP``), None when not replicating."""
        return None if self._replication is None else self._replication.statistics()

    async def read(self, work: Work) -> Any:
        """Run a read-only ``work`` on the backend in the worker thread."""
        return await self._read(work)

    async def backup(self, path: Path) -> None:
        """A consistent copy of the database at ``path`` (SQLite's backup API), taken between
        two commits: the writer waits for the copy (about a second per GB)."""

        def copy(backend: SqliteBackend) -> None:
            target = sqlite3.connect(path)
            try:
                backend.conn.backup(target)
                target.execute("PRAGMA journal_mode=DELETE")
            finally:
                target.close()
            with open(path, "rb+") as file:
                os.fsync(file.fileno())

        await self._read(copy)

    async def _read(self, work: Work) -> Any:
        if self._queue.closing:
            raise StoreError(f"{self._backend.path}: the store is closed")
        try:
            return await trio.to_thread.run_sync(work, self._backend, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._backend.path}: read failed: {exc}") from exc

    # -- the API -------------------------------------------------------------------------------

    async def create_session(
        self, client_id: str, group: str | None, owner: str | None = None, cert: str | None = None
    ) -> SessionRecord:
        """Create the session (owned by ``owner``, whose connection presented the certificate
        subject ``cert``), or return the existing one unchanged (its group, owner and
        principal included)."""
        return await self._queue.submit(
            partial(
                SqliteBackend.create_session,
                client_id=client_id,
                group=group,
                owner=owner,
                cert=cert,
            )
        )

    async def set_principal(self, client_id: str, cert: str | None) -> None:
        """The session's owner connected presenting the certificate subject ``cert`` (None:
        none): whose rules the session has while away (``SessionRecord.principal``)."""
        await self._queue.submit(
            partial(SqliteBackend.set_principal, client_id=client_id, cert=cert)
        )

    async def claim_session(self, client_id: str, owner: str) -> str | None:
        """Give the session to ``owner`` if it has no owner; the owner it has afterwards."""
        return await self._queue.submit(
            partial(SqliteBackend.claim_session, client_id=client_id, owner=owner)
        )

    async def drop_session(self, client_id: str) -> bool:
        """Delete the session, its filters and deliveries; False if there was none."""
        return await self._queue.submit(partial(SqliteBackend.drop_session, client_id=client_id))

    async def sessions(self) -> list[SessionRecord]:
        """Every session, ordered by client id."""
        return await self._read(SqliteBackend.sessions)

    async def session(self, client_id: str) -> SessionRecord | None:
        return await self._read(partial(SqliteBackend.session, client_id=client_id))

    async def set_filters(self, client_id: str, filters: Iterable[tuple[str, str]]) -> None:
        """Replace the session's filters with ``filters`` ((filter, dialect) pairs)."""
        pairs = tuple((flt, dialect) for flt, dialect in filters)
        await self._queue.submit(
            partial(SqliteBackend.set_filters, client_id=client_id, filters=pairs)
        )

    async def add_filter(
        self, client_id: str, filter: str, dialect: str, options: bytes | None = None
    ) -> None:
        """Add (filter, dialect) to the session's filters with ``options`` (opaque bytes a
        front end keeps with it, read back in ``SessionRecord.filter_options``); the same
        filter again replaces its options (None clears them)."""
        await self._queue.submit(
            partial(
                SqliteBackend.add_filter,
                client_id=client_id,
                filter=filter,
                dialect=dialect,
                options=None if options is None else bytes(options),
            )
        )

    async def remove_filter(self, client_id: str, filter: str, dialect: str) -> None:
        await self._queue.submit(
            partial(
                SqliteBackend.remove_filter, client_id=client_id, filter=filter, dialect=dialect
            )
        )

    async def append(
        self,
        *,
        msg_id: str,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        deliveries: Sequence[tuple[str, int]],
        publisher_msg_id: str | None = None,
        retain: bool = False,
        from_retained: bool = False,
        extra: bytes | None = None,
    ) -> bool:
        """Store a message once and one pending delivery per (client_id, seq); durable on return.

        Returns False, storing nothing, when ``publisher_msg_id`` is among the newest
        ``dedup_window`` ids already stored (a duplicate publish). Each delivery's session must
        exist (else ``StoreError``, nothing stored) and its ``next_seq`` becomes at least
        ``seq + 1``. With no deliveries the message is not kept (unless retention is on), but
        its publisher id is. If the caller is cancelled while waiting, the message may still
        have been stored (at-least-once). With ``retain`` the message also becomes the
        retained message of its topic (an empty payload deletes the topic's instead), in the
        same transaction; a duplicate changes nothing. ``from_retained`` marks the stored
        message as a copy of a retained message (its ``StoredMessage.retained``). ``extra``
        (``broker.core.extra.pack_extra``) is stored with the message and with the retained
        copy, and read back as ``StoredMessage.extra`` / ``RetainedMessage.extra``.
        """
        return await self._queue.submit(
            Append(
                msg_id,
                topic,
                bytes(payload),
                None if headers is None else msgpack.packb(headers),
                tuple((client_id, seq) for client_id, seq in deliveries),
                publisher_msg_id,
                retain,
                from_retained,
                extra,
            )
        )

    async def begin_append(
        self,
        *,
        msg_id: str,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        deliveries: Sequence[tuple[str, int]],
        publisher_msg_id: str | None = None,
        on_done: OnDone | None = None,
        retain: bool = False,
        from_retained: bool = False,
        extra: bytes | None = None,
    ) -> Pending:
        """``append``, returning once it is queued: the broker's reader must not wait for a
        commit per PUB, or there would be nothing to group. ``await handle.wait()`` gives
        ``append``'s result once committed; ``on_done(error)`` is called as soon as the
        outcome is known. Operations still commit in call order."""
        blob = None if headers is None else msgpack.packb(headers)
        work = Append(
            msg_id,
            topic,
            bytes(payload),
            blob,
            tuple(deliveries),
            publisher_msg_id,
            retain,
            from_retained,
            extra,
        )
        return await self._queue.enqueue(work, on_done)

    def append_nowait(
        self,
        msg_id: str,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        deliveries: tuple[tuple[str, int], ...],
        publisher_msg_id: str | None,
        on_done: OnDone | None = None,
        retain: bool = False,
        from_retained: bool = False,
        extra: bytes | None = None,
        trims: Sequence[tuple[str, int]] | None = None,
    ) -> Pending:
        """``begin_append`` without a checkpoint when the queue has room (the broker's reader
        queues one per PUB between two reads); ``trio.WouldBlock``, nothing queued, when it
        is full. ``trims`` (client id, seq) queue a ``begin_trim_through`` each right behind
        the append (a quota's drop-oldest), all or none."""
        blob = None if headers is None else msgpack.packb(headers)
        work = Append(
            msg_id,
            topic,
            bytes(payload),
            blob,
            deliveries,
            publisher_msg_id,
            retain,
            from_retained,
            extra,
        )
        if trims:
            ops: list[tuple[Work, OnDone | None]] = [(work, on_done)]
            ops.extend(
                (partial(SqliteBackend.trim_through, client_id=client_id, seq=seq), None)
                for client_id, seq in trims
            )
            return self._queue.enqueue_all_nowait(ops)[0]
        return self._enqueue_nowait(work, on_done)

    async def begin_ack(self, client_id: str, seq: int) -> Pending:
        """``ack``, returning once queued (the broker does not wait for ack commits).

        Lazy: the commit may wait up to ``LAZY_COMMIT_DELAY`` for other operations (not if
        someone waits for the handle). It still commits in call order with the rest."""
        return await self._queue.enqueue(
            partial(SqliteBackend.ack, client_id=client_id, seq=seq), lazy=True
        )

    async def begin_ack_one(self, client_id: str, seq: int) -> Pending:
        """``ack_one``, returning once queued; lazy like ``begin_ack``."""
        return await self._queue.enqueue(
            partial(SqliteBackend.ack_one, client_id=client_id, seq=seq), lazy=True
        )

    def ack_one_nowait(self, client_id: str, seq: int) -> Pending:
        """``begin_ack_one`` without a checkpoint; ``trio.WouldBlock`` (nothing queued) when
        the queue is full."""
        return self._enqueue_nowait(
            partial(SqliteBackend.ack_one, client_id=client_id, seq=seq), None
        )

    async def ack(self, client_id: str, seq: int) -> int:
        """Cumulative ack: delete deliveries with seq <= ``seq``; how many were removed.

        ``last_ack`` becomes ``max(last_ack, seq)`` (and ``next_seq`` stays above it); messages
        no delivery needs any more are deleted. The broker validates ``seq``; the store does not.
        """
        return await self._queue.submit(partial(SqliteBackend.ack, client_id=client_id, seq=seq))

    async def ack_one(self, client_id: str, seq: int) -> bool:
        """Remove exactly one delivery (shared groups); whether it was pending.

        ``last_ack`` moves only when it was the lowest pending delivery: up to just below the
        next pending one, or to ``next_seq - 1`` when none is left.
        """
        return await self._queue.submit(
            partial(SqliteBackend.ack_one, client_id=client_id, seq=seq)
        )

    async def recent_publisher_ids(self, limit: int) -> list[str]:
        """The newest ``limit`` publisher message ids of stored messages, oldest first (what
        a restarted or promoted broker's duplicate window starts from)."""
        return await self._read(partial(SqliteBackend.recent_publisher_ids, limit=limit))

    async def retained(self) -> list[RetainedMessage]:
        """Every retained message (what ``append(..., retain=True)`` left), by topic."""
        return await self._read(SqliteBackend.retained)

    async def pending(self, client_id: str, after_seq: int, limit: int) -> list[StoredMessage]:
        """Up to ``limit`` pending deliveries with seq > ``after_seq``, in seq order."""
        return await self._read(
            partial(SqliteBackend.pending, client_id=client_id, after_seq=after_seq, limit=limit)
        )

    async def begin_trim_through(self, client_id: str, seq: int) -> Pending:
        """Drop every pending delivery up to ``seq`` (a quota's drop-oldest), once queued;
        ``last_ack`` does not move."""
        return await self._queue.enqueue(
            partial(SqliteBackend.trim_through, client_id=client_id, seq=seq)
        )

    async def trim(self, client_id: str, keep_messages: int) -> int:
        """Drop the oldest pending deliveries so at most ``keep_messages`` remain; how many.

        ``last_ack`` does not move: the dropped seqs are simply gone (the broker counts them).
        """
        return await self._queue.submit(
            partial(SqliteBackend.trim, client_id=client_id, keep_messages=keep_messages)
        )

    def statistics(self) -> StoreStatistics:
        sessions, messages, deliveries, dedup_ids, duplicates = self._rows
        queue = self._queue.statistics()
        batches = queue.batches_committed
        return StoreStatistics(
            batches_committed=batches,
            operations=queue.operations,
            operations_failed=queue.operations_failed,
            mean_batch_size=queue.operations / batches if batches else 0.0,
            max_batch_size=queue.max_batch_size,
            last_commit_ms=self._last_commit_ms,
            queued_operations=queue.queued_operations,
            callers_waiting_for_room=queue.callers_waiting_for_room,
            db_size_bytes=self._db_size,
            sessions=sessions,
            messages=messages,
            deliveries=deliveries,
            dedup_ids=dedup_ids,
            duplicates=duplicates,
        )
