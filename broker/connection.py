"""One client connection: the trio shell around ``broker.protocol.Connection``.

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

import math
from typing import TYPE_CHECKING

import trio

from broker.errors import ErrorCode, ProtocolError, RemoteProtocolError
from broker.frames import (
    PROTOCOL_VERSION,
    Ack,
    Error,
    Frame,
    Hello,
    Ping,
    Pong,
    Pub,
    Stats,
    StatsReply,
    Sub,
    Unsub,
    Welcome,
)
from broker.log import get_logger
from broker.protocol import NEED_DATA, Connection, ConnectionClosed, Role
from broker.replies import encode_puback, encode_suback, encode_unsuback
from broker.session import Session

if TYPE_CHECKING:
    from broker.core import Broker

RECEIVE_SIZE = 256 * 1024
ERROR_FLUSH_SECONDS = 1.0
LINGER_SECONDS = 0.5
MIN_KEEPALIVE = 0.5
MAX_KEEPALIVE = 3600.0

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
            if session is not None and self._shutting_down:
                broker.close_session(session)
                session = None
            if session is not None:
                self.session = session
                try:
                    await self._serve_session(session)
                finally:
                    broker.close_session(session)
        finally:
            broker.connections.discard(self)
            await trio.aclose_forcefully(self.stream)

    def begin_shutdown(self) -> None:
        """Stop reading; queued messages are flushed, then ERROR SHUTTING_DOWN."""
        self._shutting_down = True
        self._handshake_scope.cancel()
        self._reader_scope.cancel()

    async def _serve_session(self, session: Session) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer, session)
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
        assert isinstance(frame, Hello)
        problem = self._check_hello(frame)
        if problem is not None:
            await self._refuse(problem)
            return None
        if frame.keepalive:
            self.keepalive = min(max(frame.keepalive, MIN_KEEPALIVE), MAX_KEEPALIVE)
        session = broker.open_session(frame.client_id)
        welcome = Welcome(
            version=PROTOCOL_VERSION,
            client_id=session.client_id,
            server_id=broker.server_id,
            session_present=False,
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
                ErrorCode.BAD_FRAME, "client_id must be 1..256 bytes of UTF-8"
            )
        if hello.durable or hello.group is not None:
            return RemoteProtocolError(
                ErrorCode.UNSUPPORTED, "durable sessions and shared groups are not available yet"
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
        while True:
            while True:
                try:
                    event = proto.next_event()
                except RemoteProtocolError as exc:
                    if exc.closes_connection:
                        return exc
                    self._refuse_request(session, exc)
                    continue
                if event is NEED_DATA:
                    break
                if isinstance(event, ConnectionClosed):
                    return None
                problem = self._handle(session, event)  # type: ignore[arg-type]
                if problem is not None:
                    return problem
            await session.wait_control_drained()
            proto.receive_data(await self._receive())

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
            broker.publish(frame.topic, frame.payload, frame.headers, frame.msg_id)
            if frame.id is not None:
                session.send_control(encode_puback(frame.id))
        elif cls is Sub:
            assert isinstance(frame, Sub)
            sub_id = broker.subscribe(session, frame.parsed)
            session.send_control(encode_suback(frame.id, sub_id))
        elif cls is Unsub:
            assert isinstance(frame, Unsub)
            if broker.unsubscribe(session, frame.sub):
                session.send_control(encode_unsuback(frame.id))
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
            if frame.seq > session.seq:
                self._refuse_request(
                    session,
                    RemoteProtocolError(
                        ErrorCode.INVALID_ACK,
                        f"ack of sequence {frame.seq}, but only {session.seq} were delivered",
                    ),
                )
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
                if not session.queued:
                    if self._closing:
                        return
                    await session.wait_data()
                    continue
                data, _messages = session.take_batch()
                await self.stream.send_all(data)
                counters.bytes_sent += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._broken = True
            self.proto.send_failed()
            self._stop(None)
        finally:
            self._writer_done.set()

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
