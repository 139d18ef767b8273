"""Durable sessions: the broker keeps a client's subscriptions and unacked messages."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, connect
from broker.wire.frames import PROTOCOL_VERSION
from tests.conftest import running_broker
from tests.streams import quiet, take
from tests.wire import RawClient, frame


async def publish(address, topic: str, payloads: list[str]) -> None:
    async with connect(address) as p:
        for payload in payloads:
            await p.publish(topic, payload, confirm=True)


async def leave_a_session(address, client_id: str, pattern: str) -> None:
    """Open durable session ``client_id`` subscribed to ``pattern``, then go away: from here on
    the broker stores what matches for it."""
    async with connect(address, client_id=client_id, durable=True) as c:
        async with c.subscribe(pattern):
            await c.ping()


async def test_durable_subscriber_gets_exactly_what_it_missed_in_order(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address, client_id="svc-a", durable=True) as c:
            assert c.session_present is False
            async with c.subscribe("orders/>") as sub:
                await publish(address, "orders/1", ["a", "b"])
                got = await take(sub, 2)
                await c.ack(got[-1].seq)
                await c.ping()
        async with connect(address) as transient, transient.subscribe("orders/>") as tsub:
            await publish(address, "orders/2", ["c", "d", "e"])
            assert [m.payload for m in await take(tsub, 3)] == [b"c", b"d", b"e"]
        async with connect(address, client_id="svc-a", durable=True) as c:
            assert c.session_present is True
            async with c.subscribe("orders/>") as sub:
                missed = await take(sub, 3)
                assert [m.payload for m in missed] == [b"c", b"d", b"e"]
                assert [m.seq for m in missed] == [3, 4, 5]
                assert await quiet(sub)
        async with connect(address) as transient, transient.subscribe("orders/>") as tsub:
            assert await quiet(tsub)  # a transient subscriber gets nothing from before


async def test_nothing_acked_is_sent_again(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address, client_id="svc-b", durable=True) as c:
            async with c.subscribe("x/#", dialect="mqtt") as sub:
                await publish(address, "x/y", [str(i) for i in range(5)])
                got = await take(sub, 5)
                await c.ack(got[2].seq)  # 0, 1, 2 done; 3 and 4 seen but not acked
                await c.ping()
        async with connect(address, client_id="svc-b", durable=True) as c:
            async with c.subscribe("x/#", dialect="mqtt") as sub:
                again = await take(sub, 2)
                assert [m.payload for m in again] == [b"3", b"4"]
                assert [m.id for m in again] == [m.id for m in got[3:]]  # same message ids
                assert await quiet(sub)


async def test_sessions_and_their_messages_survive_a_broker_restart(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await leave_a_session(address, "svc-c", "keep/>")
        await publish(address, "keep/1", ["while away 1", "while away 2"])
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await publish(address, "keep/2", ["after restart"])
        async with connect(address, client_id="svc-c", durable=True) as c:
            assert c.session_present is True
            async with c.subscribe("keep/>") as sub:
                got = await take(sub, 3)
                expected = [b"while away 1", b"while away 2", b"after restart"]
                assert [m.payload for m in got] == expected
                assert [m.seq for m in got] == [1, 2, 3]
            stats = await c.stats()
            assert stats["durable_sessions"] == 1


async def test_newer_connection_takes_over_a_durable_session(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address, client_id="svc-d", durable=True) as old:
            async with old.subscribe("t/>") as old_sub:
                async with connect(address, client_id="svc-d", durable=True) as new:
                    assert new.session_present is True
                    with trio.fail_after(5), pytest.raises(BrokerError) as info:
                        await old_sub.get()
                    assert info.value.code == "SESSION_TAKEN"
                    async with new.subscribe("t/>") as sub:
                        await publish(address, "t/1", ["for the new one"])
                        (message,) = await take(sub, 1)
                        assert message.payload == b"for the new one"


async def test_a_slow_durable_reader_loses_nothing(tmp_path: Path) -> None:
    limits = {"outbound_messages": 5, "outbound_bytes": 1 << 20}
    async with running_broker(data_dir=str(tmp_path), **limits) as server:
        address = server.addresses[0]
        async with connect(address, client_id="svc-e", durable=True) as c:
            async with c.subscribe("slow/>", buffer=1) as sub:
                async with connect(address) as p:
                    for i in range(300):
                        await p.publish("slow/x", str(i), confirm=(i % 50 == 49))
                got = await take(sub, 300, seconds=20)
                assert [int(m.payload) for m in got] == list(range(300))
                stats = await c.stats()
        assert stats["dropped"] == 0
        assert stats["messages_replayed"] > 0  # the queue overflowed; the store filled in


@pytest.mark.parametrize(
    ("hello", "code"),
    [
        ({"client_id": "", "durable": True}, "INVALID_CLIENT_ID"),
        ({"client_id": "x" * 257, "durable": True}, "INVALID_CLIENT_ID"),
        ({"durable": True}, "INVALID_CLIENT_ID"),
        ({"client_id": "g", "group": ""}, "INVALID_CLIENT_ID"),
    ],
)
async def test_bad_durable_hellos_are_refused(tmp_path: Path, hello: dict, code: str) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        raw = await RawClient.open(server.addresses[0], hello=False)
        await raw.send(frame({"type": "HELLO", "version": PROTOCOL_VERSION, **hello}))
        with trio.fail_after(5):
            error = await raw.read_until("ERROR")
        assert error["code"] == code


async def test_ack_of_a_sequence_never_delivered_is_refused(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        raw = await RawClient.open(server.addresses[0], hello=False)
        await raw.send(
            frame({"type": "HELLO", "version": PROTOCOL_VERSION, "client_id": "z", "durable": True})
        )
        assert (await raw.read_frame())["type"] == "WELCOME"
        await raw.send(frame({"type": "ACK", "seq": 1}))
        with trio.fail_after(5):
            error = await raw.read_until("ERROR")
        assert error["code"] == "INVALID_ACK"
        await raw.send(frame({"type": "PING", "id": 1}))
        assert (await raw.read_until("PONG"))["id"] == 1  # request-level: still open


async def test_drop_oldest_keeps_the_newest_within_quota(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path), session_max_messages=5) as server:
        address = server.addresses[0]
        await leave_a_session(address, "q1", "q/>")
        await publish(address, "q/1", [str(i) for i in range(12)])
        # Pipelined: a read of many PUBs, each an append and a trim, in shared batches.
        async with connect(address) as p:
            for i in range(12, 300):
                await p.publish("q/1", str(i))
            await p.publish("q/1", "300", confirm=True)  # stored in order: all are now
        stored = await server.broker.store.session("q1")
        assert stored is not None and stored.pending == 5
        assert server.broker.store.statistics().messages == 5
        async with connect(address, client_id="q1", durable=True) as c:
            async with c.subscribe("q/>") as sub:
                got = await take(sub, 5)
                assert [m.payload for m in got] == [str(i).encode() for i in range(296, 301)]
                assert await quiet(sub)
            stats = await c.stats()
    assert stats["quota_dropped"] == 296


async def test_byte_quota_counts_payload_bytes(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path), session_max_bytes=1000) as server:
        address = server.addresses[0]
        await leave_a_session(address, "q2", "b/>")
        await publish(address, "b/1", [f"{i}" * 400 for i in range(4)])
        async with connect(address, client_id="q2", durable=True) as c:
            async with c.subscribe("b/>") as sub:
                got = await take(sub, 2)
                assert [m.payload[:1] for m in got] == [b"2", b"3"]
                assert await quiet(sub)


async def test_reject_publish_refuses_the_publisher_until_the_session_catches_up(
    tmp_path: Path,
) -> None:
    settings = {"session_max_messages": 3, "overflow": "reject-publish"}
    async with running_broker(data_dir=str(tmp_path), **settings) as server:
        address = server.addresses[0]
        await leave_a_session(address, "q3", "j/>")
        async with connect(address) as watcher, watcher.subscribe("j/>") as live:
            await publish(address, "j/1", ["a", "b", "c"])
            async with connect(address) as p:
                with pytest.raises(BrokerError) as info:
                    await p.publish("j/1", "d", confirm=True, msg_id="d-1")
                assert info.value.code == "QUOTA_EXCEEDED"
                assert [m.payload for m in await take(live, 3)] == [b"a", b"b", b"c"]
                assert await quiet(live)  # refused for everyone, not only the full session
                async with connect(address, client_id="q3", durable=True) as c:
                    async with c.subscribe("j/>") as sub:
                        got = await take(sub, 3)
                        await c.ack(got[-1].seq)
                        await c.ping()
                await p.publish("j/1", "d", confirm=True, msg_id="d-1")  # the retry goes in
                assert [m.payload for m in await take(live, 1)] == [b"d"]
                stats = await p.stats()
    assert stats["quota_rejected"] == 1


async def test_a_backlog_larger_than_the_subscription_buffer_is_delivered(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await leave_a_session(address, "big", "big/>")
        async with connect(address) as p:
            for i in range(5000):
                await p.publish("big/x", str(i), confirm=(i == 4999))
        async with connect(address, client_id="big", durable=True) as c:
            async with c.subscribe("big/>", buffer=100) as sub:
                got = await take(sub, 5000, seconds=30)
                assert [int(m.payload) for m in got] == list(range(5000))


async def test_operators_list_and_drop_durable_sessions(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        await leave_a_session(address, "ops-1", "ops/>")
        await publish(address, "ops/1", ["kept"])
        async with connect(address) as admin:
            (info,) = await admin.sessions()
            assert info["client_id"] == "ops-1"
            assert info["filters"] == [["ops/>", "native"]]
            assert (info["connected"], info["pending"], info["last_seq"]) == (False, 1, 1)
            assert await admin.drop_session("ops-1") is True
            assert await admin.drop_session("ops-1") is False
            assert await admin.sessions() == []
        async with connect(address, client_id="ops-1", durable=True) as c:
            assert c.session_present is False
            async with c.subscribe("ops/>") as sub:
                assert await quiet(sub)  # what was stored went with the session


async def test_dropping_a_connected_session_closes_its_connection(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address, client_id="ops-2", durable=True) as c:
            async with c.subscribe("o/>") as sub:
                async with connect(address) as admin:
                    assert await admin.drop_session("ops-2") is True
                with trio.fail_after(5), pytest.raises(BrokerError) as info:
                    await sub.get()
                assert info.value.code == "SESSION_TAKEN"


async def test_a_client_can_end_its_own_session_and_carry_on(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address, client_id="ops-3", durable=True) as c:
            async with c.subscribe("e/>") as sub:
                assert await c.end_session() is True
                await publish(address, "e/1", ["still live"])
                (message,) = await take(sub, 1)
                assert message.payload == b"still live"
                assert await c.sessions() == []


async def member(
    address, name: str, seen: dict, stop: trio.Event, *, die_after=None, task_status
) -> None:
    """A group member that processes (records, then acks) each message it gets; started
    once its SUBACK came, which is when it has joined the group."""
    async with connect(address, client_id=name, group="workers") as c:
        async with c.subscribe("jobs/>") as sub:
            task_status.started()
            count = 0
            while not stop.is_set():
                message = None
                with trio.move_on_after(0.2):  # (only the wait: an ack is never cut off)
                    message = await sub.get()
                if message is None:
                    continue
                if die_after is not None and count >= die_after:
                    return  # killed mid-stream: this one is never acked
                seen.setdefault(message.payload.decode(), []).append(name)
                await c.ack(message.seq, single=True)
                count += 1


async def test_shared_group_survives_a_member_dying_mid_stream(tmp_path: Path) -> None:
    from broker.core.groups import group_session_id

    async with running_broker(data_dir=str(tmp_path), group_prefetch=8) as server:
        address = server.addresses[0]
        seen: dict[str, list[str]] = {}
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(member, address, "m1", seen, stop)
            await nursery.start(member, address, "m2", seen, stop)
            await nursery.start(partial(member, address, "m3", seen, stop, die_after=20))
            payloads = [f"job-{i}" for i in range(300)]
            await publish(address, "jobs/x", payloads)
            group = server.broker.durable[group_session_id("workers")]
            with trio.fail_after(20):  # no event for these: poll
                while set(seen) != set(payloads):
                    await trio.sleep(0.05)
                # Nothing queued and nothing unacked: no message can come again, so a
                # duplicate would be in ``seen`` already.
                while group.queue or any(m.inflight for m in group.members):
                    await trio.sleep(0.01)
            stop.set()
        async with connect(address) as admin:
            (info,) = await admin.sessions()
            stats = await admin.stats()
    assert set(seen) == set(payloads)  # every job processed by some member, none lost
    assert {name for names in seen.values() for name in names} == {"m1", "m2", "m3"}
    redone = sum(len(names) - 1 for names in seen.values())
    assert redone == 0  # processed (acked) once each: only unacked messages are redelivered
    assert 1 <= stats["group_redelivered"] <= 8  # m3's window at most
    assert (info["group"], info["queued"]) == ("workers", 0)


async def test_a_group_member_never_holds_more_than_its_window(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path), group_prefetch=4) as server:
        address = server.addresses[0]
        async with connect(address, client_id="slow", group="w2") as c:
            async with c.subscribe("w/>", buffer=100) as sub:
                await publish(address, "w/x", [str(i) for i in range(20)])
                first = await take(sub, 4)
                assert await quiet(sub)  # the window is full until something is acked
                await c.ack(first[0].seq, single=True)
                (fifth,) = await take(sub, 1)
                assert fifth.payload == b"4"


async def test_a_store_failure_closes_only_the_client_it_hit(tmp_path: Path, monkeypatch) -> None:
    from broker.store import Store, StoreError

    async def broken(self, *args, **kwargs):
        raise StoreError("disk on fire")

    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        monkeypatch.setattr(Store, "add_filter", broken)
        async with connect(address, client_id="unlucky", durable=True) as c:
            with pytest.raises(BrokerError) as info:
                async with c.subscribe("f/>"):
                    pass
            assert info.value.code == "INTERNAL" and "disk on fire" in info.value.text
        monkeypatch.undo()
        async with connect(address) as other, other.subscribe("f/>") as sub:
            await publish(address, "f/1", ["still serving"])
            assert (await take(sub, 1))[0].payload == b"still serving"
            assert (await other.stats())["store_errors"] == 1


async def test_a_groups_unacked_messages_survive_a_restart(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address, client_id="w1", group="restart") as c:
            async with c.subscribe("r/>") as sub:
                await publish(address, "r/1", ["a", "b", "c"])
                first = await take(sub, 3)
                await c.ack(first[0].seq, single=True)  # only "a" is done
                await c.ping()
    async with running_broker(data_dir=str(tmp_path)) as server:
        address = server.addresses[0]
        async with connect(address, client_id="w2", group="restart") as c:
            assert c.session_present is True
            async with c.subscribe("r/>") as sub:
                again = await take(sub, 2)
                assert sorted(m.payload for m in again) == [b"b", b"c"]
