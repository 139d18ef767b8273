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

With ``reconnect=True`` a lost connection is re-established with exponential
backoff and jitter; subscriptions are renewed and unconfirmed confirmed
publishes are sent again (with the same message id, so a broker that keeps
ids can drop the duplicate). Messages published while disconnected wait.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

import routing
from broker.errors import ErrorCode, ProtocolError, RemoteProtocolError, refused_for_good
from broker.log import get_logger
from broker.wire.checks import MAX_MSG_ID_BYTES
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Role
from broker.wire.frames import (
    PROTOCOL_VERSION,
    Ack,
    DropSession,
    Error,
    Frame,
    Hello,
    Msg,
    Ping,
    Pong,
    PubAck,
    Routes,
    RoutesReply,
    SessionDropped,
    Sessions,
    SessionsReply,
    Stats,
    StatsReply,
    Sub,
    SubAck,
    Unsub,
    UnsubAck,
    Welcome,
)
from broker.wire.states import State

DEFAULT_PORT = 7474
RECEIVE_SIZE = 256 * 1024
WRITE_BUFFER_LIMIT = 1024 * 1024
YIELD_AT = 64 * 1024  # a publisher in a tight loop lets the writer run every ~64 KiB
SUBSCRIPTION_BUFFER = 1000
UNCLAIMED_LIMIT = 10_000  # durable replay kept until the application subscribes again

log = get_logger("topiary.client")
_packb = msgpack.Packer(use_bin_type=True).pack


def _puback_frame_pattern() -> bytes:
    """One PUBACK frame exactly as the broker encodes it (broker/replies.py): length
    prefix, ``{"type": "PUBACK", "id": <uint>}``; the id's bytes (without their msgpack
    marker) are the group that matched, and the prefix must agree with the id's width."""
    head = re.escape(_packb({"type": "PUBACK", "id": 0})[:-1])  # the map up to the id
    forms = []
    for marker, width in ((b"", 1), (b"\xcc", 1), (b"\xcd", 2), (b"\xce", 4), (b"\xcf", 8)):
        size = len(_packb({"type": "PUBACK", "id": 0})) - 1 + len(marker) + width
        value = rb"([\x00-\x7f])" if not marker else rb"([\x00-\xff]{%d})" % width
        forms.append(re.escape(size.to_bytes(4, "big")) + head + re.escape(marker) + value)
    return b"|".join(forms)


# A confirming publisher reads one PUBACK per message: a read that starts with a run of
# them is answered with two regular expressions instead of a decoded frame each.
_PUBACK_ONE = re.compile(_puback_frame_pattern())
_PUBACK_RUN = re.compile(b"(?:" + _puback_frame_pattern() + b")+")
_OPEN = State.OPEN


class BrokerError(Exception):
    """The broker refused a request (ERROR frame): ``code`` and ``text`` say why."""

    def __init__(self, code: str, text: str, ref: int | None = None) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text
        self.ref = ref


class ConnectionLost(Exception):
    """The connection ended (and ``reconnect`` was off, or the client is closing)."""


def worth_retrying(exc: BaseException) -> bool:
    """Whether a failed :func:`connect` may succeed later: the broker was not there, went
    away mid-handshake, or refused for a reason of the moment (SHUTTING_DOWN); not a bad
    token or another protocol version."""
    if isinstance(exc, BrokerError):
        return not refused_for_good(exc.code)
    return isinstance(exc, (OSError, ConnectionLost, trio.BrokenResourceError))


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    payload: bytes
    headers: dict[str, str] | None
    seq: int
    id: str
    sub: int

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")


