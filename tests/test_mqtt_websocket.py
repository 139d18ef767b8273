"""MQTT over WebSocket (broker/mqtt/websocket.py): what a client sees on a real socket.

Each test runs a small trio server on 127.0.0.1 whose connections go through
``accept_websocket``; by default it echoes the MQTT byte stream back. Clients are wsproto
(tests/wsclient.py), so the wire is exactly what the test says, and MQTT.js over ``ws``.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import trio
from paho.mqtt.publish import single as paho_publish_single
from wsproto.connection import Connection, ConnectionType
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    TextMessage,
)

from broker.mqtt.websocket import (
    WebSocketRefused,
    WebSocketStream,
    accept_websocket,
    binary_frame_header,
)
from tests.wsclient import WsClient, ws_connection

JS = Path(__file__).resolve().parent / "js"
WAIT = 10.0  # seconds any one test may wait for the other end; generous, never slept


@dataclass(frozen=True)
class Ended:
    """How an accepted connection ended, as its server handler saw it."""

    subprotocol: str
    error: Exception | None  # None: the stream ended cleanly (receive_some returned b"")


Handler = Callable[[WebSocketStream], Awaitable[None]]


async def echo(ws: WebSocketStream) -> None:
    while data := await ws.receive_some():  # until the client ends the stream
        await ws.send_all(data)


def reader(into: bytearray) -> Handler:
    """A handler that only reads, into ``into``, until the stream ends."""

    async def read_all(ws: WebSocketStream) -> None:
        while data := await ws.receive_some():
            into.extend(data)

    return read_all


@dataclass
class Server:
    address: tuple[str, int]
    outcomes: trio.MemoryReceiveChannel[Ended | WebSocketRefused]

    async def outcome(self) -> Ended | WebSocketRefused:
        """How the next connection ended (WebSocketRefused when it never became one)."""
        with trio.fail_after(WAIT):
            return await self.outcomes.receive()


@contextlib.asynccontextmanager
async def serving(handler: Handler = echo, **options: object) -> AsyncIterator[Server]:
    """A server on a free 127.0.0.1 port: accept_websocket(**options), then ``handler``."""
    send, receive = trio.open_memory_channel[Ended | WebSocketRefused](16)

    async def connection(stream: trio.SocketStream) -> None:
        try:
            ws = await accept_websocket(stream, **options)  # type: ignore[arg-type]
        except WebSocketRefused as exc:
            await send.send(exc)
            return
        async with ws:
            error = None
            try:
                await handler(ws)
            except trio.BrokenResourceError as exc:
                error = exc
        await send.send(Ended(ws.subprotocol, error))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, connection, 0, host="127.0.0.1"))
        yield Server(listeners[0].socket.getsockname()[:2], receive)
        nursery.cancel_scope.cancel()


# -- the handshake ---------------------------------------------------------------------------


async def test_the_handshake_picks_mqtt_whatever_else_is_offered() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        answer = await client.handshake(subprotocols=["chat", "mqttv3.1", "mqtt"])
        assert isinstance(answer, AcceptConnection)
        assert answer.subprotocol == "mqtt"
        await client.send(CloseConnection(code=1000))
        assert await server.outcome() == Ended("mqtt", None)


async def test_an_mqtt_3_1_client_gets_mqttv3_1() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        answer = await client.handshake(subprotocols=["mqttv3.1"])
        assert isinstance(answer, AcceptConnection)
        assert answer.subprotocol == "mqttv3.1"
        await client.send(CloseConnection(code=1000))
        assert await server.outcome() == Ended("mqttv3.1", None)


async def test_the_query_string_does_not_matter() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        assert isinstance(await client.handshake("/mqtt?client=7"), AcceptConnection)


async def test_a_wrong_path_gets_404() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        answer = await client.handshake("/ws")
        assert isinstance(answer, RejectConnection)
        assert answer.status_code == 404
        assert b"'/mqtt'" in client.rejection_body
        refused = await server.outcome()
        assert isinstance(refused, WebSocketRefused)
        assert refused.status == 404
        assert await client.read_all_raw() == b""  # and the connection is closed


@pytest.mark.parametrize("offered", [[], ["chat"]])
async def test_a_client_not_offering_mqtt_is_refused(offered: list[str]) -> None:
    async with serving() as server, ws_connection(server.address) as client:
        answer = await client.handshake(subprotocols=offered)
        assert isinstance(answer, RejectConnection)
        assert answer.status_code == 400
        assert b"subprotocol mqtt or mqttv3.1 required" in client.rejection_body
        refused = await server.outcome()
        assert isinstance(refused, WebSocketRefused)
        assert refused.status == 400


async def test_a_plain_http_get_is_refused() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        await client.send_raw(b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = await client.read_all_raw()
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b"Upgrade" in answer  # the body says what was missing
        refused = await server.outcome()
        assert isinstance(refused, WebSocketRefused)
        assert refused.status == 400


def upgrade_request(version: str = "13", extra: str = "") -> bytes:
    """A WebSocket upgrade request for /mqtt offering mqtt, written out by hand."""
    return (
        "GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"Sec-WebSocket-Version: {version}\r\nSec-WebSocket-Protocol: mqtt\r\n{extra}\r\n"
    ).encode()


async def test_another_websocket_version_gets_426_naming_13() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        await client.send_raw(upgrade_request(version="8"))
        answer = await client.read_all_raw()
        assert answer.startswith(b"HTTP/1.1 426 ")
        assert b"\r\nSec-WebSocket-Version: 13\r\n" in answer
        refused = await server.outcome()
        assert isinstance(refused, WebSocketRefused)
        assert refused.status == 426


async def test_a_request_head_over_20_kib_is_refused() -> None:
    # h11 refuses once over 16 KiB wait without forming a head; the server reads 4 KiB at a time.
    async with serving() as server, ws_connection(server.address) as client:
        await client.send_raw(upgrade_request(extra=f"X-Padding: {'x' * 20_500}\r\n"))
        refused = await server.outcome()
        assert isinstance(refused, WebSocketRefused)
        assert refused.status == 400
        # The server stopped reading and closed: the client gets the 400, or a reset first.
        with contextlib.suppress(trio.BrokenResourceError):
            assert (await client.read_all_raw()).startswith(b"HTTP/1.1 400 ")


async def test_bytes_that_are_not_http_are_refused() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        await client.send_raw(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")  # MQTT CONNECT
        assert (await client.read_all_raw()).startswith(b"HTTP/1.1 400 ")
        refused = await server.outcome()
        assert isinstance(refused, WebSocketRefused)
        assert refused.status == 400


async def test_a_client_that_vanishes_mid_handshake_is_refused_without_an_answer() -> None:
    async with serving() as server:
        async with ws_connection(server.address) as client:
            await client.send_raw(b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgr")
        refused = await server.outcome()
        assert isinstance(refused, WebSocketRefused)
        assert refused.status is None
        assert "closed during the handshake" in str(refused)


async def test_a_client_that_stalls_mid_handshake_is_dropped_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(timeout=5.0) as server, ws_connection(server.address) as client:
        start = trio.current_time()
        await client.send_raw(b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgr")
        refused = await server.outcome()  # waits up to WAIT (10 s) of the mock clock
        assert isinstance(refused, WebSocketRefused)
        assert str(refused) == "no WebSocket handshake within 5.0 s"
        assert trio.current_time() - start == pytest.approx(5.0)
        assert await client.read_all_raw() == b""  # the server hung up


# -- the byte stream -------------------------------------------------------------------------


async def test_bytes_split_across_many_frames_arrive_as_one_stream() -> None:
    payload = bytes(range(256)) * 40
    chunks = [payload[i : i + 100] for i in range(0, len(payload), 100)]
    async with serving() as server, ws_connection(server.address) as client:
        await client.handshake()
        for chunk in chunks[:-1]:  # one message in 103 fragments ...
            await client.send(BytesMessage(data=chunk, message_finished=False))
        await client.send(BytesMessage(data=chunks[-1], message_finished=True))
        for i in range(0, len(payload), 4000):  # ... then three messages
            await client.send(BytesMessage(data=payload[i : i + 4000]))
        with trio.fail_after(WAIT):
            assert await client.receive_bytes(2 * len(payload)) == payload + payload


async def test_several_packets_in_one_frame_come_out_as_a_stream() -> None:
    pingreq, publish, disconnect = b"\xc0\x00", b"\x30\x07\x00\x03a/bhi", b"\xe0\x00"
    reads: list[bytes] = []

    async def read_two_at_a_time(ws: WebSocketStream) -> None:
        while data := await ws.receive_some(2):
            reads.append(data)

    async with serving(read_two_at_a_time) as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send(BytesMessage(data=pingreq + publish + disconnect))
        await client.send(CloseConnection(code=1000))
        assert await server.outcome() == Ended("mqtt", None)
    assert b"".join(reads) == pingreq + publish + disconnect
    assert all(len(read) <= 2 for read in reads)


async def test_a_ping_is_answered_with_a_pong_and_the_stream_goes_on() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send(Ping(payload=b"are you there"))
        await client.send(BytesMessage(data=b"\xc0\x00"))
        with trio.fail_after(WAIT):
            assert await client.next_event() == Pong(payload=b"are you there")
            assert await client.receive_bytes(2) == b"\xc0\x00"


async def test_send_all_is_one_binary_message_per_call() -> None:
    async def send_three(ws: WebSocketStream) -> None:
        for data in (b"\x20\x02\x00\x00", bytearray(b"\xd0\x00"), memoryview(b"x" * 70_000)):
            await ws.send_all(data)

    async with serving(send_three) as server, ws_connection(server.address) as client:
        await client.handshake()
        got = []
        with trio.fail_after(WAIT):
            while len(got) < 3:  # three messages, whatever TCP did to the frames
                data = bytearray()
                while True:
                    event = await client.next_event()
                    assert isinstance(event, BytesMessage)
                    data += event.data
                    if event.message_finished:
                        break
                got.append(bytes(data))
        assert got == [b"\x20\x02\x00\x00", b"\xd0\x00", b"x" * 70_000]
        assert await client.next_event() == CloseConnection(code=1000, reason="")


async def test_a_send_cancelled_halfway_leaves_the_stream_broken(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def send_to_a_client_that_does_not_read(ws: WebSocketStream) -> None:
        with trio.move_on_after(1.0) as scope:  # fires once the socket buffers are full
            while True:  # ends by the cancel: the client never reads
                await ws.send_all(b"x" * 1_000_000)
        assert scope.cancelled_caught
        await ws.send_all(b"\xc0\x00")  # a frame cut short cannot be followed

    async with serving(send_to_a_client_that_does_not_read) as server:
        async with ws_connection(server.address) as client:
            await client.handshake()
            ended = await server.outcome()
    assert isinstance(ended, Ended)
    assert str(ended.error) == "an earlier send failed halfway"


@pytest.mark.parametrize("length", [0, 1, 125, 126, 65_535, 65_536, 70_000])
def test_the_frame_header_is_what_wsproto_would_write(length: int) -> None:
    payload = b"\x55" * length
    framed_by_wsproto = Connection(ConnectionType.SERVER).send(BytesMessage(data=payload))
    assert binary_frame_header(length) + payload == framed_by_wsproto


# -- closing ---------------------------------------------------------------------------------


async def test_the_clients_close_is_answered_and_the_stream_ends() -> None:
    async with serving() as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send(BytesMessage(data=b"\xc0\x00"))
        with trio.fail_after(WAIT):
            assert await client.receive_bytes(2) == b"\xc0\x00"
            await client.send(CloseConnection(code=1000, reason="bye"))
            assert await client.next_event() == CloseConnection(code=1000, reason="bye")
            assert await client.next_event() is None  # then the server closes TCP
        assert await server.outcome() == Ended("mqtt", None)


async def test_the_reader_gets_every_byte_sent_before_the_close_frame() -> None:
    got = bytearray()
    async with serving(reader(got)) as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send_raw(
            client.ws.send(BytesMessage(data=b"\xe0\x00"))
            + client.ws.send(CloseConnection(code=1000))  # in the same TCP segment
        )
        assert await server.outcome() == Ended("mqtt", None)
    assert got == b"\xe0\x00"


async def test_the_server_closes_with_1000() -> None:
    async def greet_and_close(ws: WebSocketStream) -> None:
        await ws.send_all(b"\x20\x02\x00\x00")

    async with serving(greet_and_close) as server, ws_connection(server.address) as client:
        await client.handshake()
        with trio.fail_after(WAIT):
            assert await client.receive_bytes(4) == b"\x20\x02\x00\x00"
            assert await client.next_event() == CloseConnection(code=1000, reason="")
            assert await client.next_event() is None


async def test_tcp_ending_without_a_close_frame_ends_the_stream() -> None:
    async with serving() as server:
        async with ws_connection(server.address) as client:
            await client.handshake()
        assert await server.outcome() == Ended("mqtt", None)


async def test_sending_after_the_client_closed_is_broken() -> None:
    async def wait_then_send(ws: WebSocketStream) -> None:
        assert await ws.receive_some() == b""
        await ws.send_all(b"\xd0\x00")

    async with serving(wait_then_send) as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send(CloseConnection(code=1000))
        ended = await server.outcome()
        assert isinstance(ended, Ended)
        assert isinstance(ended.error, trio.BrokenResourceError)


# -- protocol errors: a close frame that says why, then BrokenResourceError ------------------
# The server only reads here, so the close frame is the first thing the client gets back.


async def closed_with(client: WsClient, server: Server) -> tuple[int, str]:
    """The code of the server's close frame, and the error its reader got."""
    with trio.fail_after(WAIT):
        close = await client.next_event()
    assert isinstance(close, CloseConnection), close
    ended = await server.outcome()
    assert isinstance(ended, Ended)
    assert isinstance(ended.error, trio.BrokenResourceError)
    return close.code, str(ended.error)


