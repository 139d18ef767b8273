"""Requests awaiting their replies: one ``Waiter`` per request, or a ``BatchPart`` per PUB
of a ``publish_confirmed`` batch. The reader resolves them by request id; after a
reconnect the client sends their ``request`` again."""

from __future__ import annotations

from typing import Any

import trio

from broker.client.errors import BrokerError
from broker.wire.frames import Frame


class Waiter:
    """One request awaiting its reply. A confirming publisher has one per PUB in flight, so
    the waiting task is parked and rescheduled directly: a ``trio.Event`` (and its parking
    lot) per request cost the publisher more than packing the PUB."""

    __slots__ = ("_task", "error", "frame", "request", "resolved")

    def __init__(self, request: Frame | bytes | None) -> None:
        self.request = request  # resent after a reconnect when not None (bytes: as they are)
        self.frame: Frame | None = None
        self.error: Exception | None = None
        self.resolved = False
        self._task: trio.lowlevel.Task | None = None

    def resolve(self, frame: Frame | None = None, error: Exception | None = None) -> None:
        self.frame = frame
        self.error = error
        self.resolved = True
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)

    def _abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> Frame:
        if self.resolved:
            await trio.lowlevel.checkpoint()
        else:
            self._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        if self.error is not None:
            raise self.error
        assert self.frame is not None
        return self.frame


class Batch:
    """Confirmations still awaited for one ``publish_confirmed`` call."""

    __slots__ = ("done", "errors", "failure", "remaining")

    def __init__(self, size: int) -> None:
        self.remaining = size
        self.errors: list[BrokerError | None] = [None] * size
        self.failure: Exception | None = None
        self.done = trio.Event()
        if size == 0:
            self.done.set()


class BatchPart:
    """One PUB of a batch, kept (as its bytes) to be sent again after a reconnect."""

    __slots__ = ("batch", "index", "request")

    def __init__(self, batch: Batch, index: int, request: bytes) -> None:
        self.batch = batch
        self.index = index
        self.request = request

    def resolve(self, frame: Frame | None = None, error: Exception | None = None) -> None:
        batch = self.batch
        if isinstance(error, BrokerError):
            batch.errors[self.index] = error
        elif error is not None:
            batch.failure = error
        batch.remaining -= 1
        if batch.remaining == 0:
            batch.done.set()


#: What the reader keeps per request id until the reply comes.
Pending = Waiter | BatchPart
