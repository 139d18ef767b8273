"""One client connection: the trio shell around ``broker.wire.connection.Connection``.

Three tasks share a nursery owned by ``ClientConnection.run``:

- the reader (run inline) reads as many bytes as are available, handles every
  whole frame in them, and only then reads again: many frames per syscall;
- the writer drains the session's queue, many frames per ``send_all``;
- the keepalive pings a silent client and closes it after 1.5x the interval.

The connection ends for one reason, which decides what the client is told:
EOF (nothing), a protocol error or a failed session (ERROR with the code,
after which we read and drop input briefly so the ERROR is not lost to a TCP
reset), or broker shutdown (queued messages are flushed first, then ERROR
SHUTTING_DOWN). Only errors one client can cause are caught here; anything
else is a bug and propagates.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from typing import Any

import trio

import routing
from broker.core import (
    GROUP_PREFIX,
    Broker,
    DurableWork,
    Group,
    Member,
    Message,
    QuotaExceeded,
    Session,
)
from broker.errors import ErrorCode, ProtocolError, RemoteProtocolError
from broker.log import get_logger
from broker.mesh import Peering
from broker.store import Pending, StoreError
from broker.wire.codec import (
    append_msg,
    encode_msg,
    encode_puback,
    encode_suback,
    encode_unsuback,
)
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Role
from broker.wire.frames import (
    PROTOCOL_VERSION,
    Ack,
    DropSession,
    Error,
    Frame,
    Hello,
    PeerHello,
    Ping,
    Pong,
    Pub,
    Routes,
    RoutesReply,
    SessionDropped,
    Sessions,
    SessionsReply,
    Stats,
    StatsReply,
    Sub,
    Unsub,
    Welcome,
)
from broker.wire.states import CLOSED, CLOSING

RECEIVE_SIZE = 256 * 1024
ERROR_FLUSH_SECONDS = 1.0
LINGER_SECONDS = 0.5
MIN_KEEPALIVE = 0.5
MAX_KEEPALIVE = 3600.0
FILL_PAGE = 2000  # messages fetched from the store per gap-fill read

log = get_logger("topiary.connection")


class _Shutdown(Exception):
    """Internal: the reader was stopped because the broker is shutting down."""


class ClientConnection:
    def __init__(self, broker: Broker, stream: trio.abc.Stream, peer: str = "?") -> None:
        self.broker = broker
        self.stream = stream
        self.peer = peer
        self.proto = Connection(Role.SERVER, max_frame=broker.config.max_frame)
        self.session: Session | None = None
        self.keepalive = broker.config.keepalive
        self.last_heard = 0.0
        self._reader_scope = trio.CancelScope()
        self._handshake_scope = trio.CancelScope()
        self._stop_reason: RemoteProtocolError | None = None
        self._shutting_down = False
        self._closing = False
        self._broken = False
        self._writer_done = trio.Event()
        self._later: list[tuple[Any, tuple[Any, ...]]] = []  # awaited before reading on
        self._confirms: deque[tuple[Pending | None, int]] = deque()
        self._confirm_ready = trio.Event()
        self._joining: Group | None = None
        self.member: Member | None = None  # set while this connection is a group member
        self._peer_hello: PeerHello | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        broker = self.broker
        broker.connections.add(self)
        broker.counters.connections_total += 1
        self.last_heard = trio.current_time()
        try:
            session = None
            with self._handshake_scope:
                session = await self._handshake()
            if self._peer_hello is not None and not self._shutting_down:
                peering = broker.peering
                assert isinstance(peering, Peering)  # a served broker always has one
                await peering.accept(self.stream, self.proto, self._peer_hello, self.peer)
            if session is not None and self._shutting_down:
                self._release(session)
                session = None
            if session is not None:
                self.session = session
                try:
                    await self._serve_session(session)
                finally:
                    self._release(session)
        finally:
            broker.connections.discard(self)
            await trio.aclose_forcefully(self.stream)

    def _release(self, session: Session) -> None:
        if self.member is not None:
            self.member.group.leave(self.member)  # what it held goes to the others
            self.member = None
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
        self._shutting_down = True
        self._handshake_scope.cancel()
        self._reader_scope.cancel()

    async def _serve_session(self, session: Session) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer, session)
            nursery.start_soon(self._confirm_loop, session)
            nursery.start_soon(self._keepalive_loop)
            nursery.start_soon(self._watch_session, session)
            reason: RemoteProtocolError | None = None
            with self._reader_scope:  # cancelled by begin_shutdown() or _stop()
                reason = await self._reader(session)
            if self._reader_scope.cancelled_caught:
                reason = self._stop_reason
                if reason is None and self._shutting_down:
                    reason = RemoteProtocolError(
                        ErrorCode.SHUTTING_DOWN, "the broker is shutting down"
                    )
            await self._finish(session, reason)
            nursery.cancel_scope.cancel()

    async def _finish(self, session: Session, reason: RemoteProtocolError | None) -> None:
        if reason is None or self._broken:
            return  # EOF or a dead socket: nobody to tell
        if self.proto.state in (CLOSING, CLOSED):
            return  # the client said a closing ERROR: nothing more may be sent to it
        session.accepting = False
        if reason.code == ErrorCode.SLOW_CONSUMER:
            session.discard_messages()
        self._count_error(reason.code)
        session.send_control(self.proto.send(Error.from_exception(reason)))
        self._closing = True
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
        with trio.move_on_after(timeout):
            await self._writer_done.wait()
        if not self._broken and not self._shutting_down:
            await self._linger()

    async def _linger(self) -> None:
        """Read and drop briefly so our ERROR is not lost to a TCP reset."""
        with trio.move_on_after(LINGER_SECONDS):
            try:
                while await self.stream.receive_some(RECEIVE_SIZE):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    # -- handshake -----------------------------------------------------------------------

    async def _handshake(self) -> Session | None:
        broker = self.broker
        config = broker.config
        frame: Frame | None = None
        with trio.move_on_after(config.hello_timeout) as waiting:
            try:
                frame = await self._next_frame()
            except RemoteProtocolError as exc:
                await self._refuse(exc)
                return None
        if waiting.cancelled_caught:
            await self._refuse(
                RemoteProtocolError(
                    ErrorCode.IDLE_TIMEOUT, f"no HELLO within {config.hello_timeout} s"
                )
            )
            return None
        if frame is None:
            return None  # EOF before HELLO
        if isinstance(frame, PeerHello):
            self._peer_hello = frame  # a broker or an observer: peering takes the stream
            return None
        assert isinstance(frame, Hello)
        problem = self._check_hello(frame)
        if problem is not None:
            await self._refuse(problem)
            return None
        if frame.keepalive:
            self.keepalive = min(max(frame.keepalive, MIN_KEEPALIVE), MAX_KEEPALIVE)
        present = False
        try:
            if frame.group is not None:
                group, present = await broker.open_group(frame.group)
            elif frame.durable:
                assert frame.client_id is not None
                durable, present = await broker.open_durable(frame.client_id)
        except StoreError as exc:
            broker.counters.store_errors += 1
            await self._refuse(RemoteProtocolError(ErrorCode.INTERNAL, f"storage failed: {exc}"))
            return None
        if frame.group is not None:
            session = broker.open_session(frame.client_id)
            self._joining = group  # joins once its first request is answered, like a backlog
            session.ready = False
        elif frame.durable:
            session = durable
            previous = session.connection
            if previous is not None:
                previous.take_over()
                with trio.move_on_after(config.shutdown_timeout):
                    while session.connection is previous:
                        await trio.sleep(0.01)
                if session.connection is not None:
                    await self._refuse(
                        RemoteProtocolError(
                            ErrorCode.SESSION_TAKEN, "the session's connection did not let go"
                        )
                    )
                    return None
            session.attach(self)
        else:
            session = broker.open_session(frame.client_id)
        welcome = Welcome(
            version=PROTOCOL_VERSION,
            client_id=session.client_id,
            server_id=broker.server_id,
            session_present=present,
            max_frame=config.max_frame,
            keepalive=self.keepalive * 1.5,
        )
        session.send_control(self.proto.send(welcome))
        log.debug("hello", peer=self.peer, client=session.client_id)
        return session

    def _check_hello(self, hello: Hello) -> RemoteProtocolError | None:
        config = self.broker.config
        if hello.version != PROTOCOL_VERSION:
            return RemoteProtocolError(
                ErrorCode.VERSION_MISMATCH,
                f"this broker speaks protocol version {PROTOCOL_VERSION}, not {hello.version}",
            )
        if config.auth_token is not None:
            token = (hello.credentials or {}).get("token")
            if token != config.auth_token:
                return RemoteProtocolError(ErrorCode.AUTH_FAILED, "bad or missing token")
        if hello.client_id is not None and not 0 < len(hello.client_id.encode()) <= 256:
            return RemoteProtocolError(
                ErrorCode.INVALID_CLIENT_ID, "client_id must be 1..256 bytes of UTF-8"
            )
        if hello.group is not None:
            if not 0 < len(hello.group.encode()) <= 256:
                return RemoteProtocolError(
                    ErrorCode.INVALID_CLIENT_ID, "group must be 1..256 bytes of UTF-8"
                )
            if self.broker.store is None:
                return RemoteProtocolError(
                    ErrorCode.UNSUPPORTED, "shared groups need a broker started with --data-dir"
                )
        elif hello.durable:
            if hello.client_id is not None and hello.client_id.startswith(GROUP_PREFIX):
                return RemoteProtocolError(
                    ErrorCode.INVALID_CLIENT_ID,
                    f"client ids starting with {GROUP_PREFIX!r} name shared groups",
                )
            if hello.client_id is None:
                return RemoteProtocolError(
                    ErrorCode.INVALID_CLIENT_ID, "a durable session needs a client_id"
                )
            if self.broker.store is None:
                return RemoteProtocolError(
                    ErrorCode.UNSUPPORTED,
                    "durable sessions need a broker started with --data-dir",
                )
        return None

    async def _refuse(self, exc: RemoteProtocolError) -> None:
        """Answer a failed handshake with ERROR, write it, linger, and give up."""
        self._count_error(exc.code)
        if exc.code == ErrorCode.AUTH_FAILED:
            self.broker.counters.connections_refused += 1
        try:
            await self.stream.send_all(self.proto.send(Error.from_exception(exc)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        await self._linger()

    async def _next_frame(self) -> Frame | None:
        """Read until one whole frame is there; None at EOF."""
        while True:
            event = self.proto.next_event()
            if isinstance(event, ConnectionClosed):
                return None
            if event is not NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self._receive()
            self.proto.receive_data(data)

    async def _receive(self) -> bytes:
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        self.last_heard = trio.current_time()
        return data

    # -- reading -------------------------------------------------------------------------

    async def _reader(self, session: Session) -> RemoteProtocolError | None:
        """Handle frames until EOF (None) or an error that closes the connection."""
        proto = self.proto
        handle = self._handle
        while True:
            events: list[Any] = proto.next_events()  # the frames of the last read
            count = len(events)
            events.append(None)  # so that looking one event ahead needs no bounds check
            need_data = False
            i = 0
            while i < count:
                event = events[i]
                i += 1
                if event is NEED_DATA:
                    need_data = True
                    break
                if isinstance(event, RemoteProtocolError):
                    if event.closes_connection:
                        return event
                    self._refuse_request(session, event)
                    continue
                if isinstance(event, ConnectionClosed):
                    return None
                cls = event.__class__
                if (
                    cls is events[i].__class__
                    and (cls is Sub or cls is Unsub)
                    and self._plain(session)
                ):  # pipelined SUBs or UNSUBs: a run in one pass
                    if cls is Sub:
                        i = self._subscribe_run(session, events, i - 1)
                    else:
                        i = self._unsubscribe_run(session, events, i - 1)
                    continue
                problem = handle(session, event)  # type: ignore[arg-type]
                if problem is not None:
                    return problem
                if self._later:
                    try:
                        await self._run_later()
                    except StoreError as exc:  # this client's request; others carry on
                        self.broker.counters.store_errors += 1
                        log.error("store failed", client=session.client_id, error=str(exc))
                        return RemoteProtocolError(ErrorCode.INTERNAL, f"storage failed: {exc}")
                if not session.ready:  # its first request is answered: the backlog may come
                    session.ready = True
                    if self._joining is not None:
                        self.member = self._joining.join(session)
                        self._joining = None
                    session.wake()
            if not need_data:
                continue  # next_events stopped before a frame that changes the state
            await session.wait_control_drained()
            proto.receive_data(await self._receive())

    def _plain(self, session: Session) -> bool:
        """Is a SUB or UNSUB here only a table change and a reply? (The client's own
        transient session, no group, no peers to sync with: then runs of them are batched.)"""
        return (
            self.member is None
            and self._joining is None
            and session.ready
            and not session.durable
            and not self.broker.peering.active
        )

    def _subscribe_run(self, session: Session, events: list[Any], start: int) -> int:
        """Handle the run of SUBs at ``events[start]`` (``_plain`` sessions only) as
        ``_handle`` would, one after the other, with their SUBACKs in one write; returns the
        index after the run."""
        end = start + 1
        while events[end].__class__ is Sub:  # (the list ends with None)
            end += 1
        frames = events[start:end]
        sub_ids = self.broker.subscribe_many(session, [frame.parsed for frame in frames])
        replies = map(encode_suback, [frame.id for frame in frames], sub_ids)
        session.send_control(b"".join(replies))
        return end

    def _unsubscribe_run(self, session: Session, events: list[Any], start: int) -> int:
        """``_subscribe_run`` for a run of UNSUBs: UNSUBACKs, and ERRORs for unknown
        subscriptions, in order in one write."""
        end = start + 1
        while events[end].__class__ is Unsub:
            end += 1
        frames = events[start:end]
        dropped = self.broker.unsubscribe_many(session, [frame.sub for frame in frames])
        parts = []
        for frame, ok in zip(frames, dropped, strict=True):
            if ok:
                parts.append(encode_unsuback(frame.id))
            else:
                exc = RemoteProtocolError(
                    ErrorCode.UNKNOWN_SUBSCRIPTION,
                    f"no subscription {frame.sub} on this session",
                    ref=frame.id,
                )
                self._count_error(exc.code)
                parts.append(self.proto.send(Error.from_exception(exc)))
        session.send_control(b"".join(parts))
        return end

    def _owner(self, session: Session) -> Session:
        """The session a SUB or UNSUB changes: the group's for a member (joined or about
        to join), else the client's own."""
        group = self.member.group if self.member is not None else self._joining
        return group if group is not None else session

    def _refuse_request(self, session: Session, exc: ProtocolError) -> None:
        self._count_error(exc.code)
        session.send_control(self.proto.send(Error.from_exception(exc)))

    def _handle(self, session: Session, frame: Frame) -> RemoteProtocolError | None:
        broker = self.broker
        send = self.proto.send
        cls = frame.__class__
        if cls is Pub:
            assert isinstance(frame, Pub)
            if len(frame.payload) > broker.config.max_payload:
                self._refuse_request(
                    session,
                    RemoteProtocolError(
                        ErrorCode.PAYLOAD_TOO_LARGE,
                        f"payload of {len(frame.payload)} bytes exceeds the limit of "
                        f"{broker.config.max_payload}",
                        ref=frame.id,
                    ),
                )
                return None
            try:
                work = broker.publish(frame.topic, frame.payload, frame.headers, frame.msg_id)
            except QuotaExceeded as exc:
                self._refuse_request(
                    session, RemoteProtocolError(ErrorCode.QUOTA_EXCEEDED, str(exc), ref=frame.id)
                )
                return None
            if work is not None:
                pending = None if self._later else broker.persist_nowait(work)
                if pending is None:
                    self._later.append((self._persist, (work, frame.id)))
                elif frame.id is not None:
                    self._confirm_after(pending, frame.id)
            elif frame.id is not None:
                if self._confirms:  # keep PUBACKs in order behind ones waiting for a commit
                    self._confirm_after(None, frame.id)
                else:
                    session.send_control(encode_puback(frame.id))
        elif cls is Sub:
            assert isinstance(frame, Sub)
            owner = (
                session if self.member is None and self._joining is None else self._owner(session)
            )  # (most sessions are nobody's group member: no call for them)
            sub_id = broker.subscribe(owner, frame.parsed)
            reply = encode_suback(frame.id, sub_id)
            sync = frame.sync and broker.peering.active
            if owner.durable:
                self._later.append(
                    (
                        self._store_filter,
                        (owner, frame.parsed, True, None if sync else reply, session),
                    )
                )
            if sync:
                self._later.append((self._sync_sub, (owner, sub_id, frame, reply, session)))
            elif not owner.durable:
                session.send_control(reply)
        elif cls is Unsub:
            assert isinstance(frame, Unsub)
            owner = self._owner(session)
            ref = owner.subs.get(frame.sub)
            if broker.unsubscribe(owner, frame.sub):
                reply = encode_unsuback(frame.id)
                if owner.durable and ref is not None and not ref.sub_ids:
                    flt = routing.parse_filter(ref.filter, ref.dialect)
                    self._later.append((self._store_filter, (owner, flt, False, reply, session)))
                else:
                    session.send_control(reply)
            else:
                self._refuse_request(
                    session,
                    RemoteProtocolError(
                        ErrorCode.UNKNOWN_SUBSCRIPTION,
                        f"no subscription {frame.sub} on this session",
                        ref=frame.id,
                    ),
                )
        elif cls is Ping:
            assert isinstance(frame, Ping)
            session.send_control(send(Pong(id=frame.id)))
        elif cls is Pong:
            pass  # last_heard was updated when its bytes arrived
        elif cls is Ack:
            assert isinstance(frame, Ack)
            member = self.member
            if member is not None:
                settled = member.group.ack(member, frame.seq, frame.single)
                if frame.single and not settled:
                    self._refuse_request(
                        session,
                        RemoteProtocolError(
                            ErrorCode.INVALID_ACK,
                            f"sequence {frame.seq} is not held by this group member",
                        ),
                    )
                elif settled:
                    group_id = member.group.client_id
                    self._later.append((self._store_ack_one, (group_id, settled)))
                return None
            delivered = session.sent_upto if session.durable else session.seq
            if frame.seq > delivered:
                self._refuse_request(
                    session,
                    RemoteProtocolError(
                        ErrorCode.INVALID_ACK,
                        f"ack of sequence {frame.seq}, but only {delivered} were delivered",
                    ),
                )
            elif session.durable and frame.seq > session.last_ack:
                session.last_ack = frame.seq
                session.release_through(frame.seq)
                self._later.append((self._store_ack, (session, frame.seq)))
        elif cls is Sessions:
            assert isinstance(frame, Sessions)
            session.send_control(send(SessionsReply(id=frame.id, sessions=broker.sessions_info())))
        elif cls is DropSession:
            assert isinstance(frame, DropSession)
            self._later.append((self._drop_session, (session, frame)))
        elif cls is Routes:
            assert isinstance(frame, Routes)
            session.send_control(send(RoutesReply(id=frame.id, routes=broker.routes_info())))
        elif cls is Stats:
            assert isinstance(frame, Stats)
            session.send_control(send(StatsReply(id=frame.id, stats=broker.stats())))
        elif cls is Error:
            assert isinstance(frame, Error)
            log.info("client error", peer=self.peer, code=frame.code, text=frame.text)
            if frame.closes_connection:
                return None
        else:  # the state table lets nothing else through
            raise AssertionError(f"unhandled frame {frame!r}")
        return None

    # -- writing and keepalive -----------------------------------------------------------

    async def _writer(self, session: Session) -> None:
        counters = self.broker.counters
        try:
            while True:
                if session.needs_fill():
                    await self._fill_from_store(session)
                    continue
                if not session.queued:
                    if self._closing:
                        return
                    await session.wait_data()
                    continue
                data, _messages = session.take_batch(append_msg)
                await self.stream.send_all(data)
                counters.bytes_sent += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._broken = True
            self.proto.send_failed()
            self._stop(None)
        finally:
            self._writer_done.set()

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
            encode_msg(Message(m.topic, m.payload, m.headers, m.msg_id), 0, m.seq) for m in page
        )
        session.sent_upto = page[-1].seq
        self.broker.counters.messages_replayed += len(page)
        await self.stream.send_all(data)
        self.broker.counters.bytes_sent += len(data)

    # -- work that waits for the store ---------------------------------------------------

    async def _run_later(self) -> None:
        later, self._later = self._later, []
        for job, args in later:
            await job(*args)

    async def _persist(self, work: DurableWork, request_id: int | None) -> None:
        pending = await self.broker.persist(work)
        if request_id is not None:
            self._confirm_after(pending, request_id)

    def _confirm_after(self, pending: Pending | None, request_id: int) -> None:
        self._confirms.append((pending, request_id))
        self._confirm_ready.set()

    async def _confirm_loop(self, session: Session) -> None:
        """PUBACKs in order, each once its message is committed (when it had to be)."""
        confirms = self._confirms
        while True:
            if not confirms:
                self._confirm_ready = trio.Event()
                await self._confirm_ready.wait()
                continue
            pending = confirms[0][0]
            if pending is not None and not pending.done:
                with contextlib.suppress(StoreError):
                    await pending.wait()  # the outcome is read below
            # One commit resolves a whole batch: answer every confirm that is ready now, in
            # one go (one queued write), instead of one per scheduler round.
            replies: list[bytes] = []
            while confirms and (confirms[0][0] is None or confirms[0][0].done):
                pending, request_id = confirms.popleft()
                reply = encode_puback(request_id)
                if pending is not None:
                    try:
                        pending.result()
                    except StoreError as exc:
                        error = Error(
                            code=ErrorCode.INTERNAL, text=f"not stored: {exc}", ref=request_id
                        )
                        reply = self.proto.send(error)
                replies.append(reply)
            if replies:
                session.send_control(b"".join(replies))

    async def _store_filter(
        self,
        owner: Session,
        flt: routing.Filter,
        add: bool,
        reply: bytes | None,
        session: Session,
    ) -> None:
        store = self.broker.store
        assert store is not None
        if add:
            await store.add_filter(owner.client_id, flt.text, flt.dialect)
        else:
            await store.remove_filter(owner.client_id, flt.text, flt.dialect)
        if reply is not None:
            session.send_control(reply)

    async def _sync_sub(
        self, owner: Session, sub_id: int, frame: Sub, reply: bytes, session: Session
    ) -> None:
        """SUBACK only once every reachable broker has the route; else undo, and say so."""
        if await self.broker.peering.sync():
            session.send_control(reply)
            return
        ref = owner.subs.get(sub_id)
        self.broker.unsubscribe(owner, sub_id)
        if owner.durable and ref is not None and not ref.sub_ids:
            await self._store_filter(owner, frame.parsed, False, None, session)
        self._refuse_request(
            session,
            RemoteProtocolError(
                ErrorCode.SYNC_TIMEOUT,
                f"not every reachable broker acknowledged the route within "
                f"{self.broker.config.sync_timeout} s; the subscription was removed",
                ref=frame.id,
            ),
        )

    async def _drop_session(self, session: Session, frame: DropSession) -> None:
        dropped = await self.broker.drop_session(frame.client_id, requester=session)
        session.send_control(self.proto.send(SessionDropped(id=frame.id, dropped=dropped)))

    async def _store_ack_one(self, client_id: str, seqs: list[int]) -> None:
        store = self.broker.store
        assert store is not None
        for seq in seqs:
            await store.begin_ack_one(client_id, seq)

    async def _store_ack(self, session: Session, seq: int) -> None:
        store = self.broker.store
        assert store is not None
        await store.begin_ack(session.client_id, seq)

    async def _keepalive_loop(self) -> None:
        interval = self.keepalive
        ping_sent = False
        while True:
            await trio.sleep(max(interval / 4, 0.05))
            idle = trio.current_time() - self.last_heard
            if idle >= interval * 1.5:
                self.broker.counters.idle_disconnects += 1
                self._stop(
                    RemoteProtocolError(
                        ErrorCode.IDLE_TIMEOUT,
                        f"nothing heard for {math.floor(idle * 10) / 10} s "
                        f"(keepalive {interval} s)",
                    )
                )
                return
            if idle >= interval and not ping_sent and not self._closing and self.session:
                self.session.send_control(self.proto.send(Ping(id=0)))
                ping_sent = True
            elif idle < interval:
                ping_sent = False

    async def _watch_session(self, session: Session) -> None:
        await session.failed.wait()
        if session.failure is not None and session.failure.code == ErrorCode.SLOW_CONSUMER:
            self.broker.counters.slow_consumer_disconnects += 1
        self._stop(session.failure)

    def _stop(self, reason: RemoteProtocolError | None) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        self._reader_scope.cancel()

    def _count_error(self, code: str) -> None:
        self.broker.counters.errors[str(code)] += 1
