"""One MQTT client connection (3.1.1 or 5.0, over TCP or WebSocket): the trio shell.

Like the native front end (``broker.native.connection``), a connection has a reader,
which decodes packets (``broker.mqtt.codec``) and turns them into core calls
(``broker.mqtt.requests``), and a writer, which drains the client's ``Session`` (replies
first, then messages), encoding each delivery as a PUBLISH for this client
(``broker.mqtt.outbound``). Fair service is the same: the reader handles at most
``turn_frames`` packets between looks at the clock and yields once its turn has lasted
``turn_time``. The keepalive is the server's sweeper calling ``check_keepalive``: MQTT
closes a client silent for 1.5 times its Keep Alive.

How it ends decides what the client is told: after a clean DISCONNECT nothing, and its
Will is discarded; on bad input, a keepalive timeout, a take-over or shutdown, an MQTT 5
client gets a DISCONNECT with the reason code (3.1.1 has none: the connection just
closes), and the Will is published.
"""

from __future__ import annotations

import math
from typing import ClassVar

import trio

from broker.core import Broker, Session
from broker.core.session import HELD_TURNS, flush_wakes, hold_wakes
from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger
from broker.mqtt import reasons as R
from broker.mqtt.closing import Closing
from broker.mqtt.codec import Decoder, MqttError, encode
from broker.mqtt.connect import Accepted, accept_connect
from broker.mqtt.outbound import Outbound
from broker.mqtt.packets import Disconnect
from broker.mqtt.requests import Requests
from broker.mqtt.state import MqttFrontEnd
from broker.native.keepalive import KeepaliveSweeper
from broker.net import RECEIVE_SIZE, linger, receive_from
from broker.security import ANONYMOUS
from broker.security.floods import Refusal
from broker.store import StoreError

ERROR_FLUSH_SECONDS = 1.0
BATCH_BYTES = 256 * 1024

log = get_logger("topiary.mqtt")

#: What a core failure (``Session.fail``) is called in an MQTT 5 DISCONNECT.
_FAILURE_REASONS = {
    ErrorCode.SLOW_CONSUMER: R.QUOTA_EXCEEDED,
    ErrorCode.INTERNAL: R.UNSPECIFIED_ERROR,
    ErrorCode.SESSION_TAKEN: R.SESSION_TAKEN_OVER,
}


