"""Fair service: one client's slowness or storm never hurts anyone else (issue 18).

Real sockets on 127.0.0.1 against a broker in this process. A slow reader is slow on
purpose (it naps between small reads); nothing here waits on a nap for a result: every
check follows a barrier (a confirmed publish, a PING round trip, the last message read).
"""

from __future__ import annotations

import msgpack
import trio

from broker.client import connect
from broker.wire.buffer import FrameBuffer
from tests.conftest import running_broker
from tests.wire import RawClient, frame

Address = tuple[str, int]


async def read_slowly(
    raw: RawClient, expect: int, chunk: int, nap: float
) -> tuple[list[int], list[dict]]:
    """Read ``chunk`` bytes at a time, napping between reads, answering every PING, until
    ``expect`` MSGs came: their seqs, and every other frame seen. A cut frame at EOF raises
    (FrameBuffer: "connection closed mid-frame")."""
    buffer = FrameBuffer()
    seqs: list[int] = []
    others: list[dict] = []
    while len(seqs) < expect:
        data = await raw.stream.receive_some(chunk)
        buffer.feed(data)
        for body in buffer.next_frames():
            got = msgpack.unpackb(body, raw=False)
            if got["type"] == "MSG":
                seqs.append(got["seq"])
            else:
                others.append(got)
                if got["type"] == "PING":
                    await raw.send(frame({"type": "PONG", "id": got["id"]}))
                elif got["type"] == "ERROR":
                    return seqs, others
        if not data:
            return seqs, others
        await trio.sleep(nap)  # the slowness itself, not a wait for anything
    return seqs, others


async def round_trip(raw: RawClient, ping_id: int) -> None:
    """PING -> PONG on a raw connection: it is open and served."""
    await raw.send(frame({"type": "PING", "id": ping_id}))
    while True:
        got = await raw.read_frame()
        assert got["type"] != "EOF", "the broker closed the connection"
        if got["type"] == "PONG" and got["id"] == ping_id:
            return


async def test_slow_reader_that_answers_pings_gets_every_message_and_stays_connected() -> None:
    """8,000 messages of 500 B (4 MB, inside the default queue) read at ~1-2 MB/s with a
    0.5 s keepalive: the reading takes several keepalive intervals, during which the
    client says nothing but PONGs. It is never closed as idle and sees no cut frame."""
    total, payload = 8000, b"s" * 500
    async with running_broker(keepalive=0.5) as server:
        address = server.addresses[0]
        slow = await RawClient.open(address)
        await slow.send(frame({"type": "SUB", "id": 1, "filter": "slow/>"}))
        assert (await slow.read_frame())["type"] == "SUBACK"
        async with connect(address) as publisher:
            for _ in range(total - 1):
                await publisher.publish("slow/x", payload)
            # the barrier: the broker handles one connection's PUBs in order, so once
            # this is confirmed every message is queued for the slow reader
            await publisher.publish("slow/x", payload, confirm=True)
            with trio.fail_after(60):
                seqs, others = await read_slowly(slow, total, chunk=16 * 1024, nap=0.01)
            assert [f for f in others if f["type"] not in ("PING",)] == []
            assert seqs == list(range(1, total + 1))
            with trio.fail_after(10):
                await round_trip(slow, 99)
            stats = await publisher.stats()
        assert stats["idle_disconnects"] == 0
        assert stats["dropped"] == 0
        await slow.aclose()


async def test_a_ping_is_answered_ahead_of_queued_messages() -> None:
    """The reply to a PING goes in the priority lane: a client with thousands of messages
    queued for it gets its PONG before them."""
    total, payload = 4000, b"q" * 1000
    async with running_broker() as server:
        address = server.addresses[0]
        reader = await RawClient.open(address)
        await reader.send(frame({"type": "SUB", "id": 1, "filter": "queued/>"}))
        assert (await reader.read_frame())["type"] == "SUBACK"
        async with connect(address) as publisher:
            for _ in range(total - 1):
                await publisher.publish("queued/x", payload)
            await publisher.publish("queued/x", payload, confirm=True)  # all queued now
        await reader.send(frame({"type": "PING", "id": 5}))
        with trio.fail_after(20):
            before_pong = 0
            while True:
                got = await reader.read_frame()
                assert got["type"] != "EOF"
                if got["type"] == "PONG":
                    break
                before_pong += 1
            after = 0
            while after + before_pong < total:
                got = await reader.read_frame()
                assert got["type"] == "MSG", got
                after += 1
        # Only what was already written to the socket (or the batch being written) can come
        # first: far from all of it.
        assert before_pong < total // 2
        await reader.aclose()


async def test_unsuback_keeps_its_place_behind_queued_messages() -> None:
    """UNSUBACK promises that no MSG of that subscription follows: it is not overtaken."""
    total = 2000
    async with running_broker() as server:
        address = server.addresses[0]
        reader = await RawClient.open(address)
        await reader.send(frame({"type": "SUB", "id": 1, "filter": "line/>"}))
        suback = await reader.read_frame()
        async with connect(address) as publisher:
            for _ in range(total - 1):
                await publisher.publish("line/x", b"m" * 200)
            await publisher.publish("line/x", b"m" * 200, confirm=True)
        await reader.send(frame({"type": "UNSUB", "id": 2, "sub": suback["sub"]}))
        with trio.fail_after(20):
            messages = 0
            while True:
                got = await reader.read_frame()
                if got["type"] == "UNSUBACK":
                    break
                assert got["type"] == "MSG", got
                messages += 1
            assert messages == total
            await round_trip(reader, 3)  # and nothing else came after it
        await reader.aclose()


async def pipelined_subs(count: int, first_id: int = 1) -> bytes:
    return b"".join(
        frame({"type": "SUB", "id": first_id + i, "filter": f"storm/{i}/>"}) for i in range(count)
    )


async def test_a_pipelined_storm_is_handled_in_turns_of_at_most_turn_frames() -> None:
    """With a turn so short that it is always up, the storm's connection yields after every
    ``turn_frames`` frames: 4,000 pipelined SUBs take at least 4,000 / 16 turns."""
    count, turn_frames = 4000, 16
    async with running_broker(turn_frames=turn_frames, turn_time=1e-9) as server:
        storm = await RawClient.open(server.addresses[0])
        await storm.send(await pipelined_subs(count))
        with trio.fail_after(30):
            for _ in range(count):
                assert (await storm.read_frame())["type"] == "SUBACK"
        yielded = server.broker.counters.turns_yielded
        # (a read ends a turn too, without yielding again: one per read is allowed for)
        assert yielded >= count // turn_frames - count * 40 // (256 * 1024) - 2
        await storm.aclose()


async def test_another_client_is_answered_while_a_storm_is_being_handled() -> None:
    """A bystander's PING, sent once the storm's 20,000 SUBs are written, is answered before
    the broker has handled them all: the storm gave way."""
    count = 20_000
    async with running_broker() as server:
        address = server.addresses[0]
        storm = await RawClient.open(address)
        bystander = await RawClient.open(address)
        await storm.send(await pipelined_subs(count))
        with trio.fail_after(30):
            await round_trip(bystander, 1)
            handled_at_pong = server.broker.counters.subscribes
            suback_ids = []
            while len(suback_ids) < count:
                got = await storm.read_frame()
                assert got["type"] == "SUBACK", got
                suback_ids.append(got["id"])
        assert handled_at_pong < count
        assert suback_ids == list(range(1, count + 1))
        assert server.broker.counters.turns_yielded > 0
        await storm.aclose()
        await bystander.aclose()