def parse_server(server: str | tuple[str, int]) -> tuple[str, int]:
    """``host:port``, ``host`` or ``(host, port)``; raises ValueError saying what is wrong."""
    if isinstance(server, tuple):
        host, port = server
    else:
        text = server.strip()
        if not text:
            raise ValueError("server address is empty")
        if text.startswith("["):  # [::1]:7474
            host, _, rest = text[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else str(DEFAULT_PORT)
        elif text.count(":") == 1:
            host, port_text = text.split(":")
        else:
            host, port_text = text, str(DEFAULT_PORT)
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"bad port {port_text!r} in server address {server!r}") from None
    if not host:
        raise ValueError(f"no host in server address {server!r}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return host, port


#: What a publish's waiter is resolved with on the fast path (nobody reads its id).
_PUBACKED = PubAck(id=0)


class _Waiter:
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


class _Batch:
    """Confirmations still awaited for one ``publish_confirmed`` call."""

    __slots__ = ("done", "errors", "failure", "remaining")

    def __init__(self, size: int) -> None:
        self.remaining = size
        self.errors: list[BrokerError | None] = [None] * size
        self.failure: Exception | None = None
        self.done = trio.Event()
        if size == 0:
            self.done.set()


class _BatchPart:
    """One PUB of a batch, kept (as its bytes) to be sent again after a reconnect."""

    __slots__ = ("batch", "index", "request")

    def __init__(self, batch: _Batch, index: int, request: bytes) -> None:
        self.batch = batch
        self.index = index
        self.request = request

    def resolve(self, frame: Frame | None = None, error: Exception | None = None) -> None:
        batch = self.batch
        if isinstance(error, BrokerError):
            batch.errors[self.index] = error
        elif error is not None:
            batch.failure = error
        batch.remaining -= 1
        if batch.remaining == 0:
            batch.done.set()


class Subscription:
    """Messages for one filter; iterate with ``async for``."""

    def __init__(self, client: Client, filter: str, dialect: str, buffer: int) -> None:
        self.client = client
        self.filter = filter
        self.dialect = dialect
        self.sub_id: int | None = None
        self._send, self._receive = trio.open_memory_channel[Message | Exception](buffer)
        self.closed = False

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if isinstance(item, Exception):
            raise item
        return item

    async def get(self) -> Message:
        """The next message (raises ConnectionLost when the connection is gone)."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise ConnectionLost("subscription closed") from None

    async def unsubscribe(self) -> None:
        """End the subscription at the broker (for a durable session: for good)."""
        if self.sub_id is not None and not self.closed:
            sub_id = self.sub_id
            await self.client._request(lambda rid: Unsub(id=rid, sub=sub_id))
            self.sub_id = None

    async def _put(self, message: Message) -> None:
        if not self.closed:
            await self._send.send(message)

    def _end(self, error: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if error is not None:
            with suppress(trio.WouldBlock):
                self._send.send_nowait(error)
        self._send.close()


class Client:
    def __init__(
        self,
        server: str | tuple[str, int],
        *,
        client_id: str | None,
        credentials: dict[str, Any] | None,
        keepalive: float,
        reconnect: bool,
        backoff: tuple[float, float],
        durable: bool = False,
        group: str | None = None,
    ) -> None:
        self.address = parse_server(server)
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
        self.reconnects = 0
        self._ids = itertools.count(1)
        self._stream: trio.SocketStream | None = None
        self._proto = Connection(Role.CLIENT)
        self._waiters: dict[int, _Waiter | _BatchPart] = {}
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

    async def _open(self) -> None:
        host, port = self.address
        stream = await trio.open_tcp_stream(host, port)
        proto = Connection(Role.CLIENT)
        client_id = self.client_id or self.requested_client_id
        hello = Hello(
            version=PROTOCOL_VERSION,
            client_id=client_id,
            durable=self.durable and self.group is None,
            group=self.group,
            credentials=self.credentials,
            keepalive=self.keepalive,
        )
        try:
            await stream.send_all(proto.send(hello))
            while True:
                event = proto.next_event()
                if event is NEED_DATA:
                    proto.receive_data(await stream.receive_some(RECEIVE_SIZE))
                    continue
                if isinstance(event, ConnectionClosed):
                    raise ConnectionLost("the broker closed the connection during the handshake")
                if isinstance(event, Error):
                    raise BrokerError(event.code, event.text, event.ref)
                assert isinstance(event, Welcome)
                break
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        self._stream = stream
        self._proto = proto
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
            if not self.reconnect or (
                isinstance(error, BrokerError) and error.code == ErrorCode.AUTH_FAILED
            ):
                self._fail(error or ConnectionLost("connection closed by the broker"))
                return
            self._connected = trio.Event()
            await self._reconnect()

    async def _reconnect(self) -> None:
        delay, limit = self.backoff
        while not self._closing:
            await trio.sleep(delay * (0.5 + random.random()))
            try:
                await self._open()
            except (OSError, ConnectionLost, BrokerError, trio.BrokenResourceError) as exc:
                log.info("reconnect failed", error=str(exc), retry_in=delay)
                delay = min(delay * 2, limit)
                continue
            self.reconnects += 1
            await self._resume()
            return

    async def _resume(self) -> None:
        """After a reconnect: renew subscriptions, resend unconfirmed requests."""
        self._subs.clear()
        pending = list(self._waiters.items())
        for sub in self._active:
            if sub.closed:
                continue
            request_id = next(self._ids)
            waiter = _Waiter(None)
            self._waiters[request_id] = waiter
            self._write(Sub(id=request_id, filter=sub.filter, dialect=sub.dialect))
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
            if event.__class__ is PubAck:  # the confirming publisher's hot path
                waiter = self._waiters.pop(event.id, None)  # type: ignore[union-attr]
                if waiter is not None:
                    waiter.resolve(event)  # type: ignore[arg-type]
                continue
            if isinstance(event, ConnectionClosed):
                return ConnectionLost("the broker closed the connection")
            if isinstance(event, Msg):
                await self._dispatch(event)
            elif isinstance(event, Error):
                error = BrokerError(event.code, event.text, event.ref)
                waiter = self._waiters.pop(event.ref, None) if event.ref is not None else None
                if waiter is not None:
                    self._renewals.pop(event.ref, None)
                    waiter.resolve(error=error)
                else:
                    self.errors.append(error)
                    log.warning("broker error", code=event.code, text=event.text)
                if event.closes_connection:
                    return error
            elif isinstance(event, Ping):
                self._write(Pong(id=event.id))
            elif isinstance(
                event,
                SubAck
                | UnsubAck
                | PubAck
                | StatsReply
                | SessionsReply
                | SessionDropped
                | RoutesReply,
            ):
                waiter = self._waiters.pop(event.id, None)
                renewed = self._renewals.pop(event.id, None)
                if renewed is not None and isinstance(event, SubAck):
                    renewed.sub_id = event.sub
                    self._subs[event.sub] = renewed
                if waiter is not None:
                    waiter.resolve(event)
            # PONG: nothing to do; hearing anything is what keeps us alive

    def _take_pubacks(self, data: bytes) -> bytes:
        """Resolve the waiters of the PUBACKs ``data`` starts with; the rest of ``data``.

        The confirming publisher's hot path: ``next_event`` cost ~4 us per PUBACK (cut,
        unpack, check, build a frame), a regular expression over the run ~1 us. Only for
        frames in the broker's own encoding, only at a frame boundary (nothing buffered) and
        in OPEN, where a PUBACK changes no state: anything else goes through ``proto``.
        """
        run = _PUBACK_RUN.match(data)
        if run is None:
            return data
        end = run.end()
        pop = self._waiters.pop
        from_bytes = int.from_bytes
        for match in _PUBACK_ONE.finditer(data, 0, end):
            waiter = pop(from_bytes(match.group(match.lastindex), "big"), None)  # type: ignore[arg-type]
            if waiter is not None:
                waiter.resolve(_PUBACKED)
        return data[end:]

    async def _dispatch(self, frame: Msg) -> None:
        message = Message(
            topic=frame.topic,
            payload=frame.payload,
            headers=frame.headers,
            seq=frame.seq,
            id=frame.msg_id,
            sub=frame.sub,
        )
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
            self._write(Ping(id=0))

    def _fail(self, error: Exception) -> None:
        self._failure = error
        for waiter in self._waiters.values():
            waiter.resolve(error=error)
        self._waiters.clear()
        for sub in self._active:
            sub._end(error)
        self._connected.set()  # wake publishers so they see the failure

    # -- requests ------------------------------------------------------------------------

    def _write(self, frame: Frame) -> None:
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

    async def _request(self, make: Any) -> Frame:
        await self._ready()
        request_id = next(self._ids)
        frame = make(request_id)
        waiter = _Waiter(frame)
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
    ) -> None:
        """Publish; with ``confirm`` wait for the broker's PUBACK (BrokerError if refused)."""
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
        if self._failure is not None or self._closing or not self._connected.is_set():
            await self._ready()
        # The hot path of a publisher: the topic is checked above and the other fields
        # have the right types by construction, so the PUB is packed directly.
        wire: dict[str, Any] = {"type": "PUB", "topic": topic, "payload": data}
        if headers is not None:
            wire["headers"] = headers
        if msg_id is not None:
            wire["msg_id"] = msg_id
        if confirm:
            request_id = next(self._ids)
            wire["id"] = request_id
            body = _packb(wire)
            raw = len(body).to_bytes(4, "big") + body
            waiter = _Waiter(raw)  # sent again as it is after a reconnect
            self._waiters[request_id] = waiter
            self._out += raw
            self._out_ready.set()
            await waiter.wait()
            return
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

    async def publish_confirmed(
        self, messages: Sequence[tuple[str, bytes, str | None]]
    ) -> list[BrokerError | None]:
        """Publish ``(topic, payload, msg_id)`` messages with confirmation, all pipelined,
        and wait for every PUBACK: one round trip for the batch, not one per message.

        Returns, in order, ``None`` for each confirmed message or the broker's refusal.
        With ``reconnect=True`` unconfirmed PUBs are sent again after a reconnect (set
        ``msg_id`` so the broker drops the ones it already had); otherwise a lost
        connection raises ConnectionLost.
        """
        for topic, _payload, msg_id in messages:
            routing.validate_topic(topic)
            if msg_id is not None and len(msg_id.encode("utf-8")) > MAX_MSG_ID_BYTES:
                raise ValueError(f"msg_id must be at most {MAX_MSG_ID_BYTES} bytes")
        await self._ready()
        batch = _Batch(len(messages))
        out = self._out
        waiters = self._waiters
        ids = self._ids
        for index, (topic, payload, msg_id) in enumerate(messages):
            request_id = next(ids)
            wire: dict[str, Any] = {"type": "PUB", "topic": topic, "payload": payload}
            if msg_id is not None:
                wire["msg_id"] = msg_id
            wire["id"] = request_id
            body = _packb(wire)
            raw = len(body).to_bytes(4, "big") + body
            waiters[request_id] = _BatchPart(batch, index, raw)
            out += raw
        self._out_ready.set()
        await batch.done.wait()
        if batch.failure is not None:
            raise batch.failure
        return batch.errors

    async def ack(self, seq: int, *, single: bool = False) -> None:
        """Acknowledge every message up to ``seq`` (cumulative) on a durable session: the
        broker will not send them again. A shared-group member acknowledges each message it
        has processed with ``single=True`` (cumulative acks cover only what it holds)."""
        await self._ready()
        self._write(Ack(seq=seq, single=single))
        await trio.lowlevel.checkpoint_if_cancelled()

    async def sessions(self) -> list[dict[str, Any]]:
        """The broker's durable sessions, as operators see them."""
        reply = await self._request(lambda rid: Sessions(id=rid))
        assert isinstance(reply, SessionsReply)
        return reply.sessions

    async def drop_session(self, client_id: str) -> bool:
        """Delete a durable session and its stored messages; False if there was none."""
        reply = await self._request(lambda rid: DropSession(id=rid, client_id=client_id))
        assert isinstance(reply, SessionDropped)
        if client_id == self.client_id:
            self.durable = False
        return reply.dropped

    async def end_session(self) -> bool:
        """End this client's durable session; the connection carries on as a transient one."""
        assert self.client_id is not None
        return await self.drop_session(self.client_id)

    async def stats(self) -> dict[str, Any]:
        reply = await self._request(lambda rid: Stats(id=rid))
        assert isinstance(reply, StatsReply)
        return reply.stats

    async def routes(self) -> dict[str, Any]:
        """The broker's route table (peer links, origins, next hops), as operators see it."""
        reply = await self._request(lambda rid: Routes(id=rid))
        assert isinstance(reply, RoutesReply)
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
        buffer: int = SUBSCRIPTION_BUFFER,
    ) -> AsyncIterator[Subscription]:
        """Subscribe; the broker has confirmed it when the block starts."""
        routing.parse_filter(filter, dialect)  # a bad filter fails here, with its reason
        sub = Subscription(self, filter, dialect, buffer)
        if self._unclaimed:
            await self._claim(sub)
        # Registered before the SUB goes out, so that a resumed durable session's backlog,
        # which follows the SUBACK, lands here (and waits for room) rather than elsewhere.
        self._local.add(filter, sub, dialect)
        try:
            reply = await self._request(
                lambda rid: Sub(id=rid, filter=filter, dialect=dialect, sync=sync)
            )
        except BaseException:
            self._local.remove(filter, sub, dialect)
            raise
        assert isinstance(reply, SubAck)
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
                ):
                    with (
                        trio.CancelScope(shield=True),
                        trio.move_on_after(5),
                        suppress(BrokerError, ConnectionLost),
                    ):
                        await self._request(lambda rid: Unsub(id=rid, sub=sub.sub_id))

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


