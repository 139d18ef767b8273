"""Raw native-protocol clients for the benchmarks: HELLO, pipelined requests, frames.

The benchmarks' subscribers and bulk subscribers skip ``broker.client`` and speak the
protocol through the sans-IO ``Connection`` (or bare frames), so that their own CPU,
which competes with the broker's on a small machine, stays low.
"""

from __future__ import annotations

import time

import trio

from bench.harness import BenchError
from bench.harness.processes import HOST
from broker.wire.codec import encode_frame
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, Role
from broker.wire.frames import PROTOCOL_VERSION, Error, Frame, Hello, Welcome

RECEIVE_SIZE = 256 * 1024
KEEPALIVE = 600.0  # seconds; bench clients only read, so ask the broker not to expect PINGs


async def next_frame(
    stream: trio.SocketStream, proto: Connection, closed: str = "the broker closed the connection"
) -> Frame:
    """The next frame on ``stream``, reading as needed; BenchError(``closed``) if the broker
    hung up."""
    while True:
        event = proto.next_event()
        if event is NEED_DATA:
            proto.receive_data(await stream.receive_some(RECEIVE_SIZE))
            continue
        if isinstance(event, ConnectionClosed):
            raise BenchError(closed)
        return event  # type: ignore[return-value]


async def open_raw(port: int) -> tuple[trio.SocketStream, Connection]:
    """A TCP connection after HELLO / WELCOME, and its protocol object."""
    stream = await trio.open_tcp_stream(HOST, port)
    proto = Connection(Role.CLIENT)
    await stream.send_all(proto.send(Hello(version=PROTOCOL_VERSION, keepalive=KEEPALIVE)))
    welcome = await next_frame(stream, proto)
    if not isinstance(welcome, Welcome):
        raise BenchError(f"expected WELCOME, got {welcome!r}")
    return stream, proto


async def pipelined(
    stream: trio.SocketStream, proto: Connection, data: bytes, want: type, count: int
) -> tuple[float, list[Frame], list[Error]]:
    """Send ``data`` while reading ``count`` replies of type ``want`` (or ERRORs).

    Returns the seconds from the first byte sent to the last reply, the replies and the
    errors.
    """
    replies: list[Frame] = []
    errors: list[Error] = []
    started = time.perf_counter()
    elapsed = 0.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all, data)
        while len(replies) + len(errors) < count:
            for event in proto.next_events():  # every reply of the last read, NEED_DATA
                if event is NEED_DATA:
                    if len(replies) + len(errors) < count:
                        proto.receive_data(await stream.receive_some(RECEIVE_SIZE))
                elif isinstance(event, want):
                    replies.append(event)  # type: ignore[arg-type]
                elif isinstance(event, Error):
                    errors.append(event)
                elif isinstance(event, ConnectionClosed):
                    raise BenchError("the broker closed the connection")
                elif isinstance(event, BaseException):
                    raise event
        elapsed = time.perf_counter() - started
    return elapsed, replies, errors


def frame_bytes(frame: Frame) -> bytes:
    """One frame as it goes on the wire (length prefix + msgpack body), without a
    ``Connection``: for clients that parse what comes back themselves."""
    body = encode_frame(frame)
    return len(body).to_bytes(4, "big") + body
