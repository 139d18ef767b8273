"""kill -9 the broker under load, restart it on the same data dir, check the promises.

Rounds: start `topiary serve --data-dir D` as a real process; two durable
subscribers consume and ack while a publisher publishes with confirm; at a
random moment the broker gets SIGKILL. After the last round a final broker
lets the subscribers drain. Then, for every durable session:

- every confirmed message (PUBACK received) was delivered at least once;
- nothing acked was delivered again, for every ack known to be committed. An
  ACK has no reply, but the store commits in the order operations arrive, so
  an ack the broker read before it read a PUB that was then confirmed is
  committed: the subscriber records, after each ack and a round trip, how
  many publishes had been issued, and the ack counts once a publish issued
  later than that was confirmed.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from broker.client import connect
from tests.ports import free_port

ROUNDS = int(os.environ.get("TOPIARY_CRASH_ROUNDS", "20"))
TIME_BUDGET = 60.0  # seconds for all rounds together
SESSIONS = ("crash-a", "crash-b")


def start_broker(
    port: int, data_dir: Path, *extra: str, wait_port: int | None = None
) -> subprocess.Popen:
    """``topiary serve`` on ``port`` with ``data_dir`` (and ``extra`` arguments), once it
    listens on ``wait_port`` (default: ``port``)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--log-format",
            "json",
            *extra,
        ],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", wait_port or port), timeout=0.2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise AssertionError("the broker exited at start-up") from None
            time.sleep(0.05)  # a real process: poll its port (bounded) until it listens
    proc.kill()
    raise AssertionError("the broker did not start")


@dataclass
class Ledger:
    issued: int = 0
    confirmed: set[str] = field(default_factory=set)
    confirmed_issue: int = 0  # highest issue number whose PUBACK came back
    received: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    # per session: (seq acked, issue count when its round trip returned)
    acks: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    committed_acks: dict[str, int] = field(default_factory=dict)


async def subscriber(
    port: int, client_id: str, ledger: Ledger, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    try:
        async with (
            connect(("127.0.0.1", port), client_id=client_id, durable=True) as c,
            c.subscribe("crash/>") as sub,
        ):
            task_status.started()  # SUBACK: the session takes what is published from now
            async for message in sub:
                ledger.received.setdefault(client_id, []).append(
                    (message.seq, message.payload.decode())
                )
                if random.random() < 0.3:
                    await c.ack(message.seq)
                    await c.ping()  # the broker has read the ACK
                    ledger.acks.setdefault(client_id, []).append((message.seq, ledger.issued))
    except Exception:
        return  # the broker was killed


async def publisher(
    port: int, round_no: int, ledger: Ledger, kill_after: int, reached: trio.Event
) -> None:
    """Publish with confirmation until the broker dies; ``reached`` is set once
    ``kill_after`` publishes of this round were confirmed (and publishing goes on)."""
    try:
        async with connect(("127.0.0.1", port)) as p:
            for i in range(1_000_000):
                ledger.issued += 1
                issue = ledger.issued
                payload = f"r{round_no}-{i}"
                await p.publish(f"crash/{i % 5}", payload, confirm=True)
                ledger.confirmed.add(payload)
                ledger.confirmed_issue = max(ledger.confirmed_issue, issue)
                if i + 1 == kill_after:
                    reached.set()
    except Exception:
        return


def settle_acks(ledger: Ledger) -> None:
    """Acks followed by a confirmed publish issued later are committed."""
    for client_id, acks in ledger.acks.items():
        for seq, issued_then in acks:
            if ledger.confirmed_issue > issued_then:
                best = ledger.committed_acks.get(client_id, 0)
                ledger.committed_acks[client_id] = max(best, seq)
        ledger.acks[client_id] = []


async def one_round(port: int, data_dir: Path, round_no: int, ledger: Ledger, rng) -> None:
    proc = start_broker(port, data_dir)
    # The kill lands mid-stream after a random number of confirmed publishes, rather than
    # after a random time: on a loaded machine a time could pass before any publish.
    kill_after = rng.randint(20, 300)  # ~0.1-1 s of publishing here
    reached = trio.Event()
    try:
        with trio.CancelScope() as clients:
            async with trio.open_nursery() as nursery:
                for client_id in SESSIONS:
                    await nursery.start(subscriber, port, client_id, ledger)
                nursery.start_soon(publisher, port, round_no, ledger, kill_after, reached)
                with trio.fail_after(30):
                    await reached.wait()
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                # The clients notice the dead connection and return; if one does not
                # within 5 s, it is cancelled, as before.
                clients.deadline = trio.current_time() + 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    settle_acks(ledger)


async def drain(port: int, data_dir: Path, ledger: Ledger) -> None:
    proc = start_broker(port, data_dir)
    try:
        for client_id in SESSIONS:
            async with (
                connect(("127.0.0.1", port), client_id=client_id, durable=True) as c,
                c.subscribe("crash/>") as sub,
            ):
                while True:
                    with trio.move_on_after(1.0) as quiet:
                        message = await sub.get()
                    if quiet.cancelled_caught:
                        break
                    ledger.received.setdefault(client_id, []).append(
                        (message.seq, message.payload.decode())
                    )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_kill_9_loses_nothing_confirmed_and_redelivers_nothing_acked(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("TOPIARY_CRASH_SEED", "7")))
    ledger = Ledger()
    data_dir = tmp_path / "data"
    port = free_port()

    # Everything an ack had covered when its commit was certain, per session, and the
    # deliveries made after it: none of those may be at or below the acked sequence.
    checkpoints: list[tuple[str, int, int]] = []  # (session, acked seq, deliveries so far)

    async def main() -> None:
        started = time.monotonic()
        rounds = 0
        while rounds < ROUNDS and time.monotonic() - started < TIME_BUDGET:
            await one_round(port, data_dir, rounds, ledger, rng)
            for client_id, seq in ledger.committed_acks.items():
                checkpoints.append((client_id, seq, len(ledger.received.get(client_id, []))))
            rounds += 1
        await drain(port, data_dir, ledger)
        assert rounds >= min(ROUNDS, 3), "too few kill rounds ran in the time budget"

    trio.run(main)

    assert ledger.confirmed, "nothing was confirmed: the test did not exercise anything"
    for client_id in SESSIONS:
        got = {payload for _seq, payload in ledger.received.get(client_id, [])}
        missing = ledger.confirmed - got
        assert not missing, f"{client_id} never got {len(missing)} confirmed messages"
    for client_id, acked, seen in checkpoints:
        later = ledger.received[client_id][seen:]
        again = [seq for seq, _payload in later if seq <= acked]
        assert not again, f"{client_id} got seqs {again[:5]} again after acking {acked}"
