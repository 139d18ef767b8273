"""kill -9 the broker while retained messages are published with confirmation; restart it on
the same data dir: a new subscriber gets the last confirmed retained message of every topic.

A real ``topiary serve`` process per round. One publisher publishes retained messages
(every seventh an empty payload, which deletes) on a few topics, each confirmed before the
next, so at most one publish is in flight when a SIGKILL lands: its topic may then hold
either the value confirmed before or the in-flight one (until a later publish on it is
confirmed); every other topic holds exactly its last confirmed value.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass, field
from pathlib import Path

import trio

from broker.client import connect
from tests.test_crash import free_port, start_broker

ROUNDS = 3
TOPICS = 8
MARKER = b"-- marker --"


@dataclass
class Ledger:
    # topic -> the payloads it may hold now (b"": none, deleted or never retained)
    allowed: dict[str, set[bytes]] = field(default_factory=dict)
    in_flight: tuple[str, bytes] | None = None
    issued: int = 0
    confirmed: int = 0

    def killed(self) -> None:
        """The broker died: the publish in flight may or may not have been stored."""
        if self.in_flight is not None:
            topic, payload = self.in_flight
            self.allowed.setdefault(topic, {b""}).add(payload)
            self.in_flight = None


async def publisher(port: int, ledger: Ledger, kill_after: int, reached: trio.Event) -> None:
    try:
        async with connect(("127.0.0.1", port)) as p:
            for i in range(1_000_000):
                ledger.issued += 1
                topic = f"r/{ledger.issued % TOPICS}"
                payload = b"" if ledger.issued % 7 == 0 else b"v%d" % ledger.issued
                ledger.in_flight = (topic, payload)
                await p.publish(topic, payload, confirm=True, retain=True)
                ledger.allowed[topic] = {payload}
                ledger.in_flight = None
                ledger.confirmed += 1
                if i + 1 == kill_after:
                    reached.set()
    except Exception:
        return  # the broker was killed


async def one_round(port: int, data_dir: Path, ledger: Ledger, rng: random.Random) -> None:
    proc = start_broker(port, data_dir)
    reached = trio.Event()
    try:
        with trio.CancelScope() as clients:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publisher, port, ledger, rng.randint(20, 200), reached)
                with trio.fail_after(30):
                    await reached.wait()
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                clients.deadline = trio.current_time() + 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ledger.killed()


async def retained_now(port: int, data_dir: Path) -> dict[str, bytes]:
    """Topic -> payload of what a new subscriber gets (up to a live marker)."""
    proc = start_broker(port, data_dir)
    try:
        async with connect(("127.0.0.1", port)) as c, c.subscribe("r/>") as sub:
            await c.publish("r/marker", MARKER, confirm=True)
            got = {}
            with trio.fail_after(10):
                while (message := await sub.get()).payload != MARKER:
                    assert message.retained
                    got[message.topic] = message.payload
            return got
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_kill_9_keeps_every_confirmed_retained_message(tmp_path: Path) -> None:
    rng = random.Random(11)
    ledger = Ledger()
    port = free_port()
    got: dict[str, bytes] = {}

    async def main() -> None:
        nonlocal got
        for _ in range(ROUNDS):
            await one_round(port, tmp_path / "data", ledger, rng)
        got = await retained_now(port, tmp_path / "data")

    trio.run(main)

    assert ledger.confirmed >= ROUNDS * 20 and len(ledger.allowed) == TOPICS
    for topic, allowed in ledger.allowed.items():
        assert got.get(topic, b"") in allowed, (topic, got.get(topic), allowed)
    assert set(got) <= set(ledger.allowed)
