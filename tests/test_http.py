"""The operators' HTTP port: health, readiness, metrics, stats; bad requests cost one
connection. Real sockets on 127.0.0.1, the broker's own trio loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from prometheus_client.parser import text_string_to_metric_families

from broker.client import connect
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
