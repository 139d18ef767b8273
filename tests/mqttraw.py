"""A raw MQTT client for conformance tests: our own codec over a blocking socket.

paho-mqtt answers PUBLISHes, PUBRELs and keepalives on its own and hides DUP flags,
packet ids and the DISCONNECT a server sends before it closes; ``Raw`` shows every
packet as it came and sends only what a test tells it to. Every wait is bounded
(``WAIT``); a bound that runs out is a failure, never a pass.
"""

from __future__ import annotations

import socket
from typing import Any

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.packets import ConnAck, Connect, Packet

WAIT = 10.0


class Closed(Exception):
    """The server closed the connection."""


class Raw:
    """One TCP connection speaking protocol level ``version`` (4 or 5) packet by packet."""

    def __init__(self, port: int, version: int = 5) -> None:
        self.version = version
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.decoder = Decoder(server=False, protocol_level=version)

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str, **kwargs: Any) -> ConnAck:
        """CONNECT and the CONNACK that answers it."""
        self.send(Connect(client_id, protocol_level=self.version, **kwargs))
        connack = self.expect()
        assert isinstance(connack, ConnAck), connack
        return connack

    def expect(self, timeout: float = WAIT) -> Packet:
        """The next packet from the server; raises Closed when it closes instead."""
        self.sock.settimeout(timeout)
        while True:
            packet = self.decoder.next_packet()
            if packet is not None:
                return packet
            data = self.sock.recv(65536)
            if not data:
                raise Closed()
            self.decoder.receive_data(data)

    def expect_closed(self, timeout: float = WAIT) -> list[Packet]:
        """Read until the server closes the connection: what it sent before closing."""
        got = []
        try:
            while True:
                got.append(self.expect(timeout))
        except Closed:
            return got
        except ConnectionResetError:
            return got

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
