"""One trio client for three protocols: the same code around a different codec.

``LeanClient`` is what every benchmark process uses to talk to topiary (native), Mosquitto
(MQTT 3.1.1) or nats-server (NATS), so that a comparison measures the brokers and not three
client libraries of different weight. Per connection:

- ``connect(protocol, port, name)``: TCP, then the protocol's hello (HELLO -> WELCOME;
  CONNECT -> CONNACK; CONNECT + PING -> PONG, INFO ignored).
- ``subscribe(filters)``: every filter (portable, native form: see ``topics``) in one
  pipelined write, then wait for all the answers: a SUBACK per SUB (native), a SUBACK per
  SUBSCRIBE packet of one filter (MQTT), one PONG after all the SUBs (NATS has no
  per-subscription answer: a PING after them is its barrier, as in NATS' own clients'
  ``flush``). ``Timing`` from the first byte sent to the read that brought the last answer.
  ``unsubscribe_all()`` the same for every filter subscribed.
- ``publish(wire_topic, payload)``: appended to a buffer, unacknowledged (native PUB without
  id, MQTT QoS 0, NATS PUB); ``flush()`` writes the buffer. Topics are translated once by the
  caller (``wire_topic``), not per message.
- ``receive()``: one read, as ``(time.monotonic_ns() when the read returned, [(topic,
  payload), ...])``; topics in the wire's form. Control frames that come along are handled
  on the way (server PINGs answered, acknowledgements counted).
- ``ping()``: a round trip (native PING/PONG, MQTT PINGREQ/PINGRESP, NATS PING/PONG): the
  server has processed everything this connection sent before it.

A connection is read either by its owner calling ``receive`` (subscribers: no overhead per
read) or by ``read_forever`` in a task of its own (publishers and the storm connection, whose
owners wait for answers with ``subscribe``/``ping`` meanwhile). Writes go through one lock,
and the answers to a server's PINGs wait for a write in progress rather than interleave.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import trio

from bench.harness.clients import mqtt, native, nats
from bench.harness.clients.topics import wire_filter, wire_topic
from broker.wire.frames import (
    PROTOCOL_VERSION,
    Error,
    Hello,
    Ping,
    Pong,
    SubAck,
    UnsubAck,
    Welcome,
)

HOST: Final = "127.0.0.1"
RECEIVE_SIZE: Final = 256 * 1024
NATIVE_KEEPALIVE: Final = 600.0  # seconds: readers never PING, ask topiary not to expect it

# What ``Codec.kind`` says an event is, for the shell.
ACK, PONG, PING, REFUSED, CONNECTED, FATAL, OTHER = (
    "ack", "pong", "ping", "refused", "connected", "fatal", "other",
)  # fmt: skip


class ConnectionLost(Exception):
    """The broker closed the connection, or sent what the codec cannot read."""


@dataclass(frozen=True, slots=True)
class Timing:
    """A pipelined request: first byte sent -> the read that brought the last answer."""

    count: int
    first_ns: int
    last_ns: int
    refused: int

    @property
    def seconds(self) -> float:
        return (self.last_ns - self.first_ns) / 1e9


# -- codecs: what differs between the protocols -----------------------------------------------


class NativeCodec:
    protocol = "native"
    hello_wait = CONNECTED  # what ends the handshake

    def __init__(self) -> None:
        self.parser = native.Parser()
        self.publish = native.encode_pub
        self._next_id = 1
        self._subs: list[int] = []  # subscription ids from the SUBACKs
        self._pings = 0

    def _ids(self, n: int) -> range:
        first = self._next_id
        self._next_id += n
        return range(first, first + n)

    def hello(self, name: str) -> bytes:
        return native.frame_bytes(
            Hello(version=PROTOCOL_VERSION, client_id=name, keepalive=NATIVE_KEEPALIVE)
        )

    def subscribe(self, filters: list[str]) -> tuple[bytes, str, int]:
        ids = self._ids(len(filters))
        data = b"".join(native.encode_sub(i, f) for i, f in zip(ids, filters, strict=True))
        return data, ACK, len(filters)

    def unsubscribe_all(self) -> tuple[bytes, str, int]:
        subs, self._subs = self._subs, []
        ids = self._ids(len(subs))
        data = b"".join(native.encode_unsub(i, s) for i, s in zip(ids, subs, strict=True))
        return data, ACK, len(subs)

    def held(self) -> int:
        return len(self._subs)

    def ping(self) -> bytes:
        self._pings += 1
        return native.frame_bytes(Ping(id=self._pings))

    def kind(self, event: Any) -> tuple[str, Any]:
        cls = event.__class__
        if cls is SubAck:
            self._subs.append(event.sub)
            return ACK, None
        if cls is UnsubAck:
            return ACK, None
        if cls is Pong:
            return PONG, None
        if cls is Ping:
            return PING, native.frame_bytes(Pong(id=event.id))
        if cls is Welcome:
            return CONNECTED, None
        if cls is Error:
            text = f"ERROR {event.code}: {event.text}"
            return (REFUSED if event.ref is not None else FATAL), text
        return OTHER, None


class MqttCodec:
    protocol = "mqtt"
    hello_wait = CONNECTED

    def __init__(self) -> None:
        self.parser = mqtt.Parser()
        self.publish = mqtt.encode_publish
        self._next_id = 0
        self._filters: list[str] = []

    def _packet_id(self) -> int:
        self._next_id = self._next_id % 0xFFFF + 1  # 1..65535, then around again
        return self._next_id

    def hello(self, name: str) -> bytes:
        return mqtt.encode_connect(name, keepalive=0, clean_session=True)

    def subscribe(self, filters: list[str]) -> tuple[bytes, str, int]:
        self._filters.extend(filters)
        data = b"".join(mqtt.encode_subscribe(self._packet_id(), [f]) for f in filters)
        return data, ACK, len(filters)

    def unsubscribe_all(self) -> tuple[bytes, str, int]:
        filters, self._filters = self._filters, []
        data = b"".join(mqtt.encode_unsubscribe(self._packet_id(), [f]) for f in filters)
        return data, ACK, len(filters)

    def held(self) -> int:
        return len(self._filters)

    def ping(self) -> bytes:
        return mqtt.PINGREQ

    def kind(self, event: Any) -> tuple[str, Any]:
        cls = event.__class__
        if cls is mqtt.SubAck:
            if mqtt.SUBACK_FAILURE in event.return_codes:
                return REFUSED, f"SUBACK {event.packet_id} refused: {event.return_codes}"
            return ACK, None
        if cls is mqtt.UnsubAck:
            return ACK, None
        if cls is mqtt.PingResp:
            return PONG, None
        if cls is mqtt.ConnAck:
            if event.return_code:
                return FATAL, f"CONNACK return code {event.return_code}"
            return CONNECTED, None
        return OTHER, None


class NatsCodec:
    protocol = "nats"
    hello_wait = PONG  # CONNECT, then PING: the PONG says the server took the CONNECT

    def __init__(self) -> None:
        self.parser = nats.Parser()
        self.publish = nats.encode_pub
        self._next_sid = 1
        self._sids: list[int] = []

    def hello(self, name: str) -> bytes:
        return nats.encode_connect({**nats.CONNECT_OPTIONS, "name": name}) + nats.PING

    def subscribe(self, filters: list[str]) -> tuple[bytes, str, int]:
        sids = range(self._next_sid, self._next_sid + len(filters))
        self._next_sid += len(filters)
        self._sids.extend(sids)
        data = b"".join(nats.encode_sub(f, s) for f, s in zip(filters, sids, strict=True))
        return data + nats.PING, PONG, 1

    def unsubscribe_all(self) -> tuple[bytes, str, int]:
        sids, self._sids = self._sids, []
        return b"".join(nats.encode_unsub(s) for s in sids) + nats.PING, PONG, 1

    def held(self) -> int:
        return len(self._sids)

    def ping(self) -> bytes:
        return nats.PING

    def kind(self, event: Any) -> tuple[str, Any]:
        cls = event.__class__
        if cls is nats.Pong:
            return PONG, None
        if cls is nats.Ping:
            return PING, nats.PONG
        if cls is nats.Err:
            # Permission and subject errors leave the connection open; the rest close it.
            text = f"-ERR {event.text}"
            lowered = event.text.lower()
            refused = "invalid subject" in lowered or "permissions violation" in lowered
            return (REFUSED if refused else FATAL), text
        return OTHER, None


CODECS: Final[dict[str, Callable[[], Any]]] = {
    "native": NativeCodec,
    "mqtt": MqttCodec,
    "nats": NatsCodec,
}
CODEC_ERRORS: Final = (native.NativeError, mqtt.MqttError, nats.NatsError)
_connections = 0  # in this process, for unique client ids


# -- the shell --------------------------------------------------------------------------------


class LeanClient:
    """One connection; see the module docstring."""

    def __init__(self, stream: trio.SocketStream, codec: Any) -> None:
        self.stream = stream
        self.codec = codec
        self.protocol: str = codec.protocol
        self.feed = codec.parser.feed
        self.publish_bytes = codec.publish
        self.acks = 0
        self.pongs = 0
        self.connected = False
        self.refused = 0
        self.first_refusal: str | None = None
        self.stray_messages = 0  # messages read while waiting for an answer
        self.lost: str | None = None  # why the connection ended, once it has
        self.client_id: str | None = None  # what the hello said, once ``connect`` sent it
        self.last_control_ns = 0  # when the read that brought the last answer returned
        self._out = bytearray()
        self._replies = bytearray()
        self._send_lock = trio.Lock()
        self._reader_running = False
        self._changed = trio.Event()

    @classmethod
    async def connect(cls, protocol: str, port: int, name: str, host: str = HOST) -> LeanClient:
        """A connection after the handshake. ``name`` becomes a client id unique to this
        connection (two MQTT or topiary connections with one id would replace each other)."""
        global _connections
        _connections += 1
        stream = await trio.open_tcp_stream(host, port)
        client = cls(stream, CODECS[protocol]())
        client.client_id = f"{name}-{os.getpid()}-{_connections}"
        try:
            await client._send(client.codec.hello(client.client_id))
            if client.codec.hello_wait == PONG:
                await client._until(lambda: client.pongs >= 1)
                client.connected = True
            else:
                await client._until(lambda: client.connected)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return client

    # -- names ---------------------------------------------------------------------------

    def wire_topic(self, topic: str) -> str:
        return wire_topic(self.protocol, topic)

    def wire_filter(self, portable_filter: str) -> str:
        return wire_filter(self.protocol, portable_filter)

    # -- writing -------------------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        async with self._send_lock:
            if data:
                await self.stream.send_all(data)
            while self._replies:  # answers to server PINGs that came meanwhile
                replies = bytes(self._replies)
                self._replies.clear()
                await self.stream.send_all(replies)

    async def _reply(self, data: bytes) -> None:
        self._replies += data
        if not self._send_lock.locked():
            await self._send(b"")

    def publish(self, wire_topic: str, payload: bytes) -> None:
        """Buffer one message (unacknowledged); ``flush`` sends the buffer."""
        self._out += self.publish_bytes(wire_topic, payload)

    @property
    def unflushed(self) -> int:
        return len(self._out)

    async def flush(self) -> None:
        if self._out:
            data = bytes(self._out)
            self._out.clear()
            await self._send(data)

    # -- reading -------------------------------------------------------------------------

    async def receive(self) -> tuple[int, list[tuple[str, bytes]]]:
        """One read: when it returned and the messages in it (controls handled on the way).
        Raises ConnectionLost at EOF or on bytes the codec refuses."""
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._lose(f"connection broken: {exc}")
        now = time.monotonic_ns()
        if not data:
            self._lose("EOF: the broker closed the connection")
        try:
            events = self.feed(data)
        except CODEC_ERRORS as exc:
            self._lose(f"{type(exc).__name__}: {exc}")
        messages = []
        for event in events:
            if event.__class__ is tuple:
                messages.append(event)
            else:
                await self._control(event, now)
        return now, messages

    def _lose(self, why: str) -> None:
        self.lost = why
        self._signal()
        raise ConnectionLost(why)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _control(self, event: Any, now: int) -> None:
        kind, detail = self.codec.kind(event)
        if kind == ACK:
            self.acks += 1
        elif kind == PONG:
            self.pongs += 1
        elif kind == PING:
            await self._reply(detail)
            return
        elif kind == REFUSED:
            self.acks += 1  # an answer all the same
            self.refused += 1
            if self.first_refusal is None:
                self.first_refusal = detail
        elif kind == CONNECTED:
            self.connected = True
        elif kind == FATAL:
            self._lose(detail)
        else:
            return
        self.last_control_ns = now
        if self._reader_running:
            self._signal()

    async def read_forever(
        self, on_messages: Callable[[int, list[tuple[str, bytes]]], None] | None = None
    ) -> None:
        """Read until EOF (then return, ``lost`` says why) or cancellation; messages go to
        ``on_messages(read_ns, messages)`` or are counted as strays."""
        self._reader_running = True
        try:
            while True:
                now, messages = await self.receive()
                if messages:
                    if on_messages is None:
                        self.stray_messages += len(messages)
                    else:
                        on_messages(now, messages)
        except ConnectionLost:
            return
        finally:
            self._reader_running = False
            self._signal()

    async def _until(self, done: Callable[[], bool]) -> None:
        """Until ``done()``: reading ourselves, or waiting for ``read_forever`` to."""
        while not done():
            if self.lost is not None:
                raise ConnectionLost(self.lost)
            if self._reader_running:
                await self._changed.wait()
            else:
                _, messages = await self.receive()
                self.stray_messages += len(messages)

    # -- requests ------------------------------------------------------------------------

    async def _pipelined(self, data: bytes, wait: str, count: int) -> Timing:
        refused_before = self.refused
        if wait == ACK:
            target = self.acks + count
            done: Callable[[], bool] = lambda: self.acks >= target  # noqa: E731
        else:
            target = self.pongs + count
            done = lambda: self.pongs >= target  # noqa: E731
        first = time.monotonic_ns()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send, data)
            await self._until(done)
        return Timing(count, first, self.last_control_ns, self.refused - refused_before)

    async def subscribe(self, filters: list[str]) -> Timing:
        """Subscribe to ``filters`` (portable, native form) and wait for every answer."""
        data, wait, count = self.codec.subscribe([self.wire_filter(f) for f in filters])
        timing = await self._pipelined(data, wait, count)
        return Timing(len(filters), timing.first_ns, timing.last_ns, timing.refused)

    async def unsubscribe_all(self) -> Timing:
        """Drop every subscription made so far and wait for every answer."""
        held = self.subscriptions
        data, wait, count = self.codec.unsubscribe_all()
        timing = await self._pipelined(data, wait, count)
        return Timing(held, timing.first_ns, timing.last_ns, timing.refused)

    @property
    def subscriptions(self) -> int:
        """Subscriptions held (answered, for native: the ids come with the SUBACKs)."""
        return self.codec.held()

    async def ping(self) -> float:
        """A round trip; its seconds."""
        started = time.perf_counter()
        target = self.pongs + 1
        await self._send(self.codec.ping())
        await self._until(lambda: self.pongs >= target)
        return time.perf_counter() - started

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def connect(protocol: str, port: int, name: str, host: str = HOST) -> LeanClient:
    return await LeanClient.connect(protocol, port, name, host)