async def test_a_message_over_max_message_closes_with_1009() -> None:
    got = bytearray()
    options = {"max_message": 1000}
    async with serving(reader(got), **options) as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send(BytesMessage(data=b"a" * 1000))  # at the limit: fine
        await client.send(BytesMessage(data=b"b" * 600, message_finished=False))
        await client.send(BytesMessage(data=b"b" * 401))  # 1001 bytes in one message
        assert await closed_with(client, server) == (
            1009,
            "WebSocket closed with 1009: message over 1000 bytes",
        )
    # The reader got what came before the limit was crossed, as a stream does.
    assert got[:1000] == b"a" * 1000
    assert got[1000:] == b"b" * len(got[1000:])
    assert 600 <= len(got[1000:]) <= 1000


async def test_a_text_message_closes_with_1003() -> None:
    got = bytearray()
    async with serving(reader(got)) as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send(BytesMessage(data=b"\xc0\x00"))
        await client.send(TextMessage(data="\xc0\x00"))
        assert await closed_with(client, server) == (
            1003,
            "WebSocket closed with 1003: MQTT needs binary messages",
        )
    assert got == b"\xc0\x00"


async def test_an_unmasked_client_frame_closes_with_1002() -> None:
    got = bytearray()
    async with serving(reader(got)) as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send_raw(b"\x82\x02\xc0\x00")  # RFC 6455 5.1: clients must mask
        code, error = await closed_with(client, server)
        assert code == 1002
        assert "1002" in error
    assert got == b""


