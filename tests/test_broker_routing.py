"""The live path over real sockets: connect, subscribe with wildcards, publish, receive."""

from __future__ import annotations

from pathlib import Path

import trio

import routing
from broker.client import BrokerError, connect
from broker.core.router import Broker
from broker.core.session import Session
from broker.server import Server
from broker.wire.codec import append_msg, decode_frame
from tests.conftest import running_broker
from tests.streams import quiet, take

Address = tuple[str, int]


async def test_native_wildcards_route_end_to_end(address: Address) -> None:
    async with (
        connect(address) as sub_client,
        connect(address) as publisher,
        sub_client.subscribe("beacon/*/de/site4*/>") as sub,
    ):
        for topic in [
            "beacon/eu/de/site42/checkout/purchase",  # yes
            "beacon/eu/fr/site42/checkout/purchase",  # other country
            "beacon/na/de/site4/home/view",  # yes: site4* matches site4
            "beacon/eu/de/site5/home/view",  # other site
            "beacon/eu/de/site42",  # '>' needs one more level
        ]:
            await publisher.publish(topic, topic, confirm=True)
        got = await take(sub, 2)
        assert [m.topic for m in got] == [
            "beacon/eu/de/site42/checkout/purchase",
            "beacon/na/de/site4/home/view",
        ]
        assert await quiet(sub)


async def test_mqtt_wildcards_route_end_to_end(address: Address) -> None:
    async with (
        connect(address) as sub_client,
        connect(address) as publisher,
        sub_client.subscribe("beacon/+/de/#", dialect="mqtt") as sub,
    ):
        for topic in ["beacon/eu/de", "beacon/eu/de/x/y", "beacon/eu/fr/x", "beacon/de"]:
            await publisher.publish(topic, b"", confirm=True)
        got = await take(sub, 2)
        assert [m.topic for m in got] == ["beacon/eu/de", "beacon/eu/de/x/y"]
        assert await quiet(sub)


async def test_payload_headers_and_ids_arrive_intact(address: Address) -> None:
    async with connect(address) as c, c.subscribe("a/>") as sub:
        await c.publish("a/b", b"\x00\xffbytes", headers={"k": "v"}, msg_id="m-1", confirm=True)
        (message,) = await take(sub, 1)
        assert message.payload == b"\x00\xffbytes"
        assert (message.headers, message.id) == ({"k": "v"}, "m-1")
        assert message.seq == 1


async def test_overlapping_subscriptions_get_one_message_each(address: Address) -> None:
    async with connect(address) as c, c.subscribe("a/>") as wide, c.subscribe("a/b") as narrow:
        await c.publish("a/b", b"x", confirm=True)
        (w,) = await take(wide, 1)
        (n,) = await take(narrow, 1)
        assert w.seq == n.seq == 1  # one MSG from the broker, routed to both locally
        stats = await c.stats()
        assert stats["messages_out"] == 1


async def test_unsubscribe_stops_delivery(address: Address) -> None:
    async with connect(address) as c, connect(address) as publisher:
        async with c.subscribe("a/*") as sub:
            await publisher.publish("a/1", b"", confirm=True)
            await take(sub, 1)
        async with c.subscribe("zzz") as other:
            await publisher.publish("a/2", b"", confirm=True)
            await publisher.publish("zzz", b"", confirm=True)
            (only,) = await take(other, 1)
            assert only.topic == "zzz"
        stats = await c.stats()
        assert stats["subscriptions"] == 0
        assert stats["messages_unrouted"] >= 1


async def test_per_publisher_order_is_kept_per_topic(address: Address) -> None:
    n = 300
    async with connect(address) as c, c.subscribe("order/>") as sub:
        async with connect(address) as p1, connect(address) as p2:

            async def publish(p, name):
                for i in range(n):
                    await p.publish(f"order/{name}", str(i).encode())
                await p.ping()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish, p1, "one")
                nursery.start_soon(publish, p2, "two")
        got = await take(sub, 2 * n)
        for name in ("one", "two"):
            seen = [int(m.payload) for m in got if m.topic == f"order/{name}"]
            assert seen == list(range(n))
        assert [m.seq for m in got] == list(range(1, 2 * n + 1))


