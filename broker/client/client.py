"""The async client for trio.

    async with connect("127.0.0.1:7474") as client:
        await client.publish("beacon/eu/de/s1/cart/view", b"{}", confirm=True)
        async with client.subscribe("beacon/eu/>") as sub:
            async for message in sub:
                ...

No call takes a timeout: wrap it in ``trio.fail_after`` (trio's convention).

The broker sends each message once per session, however many of the
session's filters match, so the client routes it to every local subscription
that wants it with its own ``routing.SubscriptionTable`` (the MSG's ``sub``
names just one of them). Each subscription has a bounded buffer; when one is
full the reader waits, TCP pushes back, and the broker's flow control for
slow consumers takes over: memory stays bounded on both sides.

Writes go through one buffer drained by a writer task, so a fast publisher
puts many frames in each ``send_all``; a publisher that outruns the socket
waits in ``publish`` once the buffer is over ``WRITE_BUFFER_LIMIT`` bytes.

A resumed durable session's backlog follows the SUBACK of the client's first
subscription and lands in that subscription (waiting for room in its
buffer). Subscribe to a durable session's filters one at a time and read as
you go, or give the first subscription a buffer as large as the backlog: a
second ``subscribe`` waits for its SUBACK behind the first one's messages.

A client may be given several servers (``connect(["A", "B"])`` or ``"A,B"``): it
connects to the first that accepts, in order. A server that refuses for good
(``broker.errors.refused_for_good``: a bad token, another protocol version; a
standby of a hot-spare pair) does not stop it trying the next; only when every
server refuses for good does it fail, with the last refusal.

With ``reconnect=True`` a lost connection is re-established over the same list,
starting with the server after the one lost, in rounds separated by exponential
backoff with jitter (``reconnect_timeout`` bounds how long). Subscriptions are
renewed, a durable session resumes, and unconfirmed confirmed publishes are sent
again in their order, before any new publish, with the same message id: the
client gives every confirmed publish one, so a broker that has it already (its
duplicate window) confirms and drops the copy. At most ``max_in_flight``
confirmed publishes await their PUBACK; more wait. Messages published while
disconnected wait. A ``Message`` names the broker (``server``) whose sequence its
``seq`` counts in, and ``ack(seq, server=...)`` is not sent to another.
"""

from __future__ import annotations

import itertools
import math
import secrets
import ssl
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import msgpack
import trio

import routing
from broker.address import DEFAULT_PORT, format_address, parse_servers
from broker.client.errors import BrokerError, ConnectionLost, worth_retrying
from broker.client.pubacks import take_pubacks
from broker.client.subscription import Message, Subscription
from broker.client.waiters import Batch, BatchPart, InFlight, Pending, Waiter
from broker.errors import ErrorCode, RemoteProtocolError, refused_for_good
from broker.log import get_logger
from broker.net import RECEIVE_SIZE, Backoff, receive_frame
from broker.security.tls import client_context
from broker.wire import frames
from broker.wire.checks import MAX_MSG_ID_BYTES
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Role
from broker.wire.states import State

WRITE_BUFFER_LIMIT = 1024 * 1024
YIELD_AT = 64 * 1024  # a publisher in a tight loop lets the writer run every ~64 KiB
SUBSCRIPTION_BUFFER = 1000
MAX_IN_FLIGHT = 10_000  # confirmed publishes awaiting PUBACK (kept to be sent again)
UNCLAIMED_LIMIT = 10_000  # durable replay kept until the application subscribes again

log = get_logger("topiary.client")
_packb = msgpack.Packer(use_bin_type=True).pack


_OPEN = State.OPEN


