"""Loss is never silent: a transient subscriber whose queue overflowed is told how many
messages it lost (MSG ``discarded``), the drops are logged with its client id, and STATS
names it among the sessions that dropped most (issue 18)."""

from __future__ import annotations

import structlog
import trio

from broker.client import connect
from broker.core import Counters, Message, OutboundLimits, Session
from broker.wire.codec import append_msg, decode_frame
from broker.wire.frames import Msg
from tests.conftest import running_broker
from tests.wire import RawClient, frame


def _append_discarded(parts: list, message: Message, sub: int, seq: int, n: int) -> int:
    return append_msg(parts, message, sub, seq, discarded=n)


def msgs_sent(session: Session) -> list[Msg]:
    data, _ = session.take_batch(append_msg, 256 * 1024, _append_discarded)
    frames = []
    while data:
        size = int.from_bytes(data[:4], "big")
        frames.append(decode_frame(data[4 : 4 + size]))
        data = data[4 + size :]
    return frames


def a_session(queue: int) -> Session:
    return Session("slow-one", OutboundLimits(messages=queue), Counters())


def test_the_message_after_drops_carries_how_many_were_dropped() -> None:
    session = a_session(queue=2)
    for i in range(5):  # 2 queued, 3 dropped
        session.deliver(Message("t", b"%d" % i, None, f"m{i}"), 1)
    first = msgs_sent(session)
    assert [(m.payload, m.discarded) for m in first] == [(b"0", 0), (b"1", 0)]
    session.deliver(Message("t", b"5", None, "m5"), 1)
    session.deliver(Message("t", b"6", None, "m6"), 1)
    after = msgs_sent(session)
    assert [(m.payload, m.discarded) for m in after] == [(b"5", 3), (b"6", 0)]
    assert session.dropped == 3


def test_separate_runs_of_drops_are_told_separately() -> None:
    session = a_session(queue=1)
    told = []
    for run in (2, 4):
        session.deliver(Message("t", b"kept", None, "k"), 1)
        for _ in range(run):
            session.deliver(Message("t", b"lost", None, "l"), 1)
        told += [m.discarded for m in msgs_sent(session)]
    session.deliver(Message("t", b"last", None, "z"), 1)
    told += [m.discarded for m in msgs_sent(session)]
    assert told == [0, 2, 4]
    assert sum(told) == session.dropped == 6


class Holder:
    def take_over(self, why: str = "") -> None:
        pass


def test_a_durable_session_defers_to_the_store_instead_so_never_tells() -> None:
    session = Session("d", OutboundLimits(messages=1), Counters(), durable=True)
    session.attach(Holder())
    session.ready = True
    for i in range(3):
        session.deliver(Message("t", b"x", None, f"m{i}"), 1)
    assert (session.dropped, session.deferred) == (0, 2)  # the store has the other two
    assert [m.discarded for m in msgs_sent(session)] == [0]


def test_drops_are_logged_with_the_client_id_at_most_once_per_interval() -> None:
    session = a_session(queue=1)
    with structlog.testing.capture_logs() as logs:
        for i in range(50):
            session.deliver(Message("t", b"x", None, f"m{i}"), 1)
    dropped_lines = [line for line in logs if line["event"] == "messages dropped"]
    assert len(dropped_lines) == 1
    assert dropped_lines[0]["client"] == "slow-one"
    assert dropped_lines[0]["log_level"] == "warning"


async def test_a_slow_subscriber_is_told_and_named_in_stats() -> None:
    total = 3000
    async with running_broker(outbound_messages=100, slow_consumer_drops=100_000) as server:
        address = server.addresses[0]
        slow = await RawClient.open(address)
        await slow.send(frame({"type": "SUB", "id": 1, "filter": "burst/>"}))
        assert (await slow.read_frame())["type"] == "SUBACK"
        async with connect(address) as publisher:
            for i in range(total - 1):
                await publisher.publish("burst/x", b"%d" % i)
            await publisher.publish("burst/x", b"last", confirm=True)  # all routed now
            stats = await publisher.stats()
            dropped = stats["dropped"]
            assert dropped > 0
            received = told = 0
            with trio.fail_after(20):
                while received < total - dropped:  # everything that was not dropped
                    got = await slow.read_frame()
                    assert got["type"] == "MSG", got
                    received += 1
                    told += got.get("discarded", 0)
                # drops after the last queued message are told by the next one
                await publisher.publish("burst/x", b"end")
                got = await slow.read_frame()
            assert got["payload"] == b"end"
            told += got.get("discarded", 0)
        assert told == dropped
        (worst,) = stats["worst_dropping"]
        assert worst["dropped"] == dropped and worst["client"].startswith("anon-")
        await slow.aclose()


async def test_the_python_client_adds_up_what_it_was_told() -> None:
    async with running_broker(outbound_messages=50, slow_consumer_drops=100_000) as server:
        address = server.addresses[0]
        async with connect(address) as slow, slow.subscribe("told/>", buffer=10_000) as sub:
            # the subscriber's reader shares this event loop: publish from a raw client in
            # one write so that the broker routes much of it before the subscriber reads
            raw = await RawClient.open(address)
            burst = b"".join(
                frame({"type": "PUB", "topic": "told/x", "payload": b"%d" % i}) for i in range(2000)
            ) + frame({"type": "PUB", "topic": "told/x", "payload": b"last", "id": 1})
            await raw.send(burst)
            assert (await raw.read_until("PUBACK"))["type"] == "PUBACK"
            dropped = server.broker.counters.dropped
            assert dropped > 0
            received = told = 0
            with trio.fail_after(20):
                while received < 2001 - dropped:
                    told += (await sub.get()).discarded
                    received += 1
                await raw.send(frame({"type": "PUB", "topic": "told/x", "payload": b"end"}))
                end = await sub.get()
            assert end.payload == b"end"
            told += end.discarded
            assert told == slow.discarded == dropped
            await raw.aclose()
