"""The operators' HTTP port: health, readiness, metrics, stats; bad requests cost one
connection. Real sockets on 127.0.0.1, the broker's own trio loop; the deadline's arithmetic
on in-memory streams and a virtual clock."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from broker.client import connect
from broker.http.server import HttpServer, text
from broker.server import Server
from tests.conftest import running_broker


@asynccontextmanager
async def broker_with_http(**overrides: object) -> AsyncIterator[Server]:
    async with running_broker(http_listen="127.0.0.1:0", **overrides) as server:
        yield server


def http_address(server: Server) -> tuple[str, int]:
    assert server.http is not None
    return server.http.addresses[0]


async def request(address: tuple[str, int], raw: bytes) -> bytes:
    """Send ``raw`` and read the answer until the server closes or 1 s of quiet."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(raw)
        chunks = []
        with trio.move_on_after(5):
            while data := await stream.receive_some(65536):
                chunks.append(data)
                if b"Content-Length" in b"".join(chunks) and _complete(b"".join(chunks)):
                    break
        return b"".join(chunks)


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


async def get(address: tuple[str, int], path: str, method: str = "GET") -> tuple[int, bytes]:
    raw = f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()
    answer = await request(address, raw)
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


async def test_healthz_answers_ok() -> None:
    async with broker_with_http() as server:
        assert await get(http_address(server), "/healthz") == (200, b"ok\n")


async def test_unknown_paths_are_404_and_other_methods_405() -> None:
    async with broker_with_http() as server:
        address = http_address(server)
        assert (await get(address, "/nope"))[0] == 404
        assert (await get(address, "/metrics", "POST"))[0] == 405


async def test_metrics_parse_and_count_what_was_published() -> None:
    async with broker_with_http() as server:
        async with connect(server.addresses[0]) as client, client.subscribe("m/>") as sub:
            for i in range(5):
                await client.publish(f"m/{i}", b"12345", confirm=True)
            for _ in range(5):
                await sub.get()
            status, body = await get(http_address(server), "/metrics")
        assert status == 200
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if not sample.labels
        }
        assert samples["topiary_messages_in_total"] == 5
        assert samples["topiary_messages_out_total"] == 5
        assert samples["topiary_payload_bytes_in_total"] == 25
        assert samples["topiary_subscribes_total"] == 1


async def test_a_garbage_request_gets_400_and_the_port_keeps_serving() -> None:
    async with broker_with_http() as server:
        address = http_address(server)
        answer = await request(address, b"GARBAGE\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert await get(address, "/healthz") == (200, b"ok\n")


# -- bad input costs one connection -----------------------------------------------------------


async def read_to_eof(stream: trio.abc.Stream, limit: float = 10) -> bytes:
    """Everything until the server closes (fails after ``limit`` seconds of waiting)."""
    chunks = []
    with trio.fail_after(limit):
        while data := await stream.receive_some(65536):
            chunks.append(data)
    return b"".join(chunks)


async def native_round_trip(server: Server, topic: str) -> None:
    """A real client publishes and receives on the broker's own port."""
    with trio.fail_after(10):
        async with connect(server.addresses[0]) as client, client.subscribe(topic) as sub:
            await client.publish(topic, b"still here", confirm=True)
            assert (await sub.get()).payload == b"still here"


async def test_binary_garbage_costs_one_connection() -> None:
    async with broker_with_http() as server:
        address = http_address(server)
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200))
            answer = await read_to_eof(stream)
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b"Connection: close" in answer
        assert server.http is not None and server.http.counters.bad_requests == 1
        assert await get(address, "/healthz") == (200, b"ok\n")
        await native_round_trip(server, "garbage/after")


async def test_a_slowloris_is_closed_by_the_server_while_both_ports_keep_serving() -> None:
    timeout = 2.0
    async with broker_with_http(http_request_timeout=timeout) as server:
        assert server.http is not None and server.http.request_timeout == timeout
        address = http_address(server)
        trickling = trio.Event()
        closed = trio.Event()
        answer = b""
        head = b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + b"X-Slow: " + b"z" * 10_000

        async def slowloris(stream: trio.abc.Stream) -> None:
            for byte in head:  # far slower than the timeout: ~500 s for the whole head
                await stream.send_all(bytes([byte]))
                trickling.set()
                await trio.sleep(0.05)

        async def reader(stream: trio.abc.Stream, cancel: trio.CancelScope) -> None:
            nonlocal answer
            answer = await read_to_eof(stream, limit=timeout + 20)
            closed.set()
            cancel.cancel()

        started = trio.current_time()  # (before the connect: the server's clock starts at accept)
        stream = await trio.open_tcp_stream(*address)
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(reader, stream, nursery.cancel_scope)
            nursery.start_soon(slowloris, stream)
            await trickling.wait()
            # Meanwhile: the broker's own port and the HTTP port both serve.
            await native_round_trip(server, "slowloris/meanwhile")
            assert await get(address, "/healthz") == (200, b"ok\n")
            assert not closed.is_set(), "the check ran after the slowloris was closed"
            await closed.wait()
        assert trio.current_time() - started >= timeout
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert server.http.counters.bad_requests == 1
        await native_round_trip(server, "slowloris/after")
        assert await get(address, "/healthz") == (200, b"ok\n")