class MqttConnection:
    """One MQTT client from CONNECT to close; the ``Holder`` of its durable session."""

    frontend: ClassVar[str] = "mqtt"

    def __init__(
        self,
        broker: Broker,
        frontend: MqttFrontEnd,
        stream: trio.abc.Stream,
        peer: str = "?",
        sweeper: KeepaliveSweeper | None = None,
        websocket: bool = False,
    ) -> None:
        self.broker = broker
        self.mqtt = frontend
        self.stream = stream
        self.peer = peer
        self.sweeper = sweeper
        self.websocket = websocket
        self.decoder = Decoder(server=True, max_packet=broker.config.max_frame)
        self.decoder.plain_publishes = True  # (``Requests`` takes them: the fan-out path)
        self.session: Session | None = None
        self.accepted: Accepted | None = None
        self.identity = ANONYMOUS  # who the client proved to be, once CONNECT is accepted
        self.keepalive = math.inf  # seconds; the sweeper reads it (inf: none)
        self.last_heard = 0.0
        self._reader_scope = trio.CancelScope()
        self._connect_scope: trio.CancelScope | None = trio.CancelScope()
        self._closing: Closing | None = None
        self._shutdown = False
        self._writer_done = trio.Event()
        self._last_word_due = trio.Event()
        self.outbound: Outbound | None = None
        self.requests_nursery: trio.Nursery | None = None  # where acks are stored from
        self.refusal: Refusal | None = None  # past a limit against floods (set in run)
        self._fd: int | None = None  # a plain socket's, read with os.read (net.receive_from)

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        broker = self.broker
        broker.connections.add(self)
        broker.counters.connections_total += 1
        self.mqtt.counters.connections_total += 1
        self.last_heard = trio.current_time()
        self.refusal = broker.guard.admit()  # (past a limit: refused in CONNACK)
        try:
            if self.websocket:
                from broker.mqtt.websocket import WebSocketRefused, accept_websocket

                try:
                    self.stream = await accept_websocket(self.stream)
                except (WebSocketRefused, trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            accepted = None
            with self._connect_scope:  # type: ignore[union-attr]
                accepted = await accept_connect(self)
            self._connect_scope = None
            if accepted is None or self._shutdown:
                if accepted is not None:
                    self._release(accepted, Closing(R.SERVER_SHUTTING_DOWN, "shutting down"))
                return
            self.accepted = accepted
            await self._serve(accepted)
        finally:
            if self.refusal is None:
                broker.guard.leave()
            broker.connections.discard(self)
            await trio.aclose_forcefully(self.stream)

    @property
    def shutting_down(self) -> bool:
        """The broker is shutting down (and that is what the client is told)."""
        closing = self._closing
        return self._shutdown and closing is not None and closing.reason == R.SERVER_SHUTTING_DOWN

    def take_over(self, why: str = "another connection took over this client id") -> None:
        self.mqtt.counters.takeovers += 1
        self.stop(Closing(R.SESSION_TAKEN_OVER, why))

    def begin_shutdown(self) -> None:
        self._shutdown = True
        if self._connect_scope is not None:
            self._connect_scope.cancel()
        self.stop(Closing(R.SERVER_SHUTTING_DOWN, "the broker is shutting down"))

    def stop(self, closing: Closing) -> None:
        """End the connection for ``closing`` (the first reason given is the one told)."""
        if self._closing is None:
            self._closing = closing
        self._reader_scope.cancel()

    async def _serve(self, accepted: Accepted) -> None:
        session = accepted.session
        self.session = session
        self.keepalive = accepted.keepalive or math.inf
        if self.sweeper is not None and accepted.keepalive:
            self.sweeper.hurry(accepted.keepalive)
        outbound = self.outbound = Outbound(self, accepted)
        if isinstance(self.stream, trio.SocketStream):  # (not a WebSocket, not TLS)
            self._fd = self.stream.socket.fileno()
            outbound.write_directly(self._fd, self._last_word_due)
        requests = Requests(self, accepted, outbound)
        await self._authorize(accepted, requests)
        session.on_failure = self._session_failed
        if session.failure is not None:
            self._session_failed(session.failure)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(outbound.run_writer, self._writer_done, self._last_word_due)
                requests.start_in(nursery)
                with self._reader_scope:
                    if accepted.state.shares:
                        await requests.rejoin_shares()
                    await self._reader(requests)
                await self._finish(session)
                nursery.cancel_scope.cancel()
        finally:
            self._release(accepted, self._closing)

    async def _authorize(self, accepted: Accepted, requests: Requests) -> None:
        """Give the session its topic ACL rules: a resumed session loses the subscriptions
        they do not grant (from the store too), and a will they do not let the client
        publish is dropped (counted, logged); a reload later tells ``requests``."""
        broker = self.broker
        session = accepted.session
        removed = broker.authorize(session, accepted.identity, accepted.client_id)
        session.on_revoked = requests.revoked
        if removed:
            requests.revoked(removed)
            store = broker.store
            if session.durable and store is not None:
                for _sub_id, flt in removed:
                    try:
                        await store.remove_filter(session.client_id, flt.text, flt.dialect)
                    except StoreError as exc:
                        log.error("store failed", client=session.client_id, error=str(exc))
        will = accepted.will
        if will is not None and session.acl is not None and not session.acl.may_publish(will.topic):
            accepted.will = None
            broker.counters.acl_denied_publish += 1
            log.info(
                "will dropped: not allowed by the topic ACLs",
                client=accepted.client_id,
                topic=will.topic,
            )

    def _release(self, accepted: Accepted, closing: Closing | None) -> None:
        """The session and the client id go back to the core and the front end."""
        session = accepted.session
        session.direct = None
        session.on_revoked = None
        frontend = self.mqtt
        client_id = accepted.client_id
        if frontend.live.get(client_id) is self:
            del frontend.live[client_id]
        will = accepted.will if closing is None or closing.will else None
        if self.outbound is not None:
            self.outbound.leave_all()
        if session.durable:
            session.detach(self)
        else:
            self.broker.close_session(session)
        if frontend.live.get(client_id) is None:
            frontend.away(client_id, will, accepted.will_delay, session.durable)
        elif will is not None:  # taken over: the old connection's will goes now
            frontend.publish_will(will)

    async def _finish(self, session: Session) -> None:
        """Say why we close (v5: DISCONNECT) after the replies due, then close."""
        closing = self._closing
        if closing is None or closing.reason is None:
            return
        session.accepting = False
        if closing.reason not in (R.SERVER_SHUTTING_DOWN, R.SUCCESS):
            log.info(
                "closing",
                peer=self.peer,
                client=session.client_id,
                reason=hex(closing.reason),
                text=closing.text,
            )
        self._last_word_due.set()
        session.wake()
        timeout = (
            self.broker.config.shutdown_timeout
            if closing.reason == R.SERVER_SHUTTING_DOWN
            else ERROR_FLUSH_SECONDS
        )
        with trio.move_on_after(timeout):
            await self._writer_done.wait()
        if not self._shutdown:
            await linger(self.stream)

    def last_word(self) -> bytes:
        """The DISCONNECT an MQTT 5 client gets before we close (3.1.1: nothing)."""
        closing = self._closing
        accepted = self.accepted
        if closing is None or closing.reason is None or accepted is None or not accepted.v5:
            return b""
        packet = Disconnect(reason_code=closing.reason)
        if closing.text and accepted.problem_information:
            packet.properties.reason_string = closing.text[:200]
        return encode(packet, 5)

    # -- reading -------------------------------------------------------------------------

    async def _reader(self, requests: Requests) -> None:
        """Hand packets to ``requests`` until EOF or an end; fair turns as the native reader.
        The writers the packets wake are woken (or written for) together once the read's
        packets are handled, before the reader awaits anything but the yield at the end of
        a turn, and at the latest every ``HELD_TURNS`` turns: one write per subscriber per
        read, as on the native port."""
        decoder = self.decoder
        next_packet = decoder.next_packet
        publish_plain = requests.publish_plain
        handle = requests.handle
        config = self.broker.config
        turn_frames = config.turn_frames
        turn_time = config.turn_time
        clock = trio.current_time
        turn_began = clock()
        counters = self.broker.counters
        held_turns = 0  # turns ended with the wakes still held
        while True:
            handled = 0
            hold_wakes()  # (still held when the turn goes on from the last frames)
            flush = True
            try:
                while handled < turn_frames:
                    try:
                        packet = next_packet()
                    except MqttError as exc:
                        self._malformed(exc)
                        return
                    if packet is None:
                        break
                    handled += 1
                    # (a plain PUBLISH, the fan-out path, without the look-up)
                    closing = (
                        publish_plain(packet)  # type: ignore[arg-type]
                        if packet.__class__ is tuple
                        else handle(packet)
                    )
                    if closing is None and requests.later:
                        flush_wakes()
                        closing = await requests.run_later()
                        hold_wakes()
                    if closing is not None:
                        self.stop(closing)
                        return
                busy = handled == turn_frames
                over = busy and clock() - turn_began >= turn_time
                if over:
                    held_turns += 1
                flush = not busy or held_turns >= HELD_TURNS
                if flush:
                    held_turns = 0
            finally:
                if flush:
                    flush_wakes()
            if not busy:
                await requests.wait_room()
                if self._fd is not None:
                    data = await receive_from(self._fd)
                else:
                    try:
                        data = await self.stream.receive_some(RECEIVE_SIZE)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                if not data:
                    self.stop(Closing(None, "connection lost"))
                    return
                self.last_heard = turn_began = clock()
                decoder.receive_data(data)
            elif over:
                counters.turns_yielded += 1
                await trio.lowlevel.checkpoint()
                turn_began = clock()

    def _malformed(self, exc: MqttError) -> None:
        counters = self.mqtt.counters
        if exc.reason_code == R.MALFORMED_PACKET:
            counters.packets_malformed += 1
        else:
            counters.protocol_errors += 1
        self.broker.counters.errors[f"MQTT_{exc.reason_code:#04x}"] += 1
        self.stop(Closing(exc.reason_code, exc.text))

    # -- keepalive and the session's health ----------------------------------------------

    def check_keepalive(self, now: float) -> None:
        """MQTT: a client silent for 1.5 times its Keep Alive is disconnected."""
        if self.session is None or self._closing is not None:
            return
        interval = self.keepalive
        if now - self.last_heard >= interval * 1.5:
            self.broker.counters.idle_disconnects += 1
            self.stop(
                Closing(
                    R.KEEP_ALIVE_TIMEOUT,
                    f"nothing heard for {math.floor((now - self.last_heard) * 10) / 10} s "
                    f"(keep alive {interval:g} s)",
                )
            )

    def _session_failed(self, failure: RemoteProtocolError) -> None:
        if failure.code == ErrorCode.SLOW_CONSUMER:
            self.broker.counters.slow_consumer_disconnects += 1
        self.stop(Closing(_FAILURE_REASONS.get(failure.code, R.UNSPECIFIED_ERROR), failure.text))
