"""PING a broker every 20 ms from a process of its own until stdin closes, then print the
round trips as JSON: how responsive a broker stays, measured without sharing a CPU-bound
event loop with the load generator.

    python -m tests.pinger HOST PORT
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time

import msgpack

from broker.wire.frames import PROTOCOL_VERSION

INTERVAL = 0.02
MAX_SECONDS = 120.0  # bounded even if nobody closes stdin


class _Link:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.buffer = b""

    def send(self, body: dict) -> None:
        data = msgpack.packb(body, use_bin_type=True)
        self.sock.sendall(len(data).to_bytes(4, "big") + data)

    def read(self) -> dict:
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + size:
                    body = self.buffer[4 : 4 + size]
                    self.buffer = self.buffer[4 + size :]
                    return msgpack.unpackb(body, raw=False)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.buffer += data


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    link = _Link(host, port)
    link.send({"type": "HELLO", "version": PROTOCOL_VERSION})
    assert link.read()["type"] == "WELCOME"
    print("ready", flush=True)
    round_trips = []
    deadline = time.monotonic() + MAX_SECONDS
    ping_id = 0
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sys.stdin], [], [], INTERVAL)
        if readable and not sys.stdin.readline():
            break  # stdin closed: done
        ping_id += 1
        started = time.perf_counter()
        link.send({"type": "PING", "id": ping_id})
        while link.read().get("type") != "PONG":
            pass
        round_trips.append(time.perf_counter() - started)
    print(json.dumps({"count": len(round_trips), "worst": max(round_trips, default=0.0)}))


if __name__ == "__main__":
    main()