async def test_a_huge_header_is_refused_and_closes_its_connection() -> None:
    async with broker_with_http() as server:
        assert server.http is not None
        limit = server.http.max_request_head
        address = http_address(server)
        # Far more than one read: the server answers with the rest still unread.
        big = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (16 * limit) + b"\r\n\r\n"
        stream = await trio.open_tcp_stream(*address)
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, big)
            answer = await read_to_eof(stream)
        assert answer.startswith((b"HTTP/1.1 431 ", b"HTTP/1.1 400 ")), answer[:100]
        assert b"Connection: close" in answer
        assert server.http.counters.bad_requests == 1
        assert await get(address, "/healthz") == (200, b"ok\n")
        await native_round_trip(server, "huge/after")


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 5\r\n\r\nhello",
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ],
)
async def test_a_request_with_a_body_is_refused(framing: bytes) -> None:
    async with broker_with_http() as server:
        address = http_address(server)
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + framing)
            answer = await read_to_eof(stream)
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert server.http is not None and server.http.counters.bad_requests == 1
        assert await get(address, "/healthz") == (200, b"ok\n")


async def test_head_answers_the_headers_of_get_without_a_body() -> None:
    async with broker_with_http() as server:
        address = http_address(server)
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(b"HEAD /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            answer = await read_to_eof(stream)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"Content-Length: 3" in head
        assert body == b""


async def test_keep_alive_serves_requests_in_turn_and_pipelined_on_one_connection() -> None:
    async with broker_with_http() as server:
        address = http_address(server)
        one = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            answers = []
            for _ in range(2):
                await stream.send_all(one)
                answers.append(await read_response(stream))
            await stream.send_all(
                one + b"GET /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            )
            rest = await read_to_eof(stream)
        assert answers == [answers[0]] * 2 and answers[0].startswith(b"HTTP/1.1 200 ")
        assert answers[0].endswith(b"\r\n\r\nok\n")
        assert rest.count(b"HTTP/1.1 ") == 2
        assert rest.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 404 " in rest
        assert server.http is not None
        assert server.http.counters.connections == 1 and server.http.counters.requests == 4


async def read_response(stream: trio.abc.Stream) -> bytes:
    """One response with a Content-Length, read off a connection that stays open."""
    data = b""
    with trio.fail_after(10):
        while not _complete(data):
            chunk = await stream.receive_some(65536)
            assert chunk, "the server closed a keep-alive connection"
            data += chunk
    return data


async def test_many_idle_connections_do_not_stop_others_and_are_closed_in_time() -> None:
    count, timeout = 50, 2.0
    async with broker_with_http(http_request_timeout=timeout) as server, AsyncExitStack() as stack:
        assert server.http is not None
        address = http_address(server)
        idle = [
            await stack.enter_async_context(await trio.open_tcp_stream(*address))
            for _ in range(count)
        ]
        await idle[0].send_all(b"GET /heal")  # one of them half a request
        with trio.fail_after(10):
            while server.http.counters.connections < count:
                await trio.sleep(0.01)
        assert await get(address, "/healthz") == (200, b"ok\n")
        await native_round_trip(server, "idle/meanwhile")
        answers = [await read_to_eof(stream, limit=timeout + 20) for stream in idle]
        assert answers[0].startswith(b"HTTP/1.1 408 ")
        assert answers[1:] == [b""] * (count - 1)  # an idle connection owes nobody an answer
        assert server.http.counters.bad_requests == 1


# -- the request deadline, on a virtual clock (in-memory streams, no sockets) -----------------


def memory_server(timeout: float) -> HttpServer:
    return HttpServer({"/x": lambda _request: text(200, "x\n")}, request_timeout=timeout)


async def test_the_deadline_covers_the_whole_request_not_each_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    http = memory_server(10.0)
    client, server_side = trio.testing.memory_stream_pair()

    async def trickle() -> None:
        with contextlib.suppress(trio.BrokenResourceError):
            for byte in b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n":  # each read is 1 s apart
                await client.send_all(bytes([byte]))
                await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(http._connection, server_side)
        started = trio.current_time()
        nursery.start_soon(trickle)
        answer = await read_to_eof(client, limit=60)
        assert 10 <= trio.current_time() - started < 11
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert http.counters.bad_requests == 1 and http.counters.requests == 0


async def test_an_idle_keep_alive_connection_is_closed_after_the_timeout_without_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    http = memory_server(10.0)
    client, server_side = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(http._connection, server_side)
        await client.send_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await read_response(client)).endswith(b"\r\n\r\nx\n")
        served = trio.current_time()
        assert await read_to_eof(client, limit=60) == b""
        assert 10 <= trio.current_time() - served < 11
    assert http.counters.requests == 1 and http.counters.bad_requests == 0
