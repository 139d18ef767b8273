"""The writer on a plain socket (``ClientConnection._send_fd``): every byte goes, in order,
as much per ``os.write`` as the socket takes; what it takes counts as the client's life in
steps of ``PROGRESS_BYTES``; it is a checkpoint even when the socket takes it all at once;
a peer that is gone is ``trio.BrokenResourceError``.

Real TCP sockets on 127.0.0.1 (a connection accepted from a listener in this process),
the send buffer made small so that a write of a megabyte waits for room many times.
"""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.testing

from broker.config import BrokerConfig
from broker.core import Broker
from broker.native.connection import PROGRESS_BYTES, ClientConnection

SIZE = 1024 * 1024


async def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """(the broker's side, the client's side) of one TCP connection on 127.0.0.1."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return server, client


def _connection(stream: trio.SocketStream) -> ClientConnection:
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
    return ClientConnection(Broker(BrokerConfig()), stream, "test")


async def test_a_long_write_arrives_whole_and_its_progress_counts_as_life() -> None:
    server, client = await _pair()
    connection = _connection(server)
    fd = server.socket.fileno()
    data = bytes(range(256)) * (SIZE // 256)
    received = bytearray()
    seen: set[float] = set()  # last_sent as the client saw it after each of its reads

    async def read_all() -> None:
        while len(received) < SIZE:
            chunk = await client.receive_some(32 * 1024)
            assert chunk
            received.extend(chunk)
            seen.add(connection.last_sent)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await connection._send_fd(fd, data, 1)
    assert bytes(received) == data
    # the write waited for room many times; what the socket took moved last_sent on
    assert len(seen) >= SIZE // PROGRESS_BYTES // 4
    await server.aclose()
    await client.aclose()


async def test_a_write_the_socket_takes_at_once_is_a_checkpoint() -> None:
    server, client = await _pair()
    connection = _connection(server)
    with trio.testing.assert_checkpoints():
        await connection._send_fd(server.socket.fileno(), b"x" * 100, 0)
    assert await client.receive_some(100) == b"x" * 100
    assert connection.last_sent == 0.0  # no messages in it: no life counted
    await server.aclose()
    await client.aclose()


async def test_a_write_to_a_peer_that_is_gone_is_a_broken_resource() -> None:
    server, client = await _pair()
    connection = _connection(server)
    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.aclose()  # (linger 0: a reset)
    with trio.fail_after(10), pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # (the first write may still be taken before the reset lands)
            await connection._send_fd(server.socket.fileno(), b"x" * 1000, 1)
    await server.aclose()
