"""Crash-safe storage for durable sessions: SQLite in WAL mode, group commit, one thread.

Theory of operation
-------------------

What is stored (``<data_dir>/topiary.db``, schema version ``SCHEMA_VERSION``):

- ``messages``: each message once, however many sessions need it. ``refs`` counts the delivery
  rows that point at it; when it reaches 0 the message is deleted at once, or, with
  ``retention_seconds`` > 0, by a periodic sweep once ``stored_at`` is that old.
- ``sessions``: one row per durable session: its shared group, ``last_ack`` (every seq at or
  below it is done) and ``next_seq`` (the next seq the broker may assign).
- ``filters``: the session's (filter, dialect) pairs.
- ``deliveries``: the pending queue, one row (client_id, seq, message) per delivery not yet
  acknowledged, trimmed or dropped with its session.
- ``published``: the newest ``dedup_window`` publisher message ids, for duplicate filtering.

Who talks to SQLite. Everything SQL lives in ``SqliteBackend``, a plain synchronous class with
no trio in it (the model test in tests/test_store_model.py drives it directly). ``Store`` is
the trio face: it reaches the backend only in a worker thread holding one
``CapacityLimiter(1)``, so exactly one call touches the connection at any time and the
limiter's hand-over orders one call after the other. Reads go through
``trio.to_thread.run_sync(..., limiter=...)``; the writer's commits take the limiter without a
checkpoint when it is free and start the thread at once (``Store._in_thread``), because
``run_sync`` first yields once and a commit then started a scheduling round late (another
task's work ran in between). trio's thread cache may run two calls on two different OS
threads, which is why the connection is opened with ``check_same_thread=False``; it is still
never used by two threads at once.

Group commit. Every mutating call builds an operation (the backend work to run, a result
slot, an optional ``on_done`` callback; an Event only if someone waits), puts it on a bounded
queue (a memory channel: when ``max_queued`` operations wait, callers wait for room:
backpressure) and waits. One writer task takes everything queued, up to ``max_batch``
operations, and runs them in ONE transaction in the worker thread: ``BEGIN IMMEDIATE``, the
operations, ``COMMIT``; then it resolves every operation. A run of consecutive appends is
stored with a few multi-row INSERTs (``_append_run``): each statement is a round through the
sqlite3 module that needs the GIL the broker's trio thread is using, so 3 statements per
append were costly for both threads. If any operation fails, the transaction is rolled back
and run again with each operation in its own ``SAVEPOINT`` (a failing one is rolled back
alone and only its caller gets the error). One fsync then covers a whole batch, which is what
makes many concurrent confirmed appends cheap. While a batch commits, the next one fills up.

Lazy operations. Nobody waits for an ack's commit (``begin_ack``, ``begin_ack_one``), so a batch
holding nothing but those waits up to ``LAZY_COMMIT_DELAY`` for an operation someone does wait
for (an append) and commits with it: one fsync for both. Otherwise a subscriber acking while
the publishers' appends commit got a commit of its own right behind them, and the publishers'
next appends queued behind that fsync (in the 128-task confirm benchmark one commit in two was
a lone ack). Waiting for a lazy operation's handle, a full batch or closing the store ends the
wait at once. A crash may lose an ack a little longer after it was queued: its messages are
delivered again (at-least-once); order is unchanged, so an ack queued before an append that
committed is committed too.
Operations commit in the order they were queued, so a broker that assigns a session's seqs
and calls ``append`` in the same order (no await in between) stores them in seq order.

Durability. ``journal_mode=WAL`` with ``synchronous=FULL``: the WAL is fsynced at every commit,
so a call that returned survives SIGKILL of the process and a power loss or kernel crash of
the machine. With ``synchronous=NORMAL`` a WAL database fsyncs only at checkpoints: a commit
that returned would still survive SIGKILL (the data is in the OS page cache), but a power loss
or OS crash could roll back the last transactions, i.e. lose messages the broker had already
confirmed to their publishers; the database would stay consistent, just older. The broker
promises publishers more than that, so FULL. On first creation the data directory is fsynced
too, so the new file's directory entry is durable.

Opening checks the file: ``PRAGMA quick_check`` (reads every page, so about a second per GB),
the schema version in ``meta``, and that it is a topiary database at all. Any problem raises
``StoreError`` with one line naming the file and the problem, never a sqlite3 traceback.

Cancellation. A caller cancelled while it waits for its commit leaves its operation queued: it
is committed anyway, or, if the store closes first without reaching it, not at all; either way
the database is consistent. A cancelled ``append`` may therefore have been stored; the broker
must treat that as at-least-once (the publisher gets no confirmation and may resend; the
publisher message id drops the copy). A caller cancelled while waiting for room in the queue
never enqueued anything.

Shutdown. Leaving ``async with Store.open(...)`` (or calling ``aclose``) stops accepting
operations, lets the writer commit everything already queued within a shielded
``move_on_after(CLEANUP_TIMEOUT)``, fails whatever is left with ``StoreError`` and closes the
connection (which checkpoints the WAL into the main file).

Sequence numbers are the broker's: it assigns them from ``SessionRecord.next_seq`` upwards.
The store keeps ``next_seq = max(next_seq, seq + 1)`` for every stored delivery and
``last_ack < next_seq`` always, so after a restart ``next_seq`` is past every seq it ever
stored. It does not check that a delivery's seq is above ``last_ack``; such a row stays
pending until a cumulative ack covers it.
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
from typing import Any, NoReturn

import msgpack
import trio

from broker.store.files import lock_directory
from broker.store.records import (
    SessionRecord,
    StoredMessage,
    StoreError,
    StoreStatistics,
)
from broker.store.schema import DB_FILENAME, SCHEMA_VERSION
from broker.store.sqlite import Append, Outcome, RowCounts, SqliteBackend, Work

__all__ = [
    "CLEANUP_TIMEOUT",
    "DB_FILENAME",
    "MAX_BATCH",
    "MAX_QUEUED",
    "SCHEMA_VERSION",
    "SessionRecord",
    "Store",
    "StoreError",
    "StoreStatistics",
    "StoredMessage",
]

#: Most operations in one transaction: bounds how long one commit (and a reader behind it) takes.
MAX_BATCH = 5_000
#: Operations that may wait for the writer before callers wait for room.
MAX_QUEUED = 10_000
#: Seconds a batch of nothing but lazy operations (acks: no caller waits for them)
#: may wait for an operation someone does wait for, so that it shares that commit's fsync.
LAZY_COMMIT_DELAY = 0.05
#: Seconds that leaving the store may spend committing what is still queued.
CLEANUP_TIMEOUT = 5.0
#: Called with an operation's error (None: it succeeded) once its outcome is known.
_OnDone = Callable[[BaseException | None], None]


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


class _Op:
    """One queued mutation: the backend method to run, and where its outcome goes.

    The broker queues one per confirmed PUB, and usually only the oldest is awaited (a
    connection's PUBACKs go out in order), so the Event is made only for a waiter.
    ``on_done(error)`` runs when the outcome is known (``error`` None if it succeeded), in
    commit order, before any checkpoint.
    """

    __slots__ = ("_event", "done", "error", "hurry", "on_done", "result", "work")

    def __init__(
        self,
        work: Work,
        on_done: _OnDone | None = None,
        hurry: Callable[[], None] | None = None,
    ) -> None:
        self.work = work
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.on_done = on_done
        # Set on a lazy operation: its commit may wait for company (LAZY_COMMIT_DELAY) until
        # someone waits for it; then this asks the writer not to wait.
        self.hurry = hurry
        self._event: trio.Event | None = None

    def resolve(self, ok: bool, value: Any) -> None:
        if self.done:
            return
        if ok:
            self.result = value
        else:
            self.error = value
        self.done = True
        if self._event is not None:
            self._event.set()
        if self.on_done is not None:
            self.on_done(self.error)

    async def wait_done(self) -> None:
        if self.done:
            await trio.lowlevel.checkpoint()
            return
        if self._event is None:
            self._event = trio.Event()
        if self.hurry is not None:
            self.hurry()
        await self._event.wait()

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class Pending:
    """A queued store operation; ``await wait()`` returns its result once committed."""

    __slots__ = ("_op",)

    def __init__(self, op: _Op) -> None:
        self._op = op

    @property
    def done(self) -> bool:
        return self._op.done

    async def wait(self) -> Any:
        await self._op.wait_done()
        return self._op.unwrap()

    def result(self) -> Any:
        """The outcome of a done operation (raises its error), without a checkpoint."""
        assert self._op.done, "not committed yet"
        return self._op.unwrap()


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
        self._max_batch = max_batch
        self._send, self._receive = trio.open_memory_channel[_Op](max_queued)
        self._closing = False
        self._writer_done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._lazy_wait: trio.CancelScope | None = None  # the writer waiting for company
        self._hurried = False  # someone waits for a lazy operation: commit without waiting
        retention = backend.retention_seconds
        self._sweep_interval = min(max(retention / 2, 0.05), 60.0) if retention > 0 else math.inf
        self._next_sweep = 0.0
        # statistics
        self._batches = 0
        self._operations = 0
        self._failed = 0
        self._max_batch_seen = 0
        self._last_commit_ms = 0.0
        self._db_size = backend.file_size()
        # Row counts as of the last commit (the backend's own move during a batch).
        self._rows = backend.counts()

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
                    store._nursery = nursery
                    nursery.start_soon(store._write_loop)
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
        self._closing = True
        self._send.close()
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            await self._writer_done.wait()
        if not self._writer_done.is_set() and self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- the writer ----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                first: _Op | None = None
                with trio.move_on_after(self._sweep_interval):
                    try:
                        first = await self._receive.receive()
                    except trio.EndOfChannel:
                        return
                if first is None:
                    await self._commit([])
                    continue
                batch = [first]
                if first.hurry is not None:
                    await self._wait_for_company(batch)
                await self._commit(batch)
        finally:
            self._writer_done.set()
            self._fail_queued()

    async def _wait_for_company(self, batch: list[_Op]) -> None:
        """``batch`` holds only lazy operations: wait (at most ``LAZY_COMMIT_DELAY``) until an
        operation someone waits for is queued, someone waits for one of these, the batch is
        full or the store closes, so that acks share the fsync of the next appends instead
        of paying their own in between (the confirmed publishes would queue behind it)."""
        if self._hurried:
            self._hurried = False
            return
        with trio.move_on_after(LAZY_COMMIT_DELAY) as scope:
            self._lazy_wait = scope
            try:
                while len(batch) < self._max_batch:
                    try:
                        op = self._receive.receive_nowait()
                    except trio.WouldBlock:
                        op = await self._receive.receive()
                    batch.append(op)
                    if op.hurry is None:
                        break
            except trio.EndOfChannel:
                pass
            finally:
                self._lazy_wait = None
        self._hurried = False

    def _hurry(self) -> None:
        self._hurried = True
        if self._lazy_wait is not None:
            self._lazy_wait.cancel()

    async def _commit(self, batch: list[_Op]) -> None:
        """Commit ``batch`` plus everything queued behind it (up to ``max_batch``)."""
        try:
            # No checkpoint before the thread starts: a reader queues a whole read's appends
            # before it yields, and a scheduling round here let the subscriber's writer
            # encode and send that read's MSGs first (0.6-1.2 ms a commit started later).
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            works = [op.work for op in batch]
            if math.isfinite(self._sweep_interval) and trio.current_time() >= self._next_sweep:
                self._next_sweep = trio.current_time() + self._sweep_interval
                works.append(SqliteBackend.sweep)
            if not works:
                return
            # Not abandoned on cancel: once started, the batch runs to its end and the
            # outcomes below are delivered before any checkpoint.
            committed, outcomes, elapsed, size, rows = await self._in_thread(
                self._run_in_thread, works
            )
        except BaseException as exc:
            for op in batch:
                op.resolve(False, StoreError(f"not committed: the store stopped ({exc!r})"))
            raise
        for op, (ok, value) in zip(batch, outcomes[: len(batch)], strict=True):
            op.resolve(ok, value)
            self._failed += not ok
        if committed:
            self._batches += 1
            self._operations += len(batch)
            self._max_batch_seen = max(self._max_batch_seen, len(batch))
        self._last_commit_ms = elapsed * 1000.0
        self._db_size = size
        self._rows = rows

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``trio.to_thread.run_sync(fn, *args, limiter=self._limiter)`` for the writer, but
        the thread starts at once when the limiter is free: ``run_sync`` first takes a
        scheduling round in ``CapacityLimiter.acquire_on_behalf_of``. Not abandoned on cancel
        (like ``run_sync``): a cancelled writer still waits for the thread's outcome."""
        await trio.lowlevel.checkpoint_if_cancelled()
        limiter = self._limiter
        try:
            limiter.acquire_on_behalf_of_nowait(self)
        except trio.WouldBlock:
            await limiter.acquire_on_behalf_of(self)  # a read holds the connection
        try:
            task = trio.lowlevel.current_task()
            token = trio.lowlevel.current_trio_token()
            reschedule = trio.lowlevel.reschedule

            def deliver(outcome: Any) -> None:  # in the worker thread
                token.run_sync_soon(reschedule, task, outcome)

            trio.lowlevel.start_thread_soon(partial(fn, *args), deliver)
            return await trio.lowlevel.wait_task_rescheduled(
                lambda _raise_cancel: trio.lowlevel.Abort.FAILED
            )
        finally:
            limiter.release_on_behalf_of(self)

    def _run_in_thread(
        self, works: list[Work]
    ) -> tuple[bool, list[Outcome], float, int, RowCounts]:
        start = time.perf_counter()
        committed, outcomes = self._backend.run_batch(works)
        elapsed = time.perf_counter() - start
        return committed, outcomes, elapsed, self._backend.file_size(), self._backend.counts()

    def _fail_queued(self) -> None:
        while True:
            try:
                op = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            op.resolve(False, StoreError(f"{self._backend.path}: closed before the commit"))
        self._receive.close()

    # -- submitting ----------------------------------------------------------------------------

    async def _enqueue(
        self, work: Work, on_done: _OnDone | None = None, lazy: bool = False
    ) -> Pending:
        """Queue ``work`` (waiting only for room) and return its handle, not its outcome.

        A ``lazy`` operation may wait up to ``LAZY_COMMIT_DELAY`` for company before its
        commit, unless someone waits for its handle."""
        if self._closing:
            raise StoreError(f"{self._backend.path}: the store is closed")
        op = _Op(work, on_done, self._hurry if lazy else None)
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            try:
                self._send.send_nowait(op)
            except trio.WouldBlock:
                await self._send.send(op)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise StoreError(f"{self._backend.path}: the store is closed") from None
        return Pending(op)

    def _enqueue_nowait(self, work: Work, on_done: _OnDone | None) -> Pending:
        """Queue ``work`` if there is room now; ``trio.WouldBlock`` (nothing queued) if not."""
        if self._closing:
            raise StoreError(f"{self._backend.path}: the store is closed")
        op = _Op(work, on_done)
        try:
            self._send.send_nowait(op)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise StoreError(f"{self._backend.path}: the store is closed") from None
        return Pending(op)

    async def _submit(self, work: Work) -> Any:
        if self._closing:
            raise StoreError(f"{self._backend.path}: the store is closed")
        op = _Op(work)
        # A caller cancelled before this point enqueues nothing. send_nowait when there is room
        # saves the schedule round of ``send``; waiting for the commit is the checkpoint.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            try:
                self._send.send_nowait(op)
            except trio.WouldBlock:
                await self._send.send(op)  # backpressure: wait for room
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise StoreError(f"{self._backend.path}: the store is closed") from None
        await op.wait_done()
        return op.unwrap()

    async def _read(self, work: Work) -> Any:
        if self._closing:
            raise StoreError(f"{self._backend.path}: the store is closed")
        try:
            return await trio.to_thread.run_sync(work, self._backend, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreError(f"{self._backend.path}: read failed: {exc}") from exc

    # -- the API -------------------------------------------------------------------------------

    async def create_session(self, client_id: str, group: str | None) -> SessionRecord:
        """Create the session, or return the existing one unchanged (its group included)."""
        return await self._submit(
            partial(SqliteBackend.create_session, client_id=client_id, group=group)
        )

    async def drop_session(self, client_id: str) -> bool:
        """Delete the session, its filters and deliveries; False if there was none."""
        return await self._submit(partial(SqliteBackend.drop_session, client_id=client_id))

    async def sessions(self) -> list[SessionRecord]:
        """Every session, ordered by client id."""
        return await self._read(SqliteBackend.sessions)

    async def session(self, client_id: str) -> SessionRecord | None:
        return await self._read(partial(SqliteBackend.session, client_id=client_id))

    async def set_filters(self, client_id: str, filters: Iterable[tuple[str, str]]) -> None:
        """Replace the session's filters with ``filters`` ((filter, dialect) pairs)."""
        pairs = tuple((flt, dialect) for flt, dialect in filters)
        await self._submit(partial(SqliteBackend.set_filters, client_id=client_id, filters=pairs))

    async def add_filter(self, client_id: str, filter: str, dialect: str) -> None:
        await self._submit(
            partial(SqliteBackend.add_filter, client_id=client_id, filter=filter, dialect=dialect)
        )

    async def remove_filter(self, client_id: str, filter: str, dialect: str) -> None:
        await self._submit(
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
    ) -> bool:
        """Store a message once and one pending delivery per (client_id, seq); durable on return.

        Returns False, storing nothing, when ``publisher_msg_id`` is among the newest
        ``dedup_window`` ids already stored (a duplicate publish). Each delivery's session must
        exist (else ``StoreError``, nothing stored) and its ``next_seq`` becomes at least
        ``seq + 1``. With no deliveries the message is not kept (unless retention is on), but
        its publisher id is. If the caller is cancelled while waiting, the message may still
        have been stored (at-least-once).
        """
        return await self._submit(
            Append(
                msg_id,
                topic,
                bytes(payload),
                None if headers is None else msgpack.packb(headers),
                tuple((client_id, seq) for client_id, seq in deliveries),
                publisher_msg_id,
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
        on_done: _OnDone | None = None,
    ) -> Pending:
        """``append``, returning once it is queued: the broker's reader must not wait for a
        commit per PUB, or there would be nothing to group. ``await handle.wait()`` gives
        ``append``'s result once committed; ``on_done(error)`` is called as soon as the
        outcome is known. Operations still commit in call order."""
        blob = None if headers is None else msgpack.packb(headers)
        work = Append(msg_id, topic, bytes(payload), blob, tuple(deliveries), publisher_msg_id)
        return await self._enqueue(work, on_done)

    def append_nowait(
        self,
        msg_id: str,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        deliveries: tuple[tuple[str, int], ...],
        publisher_msg_id: str | None,
        on_done: _OnDone | None = None,
    ) -> Pending:
        """``begin_append`` without a checkpoint when the queue has room (the broker's reader
        queues one per PUB between two reads); ``trio.WouldBlock``, nothing queued, when it
        is full."""
        blob = None if headers is None else msgpack.packb(headers)
        work = Append(msg_id, topic, bytes(payload), blob, deliveries, publisher_msg_id)
        return self._enqueue_nowait(work, on_done)

    async def begin_ack(self, client_id: str, seq: int) -> Pending:
        """``ack``, returning once queued (the broker does not wait for ack commits).

        Lazy: the commit may wait up to ``LAZY_COMMIT_DELAY`` for other operations (not if
        someone waits for the handle). It still commits in call order with the rest."""
        return await self._enqueue(
            partial(SqliteBackend.ack, client_id=client_id, seq=seq), lazy=True
        )

    async def begin_ack_one(self, client_id: str, seq: int) -> Pending:
        """``ack_one``, returning once queued; lazy like ``begin_ack``."""
        return await self._enqueue(
            partial(SqliteBackend.ack_one, client_id=client_id, seq=seq), lazy=True
        )

    async def ack(self, client_id: str, seq: int) -> int:
        """Cumulative ack: delete deliveries with seq <= ``seq``; how many were removed.

        ``last_ack`` becomes ``max(last_ack, seq)`` (and ``next_seq`` stays above it); messages
        no delivery needs any more are deleted. The broker validates ``seq``; the store does not.
        """
        return await self._submit(partial(SqliteBackend.ack, client_id=client_id, seq=seq))

    async def ack_one(self, client_id: str, seq: int) -> bool:
        """Remove exactly one delivery (shared groups); whether it was pending.

        ``last_ack`` moves only when it was the lowest pending delivery: up to just below the
        next pending one, or to ``next_seq - 1`` when none is left.
        """
        return await self._submit(partial(SqliteBackend.ack_one, client_id=client_id, seq=seq))

    async def pending(self, client_id: str, after_seq: int, limit: int) -> list[StoredMessage]:
        """Up to ``limit`` pending deliveries with seq > ``after_seq``, in seq order."""
        return await self._read(
            partial(SqliteBackend.pending, client_id=client_id, after_seq=after_seq, limit=limit)
        )

    async def begin_trim_through(self, client_id: str, seq: int) -> Pending:
        """Drop every pending delivery up to ``seq`` (a quota's drop-oldest), once queued;
        ``last_ack`` does not move."""
        return await self._enqueue(
            partial(SqliteBackend.trim_through, client_id=client_id, seq=seq)
        )

    async def trim(self, client_id: str, keep_messages: int) -> int:
        """Drop the oldest pending deliveries so at most ``keep_messages`` remain; how many.

        ``last_ack`` does not move: the dropped seqs are simply gone (the broker counts them).
        """
        return await self._submit(
            partial(SqliteBackend.trim, client_id=client_id, keep_messages=keep_messages)
        )

    def statistics(self) -> StoreStatistics:
        sessions, messages, deliveries, dedup_ids, duplicates = self._rows
        send_stats = self._send.statistics()
        return StoreStatistics(
            batches_committed=self._batches,
            operations=self._operations,
            operations_failed=self._failed,
            mean_batch_size=self._operations / self._batches if self._batches else 0.0,
            max_batch_size=self._max_batch_seen,
            last_commit_ms=self._last_commit_ms,
            queued_operations=send_stats.current_buffer_used,
            callers_waiting_for_room=send_stats.tasks_waiting_send,
            db_size_bytes=self._db_size,
            sessions=sessions,
            messages=messages,
            deliveries=deliveries,
            dedup_ids=dedup_ids,
            duplicates=duplicates,
        )
