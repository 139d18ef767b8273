"""PUBACKs go out in order once their commits are done, and never after the connection
began to close (sans-IO: a server Connection, a Session, no sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from broker.core import Counters, OutboundLimits, Session
from broker.errors import ErrorCode
from broker.native.confirms import Confirms
from broker.wire.codec import append_msg, decode_frame
from broker.wire.connection import Connection
from broker.wire.frames import Error, PubAck
from tests.helpers import framed, open_server


class Commit:
    """A store commit the test completes by hand (what Confirms needs of a Pending)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    @property
    def done(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> bool:
        await self._event.wait()
        return True

    def result(self) -> bool:
        return True

    def finish(self) -> None:
        self._event.set()


def sent(session: Session) -> list[object]:
    """The frames the session's writer would send now."""
    data, _ = session.take_batch(append_msg)
    frames = []
    while data:
        size = int.from_bytes(data[:4], "big")
        frames.append(decode_frame(data[4 : 4 + size]))
        data = data[4 + size :]
    return frames


@asynccontextmanager
async def confirming(commit: Commit) -> AsyncIterator[tuple[Connection, Session, Confirms]]:
    """An open server connection whose Confirms runs and owes PUBACK 1 once ``commit``."""
    proto, session = open_server(), Session("c1", OutboundLimits(), Counters())
    confirms = Confirms(session, proto)
    async with trio.open_nursery() as nursery:
        confirms.start_in(nursery)
        confirms.after(commit, 1)
        await trio.testing.wait_all_tasks_blocked()
        yield proto, session, confirms
        nursery.cancel_scope.cancel()


async def test_pubacks_wait_for_their_commit_and_keep_their_order() -> None:
    commit = Commit()
    async with confirming(commit) as (_proto, session, confirms):
        confirms.now(2)  # needs no commit, but must not overtake 1
        await trio.testing.wait_all_tasks_blocked()
        assert sent(session) == []
        commit.finish()
        await trio.testing.wait_all_tasks_blocked()
        assert sent(session) == [PubAck(id=1), PubAck(id=2)]


async def test_a_commit_done_after_the_clients_closing_error_sends_nothing() -> None:
    commit = Commit()
    async with confirming(commit) as (proto, session, confirms):
        proto.receive_data(framed(Error(code=ErrorCode.SHUTTING_DOWN, text="bye")))
        assert isinstance(proto.next_event(), Error)  # the client is gone: CLOSING
        commit.finish()
        await trio.testing.wait_all_tasks_blocked()  # run() must neither send nor raise
        confirms.now(2)
        assert sent(session) == []


async def test_no_task_waits_while_no_confirm_does() -> None:
    """An idle connection keeps no confirms task (it would cost ~2 KiB); one starts, in the
    nursery ``start_in`` was given, while confirms wait for commits, and ends once they are sent."""
    proto, session = open_server(), Session("c1", OutboundLimits(), Counters())
    confirms = Confirms(session, proto)
    async with trio.open_nursery() as nursery:
        confirms.start_in(nursery)
        await trio.testing.wait_all_tasks_blocked()
        assert nursery.child_tasks == frozenset()
        confirms.now(1)  # no commit to wait for: at once, no task
        assert sent(session) == [PubAck(id=1)]
        first, second = Commit(), Commit()
        confirms.after(first, 2)
        confirms.now(3)
        confirms.after(second, 4)
        await trio.testing.wait_all_tasks_blocked()
        assert len(nursery.child_tasks) == 1
        first.finish()
        await trio.testing.wait_all_tasks_blocked()
        assert sent(session) == [PubAck(id=2), PubAck(id=3)]
        second.finish()
        await trio.testing.wait_all_tasks_blocked()
        assert sent(session) == [PubAck(id=4)]
        assert nursery.child_tasks == frozenset()
        confirms.after(Commit(), 5)  # and again
        await trio.testing.wait_all_tasks_blocked()
        assert len(nursery.child_tasks) == 1
        nursery.cancel_scope.cancel()
