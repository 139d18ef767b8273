"""PUBACKs, in the order the PUBs came, each once its message is safely stored.

A publisher that asks for confirmation may pipeline: its PUBs are routed at once, but a
PUB with durable subscribers is confirmed only after the store has committed it, and a
PUBACK must never overtake an earlier one. So confirms wait in one queue, and one task
answers them from the front, as their commits complete. A commit may complete after the
connection began to close (the client's closing ERROR, or ours written): then nothing
more may be sent, and what is still owed is dropped (the client reconnects and resends).
"""

from __future__ import annotations

import contextlib
from collections import deque

import trio

from broker.core import Session
from broker.errors import ErrorCode
from broker.store import NotConfirmed, Pending, StoreError, StoreFull
from broker.wire.connection import Connection
from broker.wire.frames import Error, PubAck


class Confirms:
    """The PUBACKs one session still owes, in order; see ``start_in``.

    Most connections never owe a PUBACK that waits for a commit (transient sessions, a
    broker without a store), so nothing is kept for that until it happens: the queue is
    made at the first such confirm, and the task that answers it lives while confirms
    wait. An idle connection pays for neither (a deque is 760 bytes; a waiting trio task
    with its coroutines ~2 KiB).
    """

    __slots__ = ("_draining", "_nursery", "_waiting", "proto", "session")

    def __init__(self, session: Session, proto: Connection) -> None:
        self.session = session
        self.proto = proto
        self._waiting: deque[tuple[Pending | None, int]] | None = None
        self._nursery: trio.Nursery | None = None
        self._draining = False

    def after(self, pending: Pending | None, request_id: int) -> None:
        """PUBACK ``request_id`` once ``pending`` (a store commit, if any) is done."""
        waiting = self._waiting
        if waiting is None:
            waiting = self._waiting = deque()
        waiting.append((pending, request_id))
        if not self._draining and self._nursery is not None:
            self._draining = True
            self._nursery.start_soon(self._drain)

    def now(self, request_id: int) -> None:
        """PUBACK ``request_id``, which needed no commit: at once, unless others are still
        waiting (then behind them, to keep the order)."""
        if self._waiting:
            self.after(None, request_id)
        elif self.proto.may_send(PubAck):  # else the connection is closing: nobody to tell
            self.session.send_control(self.proto.send_puback(request_id))

    def start_in(self, nursery: trio.Nursery) -> None:
        """Answer confirms from ``nursery`` (the connection's) for as long as it is open: a
        confirm that has to wait starts a task there, which ends once none waits."""
        self._nursery = nursery
        if self._waiting and not self._draining:
            self._draining = True
            nursery.start_soon(self._drain)

    async def _drain(self) -> None:
        """Send PUBACKs as commits complete, until none waits; for a PUB not confirmed, ERROR
        FENCED (a fenced hot-spare primary), STORE_FULL (the disk refused it: this request
        only) or INTERNAL (any other store failure)."""
        try:
            waiting = self._waiting
            assert waiting is not None
            while waiting:
                pending = waiting[0][0]
                if pending is not None and not pending.done:
                    with contextlib.suppress(StoreError):
                        await pending.wait()  # the outcome is read below
                if not self.proto.may_send(PubAck):  # closing: nobody to answer any more
                    waiting.clear()
                    break
                # One commit resolves a whole batch: answer every confirm that is ready
                # now, in one go (one queued write), instead of one per scheduler round.
                send_puback = self.proto.send_puback
                replies: list[bytes] = []
                while waiting and (waiting[0][0] is None or waiting[0][0].done):
                    pending, request_id = waiting.popleft()
                    reply = send_puback(request_id)
                    if pending is not None:
                        try:
                            pending.result()
                        except NotConfirmed as exc:  # a fenced primary: the client goes on
                            error = Error(code=ErrorCode.FENCED, text=str(exc), ref=request_id)
                            reply = self.proto.send(error)
                        except StoreFull as exc:  # this PUB only: the connection stays
                            error = Error(code=ErrorCode.STORE_FULL, text=str(exc), ref=request_id)
                            reply = self.proto.send(error)
                        except StoreError as exc:
                            error = Error(
                                code=ErrorCode.INTERNAL, text=f"not stored: {exc}", ref=request_id
                            )
                            reply = self.proto.send(error)
                    replies.append(reply)
                if replies:
                    self.session.send_control(b"".join(replies))
        finally:
            self._draining = False
