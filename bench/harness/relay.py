"""Two reference relays: the least a Python broker does per message, to know the floor.

    python -m bench.harness.relay {trio|epoll} PORT

Not brokers: they speak just enough of topiary's native protocol for the benchmark clients
(bench/harness/clients: HELLO -> WELCOME, SUB -> SUBACK, UNSUB -> UNSUBACK (bench/storm.py's
storm connection), PING -> PONG, PUB -> MSG to every
connection with a matching filter, once per connection, routed by ``routing``'s
``SubscriptionTable``), with no queue limits, no checks beyond the framing, no counters,
no sessions and no keepalive. What one read brings is written with one send per
connection, as topiary's direct writes do.

- ``trio``: one task per connection on trio, reading with ``os.read`` after
  ``wait_readable`` as topiary's native reader does; a full socket is waited for with
  ``wait_writable`` (the reader stops reading meanwhile).
- ``epoll``: one thread on a bare ``select.epoll`` loop (level-triggered, each socket
  registered once); a full socket keeps the rest and is written when epoll says so.

The difference between the two is what trio's loop costs per wake-up; between ``trio``
and topiary, what the broker does beyond relaying (bench/sidebyside.py ``--brokers
topiary,relay-trio,relay-epoll,mosquitto``; docs/benchmarks.md, "p99 at 2,000 msg/s").
Both exit at once, with status 0, on SIGTERM.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
from typing import Any, Final

import msgpack
import trio

import routing
from bench.harness.clients.native import frame_bytes
from broker.wire.frames import Pong, SubAck, UnsubAck, Welcome

HOST: Final = "127.0.0.1"
RECEIVE_SIZE: Final = 256 * 1024
_unpackb: Final = msgpack.unpackb
_packb: Final = msgpack.packb


class Peer:
    """One connection: its socket's descriptor, what the current read owes it, unread bytes."""

    __slots__ = ("__weakref__", "buf", "fd", "filters", "out", "subs", "unsent", "uses")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.out: list[bytes] = []
        self.buf = bytearray()
        self.subs = 0
        self.filters: dict[int, str] = {}  # sub id -> filter text, for UNSUB
        self.uses: dict[str, int] = {}  # filter text -> its sub ids here
        self.unsent = b""  # (epoll) the rest of a write the socket did not take


class Relay:
    """The protocol, shared by both loops: bytes of one read in, who is owed what out."""

    def __init__(self) -> None:
        self.table = routing.SubscriptionTable()

    def feed(self, peer: Peer, data: bytes) -> list[Peer]:
        """Handle the whole frames ``peer`` has sent so far; the peers owed bytes now."""
        buf = peer.buf
        buf += data
        touched: list[Peer] = []
        pos, end = 0, len(buf)
        match = self.table.match
        while end - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if pos + 4 + size > end:
                break
            wire: dict[str, Any] = _unpackb(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            kind = wire["type"]
            if kind == "PUB":
                topic = wire["topic"]
                body = _packb(
                    {"type": "MSG", "topic": topic, "sub": 1, "seq": 1, "payload": wire["payload"]}
                )
                frame = len(body).to_bytes(4, "big") + body
                for other in match(topic):
                    if not other.out:
                        touched.append(other)
                    other.out.append(frame)
                continue
            if kind == "SUB":
                peer.subs += 1
                text = peer.filters[peer.subs] = wire["filter"]
                peer.uses[text] = peer.uses.get(text, 0) + 1
                self.table.add(text, peer)
                reply = frame_bytes(SubAck(id=wire["id"], sub=peer.subs))
            elif kind == "UNSUB":
                text = peer.filters.pop(wire["sub"], None)
                if text is not None:
                    left = peer.uses.pop(text) - 1
                    if left:
                        peer.uses[text] = left
                    else:
                        self.table.remove(text, peer)
                reply = frame_bytes(UnsubAck(id=wire["id"]))
            elif kind == "PING":
                reply = frame_bytes(Pong(id=wire.get("id", 0)))
            elif kind == "HELLO":
                welcome = Welcome(
                    version=wire["version"],
                    client_id=wire.get("client_id") or f"relay-{peer.fd}",
                    server_id="relay",
                    max_frame=1 << 20,
                    keepalive=0,
                )
                reply = frame_bytes(welcome)
            else:
                continue  # (the rest: the benchmarks send none)
            if not peer.out:
                touched.append(peer)
            peer.out.append(reply)
        del buf[:pos]
        return touched

    def leave(self, peer: Peer) -> None:
        self.table.remove_subscriber(peer)


# -- on trio -----------------------------------------------------------------------------------


async def _serve_trio(relay: Relay, stream: trio.SocketStream) -> None:
    fd = stream.socket.fileno()
    peer = Peer(fd)
    try:
        while True:
            try:
                data = os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError:
                return
            if not data:
                return
            for other in relay.feed(peer, data):
                out = b"".join(other.out)
                other.out.clear()
                while out:
                    try:
                        out = out[os.write(other.fd, out) :]
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(other.fd)
                    except OSError:
                        break  # gone: its own task finds out
    finally:
        relay.leave(peer)


async def _run_trio(port: int) -> None:
    relay = Relay()
    await trio.serve_tcp(lambda stream: _serve_trio(relay, stream), port, host=HOST)


# -- on a bare epoll loop ----------------------------------------------------------------------


def _run_epoll(port: int) -> None:
    relay = Relay()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, port))
    listener.listen(128)
    listener.setblocking(False)
    epoll = select.epoll()
    epoll.register(listener.fileno(), select.EPOLLIN)
    peers: dict[int, tuple[socket.socket, Peer]] = {}

    def close(fd: int) -> None:
        sock, peer = peers.pop(fd)
        epoll.unregister(fd)
        relay.leave(peer)
        sock.close()

    def write(peer: Peer, data: bytes) -> None:
        if peer.unsent:  # behind already: in line after the rest
            peer.unsent += data
            return
        try:
            sent = os.write(peer.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return  # gone: its read says so
        if sent < len(data):
            peer.unsent = data[sent:]
            epoll.modify(peer.fd, select.EPOLLIN | select.EPOLLOUT)

    while True:
        for fd, flags in epoll.poll():
            if fd == listener.fileno():
                sock, _ = listener.accept()
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as trio does
                peers[sock.fileno()] = (sock, Peer(sock.fileno()))
                epoll.register(sock.fileno(), select.EPOLLIN)
                continue
            if fd not in peers:
                continue
            peer = peers[fd][1]
            if flags & select.EPOLLOUT and peer.unsent:
                data, peer.unsent = peer.unsent, b""
                write(peer, data)
                if not peer.unsent:
                    epoll.modify(fd, select.EPOLLIN)
            if not flags & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                continue
            try:
                data = os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                close(fd)
                continue
            for other in relay.feed(peer, data):
                out = b"".join(other.out)
                other.out.clear()
                write(other, out)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("trio", "epoll") or not argv[1].isdigit():
        print("usage: python -m bench.harness.relay {trio|epoll} PORT", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    gc.freeze()  # as `topiary serve` does (broker/commands.py tune_gc)
    gc.set_threshold(10_000, 0, 500)
    if argv[0] == "trio":
        trio.run(_run_trio, int(argv[1]))
    else:
        _run_epoll(int(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