async def test_sending_after_a_protocol_error_says_what_the_error_was() -> None:
    async def send_after_error(ws: WebSocketStream) -> None:
        with pytest.raises(trio.BrokenResourceError, match="1003"):
            await ws.receive_some()
        await ws.send_all(b"\xd0\x00")

    async with serving(send_after_error) as server, ws_connection(server.address) as client:
        await client.handshake()
        await client.send(TextMessage(data="hello"))
        assert await closed_with(client, server) == (
            1003,
            "WebSocket closed with 1003: MQTT needs binary messages",
        )


# -- a real MQTT client: MQTT.js over the `ws` library ---------------------------------------


async def read_packet(ws: WebSocketStream, buffer: bytearray) -> tuple[int, bytes]:
    """The next MQTT packet's first byte and body, from the stream (and what is buffered)."""
    while True:  # bounded by the caller's cancel scope and the 4-byte length limit
        length, shift, at = 0, 0, 1
        while at < len(buffer) and at <= 4:
            length |= (buffer[at] & 0x7F) << shift
            shift += 7
            at += 1
            if not buffer[at - 1] & 0x80:
                if len(buffer) >= at + length:
                    first, body = buffer[0], bytes(buffer[at : at + length])
                    del buffer[: at + length]
                    return first, body
                break
        data = await ws.receive_some()
        assert data, "the stream ended inside a packet"
        buffer += data


