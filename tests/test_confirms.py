"""PUBACKs go out in order once their commits are done, and never after the connection
began to close (sans-IO: a server Connection, a Session, no sockets)."""

from __future__ import annotations

import trio
import trio.testing

from broker.core import Counters, OutboundLimits, Session
from broker.errors import ErrorCode
from broker.native.confirms import Confirms
from broker.wire.codec import append_msg, decode_frame
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


def new_session() -> Session:
    return Session("c1", OutboundLimits(), Counters())


async def test_pubacks_wait_for_their_commit_and_keep_their_order() -> None:
    proto, session = open_server(), new_session()
    confirms = Confirms(session, proto)
    commit = Commit()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(confirms.run)
        confirms.after(commit, 1)
        confirms.now(2)  # needs no commit, but must not overtake 1
        await trio.testing.wait_all_tasks_blocked()
        assert sent(session) == []
        commit.finish()
        await trio.testing.wait_all_tasks_blocked()
        assert sent(session) == [PubAck(id=1), PubAck(id=2)]
        nursery.cancel_scope.cancel()


async def test_a_commit_done_after_the_clients_closing_error_sends_nothing() -> None:
    proto, session = open_server(), new_session()
    confirms = Confirms(session, proto)
    commit = Commit()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(confirms.run)
        confirms.after(commit, 1)
        await trio.testing.wait_all_tasks_blocked()
        proto.receive_data(framed(Error(code=ErrorCode.SHUTTING_DOWN, text="bye")))
        assert isinstance(proto.next_event(), Error)  # the client is gone: CLOSING
        commit.finish()
        await trio.testing.wait_all_tasks_blocked()  # run() must neither send nor raise
        confirms.now(2)
        assert sent(session) == []
        nursery.cancel_scope.cancel()
