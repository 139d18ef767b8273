"""A group-commit queue: many callers' operations, one writer task, one commit per batch.

Every mutating call builds an operation (the work to run, a result slot, an optional
``on_done`` callback; an Event only if someone waits), puts it on a bounded queue (a memory
channel: when ``max_queued`` operations wait, callers wait for room: backpressure) and waits.
One writer task takes everything queued, up to ``max_batch`` operations, hands their works to
the owner's ``run`` (the store runs them in ONE SQLite transaction in a worker thread), then
resolves every operation. One fsync then covers a whole batch, which is what makes many
concurrent confirmed appends cheap. While a batch commits, the next one fills up.
Operations commit in the order they were queued, so a broker that assigns a session's seqs
and calls ``append`` in the same order (no await in between) stores them in seq order.

The queue knows nothing of what a work is or where it is committed: the store gives it
SQLite backend calls, and a replication stream could give it records to ship.

Lazy operations. Nobody waits for the commit of a lazy operation (the store's acks), so a
batch holding nothing but those waits up to ``LAZY_COMMIT_DELAY`` for an operation someone
does wait for (an append) and commits with it: one fsync for both. Otherwise a subscriber
acking while the publishers' appends commit got a commit of its own right behind them, and the
publishers' next appends queued behind that fsync (in the 128-task confirm benchmark one
commit in two was a lone ack). Waiting for a lazy operation's handle, a full batch or closing
the queue ends the wait at once. A crash may lose a lazy operation a little longer after it
was queued (an ack: its messages are delivered again, at-least-once); order is unchanged, so
an operation queued before one that committed is committed too.

Cancellation. A caller cancelled while it waits for its commit leaves its operation queued:
it is committed anyway, or, if the queue closes first without reaching it, not at all. A
caller cancelled while waiting for room in the queue never enqueued anything.

Settling. ``run`` may return a third value, ``settle``: an async callable whose return
means the batch may be confirmed (the primary of a hot-spare pair: the standby has it on
disk too). The batch's outcomes are then delivered by a second task, the settler, once
``settle()`` returned, while the writer goes on committing the next batches (at most
``SETTLING_DEPTH`` batches wait to settle; then the writer waits: backpressure). Outcomes
still go out in commit order: while any batch is settling, later batches queue behind it
even without a ``settle`` of their own.

Closing. ``aclose`` stops accepting operations, lets the writer commit everything already
queued within a shielded ``move_on_after(CLEANUP_TIMEOUT)`` and then cancels the nursery the
writer runs in; whatever is still queued fails.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

__all__ = [
    "CLEANUP_TIMEOUT",
    "LAZY_COMMIT_DELAY",
    "GroupCommit",
    "GroupCommitStatistics",
    "OnDone",
    "Outcome",
    "Pending",
    "RunBatch",
]

#: Seconds a batch of nothing but lazy operations (acks: no caller waits for them)
#: may wait for an operation someone does wait for, so that it shares that commit's fsync.
LAZY_COMMIT_DELAY = 0.05
#: Seconds that closing the queue may spend committing what is still queued.
CLEANUP_TIMEOUT = 5.0
#: Committed batches that may wait to settle (``RunBatch``'s ``settle``) before the writer waits.
SETTLING_DEPTH = 8

# (ok, value): the value returned, or the exception raised, by one operation.
Outcome = tuple[bool, Any]
#: Called with an operation's error (None: it succeeded) once its outcome is known.
OnDone = Callable[[BaseException | None], None]
#: Awaited before a committed batch's outcomes are delivered (see "Settling"); a string
#: it returns says why the batch may not be confirmed (its operations fail with it).
Settle = Callable[[], Awaitable[str | None]]
#: The owner's commit of a batch's works: (committed, an outcome per work[, settle]), or None
#: when there was nothing to commit. It may append works of its own after the batch's (their
#: outcomes are ignored) and must not give up on cancellation once the commit has started.
RunBatch = Callable[
    [list[Any]],
    Awaitable[tuple[bool, Sequence[Outcome]] | tuple[bool, Sequence[Outcome], Settle] | None],
]


class _Op:
    """One queued mutation: the work to run, and where its outcome goes.

    The broker queues one per confirmed PUB, and usually only the oldest is awaited (a
    connection's PUBACKs go out in order), so the Event is made only for a waiter.
    ``on_done(error)`` runs when the outcome is known (``error`` None if it succeeded), in
    commit order, before any checkpoint.
    """

    __slots__ = ("_event", "done", "error", "hurry", "on_done", "result", "work")

    def __init__(
        self,
        work: Any,
        on_done: OnDone | None = None,
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
    """A queued operation; ``await wait()`` returns its result once committed."""

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


@dataclass(frozen=True, slots=True)
class GroupCommitStatistics:
    """The queue's counters; ``operations`` counts those of committed batches, failed or not."""

    batches_committed: int
    operations: int
    operations_failed: int
    max_batch_size: int
    queued_operations: int  # waiting in the queue for the writer
    callers_waiting_for_room: int  # backpressure: callers blocked because the queue is full


class GroupCommit:
    """Operations from any number of tasks, committed in batches by one writer, in order.

    ``run`` commits a batch (see ``RunBatch``). ``name`` and ``noun`` word the errors ("<name>:
    the <noun> is closed"), raised as ``error``. When nothing is queued for ``idle_interval``
    seconds, the writer calls ``run`` with an empty batch, so that the owner may do periodic
    work of its own. Start the writer with ``start(nursery)``; ``aclose`` stops it.
    """

    def __init__(
        self,
        run: RunBatch,
        *,
        name: str,
        noun: str,
        error: Callable[[str], Exception],
        max_batch: int,
        max_queued: int,
        idle_interval: float = math.inf,
        refused: Callable[[str], Exception] | None = None,
    ) -> None:
        self._run = run
        self._name = name
        self._noun = noun
        self._error = error
        # What a committed batch that its settle step refused fails with (default: error)
        self._refused = refused or error
        self._max_batch = max_batch
        self._idle_interval = idle_interval
        self._send, self._receive = trio.open_memory_channel[_Op](max_queued)
        self._closing = False
        self._writer_done = trio.Event()
        self._settled = trio.Event()  # the settler has delivered everything and stopped
        self._settling_send, self._settling_receive = trio.open_memory_channel[
            tuple[list[_Op], Sequence[Outcome], Settle | None]
        ](SETTLING_DEPTH)
        self._settling = 0  # batches handed to the settler and not delivered yet
        self._nursery: trio.Nursery | None = None
        self._lazy_wait: trio.CancelScope | None = None  # the writer waiting for company
        self._hurried = False  # someone waits for a lazy operation: commit without waiting
        # statistics
        self._batches = 0
        self._operations = 0
        self._failed = 0
        self._max_batch_seen = 0

    @property
    def closing(self) -> bool:
        """``aclose`` has begun: no operation is taken any more."""
        return self._closing

    def start(self, nursery: trio.Nursery) -> None:
        """Run the writer in ``nursery``, which ``aclose`` cancels if the writer overstays."""
        self._nursery = nursery
        nursery.start_soon(self._write_loop)
        nursery.start_soon(self._settle_loop)

    async def aclose(self) -> None:
        """Stop taking operations, commit what is queued (bounded, shielded), stop the writer.

        Calling it twice is harmless. Operations still queued after ``CLEANUP_TIMEOUT``
        seconds fail with ``error``.
        """
        self._closing = True
        self._send.close()
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            await self._writer_done.wait()
            await self._settled.wait()
        if not self._settled.is_set() and self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- the writer ----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                first: _Op | None = None
                with trio.move_on_after(self._idle_interval):
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
            self._settling_send.close()

    async def _settle_loop(self) -> None:
        """Deliver settling batches' outcomes in commit order, each once its settle returned."""
        try:
            async for batch, outcomes, settle in self._settling_receive:
                refused = None
                try:
                    if settle is not None:
                        refused = await settle()
                except BaseException as exc:
                    why = f"not confirmed: the {self._noun} stopped ({exc!r})"
                    for op in batch:
                        op.resolve(False, self._error(why))
                    self._settling -= 1
                    raise
                if refused is not None:  # committed, but may not be confirmed (fenced)
                    for op in batch:
                        op.resolve(False, self._refused(f"not confirmed: {refused}"))
                else:
                    self._deliver(batch, outcomes)
                self._settling -= 1
        finally:
            self._settled.set()
            while True:  # (cancelled) what is left was committed but is not confirmed
                try:
                    batch, _, _ = self._settling_receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
                for op in batch:
                    op.resolve(False, self._error(f"{self._name}: closed before settling"))

    async def _wait_for_company(self, batch: list[_Op]) -> None:
        """``batch`` holds only lazy operations: wait (at most ``LAZY_COMMIT_DELAY``) until an
        operation someone waits for is queued, someone waits for one of these, the batch is
        full or the queue closes, so that acks share the fsync of the next appends instead
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
            # No checkpoint before ``run`` starts its commit: a reader queues a whole read's
            # appends before it yields, and a scheduling round here let the subscriber's
            # writer encode and send that read's MSGs first (0.6-1.2 ms a commit started later).
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            # Not abandoned on cancel: once started, the batch runs to its end and the
            # outcomes below are delivered before any checkpoint.
            ran = await self._run([op.work for op in batch])
            if ran is None:
                return
            committed, outcomes = ran[0], ran[1]
            settle = ran[2] if len(ran) > 2 else None  # type: ignore[misc]
        except BaseException as exc:
            for op in batch:
                op.resolve(False, self._error(f"not committed: the {self._noun} stopped ({exc!r})"))
            raise
        if committed:
            self._batches += 1
            self._operations += len(batch)
            self._max_batch_seen = max(self._max_batch_seen, len(batch))
        if settle is None and not self._settling:
            self._deliver(batch, outcomes)
            return
        self._settling += 1  # behind the batches still settling, in commit order
        await self._settling_send.send((batch, outcomes, settle))

    def _deliver(self, batch: list[_Op], outcomes: Sequence[Outcome]) -> None:
        for op, (ok, value) in zip(batch, outcomes[: len(batch)], strict=True):
            op.resolve(ok, value)
            self._failed += not ok

    def _fail_queued(self) -> None:
        while True:
            try:
                op = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            op.resolve(False, self._error(f"{self._name}: closed before the commit"))
        self._receive.close()

    # -- submitting ----------------------------------------------------------------------------

    async def enqueue(
        self, work: Any, on_done: OnDone | None = None, lazy: bool = False
    ) -> Pending:
        """Queue ``work`` (waiting only for room) and return its handle, not its outcome.

        A ``lazy`` operation may wait up to ``LAZY_COMMIT_DELAY`` for company before its
        commit, unless someone waits for its handle."""
        if self._closing:
            raise self._error(f"{self._name}: the {self._noun} is closed")
        op = _Op(work, on_done, self._hurry if lazy else None)
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            try:
                self._send.send_nowait(op)
            except trio.WouldBlock:
                await self._send.send(op)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self._error(f"{self._name}: the {self._noun} is closed") from None
        return Pending(op)

    def enqueue_nowait(self, work: Any, on_done: OnDone | None) -> Pending:
        """Queue ``work`` if there is room now; ``trio.WouldBlock`` (nothing queued) if not."""
        if self._closing:
            raise self._error(f"{self._name}: the {self._noun} is closed")
        op = _Op(work, on_done)
        try:
            self._send.send_nowait(op)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise self._error(f"{self._name}: the {self._noun} is closed") from None
        return Pending(op)

    def enqueue_all_nowait(self, works: Sequence[tuple[Any, OnDone | None]]) -> list[Pending]:
        """``enqueue_nowait`` of each (work, on_done), in order, all or none: if there is not
        room for all of them now, ``trio.WouldBlock`` and nothing is queued."""
        if self._closing:
            raise self._error(f"{self._name}: the {self._noun} is closed")
        room = self._send.statistics()
        if room.max_buffer_size - room.current_buffer_used < len(works):
            raise trio.WouldBlock
        return [self.enqueue_nowait(work, on_done) for work, on_done in works]

    async def submit(self, work: Any) -> Any:
        """Queue ``work`` and return its result once committed (or raise its error)."""
        if self._closing:
            raise self._error(f"{self._name}: the {self._noun} is closed")
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
            raise self._error(f"{self._name}: the {self._noun} is closed") from None
        await op.wait_done()
        return op.unwrap()

    def statistics(self) -> GroupCommitStatistics:
        send_stats = self._send.statistics()
        return GroupCommitStatistics(
            batches_committed=self._batches,
            operations=self._operations,
            operations_failed=self._failed,
            max_batch_size=self._max_batch_seen,
            queued_operations=send_stats.current_buffer_used,
            callers_waiting_for_room=send_stats.tasks_waiting_send,
        )
