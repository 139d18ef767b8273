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


class InFlight:
    """Confirmed publishes awaiting their PUBACK, at most ``limit``: each is kept (its
    bytes) to be sent again after a reconnect, so the limit bounds what a client holds
    for a broker that does not answer. A publisher past the limit waits for room."""

    __slots__ = ("_room", "count", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {limit}")
        self.limit = limit
        self.count = 0
        self._room: trio.Event | None = None

    async def acquire(self) -> None:
        """Take a place, waiting while all ``limit`` are taken (no checkpoint otherwise:
        the publisher's own wait for its PUBACK is one)."""
        while self.count >= self.limit:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()
        self.count += 1

    def release(self) -> None:
        self.count -= 1
        room = self._room
        if room is not None:
            self._room = None
            room.set()


class Batch:
    """Confirmations still awaited for one ``publish_confirmed`` call; each part gives its
    place in flight back when it is resolved."""

    __slots__ = ("done", "errors", "failure", "in_flight", "remaining")

    def __init__(self, size: int, in_flight: InFlight | None = None) -> None:
        self.in_flight = in_flight
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
        if batch.in_flight is not None:
            batch.in_flight.release()
        if isinstance(error, BrokerError):
            batch.errors[self.index] = error
        elif error is not None:
            batch.failure = error
        batch.remaining -= 1
        if batch.remaining == 0:
            batch.done.set()


#: What the reader keeps per request id until the reply comes.
Pending = Waiter | BatchPart
