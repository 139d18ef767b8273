"""One client connection: the trio shell around ``broker.wire.connection.Connection``.

Two tasks share a nursery owned by ``ClientConnection.run`` once the handshake
(``broker.native.handshake``) has opened a session:

- the reader (run inline) reads as many bytes as are available, has ``Requests``
  handle every whole frame in them, and only then reads again: many frames per syscall;
- the writer drains the session's queue, many frames per write (``os.write`` on a plain
  socket, ``send_all`` on other streams), replies first;
  while it is parked, what a reader's read queues for it is written by that reader
  instead, in one non-blocking send (``_direct``; the writer finishes a partial one);

plus, only while a PUBACK waits for a store commit, ``Confirms``' drain task. The
keepalive is no task of its own: the server's ``KeepaliveSweeper`` calls each
connection's ``check_keepalive``, which pings a client that has neither sent anything nor
read what we wrote for an interval, and closes it after 1.5x the interval. A failing
session calls back (``Session.on_failure``). Tasks cost memory (a connection is a few
kilobytes; docs/benchmarks.md, Memory), so there are no more of them than that.

The connection ends for one reason (``broker.native.ending``), which decides what the
client is told: EOF (nothing), a protocol error or a failed session (ERROR with the code,
sent after the write in progress and the replies due, ahead of the queued messages, which
are dropped; then we read and drop input briefly so the ERROR is not lost to a TCP reset),
or broker shutdown (queued messages are flushed first, then ERROR SHUTTING_DOWN). A
connection is only ever closed between frames, except when its socket stops taking bytes
altogether (a client that reads nothing). Only
errors one client can cause are caught here; anything else is a bug and propagates.
"""

from __future__ import annotations

import math
import os
from typing import ClassVar

import trio

from broker.core import Broker, Member, Message, Session
from broker.core.session import HELD_TURNS, flush_wakes, hold_wakes
from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger
from broker.mesh import Peering
from broker.native.confirms import Confirms
from broker.native.ending import Ending
from broker.native.handshake import handshake
from broker.native.keepalive import KeepaliveSweeper
from broker.native.requests import Requests
from broker.net import RECEIVE_SIZE, linger
from broker.security import ANONYMOUS
from broker.store import StoreError
from broker.wire.codec import append_msg, append_msg_run, encode_msg
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Role
from broker.wire.frames import Error, PeerHello, Ping
from broker.wire.states import CLOSED, CLOSING
from routing import Filter

ERROR_FLUSH_SECONDS = 1.0
FILL_PAGE = 2000  # messages fetched from the store per gap-fill read
WRITER_TASK = "topiary.connection.writer"  # one name for all (trio would format one each)
PROGRESS_BYTES = 64 * 1024  # a write of messages counts as the client's life in steps of this
BATCH_BYTES = 256 * 1024  # about this much is encoded per write

log = get_logger("topiary.connection")


def _append_discarded(
    parts: list[bytes | memoryview], message: Message, sub: int, seq: int, discarded: int
) -> int:
    """A MSG that also says how many messages were dropped just before it."""
    return append_msg(parts, message, sub, seq, discarded=discarded)


def _read_now(fd: int) -> bytes | None:
    """What socket ``fd`` has now: None if nothing yet, b"" at EOF or when it broke."""
    try:
        return os.read(fd, RECEIVE_SIZE)
    except BlockingIOError:
        return None
    except OSError:  # reset, or closed under us
        return b""