async def mqtt_js_publish(address: tuple[str, int], version: int) -> None:
    if shutil.which("node") is None:
        pytest.skip("needs Node.js")
    if not (JS / "node_modules" / "mqtt").is_dir():
        pytest.skip("MQTT.js is not installed: `make test` installs it")
    host, port = address
    command = ["node", str(JS / "mqtt_pub.js"), f"ws://{host}:{port}/mqtt", "a/b", "héllo"]
    done = await trio.run_process(
        [*command, "--protocol-version", str(version)], capture_stderr=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()


async def paho_publish(address: tuple[str, int], version: int) -> None:
    host, port = address
    protocol = paho.MQTTv311 if version == 4 else paho.MQTTv5
    publish = partial(
        paho_publish_single,
        "a/b",
        "héllo",
        hostname=host,
        port=port,
        protocol=protocol,
        transport="websockets",  # path /mqtt, subprotocol mqtt
    )
    await trio.to_thread.run_sync(publish, abandon_on_cancel=True)


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("publish", [mqtt_js_publish, paho_publish], ids=["mqtt.js", "paho"])
async def test_a_real_mqtt_client_publishes_through_the_websocket(
    publish: Callable[[tuple[str, int], int], Awaitable[None]], version: int
) -> None:
    seen: list[tuple[int, bytes]] = []

    async def fake_broker(ws: WebSocketStream) -> None:
        buffer = bytearray()
        seen.append(await read_packet(ws, buffer))  # CONNECT
        await ws.send_all(b"\x20\x02\x00\x00" if version == 4 else b"\x20\x03\x00\x00\x00")
        seen.append(await read_packet(ws, buffer))  # PUBLISH, QoS 0
        seen.append(await read_packet(ws, buffer))  # DISCONNECT
        assert await ws.receive_some() == b""

    async with serving(fake_broker) as server:
        with trio.fail_after(30):
            await publish(server.address, version)
            ended = await server.outcome()
    assert ended == Ended("mqtt", None)
    (connect_type, connect), (publish_type, packet), (disconnect_type, _) = seen
    assert (connect_type, connect[:6], connect[6]) == (0x10, b"\x00\x04MQTT", version)
    topic_end = 2 + int.from_bytes(packet[:2], "big")
    properties = 1 if version == 5 else 0  # an empty property list
    assert (publish_type, packet[2:topic_end]) == (0x30, b"a/b")
    assert packet[topic_end + properties :] == "héllo".encode()
    assert disconnect_type == 0xE0
