"""Small I/O rules every trio shell here shares: read one frame, linger, back off.

Each existed in several copies (the native front end, peer links, the client, the
bridge's route watcher, the test and bench raw clients); one copy each keeps them alike.
"""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable

import trio

from broker.errors import ProtocolError
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed
from broker.wire.frames import Error, Frame

RECEIVE_SIZE = 256 * 1024
LINGER_SECONDS = 0.5

Receive = Callable[[int], Awaitable[bytes]]


async def receive_frame(proto: Connection, receive: Receive) -> Frame | None:
    """Read (with ``receive``, e.g. a stream's ``receive_some``) until ``proto`` has a whole
    frame: that frame, or None at EOF. A frame that breaks the protocol raises
    ``RemoteProtocolError``."""
    while True:
        event = proto.next_event()
        if event is NEED_DATA:
            proto.receive_data(await receive(RECEIVE_SIZE))
            continue
        if isinstance(event, ConnectionClosed):
            return None
        return event  # type: ignore[return-value]


async def receive_from(fd: int) -> bytes:
    """What socket ``fd`` has (up to ``RECEIVE_SIZE``), waiting for it when it has nothing
    yet: b"" at EOF or when it broke. A checkpoint either way. For a reader on a plain
    socket: one ``os.read``, where ``SocketStream.receive_some`` goes through five
    coroutines and a context manager per read (~2 us more on every wake-up)."""
    try:
        data = os.read(fd, RECEIVE_SIZE)
    except BlockingIOError:
        pass
    except OSError:  # reset, or closed under us
        return b""
    else:
        await trio.lowlevel.checkpoint()
        return data
    while True:
        try:
            await trio.lowlevel.wait_readable(fd)
            return os.read(fd, RECEIVE_SIZE)
        except BlockingIOError:
            continue  # (woken, and someone else read it: wait again)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return b""


async def linger(stream: trio.abc.ReceiveStream, seconds: float = LINGER_SECONDS) -> None:
    """Read and drop for up to ``seconds`` (until EOF), so that what we just wrote (a closing
    ERROR) is not lost to a TCP reset caused by unread input."""
    with trio.move_on_after(seconds):
        try:
            while await stream.receive_some(RECEIVE_SIZE):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def send_error(
    stream: trio.abc.Stream,
    proto: Connection,
    problem: ProtocolError,
    seconds: float = LINGER_SECONDS,
) -> None:
    """Write ERROR for ``problem`` and linger; a peer that is already gone is no error."""
    try:
        await stream.send_all(proto.send(Error.from_exception(problem)))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    await linger(stream, seconds)


class Backoff:
    """Exponential backoff with jitter: each wait is the current delay times a random factor
    in [0.5, 1.5), and the delay doubles up to ``limit``. ``reset`` after a success."""

    def __init__(self, first: float, limit: float) -> None:
        self.first = first
        self.limit = limit
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    def next_wait(self) -> float:
        """The next wait, and advance the delay."""
        wait = self.delay * (0.5 + random.random())
        self.delay = min(self.delay * 2, self.limit)
        return wait

    async def wait(self) -> None:
        await trio.sleep(self.next_wait())