async def test_many_clients_concurrently(address: Address) -> None:
    subscribers, publishers, per_publisher = 20, 10, 30
    received: dict[int, list[str]] = {i: [] for i in range(subscribers)}
    ready = trio.Semaphore(0)

    async def subscriber(i: int) -> None:
        flt = "load/>" if i % 2 == 0 else "load/+/even/#"
        dialect = "native" if i % 2 == 0 else "mqtt"
        expected = publishers * per_publisher if i % 2 == 0 else publishers * per_publisher // 2
        async with connect(address) as c, c.subscribe(flt, dialect) as sub:
            ready.release()
            for message in await take(sub, expected, seconds=20):
                received[i].append(message.topic)
            assert await quiet(sub)

    async def publisher(j: int) -> None:
        async with connect(address) as p:
            for k in range(per_publisher):
                kind = "even" if k % 2 == 0 else "odd"
                await p.publish(f"load/p{j}/{kind}/{k}", b"x", confirm=(k % 5 == 0))
            await p.ping()

    async with trio.open_nursery() as nursery:
        for i in range(subscribers):
            nursery.start_soon(subscriber, i)
        for _ in range(subscribers):
            await ready.acquire()
        async with trio.open_nursery() as pubs:
            for j in range(publishers):
                pubs.start_soon(publisher, j)
    assert all(len(set(topics)) == len(topics) for topics in received.values())


async def test_publish_with_confirm_returns_after_routing(address: Address) -> None:
    async with connect(address) as c, c.subscribe("x") as sub:
        await c.publish("x", b"1", confirm=True)
        stats = await c.stats()
        assert stats["messages_in"] == 1 and stats["messages_out"] == 1
        await take(sub, 1)


async def test_invalid_filter_is_refused_locally_and_by_the_broker(address: Address) -> None:
    async with connect(address) as c:
        try:
            async with c.subscribe("a/>/b"):
                raise AssertionError("subscribed to an invalid filter")
        except ValueError as exc:
            assert "'>' must be the last level" in str(exc)
        # the broker's own check, reached with a raw request
        from broker.wire.frames import Sub

        reply = None
        try:
            await c._request(lambda rid: Sub(id=rid, filter="a/b", dialect="mqtt"))
            reply = "ok"
        except BrokerError as exc:  # pragma: no cover - a valid filter is accepted
            reply = exc.code
        assert reply == "ok"


async def test_stats_count_connections_and_messages(server: Server) -> None:
    address = server.addresses[0]
    async with connect(address) as c, c.subscribe("s/>") as sub:
        await c.publish("s/1", b"abc", confirm=True)
        await c.publish("t/1", b"abc", confirm=True)
        await take(sub, 1)
        stats = await c.stats()
    assert stats["connections"] == 1
    assert stats["messages_in"] == 2
    assert stats["messages_out"] == 1
    assert stats["messages_unrouted"] == 1
    assert stats["subscriptions"] == 1
    assert stats["errors"] == {}


async def test_shutdown_under_load_loses_nothing_acknowledged() -> None:
    acknowledged: list[int] = []
    received: list[int] = []
    enough = trio.Event()  # 500 publishes confirmed
    async with running_broker(shutdown_timeout=5.0) as server:
        address = server.addresses[0]
        async with connect(address) as sub_client, sub_client.subscribe("load/>") as sub:

            async def publish_until_refused() -> None:
                try:
                    async with connect(address) as p:
                        for i in range(100_000):
                            await p.publish(f"load/{i % 7}", str(i).encode(), confirm=True)
                            acknowledged.append(i)
                            if len(acknowledged) >= 500:
                                enough.set()
                except Exception:
                    return  # the broker went away: what was acked is in `acknowledged`

            async def collect() -> None:
                try:
                    async for message in sub:
                        received.append(int(message.payload))
                except Exception:
                    return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                for _ in range(3):
                    nursery.start_soon(publish_until_refused)
                with trio.fail_after(10):
                    await enough.wait()
                server.shutdown()
    assert len(acknowledged) >= 500
    assert set(acknowledged) <= set(received)