@asynccontextmanager
async def connect(
    server: str | tuple[str, int] = f"127.0.0.1:{DEFAULT_PORT}",
    *,
    client_id: str | None = None,
    credentials: dict[str, Any] | None = None,
    keepalive: float = 30.0,
    reconnect: bool = False,
    backoff: tuple[float, float] = (0.05, 5.0),
    durable: bool = False,
    group: str | None = None,
) -> AsyncIterator[Client]:
    """Connect and say HELLO; raises BrokerError if refused, OSError if unreachable.

    ``durable=True`` (with a ``client_id``) resumes or creates a durable session: the
    broker keeps its subscriptions and stores its messages while it is away, and sends
    everything after the last ``ack`` when it comes back (``client.session_present``).
    ``group="name"`` joins a shared group: the members share one durable session and each
    message goes to one of them; acknowledge each with ``ack(seq, single=True)``.
    """
    if not (math.isfinite(keepalive) and keepalive > 0):
        raise ValueError("keepalive must be a positive number of seconds")
    client = Client(
        server,
        client_id=client_id,
        credentials=credentials,
        keepalive=keepalive,
        reconnect=reconnect,
        backoff=backoff,
        durable=durable,
        group=group,
    )
    await client._open()
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


__all__ = [
    "BrokerError",
    "Client",
    "ConnectionLost",
    "Message",
    "ProtocolError",
    "Subscription",
    "connect",
    "parse_server",
    "worth_retrying",
]