class Client:
    """One connection to a broker: publish, subscribe, ack and the operators' requests.

    Open it with :func:`connect`, which says HELLO and runs the tasks: a reader that
    resolves each reply's waiter by request id and hands each message to every local
    subscription that matches, a writer that drains the write buffer, a keepalive, and
    with ``reconnect`` the loop that opens a lost connection again (to the same server or
    another of ``servers``). The constructor only checks the addresses.
    """

    def __init__(
        self,
        server: str | tuple[str, int] | Sequence[str | tuple[str, int]],
        *,
        client_id: str | None,
        credentials: dict[str, Any] | None,
        keepalive: float,
        reconnect: bool,
        backoff: tuple[float, float],
        durable: bool = False,
        group: str | None = None,
        tls: ssl.SSLContext | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        reconnect_timeout: float | None = None,
    ) -> None:
        self.servers = parse_servers(server)
        self.address = self.servers[0]  # the server connected to (or tried first)
        self.tls = tls
        self.group = group
        self.durable = durable or group is not None
        self.session_present = False
        self.requested_client_id = client_id
        self.client_id: str | None = None
        self.server_id: str | None = None
        self.credentials = credentials
        self.keepalive = keepalive
        self.reconnect = reconnect
        self.backoff = backoff
        self.errors: list[BrokerError] = []  # refusals of requests nobody waits for
        self.discarded = 0  # messages the broker said it dropped for us (MSG ``discarded``)
        self.reconnects = 0
        self.failovers = 0  # reconnects that went to another server than the one lost
        self.reconnect_timeout = reconnect_timeout
        self._in_flight = InFlight(max_in_flight)
        # Message ids for confirmed publishes that have none, when they may be sent again
        # (``reconnect``): unique to this client, so a copy sent again after a reconnect is
        # recognised by the broker's duplicate window. Without reconnects nothing is sent
        # twice, and an id would only cost the broker a row in its duplicate filter.
        self._msg_id_prefix = f"{secrets.token_urlsafe(9)}-" if reconnect else None
        self._msg_ids = itertools.count(1)
        self._ids = itertools.count(1)
        self._stream: trio.abc.Stream | None = None
        self._proto = Connection(Role.CLIENT)
        self._waiters: dict[int, Pending] = {}
        self._subs: dict[int, Subscription] = {}  # broker sub id -> subscription
        self._local = routing.SubscriptionTable()  # filter -> local Subscription objects
        self._active: list[Subscription] = []
        self._renewals: dict[int, Subscription] = {}  # SUB request id -> renewed subscription
        self._unclaimed: deque[Message] = deque(maxlen=UNCLAIMED_LIMIT)
        self._out = bytearray()
        self._out_ready = trio.Event()
        self._out_drained = trio.Event()
        self._out_drained.set()
        self._connected = trio.Event()
        self._closing = False
        self._failure: Exception | None = None

    # -- connection ----------------------------------------------------------------------

    async def _open_first(self, start: int = 0) -> list[Exception]:
        """One pass over the servers from index ``start``: connected to the first that
        accepts (and nothing returned), else each server's failure in the order tried. A
        refusal for good from one server does not end the pass: another may accept."""
        failures: list[Exception] = []
        count = len(self.servers)
        for step in range(count):
            address = self.servers[(start + step) % count]
            try:
                await self._open(address)
            except (
                OSError,
                ConnectionLost,
                BrokerError,
                RemoteProtocolError,
                trio.BrokenResourceError,
            ) as exc:
                failures.append(exc)
                if count > 1:
                    log.info("server unavailable", server=format_address(address), error=str(exc))
                continue
            return []
        return failures

    async def _open(self, address: tuple[str, int]) -> None:
        host, port = address
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if self.tls is not None:
            stream = await _secure(stream, self.tls, host)
        proto = Connection(Role.CLIENT)
        client_id = self.client_id or self.requested_client_id
        hello = frames.Hello(
            version=frames.PROTOCOL_VERSION,
            client_id=client_id,
            durable=self.durable and self.group is None,
            group=self.group,
            credentials=self.credentials,
            keepalive=self.keepalive,
        )
        try:
            await stream.send_all(proto.send(hello))
            event = await receive_frame(proto, stream.receive_some)
            if event is None:
                raise ConnectionLost("the broker closed the connection during the handshake")
            if isinstance(event, frames.Error):
                raise BrokerError(event.code, event.text, event.ref)
            assert isinstance(event, frames.Welcome)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        self._stream = stream
        self._proto = proto
        self.address = address
        self.client_id = event.client_id
        self.server_id = event.server_id
        self.session_present = event.session_present
        self._out = bytearray()
        self._connected.set()

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            error = await self._session()
            if self._closing:
                return
            refused = isinstance(error, BrokerError) and refused_for_good(error.code)
            if self.reconnect and (not refused or len(self.servers) > 1):
                self._connected = trio.Event()
                error = await self._reconnect()
                if error is None:
                    continue
            self._fail(error or ConnectionLost("connection closed by the broker"))
            return

    async def _reconnect(self) -> Exception | None:
        """Connect again, in rounds over the servers (from the one after the server lost)
        with backoff between them, until connected (None), refused for good by every
        server (the last refusal: a bad token or another protocol version will not pass
        by waiting), or ``reconnect_timeout`` has passed (the last failure)."""
        lost = self.address
        backoff = Backoff(*self.backoff)
        start = (self.servers.index(lost) + 1) % len(self.servers)
        timeout = self.reconnect_timeout
        give_up_at = math.inf if timeout is None else trio.current_time() + timeout
        while not self._closing:
            await backoff.wait()
            failures = await self._open_first(start)
            if not failures:
                self.reconnects += 1
                if self.address != lost:
                    self.failovers += 1
                    log.warning(
                        "failed over",
                        server=format_address(self.address),
                        lost=format_address(lost),
                    )
                await self._resume()
                return None
            last = failures[-1]
            if not any(worth_retrying(exc) for exc in failures):
                log.warning("reconnect refused", error=str(last))
                return last
            if trio.current_time() >= give_up_at:
                log.warning("reconnect gave up", error=str(last), after_s=timeout)
                return last
            log.info("reconnect failed", error=str(last), retry_in=round(backoff.delay, 2))
        return None

    async def _resume(self) -> None:
        """After a reconnect: renew subscriptions, resend unconfirmed requests."""
        self._subs.clear()
        pending = list(self._waiters.items())
        for sub in self._active:
            if sub.closed:
                continue
            request_id = next(self._ids)
            waiter = Waiter(None)
            self._waiters[request_id] = waiter
            self._write(
                frames.Sub(
                    id=request_id, filter=sub.filter, dialect=sub.dialect, retained=sub.retained
                )
            )
            self._renewals[request_id] = sub
        for _request_id, waiter in pending:
            if isinstance(waiter.request, bytes):
                self._out += waiter.request
                self._out_ready.set()
            elif waiter.request is not None:
                self._write(waiter.request)

    async def _session(self) -> Exception | None:
        """Run the reader, writer and keepalive until the connection ends."""
        assert self._stream is not None
        result: list[Exception | None] = [None]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer, nursery)
            nursery.start_soon(self._keepalive_loop)
            result[0] = await self._reader()
            nursery.cancel_scope.cancel()
        await trio.aclose_forcefully(self._stream)
        return result[0]

    async def _reader(self) -> Exception | None:
        proto = self._proto
        stream = self._stream
        assert stream is not None
        while True:
            try:
                event = proto.next_event()
            except RemoteProtocolError as exc:
                return exc
            if event is NEED_DATA:
                try:
                    data = await stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    return ConnectionLost(str(exc) or "connection lost")
                if data and proto.state is _OPEN and not proto.buffered:
                    data = self._take_pubacks(data)
                    if not data:
                        continue
                proto.receive_data(data)
                continue
            if event.__class__ is frames.PubAck:  # the confirming publisher's hot path
                waiter = self._waiters.pop(event.id, None)  # type: ignore[union-attr]
                if waiter is not None:
                    waiter.resolve(event)  # type: ignore[arg-type]
                continue
            if isinstance(event, ConnectionClosed):
                return ConnectionLost("the broker closed the connection")
            if isinstance(event, frames.Msg):
                await self._dispatch(event)
            elif isinstance(event, frames.Error):
                error = BrokerError(event.code, event.text, event.ref)
                waiter = None
                if event.ref is not None and not (
                    event.code == ErrorCode.FENCED and self.reconnect and event.ref in self._waiters
                ):
                    waiter = self._waiters.pop(event.ref, None)
                # (a PUB a fenced primary did not confirm stays in flight: it is sent again,
                # with its msg id, to the broker the client fails over to)
                ended = self._subs.pop(event.sub, None) if event.sub is not None else None
                if ended is not None:  # the broker removed it (topic ACLs): iterating raises
                    ended.sub_id = None
                    ended._end(error)
                    log.warning("subscription ended by the broker", code=event.code)
                elif waiter is not None:
                    self._renewals.pop(event.ref, None)
                    waiter.resolve(error=error)
                else:
                    self.errors.append(error)
                    log.warning("broker error", code=event.code, text=event.text)
                if event.closes_connection:
                    return error
            elif isinstance(event, frames.Ping):
                self._write(frames.Pong(id=event.id))
            elif isinstance(
                event,
                frames.SubAck
                | frames.UnsubAck
                | frames.PubAck
                | frames.StatsReply
                | frames.SessionsReply
                | frames.SessionDropped
                | frames.RoutesReply,
            ):
                waiter = self._waiters.pop(event.id, None)
                renewed = self._renewals.pop(event.id, None)
                if renewed is not None and isinstance(event, frames.SubAck):
                    renewed.sub_id = event.sub
                    self._subs[event.sub] = renewed
                if waiter is not None:
                    waiter.resolve(event)
            # PONG: nothing to do; hearing anything is what keeps us alive

    def _take_pubacks(self, data: bytes) -> bytes:
        """Resolve the waiters of the PUBACKs ``data`` starts with; the rest of ``data``."""
        return take_pubacks(data, self._waiters)

    async def _dispatch(self, frame: frames.Msg) -> None:
        message = Message(
            topic=frame.topic,
            payload=frame.payload,
            headers=frame.headers,
            seq=frame.seq,
            id=frame.msg_id,
            sub=frame.sub,
            discarded=frame.discarded,
            retained=frame.retained,
            server=self.server_id,
        )
        if frame.discarded:
            self.discarded += frame.discarded
            log.warning("broker dropped messages", count=frame.discarded, before_seq=frame.seq)
        targets = self._local.match(frame.topic)
        if not targets and self.durable:
            # A resumed durable session is sent what it missed right after WELCOME, before
            # the application has subscribed again: keep it for the subscription to come.
            self._unclaimed.append(message)
            return
        for sub in targets:
            await sub._put(message)  # type: ignore[attr-defined]

    async def _writer(self, nursery: trio.Nursery) -> None:
        stream = self._stream
        assert stream is not None
        try:
            while True:
                if not self._out:
                    self._out_drained.set()
                    self._out_ready = trio.Event()
                    await self._out_ready.wait()
                    continue
                data = bytes(self._out)
                self._out.clear()
                await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            nursery.cancel_scope.cancel()

    async def _keepalive_loop(self) -> None:
        while True:
            await trio.sleep(self.keepalive)
            self._write(frames.Ping(id=0))

    def _fail(self, error: Exception) -> None:
        self._failure = error
        for waiter in self._waiters.values():
            waiter.resolve(error=error)
        self._waiters.clear()
        for sub in self._active:
            sub._end(error)
        self._connected.set()  # wake publishers so they see the failure

    # -- requests ------------------------------------------------------------------------

    def _write(self, frame: frames.Frame) -> None:
        self._out += self._proto.send(frame)
        if len(self._out) > WRITE_BUFFER_LIMIT:
            self._out_drained = trio.Event()
        self._out_ready.set()

    async def _ready(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise ConnectionLost("the client is closed")
        await self._connected.wait()
        if self._failure is not None:
            raise self._failure
        await self._out_drained.wait()

    async def _request(self, make: Any) -> frames.Frame:
        await self._ready()
        request_id = next(self._ids)
        frame = make(request_id)
        waiter = Waiter(frame)
        self._waiters[request_id] = waiter
        self._write(frame)
        return await waiter.wait()

    async def publish(
        self,
        topic: str,
        payload: bytes | str,
        headers: dict[str, str] | None = None,
        confirm: bool = False,
        msg_id: str | None = None,
        retain: bool = False,
    ) -> None:
        """Publish; with ``confirm`` wait for the broker's PUBACK (BrokerError if refused).

        With ``reconnect``, a confirmed publish without a ``msg_id`` is given one by the
        client (the message's id for its subscribers too): a copy sent again after a
        reconnect is then dropped by a broker that has it. ``retain`` makes it the retained
        message of its topic, sent to every later subscription that matches it (an empty
        payload deletes the topic's instead); with ``confirm`` the PUBACK comes once that is
        stored."""
        routing.validate_topic(topic)
        data = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
        if headers is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise TypeError("headers must map str to str")
        if msg_id is not None and (
            not isinstance(msg_id, str) or len(msg_id.encode("utf-8")) > MAX_MSG_ID_BYTES
        ):
            raise ValueError(f"msg_id must be a str of at most {MAX_MSG_ID_BYTES} bytes")
        if confirm:
            if msg_id is None and self._msg_id_prefix is not None:
                msg_id = f"{self._msg_id_prefix}{next(self._msg_ids)}"
            in_flight = self._in_flight
            await in_flight.acquire()
            try:
                await self._publish_confirmed(topic, data, headers, msg_id, retain)
            finally:
                in_flight.release()
            return
        if self._failure is not None or self._closing or not self._connected.is_set():
            await self._ready()
        # The hot path of a publisher: the topic is checked above and the other fields
        # have the right types by construction, so the PUB is packed directly.
        wire: dict[str, Any] = {"type": "PUB", "topic": topic, "payload": data}
        if headers is not None:
            wire["headers"] = headers
        if msg_id is not None:
            wire["msg_id"] = msg_id
        if retain:
            wire["retain"] = True
        body = _packb(wire)
        out = self._out
        out += len(body).to_bytes(4, "big")
        out += body
        self._out_ready.set()
        if len(out) >= WRITE_BUFFER_LIMIT:
            if self._out_drained.is_set():
                self._out_drained = trio.Event()
            await self._ready()  # wait for the writer: backpressure
        elif len(out) >= YIELD_AT:
            await trio.lowlevel.checkpoint()  # let the writer send a batch
        else:
            await trio.lowlevel.checkpoint_if_cancelled()

    async def _publish_confirmed(
        self,
        topic: str,
        data: bytes,
        headers: dict[str, str] | None,
        msg_id: str | None,
        retain: bool,
    ) -> None:
        """The confirmed half of ``publish``, once it has its place in flight."""
        if self._failure is not None or self._closing or not self._connected.is_set():
            await self._ready()
        wire: dict[str, Any] = {"type": "PUB", "topic": topic, "payload": data}
        if headers is not None:
            wire["headers"] = headers
        if msg_id is not None:
            wire["msg_id"] = msg_id
        if retain:
            wire["retain"] = True
        request_id = next(self._ids)
        wire["id"] = request_id
        body = _packb(wire)
        raw = len(body).to_bytes(4, "big") + body
        waiter = Waiter(raw)  # sent again as it is after a reconnect
        self._waiters[request_id] = waiter
        self._out += raw
        self._out_ready.set()
        try:
            await waiter.wait()
        except BaseException:
            # Cancelled: forgotten, not sent again (its place in flight is given back).
            self._waiters.pop(request_id, None)
            raise

    def publish_nowait(self, topic: str, payload: bytes) -> bool:
        """Queue an unconfirmed PUB without waiting: False, and nothing queued, while the
        client is not connected or its write buffer is full (for reports that are better
        skipped than late)."""
        routing.validate_topic(topic)
        if (
            self._failure is not None
            or self._closing
            or not self._connected.is_set()
            or not self._out_drained.is_set()
            or len(self._out) >= WRITE_BUFFER_LIMIT
        ):
            return False
        body = _packb({"type": "PUB", "topic": topic, "payload": bytes(payload)})
        self._out += len(body).to_bytes(4, "big")
        self._out += body
        self._out_ready.set()
        return True

    async def publish_confirmed(
        self, messages: Sequence[tuple[str, bytes, str | None]]
    ) -> list[BrokerError | None]:
        """Publish ``(topic, payload, msg_id)`` messages with confirmation, all pipelined,
        and wait for every PUBACK: one round trip for the batch, not one per message.

        Returns, in order, ``None`` for each confirmed message or the broker's refusal.
        With ``reconnect=True`` a message without a ``msg_id`` is given one, as by
        ``publish``, and unconfirmed PUBs are sent again after a reconnect (the broker drops
        the ones it already had); otherwise a lost connection raises ConnectionLost. A
        batch larger than the in-flight limit is sent as PUBACKs make room.
        """
        for topic, _payload, msg_id in messages:
            routing.validate_topic(topic)
            if msg_id is not None and len(msg_id.encode("utf-8")) > MAX_MSG_ID_BYTES:
                raise ValueError(f"msg_id must be at most {MAX_MSG_ID_BYTES} bytes")
        await self._ready()
        in_flight = self._in_flight
        batch = Batch(len(messages), in_flight)
        waiters = self._waiters
        ids = self._ids
        sent: list[int] = []
        try:
            for index, (topic, payload, msg_id) in enumerate(messages):
                if in_flight.count >= in_flight.limit:
                    self._out_ready.set()  # what is queued goes out while we wait for room
                    await in_flight.acquire()
                    if self._failure is not None:
                        raise self._failure
                else:
                    in_flight.count += 1
                request_id = next(ids)
                if msg_id is None and self._msg_id_prefix is not None:
                    msg_id = f"{self._msg_id_prefix}{next(self._msg_ids)}"
                wire: dict[str, Any] = {
                    "type": "PUB",
                    "topic": topic,
                    "payload": payload,
                    "id": request_id,
                }
                if msg_id is not None:
                    wire["msg_id"] = msg_id
                body = _packb(wire)
                raw = len(body).to_bytes(4, "big") + body
                waiters[request_id] = BatchPart(batch, index, raw)
                sent.append(request_id)
                self._out += raw
            self._out_ready.set()
            await batch.done.wait()
        except BaseException:
            for request_id in sent:  # cancelled: what is unconfirmed is forgotten
                if waiters.pop(request_id, None) is not None:
                    in_flight.release()
            raise
        if batch.failure is not None:
            raise batch.failure
        return batch.errors

    async def ack(self, seq: int, *, single: bool = False, server: str | None = None) -> None:
        """Acknowledge every message up to ``seq`` (cumulative) on a durable session: the
        broker will not send them again. A shared-group member acknowledges each message it
        has processed with ``single=True`` (cumulative acks cover only what it holds).

        ``server`` is the acknowledged message's ``Message.server``: after a failover to a
        broker with another id the ack is not sent (that broker's seqs count other
        messages; it sends what was not acknowledged there)."""
        await self._ready()
        if server is not None and server != self.server_id:
            log.info("ack for another server dropped", seq=seq, server=server)
            return
        self._write(frames.Ack(seq=seq, single=single))
        await trio.lowlevel.checkpoint_if_cancelled()

    async def sessions(self) -> list[dict[str, Any]]:
        """The broker's durable sessions, as operators see them."""
        reply = await self._request(lambda rid: frames.Sessions(id=rid))
        assert isinstance(reply, frames.SessionsReply)
        return reply.sessions

    async def drop_session(self, client_id: str) -> bool:
        """Delete a durable session and its stored messages; False if there was none."""
        reply = await self._request(lambda rid: frames.DropSession(id=rid, client_id=client_id))
        assert isinstance(reply, frames.SessionDropped)
        if client_id == self.client_id:
            self.durable = False
        return reply.dropped

    async def end_session(self) -> bool:
        """End this client's durable session; the connection carries on as a transient one."""
        assert self.client_id is not None
        return await self.drop_session(self.client_id)

    async def stats(self) -> dict[str, Any]:
        reply = await self._request(lambda rid: frames.Stats(id=rid))
        assert isinstance(reply, frames.StatsReply)
        return reply.stats

    async def routes(self) -> dict[str, Any]:
        """The broker's route table (peer links, origins, next hops), as operators see it."""
        reply = await self._request(lambda rid: frames.Routes(id=rid))
        assert isinstance(reply, frames.RoutesReply)
        return reply.routes

    async def ping(self) -> None:
        """Round trip to the broker: every frame sent before it has been processed."""
        await self.stats()

    @asynccontextmanager
    async def subscribe(
        self,
        filter: str,
        dialect: str = "native",
        *,
        sync: bool = False,
        retained: bool = True,
        buffer: int = SUBSCRIPTION_BUFFER,
    ) -> AsyncIterator[Subscription]:
        """Subscribe; the broker has confirmed it when the block starts.

        With ``retained`` (the default) the broker then sends the retained messages the
        filter matches (``Message.retained`` is True for them); False asks for none."""
        routing.parse_filter(filter, dialect)  # a bad filter fails here, with its reason
        sub = Subscription(self, filter, dialect, buffer, retained)
        if self._unclaimed:
            await self._claim(sub)
        # Registered before the SUB goes out, so that a resumed durable session's backlog,
        # which follows the SUBACK, lands here (and waits for room) rather than elsewhere.
        self._local.add(filter, sub, dialect)
        try:
            reply = await self._request(
                lambda rid: frames.Sub(
                    id=rid, filter=filter, dialect=dialect, sync=sync, retained=retained
                )
            )
        except BaseException:
            self._local.remove(filter, sub, dialect)
            raise
        assert isinstance(reply, frames.SubAck)
        sub.sub_id = reply.sub
        self._subs[reply.sub] = sub
        self._active.append(sub)
        try:
            yield sub
        finally:
            self._local.remove(filter, sub, dialect)
            self._active.remove(sub)
            sub._end(None)
            if sub.sub_id is not None:
                self._subs.pop(sub.sub_id, None)
                # A durable session keeps its subscriptions when the application stops
                # listening (that is the point of it); sub.unsubscribe() ends one for good.
                if (
                    not self.durable
                    and self._failure is None
                    and not self._closing
                    and self._connected.is_set()
                    and self._proto.state is _OPEN  # not after the broker's closing ERROR
                ):
                    with (
                        trio.CancelScope(shield=True),
                        trio.move_on_after(5),
                        suppress(BrokerError, ConnectionLost),
                    ):
                        await self._request(lambda rid: frames.Unsub(id=rid, sub=sub.sub_id))

    async def _claim(self, sub: Subscription) -> None:
        """Hand a new subscription the messages that arrived for it before it existed."""
        flt = routing.parse_filter(sub.filter, sub.dialect)
        while True:  # more may arrive while we hand them over: until none is left
            mine = [m for m in self._unclaimed if flt.matches(m.topic)]
            if not mine:
                return
            self._unclaimed = deque(
                (m for m in self._unclaimed if not flt.matches(m.topic)), maxlen=UNCLAIMED_LIMIT
            )
            for message in mine:
                await sub._put(message)

    async def _flush(self) -> None:
        """Wait until everything written so far has gone to the socket."""
        while self._out and self._failure is None and self._connected.is_set():
            self._out_drained = trio.Event()
            self._out_ready.set()
            with trio.move_on_after(5):
                await self._out_drained.wait()


async def _secure(stream: trio.abc.Stream, context: ssl.SSLContext, host: str) -> trio.abc.Stream:
    """The client side of TLS over ``stream``, handshaken; ``host`` (a name or an IP
    address) is what the certificate must name when the context checks hostnames."""
    secure = trio.SSLStream(stream, context, server_hostname=host, https_compatible=True)
    try:
        await secure.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return secure


def tls_context(
    ca: str | None = None, cert: str | None = None, key: str | None = None
) -> ssl.SSLContext:
    """A client context: the broker's certificate verified against ``ca`` (else the system's
    CAs) and its name checked, TLS 1.2 or later; ``cert`` and ``key`` for a client
    certificate. A file that cannot be used raises ``ConfigError`` naming it."""
    return client_context(ca, cert, key)


@asynccontextmanager
async def connect(
    server: str | tuple[str, int] | Sequence[str | tuple[str, int]] = f"127.0.0.1:{DEFAULT_PORT}",
    *,
    client_id: str | None = None,
    credentials: dict[str, Any] | None = None,
    keepalive: float = 30.0,
    reconnect: bool = False,
    backoff: tuple[float, float] = (0.05, 5.0),
    durable: bool = False,
    group: str | None = None,
    username: str | None = None,
    password: str | None = None,
    tls: ssl.SSLContext | bool | None = None,
    max_in_flight: int = MAX_IN_FLIGHT,
    reconnect_timeout: float | None = None,
) -> AsyncIterator[Client]:
    """Connect and say HELLO; raises BrokerError if refused, OSError if unreachable.

    ``server`` is one server (``"host:port"``, ``"host"``, ``(host, port)``) or several
    (``["A", "B"]`` or ``"A,B"``): the client connects to the first that accepts, in
    order, and raises the last server's failure when none does. With ``reconnect`` a lost
    connection is opened again over the list (see the module's docstring), for at most
    ``reconnect_timeout`` seconds when given (then the client fails with the last error).
    ``max_in_flight`` bounds the confirmed publishes awaiting a PUBACK (and kept to be
    sent again).

    ``username`` and ``password`` log in as a user of the broker's users file (a refusal is
    BrokerError AUTH_FAILED); they travel in HELLO's ``credentials`` (with whatever
    ``credentials`` holds, such as an old-style ``{"token": ...}``).

    ``durable=True`` (with a ``client_id``) resumes or creates a durable session: the
    broker keeps its subscriptions and stores its messages while it is away, and sends
    everything after the last ``ack`` when it comes back (``client.session_present``).
    ``group="name"`` joins a shared group: the members share one durable session and each
    message goes to one of them; acknowledge each with ``ack(seq, single=True)``.
    ``tls`` speaks TLS: an ``ssl.SSLContext`` (``tls_context(ca, cert, key)`` makes one),
    or True for the system's CAs; the broker's certificate must name the host dialled
    (each server's own host). TLS and credentials apply to every server.
    A failed TLS handshake raises ``trio.BrokenResourceError`` (its cause says why).
    """
    if not (math.isfinite(keepalive) and keepalive > 0):
        raise ValueError("keepalive must be a positive number of seconds")
    if reconnect_timeout is not None and not reconnect_timeout > 0:
        raise ValueError("reconnect_timeout must be a positive number of seconds")
    if username is not None or password is not None:
        credentials = dict(credentials or {})
        if username is not None:
            credentials["username"] = username
        if password is not None:
            credentials["password"] = password
    client = Client(
        server,
        client_id=client_id,
        credentials=credentials,
        keepalive=keepalive,
        reconnect=reconnect,
        backoff=backoff,
        durable=durable,
        group=group,
        tls=tls_context() if tls is True else (tls or None),
        max_in_flight=max_in_flight,
        reconnect_timeout=reconnect_timeout,
    )
    failures = await client._open_first()
    if failures:
        raise failures[-1]
    async with trio.open_nursery() as nursery:
        await nursery.start(client._run)
        try:
            yield client
            with trio.CancelScope(shield=True):
                await client._flush()
        finally:
            client._closing = True
            nursery.cancel_scope.cancel()
    if client._stream is not None:
        await trio.aclose_forcefully(client._stream)
