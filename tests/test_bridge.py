"""The Kafka bridge against a real Kafka-protocol broker (Tansu) and a real topiary broker.

Each test produces records to a fresh topic, runs a bridge in this process, and checks what
wildcard subscribers receive, what the bridge counted, what reached the dead-letter topic
and which offsets were committed.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import msgpack
import trio

from bridges.tansu import Tansu
from broker.client import connect
from broker.config import BrokerConfig
from broker.server import run_broker
from tests.bridgekit import (
    beacon,
    beacon_topic,
    bridge_config,
    committed,
    json_values,
    produce,
    read_all,
    running_bridge,
    wait_until,
)
from tests.conftest import running_broker
from tests.reference import ref_matches

N = 2_000
FILTERS = [
    ("beacon/eu/>", "native"),
    ("beacon/*/*/site3/>", "native"),
    ("beacon/+/+/+/checkout/#", "mqtt"),
    ("beacon/us/ny/site1*/search/purchase", "native"),
]


def server_text(server) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"


async def nothing_more(sub, seconds: float = 0.3) -> bool:
    with trio.move_on_after(seconds):
        await sub.get()
        return False
    return True


async def collect(sub, count: int, into: list, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while len(into) < count:
            into.append(await sub.get())


async def test_each_subscriber_gets_exactly_its_events_and_the_rest_are_dropped_at_the_source(
    tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 3)
    records = [beacon(i) for i in range(N)]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, json_values(records)))
    expected = {
        flt: [r["n"] for r in records if ref_matches(flt, dialect, beacon_topic(r))]
        for flt, dialect in FILTERS
    }
    wanted = sum(any(ref_matches(f, d, beacon_topic(r)) for f, d in FILTERS) for r in records)
    assert 0 < wanted < N
    async with running_broker() as server, connect(server_text(server)) as client:
        async with contextlib.AsyncExitStack() as stack:
            subs = [
                await stack.enter_async_context(client.subscribe(flt, dialect=dialect))
                for flt, dialect in FILTERS
            ]
            got: dict[str, list] = {flt: [] for flt, _ in FILTERS}
            config = bridge_config(tansu, server_text(server), topic_name)
            async with running_bridge(config) as bridge:
                async with trio.open_nursery() as nursery:
                    for (flt, _), sub in zip(FILTERS, subs, strict=True):
                        nursery.start_soon(collect, sub, len(expected[flt]), got[flt])
                await wait_until(lambda: bridge.counters.records_in == N)
                stats = bridge.stats()
            for (flt, _), sub in zip(FILTERS, subs, strict=True):
                assert await nothing_more(sub), f"{flt} got more than it wanted"
                numbers = [json.loads(m.payload)["n"] for m in got[flt]]
                assert sorted(numbers) == expected[flt], flt
        broker_stats = await client.stats()
    assert stats["published"] == wanted
    assert stats["unwanted_dropped"] == N - wanted
    assert stats["malformed"] == 0
    assert broker_stats["messages_in"] == wanted


async def test_events_of_one_partition_arrive_in_kafka_order(tansu: Tansu, topic_name: str) -> None:
    tansu.create_topic(topic_name, 2)
    records = [beacon(i) for i in range(N)]
    keys = [str(i % 2).encode() for i in range(N)]
    await trio.to_thread.run_sync(
        lambda: produce(tansu, topic_name, json_values(records), keys=keys)
    )
    async with running_broker() as server, connect(server_text(server)) as client:
        async with client.subscribe("beacon/>") as sub:
            async with running_bridge(bridge_config(tansu, server_text(server), topic_name)):
                got: list = []
                await collect(sub, N, got)
    by_key: dict[int, list[int]] = {0: [], 1: []}
    for message in got:
        n = json.loads(message.payload)["n"]
        by_key[n % 2].append(n)
    assert by_key[0] == sorted(by_key[0]) and by_key[1] == sorted(by_key[1])
    assert len({m.id for m in got}) == N
    assert all(m.id.startswith(f"kafka/{topic_name}/") for m in got)


async def test_malformed_records_go_to_the_dead_letter_topic_with_their_reason(
    tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 1)
    tansu.create_topic(f"{topic_name}.dlq", 1)
    good = beacon(0)
    bad = {
        b"{not json": "decode",
        b"[1, 2]": "decode",
        json.dumps({**good, "region": None}).encode(): "missing_field",
        json.dumps({**good, "site": {"id": 1}}).encode(): "not_scalar",
        json.dumps({**good, "site": "s" * 300}).encode(): "topic_too_long",
    }
    values = [json.dumps(good).encode(), *bad, None, json.dumps(good).encode()]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, values))
    async with running_broker() as server, connect(server_text(server)) as client:
        async with client.subscribe("beacon/>") as sub:
            async with running_bridge(
                bridge_config(tansu, server_text(server), topic_name)
            ) as bridge:
                got: list = []
                await collect(sub, 2, got)
                await wait_until(lambda: bridge.counters.dead_lettered == len(bad) + 1)
                stats = bridge.stats()
    dead = await trio.to_thread.run_sync(lambda: read_all(tansu, f"{topic_name}.dlq", len(bad) + 1))
    assert len(dead) == len(bad) + 1
    reasons = {}
    for record in dead:
        headers = dict(record.headers())
        reasons[record.value()] = headers["topiary.reason"].decode()
        assert headers["topiary.error"]
        assert headers["topiary.source"].decode().startswith(f"{topic_name}/0/")
    assert reasons == {**bad, None: "decode"}
    assert stats["malformed"] == len(bad) + 1
    assert stats["malformed_by_reason"] == dict(Counter([*bad.values(), "decode"]))
    assert stats["published"] == 2


async def test_msgpack_values_are_decoded_like_json(tansu: Tansu, topic_name: str) -> None:
    tansu.create_topic(topic_name, 1)
    records = [beacon(i) for i in range(30)]
    values = [msgpack.packb(r) for r in records]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, values))
    async with running_broker() as server, connect(server_text(server)) as client:
        async with client.subscribe("beacon/eu/>") as sub:
            config = bridge_config(
                tansu, server_text(server), topic_name, source={"format": "msgpack"}
            )
            async with running_bridge(config):
                got: list = []
                await collect(sub, 10, got)
    assert [msgpack.unpackb(m.payload)["n"] for m in got] == list(range(0, 30, 3))


async def test_values_cannot_inject_levels_or_wildcards(tansu: Tansu, topic_name: str) -> None:
    tansu.create_topic(topic_name, 1)
    sneaky = {**beacon(0), "site": "a/b/>", "section": "*"}
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, [json.dumps(sneaky).encode()]))
    async with running_broker() as server, connect(server_text(server)) as client:
        async with client.subscribe("beacon/*/*/*/*/*") as sub:
            async with running_bridge(bridge_config(tansu, server_text(server), topic_name)):
                with trio.fail_after(15):
                    message = await sub.get()
    assert message.topic == "beacon/eu/de/a%2Fb%2F%3E/%2A/view"


async def test_a_subscription_made_while_running_starts_the_flow(
    tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 1)
    async with running_broker() as server, connect(server_text(server)) as client:
        config = bridge_config(tansu, server_text(server), topic_name)
        async with running_bridge(config) as bridge:
            first = [beacon(i) for i in range(30)]
            await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, json_values(first)))
            await wait_until(lambda: bridge.counters.records_in == 30)
            assert bridge.counters.unwanted_dropped == 30
            async with client.subscribe("beacon/ap/>") as sub:
                await wait_until(lambda: bridge.watcher.wants("beacon/ap/jp/site0/home/view"))
                later = [beacon(i) for i in range(30, 60)]
                await trio.to_thread.run_sync(
                    lambda: produce(tansu, topic_name, json_values(later))
                )
                got: list = []
                await collect(sub, 10, got)
    assert [json.loads(m.payload)["n"] for m in got] == list(range(32, 60, 3))


async def test_offsets_are_committed_once_the_broker_confirmed_and_not_before(
    tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 1)
    group = f"g-{topic_name}"
    offsets = lambda: committed(tansu, group, topic_name, 1)  # noqa: E731
    batch = lambda start: json_values(beacon(i) for i in range(start, start + 10))  # noqa: E731
    async with trio.open_nursery() as nursery:
        first = await nursery.start(run_broker, BrokerConfig(port=0))
        port = first.addresses[0][1]
        address = f"127.0.0.1:{port}"
        config = bridge_config(
            tansu, address, topic_name, kafka={"group.id": group, "auto.commit.interval.ms": 50}
        )
        async with connect(address) as client, client.subscribe("beacon/>"):
            async with running_bridge(config) as bridge:
                await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, batch(0)))
                await wait_until(lambda: bridge.counters.published == 10)
                with trio.fail_after(10):  # Kafka's committed offsets: poll, bounded
                    while await trio.to_thread.run_sync(offsets) != {0: 10}:
                        await trio.sleep(0.05)
                stored = bridge.counters.offsets_stored
                first.shutdown()  # the broker goes: nothing can be confirmed
                await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, batch(10)))
                await wait_until(lambda: bridge.counters.records_in == 20)
                # librdkafka commits on its own timer in its own thread; nothing tells when
                # it ran, so this waits ten auto-commit intervals. The offsets it could
                # commit are the ones the bridge stored: none since the broker went.
                await trio.sleep(0.5)
                assert await trio.to_thread.run_sync(offsets) == {0: 10}
                assert bridge.counters.offsets_stored == stored
                assert bridge.stats()["in_flight"] == 10
                second = await nursery.start(run_broker, BrokerConfig(port=port))
                await wait_until(lambda: bridge.counters.published == 20)
                with trio.fail_after(10):  # Kafka's committed offsets: poll, bounded
                    while await trio.to_thread.run_sync(offsets) != {0: 20}:
                        await trio.sleep(0.05)
                assert (await _stats(address))["messages_in"] == 10
        second.shutdown()


async def _stats(address: str) -> dict:
    async with connect(address) as client:
        return await client.stats()


async def test_a_broker_that_refuses_for_now_slows_the_bridge_and_memory_stays_bounded(
    tansu: Tansu, topic_name: str, tmp_path
) -> None:
    tansu.create_topic(topic_name, 1)
    events = 3_000
    await trio.to_thread.run_sync(
        lambda: produce(tansu, topic_name, json_values(beacon(i) for i in range(events)))
    )
    async with running_broker(
        data_dir=str(tmp_path), session_max_messages=100, overflow="reject-publish"
    ) as server:
        address = server_text(server)
        async with connect(address, client_id="slow", durable=True) as away:
            async with away.subscribe("beacon/>"):
                pass  # the session keeps its filter (and its quota) while we are away
        config = bridge_config(
            tansu, address, topic_name,
            bridge={"batch_max": 100, "in_flight_max": 300, "backoff_max": 0.2},
        )  # fmt: skip
        async with running_bridge(config) as bridge:
            # Barrier instead of a 1 s nap: the bridge has filled its in-flight room (it
            # must stop reading now), then retried every record in flight once more, so a
            # bridge that read on regardless would have had time to read past the bound.
            await wait_until(lambda: bridge.stats()["in_flight"] > 300 - 100)
            retried = bridge.counters.publish_retries
            await wait_until(
                lambda: bridge.counters.publish_retries >= retried + bridge.stats()["in_flight"]
            )
            assert bridge.counters.records_in <= 100 + 300  # stored + in flight, no more
            assert bridge.stats()["in_flight"] <= 300
            numbers: list[int] = []
            async with connect(address, client_id="slow", durable=True) as back:
                async with back.subscribe("beacon/>") as sub:
                    with trio.fail_after(30):
                        while len(numbers) < events:
                            message = await sub.get()
                            numbers.append(json.loads(message.payload)["n"])
                            await back.ack(message.seq)
                    assert await nothing_more(sub)
    # Every event exactly once; retried records may overtake (docs/bridge.md, Guarantees).
    assert sorted(numbers) == list(range(events))


async def test_a_record_the_broker_refuses_for_good_goes_to_the_dead_letter_topic(
    tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 1)
    tansu.create_topic(f"{topic_name}.dlq", 1)
    small = json.dumps(beacon(0)).encode()
    large = json.dumps({**beacon(1), "pad": "x" * 2000}).encode()
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, [small, large, small]))
    async with running_broker(max_payload=1000) as server:
        async with connect(server_text(server)) as client, client.subscribe("beacon/>") as sub:
            config = bridge_config(tansu, server_text(server), topic_name)
            async with running_bridge(config) as bridge:
                got: list = []
                await collect(sub, 2, got)
                await wait_until(lambda: bridge.counters.dead_lettered == 1)
                stats = bridge.stats()
    dead = await trio.to_thread.run_sync(lambda: read_all(tansu, f"{topic_name}.dlq", 1))
    assert [d.value() for d in dead] == [large]
    assert dict(dead[0].headers())["topiary.reason"] == b"broker:PAYLOAD_TOO_LARGE"
    assert dict(dead[0].headers())["topiary.source"] == f"{topic_name}/0/1".encode()
    assert (stats["published"], stats["refused"]) == (2, 1)
