"""``broker.net.receive_from``: a reader's os.read on a plain socket, with trio's wait when
there is nothing yet (the MQTT front end reads TCP clients with it)."""

from __future__ import annotations

import socket
import struct

import trio
import trio.testing

from broker.net import RECEIVE_SIZE, receive_from


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return ours, theirs


async def test_what_is_there_is_returned_at_once() -> None:
    ours, theirs = _pair()
    with ours, theirs:
        theirs.sendall(b"abc")
        assert await receive_from(ours.fileno()) == b"abc"


async def test_a_read_takes_at_most_receive_size() -> None:
    ours, theirs = _pair()
    with ours, theirs:
        theirs.setblocking(False)
        sent = 0
        while sent < RECEIVE_SIZE + 10:  # (bounded: the buffers take a few MiB at most)
            try:
                sent += theirs.send(bytes(RECEIVE_SIZE))
            except BlockingIOError:
                break
        got = await receive_from(ours.fileno())
        assert 0 < len(got) <= RECEIVE_SIZE


async def test_it_waits_for_data_that_comes_later() -> None:
    ours, theirs = _pair()
    with ours, theirs:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await receive_from(ours.fileno()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # parked: nothing to read yet
            theirs.sendall(b"later")
        assert got == [b"later"]


async def test_eof_reads_as_empty() -> None:
    ours, theirs = _pair()
    with ours:
        theirs.close()
        assert await receive_from(ours.fileno()) == b""


async def test_a_reset_reads_as_empty() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        theirs = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    with ours:
        ours.setblocking(False)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        theirs.close()  # an RST, not a FIN
        assert await receive_from(ours.fileno()) == b""