class ClientConnection:
    """One native client's socket, from HELLO to close: it owns the tasks that read,
    write and keep it alive, and decides how it ends.

    What the frames mean is ``Requests``' business and what a HELLO may open is the
    handshake's; this class only moves bytes and keeps the lifecycle (see the module
    docstring). It is the ``Holder`` of a durable session, and the server tells it to
    ``begin_shutdown``.
    """

    frontend: ClassVar[str] = "native"  # the label of its connections in /metrics

    def __init__(
        self,
        broker: Broker,
        stream: trio.abc.Stream,
        peer: str = "?",
        sweeper: KeepaliveSweeper | None = None,
    ) -> None:
        self.broker = broker
        self.sweeper = sweeper
        self.stream = stream
        self.peer = peer
        self.proto = Connection(Role.SERVER, max_frame=broker.config.max_frame)
        self.session: Session | None = None
        self.identity = ANONYMOUS  # who the client proved to be, once HELLO is accepted
        self.keepalive = broker.config.keepalive
        self.last_heard = 0.0
        self.ending = Ending()
        self._reader_scope = trio.CancelScope()
        self._handshake_scope: trio.CancelScope | None = trio.CancelScope()
        self._writer_done: trio.Event | None = None  # made when _finish waits for it
        self._writer_running = False
        self._ping_sent = False
        # A socket's descriptor, read directly (``_reader``); None for other streams
        socket = getattr(stream, "socket", None)
        self._fd: int | None = socket.fileno() if isinstance(stream, trio.SocketStream) else None  # type: ignore[union-attr]
        self._last_word: Error | None = None  # the closing ERROR, written by the writer
        self._flush_first = False  # True at shutdown: the queue goes out before the ERROR
        self.last_sent = 0.0  # trio time a write of MSGs last completed: the client reads
        # The rest of a direct write the socket did not take (``_direct``), and whether it
        # carries messages: the writer sends it before anything else.
        self._unsent: bytes | memoryview = b""
        self._unsent_messages = 0

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        broker = self.broker
        broker.connections.add(self)
        broker.counters.connections_total += 1
        self.last_heard = trio.current_time()
        refusal = broker.guard.admit()  # (past a limit: refused after its HELLO, below)
        try:
            opened = None
            with self._handshake_scope:  # type: ignore[union-attr]
                opened = await handshake(
                    broker, self.stream, self.proto, self, self.peer, refusal=refusal
                )
            self._handshake_scope = None
            if isinstance(opened, PeerHello):  # a broker or an observer: peering takes over
                if not self.ending.shutdown:
                    peering = broker.peering
                    assert isinstance(peering, Peering)  # a served broker always has one
                    await peering.accept(self.stream, self.proto, opened, self.peer)
            elif opened is not None:
                session = opened.session
                if self.ending.shutdown:
                    self._release(session, None)
                    return
                self.session = session
                self.identity = opened.identity
                self.keepalive = opened.keepalive
                self.last_heard = opened.heard
                revoked = broker.authorize(session, opened.identity, opened.client_id)
                if revoked:  # a resumed durable session's filters its rules do not grant
                    self._revoked(revoked)
                    await self._forget_stored(session, revoked)
                confirms = Confirms(session, self.proto)
                requests = Requests(
                    broker,
                    self.proto,
                    session,
                    confirms,
                    opened.joining,
                    self.peer,
                    identity=opened.identity,
                )
                try:
                    await self._serve_session(session, requests, confirms)
                finally:
                    self._release(session, requests.member)
        finally:
            if refusal is None:
                broker.guard.leave()
            broker.connections.discard(self)
            await trio.aclose_forcefully(self.stream)

    def _revoked(self, removed: list[tuple[int, Filter]]) -> None:
        """Tell the client which subscriptions the topic ACLs removed: ERROR NOT_AUTHORIZED
        naming each (``sub``), in line behind the MSGs queued before (none follows it)."""
        session = self.session
        if session is None:
            return
        counters = self.broker.counters
        for sub_id, flt in removed:
            counters.errors[str(ErrorCode.NOT_AUTHORIZED)] += 1
            error = Error(
                code=str(ErrorCode.NOT_AUTHORIZED),
                text=f"subscription {sub_id} to {flt.text!r} is not allowed by the topic ACLs "
                "any more; it was removed",
                sub=sub_id,
            )
            session.send_control(self.proto.send(error), ordered=True)

    async def _forget_stored(self, session: Session, removed: list[tuple[int, Filter]]) -> None:
        """A durable session's revoked filters leave the store too."""
        store = self.broker.store
        if not session.durable or store is None:
            return
        for _sub_id, flt in removed:
            try:
                await store.remove_filter(session.client_id, flt.text, flt.dialect)
            except StoreError as exc:
                log.error("store failed", client=session.client_id, error=str(exc))

    def _release(self, session: Session, member: Member | None) -> None:
        session.direct = None
        session.on_revoked = None
        if member is not None:
            member.group.leave(member)  # what it held goes to the others
            self.broker.close_session(session)
        elif session.durable:
            session.detach(self)  # the session stays, stored, and keeps its routes
        else:
            self.broker.close_session(session)

    def take_over(self, why: str = "another connection took over this durable session") -> None:
        """Another connection claims our durable session (the newer one wins), or an
        operator dropped it."""
        self._stop(RemoteProtocolError(ErrorCode.SESSION_TAKEN, why))

    def begin_shutdown(self) -> None:
        """Stop reading; queued messages are flushed, then ERROR SHUTTING_DOWN.

        (A peer link served on this connection is closed by ``Peering.shutdown``.)
        """
        self.ending.shut_down()
        if self._handshake_scope is not None:
            self._handshake_scope.cancel()
        self._reader_scope.cancel()

    async def _serve_session(
        self, session: Session, requests: Requests, confirms: Confirms
    ) -> None:
        if self.sweeper is not None:
            self.sweeper.hurry(self.keepalive)
        session.on_failure = self._session_failed
        session.on_revoked = self._revoked
        if session.failure is not None:
            self._session_failed(session.failure)
        if self._fd is not None and not session.durable:
            session.direct = self._direct
        self.proto.plain_pubs = True  # (Requests routes plain PUBs from their map)
        async with trio.open_nursery() as nursery:
            self._writer_running = True
            nursery.start_soon(self._writer, session, name=WRITER_TASK)
            confirms.start_in(nursery)
            reason: RemoteProtocolError | None = None
            with self._reader_scope:  # cancelled by begin_shutdown() or _stop()
                reason = await self._reader(session, requests)
            if self._reader_scope.cancelled_caught:
                reason = self.ending.why()
            await self._finish(session, reason)
            nursery.cancel_scope.cancel()

    async def _finish(self, session: Session, reason: RemoteProtocolError | None) -> None:
        ending = self.ending
        if reason is None or ending.broken:
            return  # EOF or a dead socket: nobody to tell
        if self.proto.state in (CLOSING, CLOSED):
            return  # the client said a closing ERROR: nothing more may be sent to it
        # The core's side of the same fact: it must queue nothing for us after the ERROR.
        session.accepting = False
        self.broker.counters.errors[str(reason.code)] += 1
        # The writer says it, after the write in progress (a frame boundary) and the replies
        # due, before the queued messages, which are not sent; at shutdown after them. So
        # the protocol object sees every frame in the order it goes out, and nothing follows
        # the ERROR on the wire.
        self._flush_first = reason.code == ErrorCode.SHUTTING_DOWN
        self._last_word = Error.from_exception(reason)
        ending.told()
        session.wake()
        if reason.code == ErrorCode.SHUTTING_DOWN:
            timeout = self.broker.config.shutdown_timeout
        else:
            timeout = ERROR_FLUSH_SECONDS
            log.info(
                "closing",
                peer=self.peer,
                client=session.client_id,
                code=str(reason.code),
                reason=reason.text,
            )
        if self._writer_running:
            self._writer_done = trio.Event()
            with trio.move_on_after(timeout):
                await self._writer_done.wait()
        if ending.lingers:
            await linger(self.stream)

    def _stop(self, reason: RemoteProtocolError | None) -> None:
        self.ending.stop(reason)
        self._reader_scope.cancel()

    # -- reading -------------------------------------------------------------------------

    async def _reader(self, session: Session, requests: Requests) -> RemoteProtocolError | None:
        """Hand frames to ``requests`` until EOF (None) or an error that closes the
        connection.

        Fair service: a read may bring thousands of pipelined frames; they are handled
        ``turn_frames`` at a time, and once this turn has taken ``turn_time`` the reader
        yields, so one client's storm never holds the loop from everyone else (trio then
        runs every other ready task before this one again)."""
        proto = self.proto
        handle = requests.handle
        config = self.broker.config
        turn_frames = config.turn_frames
        turn_time = config.turn_time
        clock = trio.current_time
        turn_began = clock()
        # The writers a read's frames wake are woken (or written for: ``Session.direct``)
        # together once its frames are handled, before this task reads again, or returns:
        # one write per subscriber per read, as the relays do, not one per turn. A read
        # handled in many turns flushes them every ``HELD_TURNS`` turns, so a subscriber
        # waits for at most that many of this reader's turns. (The yield at the end of a
        # turn is only a checkpoint; ``handle`` flushes them itself before it awaits
        # store work.)
        held_turns = 0
        hold_wakes()
        try:
            while True:
                stop = await handle(proto.next_events(turn_frames))  # the frames of the last read
                if stop is None:
                    # next_events stopped at turn_frames, or before a frame that changes the
                    # state: go on, unless the turn is up
                    if clock() - turn_began < turn_time:
                        continue
                    held_turns += 1
                    if held_turns >= HELD_TURNS:
                        flush_wakes()
                        held_turns = 0
                        hold_wakes()
                    self.broker.counters.turns_yielded += 1
                    await trio.lowlevel.checkpoint()
                    turn_began = clock()
                    continue
                flush_wakes()
                held_turns = 0
                if stop is not NEED_DATA:
                    return None if isinstance(stop, ConnectionClosed) else stop
                await session.wait_control_drained()
                fd = self._fd
                if fd is None:
                    data = await self._receive_stream()
                else:
                    # A socket is read with os.read and waited for here, not through
                    # SocketStream.receive_some, whose five nested coroutines would stay alive
                    # in every idle connection (about 1 KiB each). A read is a checkpoint.
                    data = _read_now(fd)
                    if data is None:
                        while data is None:
                            try:
                                await trio.lowlevel.wait_readable(fd)
                            except (trio.BrokenResourceError, trio.ClosedResourceError):
                                data = b""
                            else:
                                data = _read_now(fd)
                    else:
                        await trio.lowlevel.checkpoint()
                self.last_heard = turn_began = clock()  # (a read yields: a new turn)
                proto.receive_data(data)
                hold_wakes()
        finally:
            flush_wakes()

    async def _receive_stream(self) -> bytes:
        """Read what a stream that is not a plain socket has (b"" at EOF or when broken)."""
        try:
            return await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    # -- writing -------------------------------------------------------------------------

    async def _writer(self, session: Session) -> None:
        counters = self.broker.counters
        try:
            while True:
                if self._unsent:  # the rest of a direct write: it goes on where it stopped
                    data = self._unsent
                    self._unsent = b""
                    await self._send(data, self._unsent_messages)
                    counters.bytes_sent += len(data)
                    data = b""
                    if session.sampled:
                        self._observe_latency(session.sampled)
                    continue
                if self._last_word is not None and not self._flush_first:
                    await self._say_last_word(session)  # ahead of the queued messages
                    return
                # A gap before a queued message is filled from the store; once the ERROR is
                # due, what was never queued stays in the store for the next connection.
                if session.needs_fill() and (session.queued or not self.ending.telling):
                    await self._fill_from_store(session)
                    continue
                if not session.queued:
                    if self.ending.telling:
                        await self._say_last_word(session)
                        return
                    await session.wait_data()
                    continue
                data, messages = session.take_batch(
                    append_msg, BATCH_BYTES, _append_discarded, append_run=append_msg_run
                )
                await self._send(data, messages)
                counters.bytes_sent += len(data)
                data = b""  # not kept alive while the writer waits
                if session.sampled:  # sampled messages were in it: the MSGs are sent now
                    self._observe_latency(session.sampled)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.ending.broke()
            self.proto.send_failed()
            self._stop(None)
        finally:
            self._writer_running = False
            if self._writer_done is not None:
                self._writer_done.set()

    def _direct(self) -> bool:
        """``Session.direct`` (the writer is parked in ``wait_data``): encode what is queued
        as the writer would and write it with one non-blocking send, in the caller's turn.
        True when all of it went and nothing is left queued; else the writer, woken, sends
        the rest first (``_unsent``) and goes on."""
        if self._unsent or self._last_word is not None or self.ending.telling:
            return False
        session = self.session
        assert session is not None
        if not session.queued:  # its writer ran meanwhile and sent it (a held wake)
            return True
        data, messages = session.take_batch(
            append_msg, BATCH_BYTES, _append_discarded, append_run=append_msg_run
        )
        try:
            sent = os.write(self._fd, data)  # type: ignore[arg-type]
        except BlockingIOError:
            sent = 0
        except OSError:  # broken: the writer's send finds out and ends the connection
            sent = 0
        self.broker.counters.bytes_sent += sent
        if sent < len(data):
            self._unsent = memoryview(data)[sent:]  # (not copied)
            self._unsent_messages = messages
            return False
        if messages:
            self.last_sent = trio.current_time()
        if session.sampled:
            self._observe_latency(session.sampled)
        return not session.queued

    async def _send(self, data: bytes | memoryview, messages: int) -> None:
        """Write ``data``; while it carries messages, each ``PROGRESS_BYTES`` the socket takes
        count as life (the client is reading, however slowly; our PINGs prove nothing)."""
        if self._fd is not None:
            await self._send_fd(self._fd, data, messages)
            return
        if not messages:
            await self.stream.send_all(data)
            return
        if len(data) <= PROGRESS_BYTES:
            await self.stream.send_all(data)
        else:
            view = memoryview(data)
            for start in range(0, len(data), PROGRESS_BYTES):
                await self.stream.send_all(view[start : start + PROGRESS_BYTES])
                self.last_sent = trio.current_time()
        self.last_sent = trio.current_time()

    async def _send_fd(self, fd: int, data: bytes | memoryview, messages: int) -> None:
        """``_send`` on a plain socket: as much as it takes per ``os.write``, waiting for room
        only when it takes nothing (one syscall where ``send_all`` made one per
        ``PROGRESS_BYTES`` and went through five coroutines for each). A checkpoint, as
        ``send_all`` is: a writer with a long queue yields after every batch."""
        view = memoryview(data)
        size = len(view)
        done = counted = 0
        while done < size:
            try:
                done += os.write(fd, view[done:])
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
                continue
            except OSError as exc:  # reset, or closed under us
                raise trio.BrokenResourceError(str(exc)) from exc
            if messages and done - counted >= PROGRESS_BYTES:
                counted = done
                self.last_sent = trio.current_time()
        if messages:
            self.last_sent = trio.current_time()
        await trio.lowlevel.checkpoint()

    async def _say_last_word(self, session: Session) -> None:
        """Send the replies still due and the closing ERROR, at a frame boundary (the last
        write finished); the messages still queued are not sent."""
        session.discard_messages()
        data, _messages = session.take_batch(append_msg)
        if self._last_word is not None:
            data += self.proto.send(self._last_word)
            self._last_word = None
        if data:
            await self.stream.send_all(data)
            self.broker.counters.bytes_sent += len(data)

    def _observe_latency(self, sampled: list[float]) -> None:
        """The sampled messages just sent: their routing-to-sent time into the histogram."""
        now = trio.current_time()
        observe = self.broker.delivery_latency.observe
        for routed_at in sampled:
            observe(now - routed_at)
        sampled.clear()

    async def _fill_from_store(self, session: Session) -> None:
        """Send the next messages from the store: the session missed them in its queue."""
        store = self.broker.store
        assert store is not None
        target = session.fill_target()
        await session.wait_committed(session.sent_upto + 1)
        page = await store.pending(session.client_id, session.sent_upto, FILL_PAGE)
        page = [m for m in page if m.seq <= target]
        if not page:  # trimmed, or a duplicate that was never stored: nothing to send
            session.sent_upto = min(target, session.committed_upto)
            return
        data = b"".join(
            encode_msg(
                Message(m.topic, m.payload, m.headers, m.msg_id, from_retained=m.retained),
                0,
                m.seq,
            )
            for m in page
        )
        session.sent_upto = page[-1].seq
        self.broker.counters.messages_replayed += len(page)
        await self.stream.send_all(data)
        session.delivered += len(page)
        self.broker.counters.bytes_sent += len(data)

    # -- keepalive and the session's health ----------------------------------------------

    def check_keepalive(self, now: float) -> None:
        """The sweeper's call, a few times per interval: ping a client that neither sent
        anything nor read its messages for an interval; close it after 1.5 intervals."""
        session = self.session
        if session is None or self.ending.telling:
            return
        interval = self.keepalive
        # Life is what the client proves: bytes from it (a PONG to our PING among them),
        # or our writes of messages completing, which a full socket allows only as it
        # reads (so a slow reader whose PONG waits behind what it is still reading lives).
        idle = now - max(self.last_heard, self.last_sent)
        if idle >= interval * 1.5:
            self.broker.counters.idle_disconnects += 1
            self._stop(
                RemoteProtocolError(
                    ErrorCode.IDLE_TIMEOUT,
                    f"nothing heard or read for {math.floor(idle * 10) / 10} s "
                    f"(keepalive {interval} s)",
                )
            )
        elif idle >= interval:
            if not self._ping_sent:
                session.send_control(self.proto.send(Ping(id=0)))
                self._ping_sent = True
        else:
            self._ping_sent = False

    def _session_failed(self, failure: RemoteProtocolError) -> None:
        """The session asks to be closed (``Session.fail``: a slow consumer, say)."""
        if failure.code == ErrorCode.SLOW_CONSUMER:
            self.broker.counters.slow_consumer_disconnects += 1
        self._stop(failure)