async def test_a_repeated_msg_id_is_dropped_and_still_confirmed(address: Address) -> None:
    async with connect(address) as c, c.subscribe("dup/>") as sub:
        await c.publish("dup/a", b"first", msg_id="order-17", confirm=True)
        await c.publish("dup/a", b"retry", msg_id="order-17", confirm=True)
        await c.publish("dup/a", b"other", msg_id="order-18", confirm=True)
        got = await take(sub, 2)
        assert [m.payload for m in got] == [b"first", b"other"]
        assert await quiet(sub)
        assert (await c.stats())["duplicates_dropped"] == 1


async def test_a_broker_restarted_on_its_store_still_drops_a_stored_msg_id(tmp_path: Path) -> None:
    """The duplicate window starts from the ids the store kept: a publisher resending after
    a restart (or a failover to the promoted standby) reaches no transient subscriber twice."""
    data_dir = str(tmp_path / "data")
    async with running_broker(data_dir=data_dir) as first:
        async with (
            connect(first.addresses[0], client_id="keeper", durable=True) as keeper,
            keeper.subscribe("dup/>"),  # a durable session: the message is stored
            connect(first.addresses[0]) as c,
        ):
            await c.publish("dup/a", b"first", msg_id="order-17", confirm=True)
    async with running_broker(data_dir=data_dir) as second:
        async with (
            connect(second.addresses[0]) as watcher,
            watcher.subscribe("dup/>") as sub,
            connect(second.addresses[0]) as c,
        ):
            await c.publish("dup/a", b"resent", msg_id="order-17", confirm=True)
            await c.publish("dup/a", b"next", msg_id="order-18", confirm=True)
            got = await take(sub, 1)
            assert [m.payload for m in got] == [b"next"]
            assert (await c.stats())["duplicates_dropped"] == 1


def test_recent_ids_forget_the_oldest_beyond_the_window() -> None:
    from broker.core import RecentIds

    ids = RecentIds(window=3)
    assert [ids.seen(x) for x in "abca"] == [False, False, False, True]
    assert ids.seen("d") is False  # "a" is forgotten now
    assert ids.seen("a") is False
    assert len(ids) == 3


def _sent(session: Session) -> list[tuple[str, int]]:
    """(topic, sub) of each MSG queued for ``session``, taken off its queue."""
    data, _ = session.take_batch(append_msg)
    sent = []
    while data:
        size = int.from_bytes(data[:4], "big")
        frame = decode_frame(data[4 : 4 + size])
        sent.append((frame.topic, frame.sub))
        data = data[4 + size :]
    return sent


async def test_delivery_plans_follow_every_subscription_change() -> None:
    """The router keeps how it delivers each match answer (``Broker._plans``); a change of
    subscriptions that leaves the answer equal (a second id for the same filter, the first
    id dropped) still changes the MSG's sub, and a closed session gets nothing more."""
    broker = Broker()
    one, two = broker.open_session("one"), broker.open_session("two")
    first = broker.subscribe(one, routing.parse_filter("a/>"))
    broker.subscribe(two, routing.parse_filter("a/*"))
    broker.publish("a/b", b"1")
    assert _sent(one) == [("a/b", first)]
    second = broker.subscribe(one, routing.parse_filter("a/>"))  # same entry, second id
    broker.publish("a/b", b"2")
    assert _sent(one) == [("a/b", first)]
    assert broker.unsubscribe(one, first)  # the entry stays, named by its second id now
    broker.publish("a/b", b"3")
    assert _sent(one) == [("a/b", second)]
    assert broker.unsubscribe_many(one, [second]) == [True]
    broker.publish("a/b", b"4")
    assert _sent(one) == []
    assert _sent(two) == [("a/b", 1)] * 4
    broker.subscribe_many(one, [routing.parse_filter("a/b")])
    broker.publish("a/b", b"5")
    assert len(_sent(one)) == len(_sent(two)) == 1
    broker.close_session(two)
    broker.publish("a/b", b"6")
    assert _sent(two) == [] and len(_sent(one)) == 1
