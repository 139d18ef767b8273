"""What a standby says to clients: it serves none of them, and names the primary.

A standby's store belongs to the replication stream until it is promoted, so every client
is refused at its first frame, in its own protocol, with the primary's address: native
HELLO gets ``ERROR NOT_PRIMARY`` (a server list moves on to the next address), MQTT 5.0
CONNECT gets CONNACK 0x9C *Use another server* with a Server Reference, MQTT 3.1.1 the
nearest it has, 0x03 *Server unavailable*. Each connection lives in its own task, bounded
by ``hello_timeout``; the door never touches the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from broker.errors import ErrorCode, RemoteProtocolError
from broker.ha.tls import PairTls, TlsHandshakeFailed
from broker.listeners import Listeners
from broker.log import get_logger
from broker.mqtt import reasons as R
from broker.mqtt.codec import MqttError, encode
from broker.mqtt.decoder import Decoder
from broker.mqtt.packets import ConnAck, Connect
from broker.net import RECEIVE_SIZE, receive_frame, send_error
from broker.wire.connection import Connection, Role

__all__ = ["DoorCounters", "StandbyDoor"]

log = get_logger("topiary.ha.door")


@dataclass(slots=True)
class DoorCounters:
    refused_native: int = 0
    refused_mqtt: int = 0
    #: Connections to ports a standby does not answer on (WebSocket, HTTP, the link).
    closed_other: int = 0


class StandbyDoor:
    """Refuses every client with the address of ``primary`` (HOST:PORT)."""

    def __init__(
        self,
        primary: str,
        hello_timeout: float,
        status: Callable[[], str] | None = None,
        link_tls: PairTls | None = None,
    ) -> None:
        self.primary = primary
        #: The pair's TLS ([ha] ca/cert/key): a partner dialling this broker's link port
        #: completes its handshake before the link closes, so it sees "not served here"
        #: (an end of stream before WELCOME), not a failed handshake.
        self.link_tls = link_tls
        self.hello_timeout = hello_timeout
        self.counters = DoorCounters()
        #: ``key=value`` words on the standby's state, added to NOT_PRIMARY for
        #: ``topiary ha status`` (a standby answers no STATS: it serves nobody).
        self.status = status

    async def serve(
        self, listeners: Listeners, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Answer on every socket of ``listeners`` until cancelled: native and MQTT clients
        (over TLS too) are refused in their protocol; the other ports (WebSocket, HTTP when
        given, the replication link) are closed at once, so whoever dialled moves on without
        waiting. (broker/ha/pair.py gives the HTTP ports to broker/ha/standby_http.py.)"""
        handlers: list[tuple[list[Any], Callable[[trio.abc.Stream], Awaitable[None]]]] = [
            ([*listeners.native, *listeners.secure("native")], self._native),
            ([*listeners.mqtt, *listeners.secure("mqtt")], self._mqtt),
            (
                [
                    *listeners.mqtt_ws,
                    *listeners.secure("websocket"),
                    *listeners.http,
                    *listeners.secure("http"),
                ],
                self._close,
            ),
            (listeners.link, self._close_link),
        ]
        async with trio.open_nursery() as nursery:
            for group, handler in handlers:
                for listener in group:
                    nursery.start_soon(
                        trio.serve_listeners, partial(self._secure, handler), [listener]
                    )
            task_status.started()

    async def _secure(
        self, handler: Callable[[trio.abc.Stream], Awaitable[None]], stream: trio.abc.Stream
    ) -> None:
        """A TLS stream's handshake (bounded by ``hello_timeout``) before ``handler``."""
        if isinstance(stream, trio.SSLStream):
            with trio.move_on_after(self.hello_timeout):
                try:
                    await stream.do_handshake()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                else:
                    await handler(stream)
                    return
            await trio.aclose_forcefully(stream)
            return
        await handler(stream)

    async def _close(self, stream: trio.abc.Stream) -> None:
        self.counters.closed_other += 1
        await trio.aclose_forcefully(stream)

    async def _close_link(self, stream: trio.abc.Stream) -> None:
        if self.link_tls is not None:
            with contextlib.suppress(TlsHandshakeFailed, trio.BrokenResourceError):
                stream = await self.link_tls.accept(stream, self.hello_timeout)
        await self._close(stream)

    async def _native(self, stream: trio.abc.Stream) -> None:
        async with stream:
            proto = Connection(Role.SERVER)
            with trio.move_on_after(self.hello_timeout):
                try:
                    if await receive_frame(proto, stream.receive_some) is None:
                        return
                except (RemoteProtocolError, trio.BrokenResourceError):
                    return
                self.counters.refused_native += 1
                why = f"this broker is the standby; the primary is {self.primary}"
                if self.status is not None:
                    why += f"; {self.status()}"
                await send_error(
                    stream, proto, RemoteProtocolError(ErrorCode.NOT_PRIMARY, why), seconds=0.5
                )

    async def _mqtt(self, stream: trio.abc.Stream) -> None:
        async with stream:
            decoder = Decoder(server=True)
            with trio.move_on_after(self.hello_timeout):
                try:
                    packet = None
                    while packet is None:
                        data = await stream.receive_some(RECEIVE_SIZE)
                        if not data:
                            return
                        decoder.receive_data(data)
                        packet = decoder.next_packet()
                except (MqttError, trio.BrokenResourceError):
                    return
                if not isinstance(packet, Connect):
                    return
                self.counters.refused_mqtt += 1
                if packet.protocol_level == 5:
                    connack = ConnAck(reason_code=R.USE_ANOTHER_SERVER)
                    connack.properties.server_reference = self.primary
                    connack.properties.reason_string = "this broker is the standby"
                    data = encode(connack, 5)
                else:
                    data = encode(ConnAck(reason_code=R.v3_connack_code(R.USE_ANOTHER_SERVER)), 4)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(data)
