"""Kafka unavailable at start, or going away mid-stream: the bridge waits, retries, and
resumes without loss or duplicates when Kafka is back.

Kafka clients connect to the address the broker advertises, so each test runs its own
Tansu advertising a ``FaultProxy`` in front of it; cutting the proxy makes Kafka vanish
for every client at once (connections reset, new ones refused).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import trio

from bridges.kafka import Bridge
from bridges.tansu import Tansu, TansuUnavailable, free_port, start_tansu
from broker.client import BrokerError, connect
from tests.bridgekit import beacon, bridge_config, json_values, produce, running_bridge, wait_until
from tests.conftest import running_broker
from tests.faultproxy import FaultProxy


@pytest.fixture
def proxied() -> Iterator[tuple[Tansu, FaultProxy]]:
    """A Tansu of this test's own, reachable only through a proxy the test can cut."""
    port = free_port()
    try:
        tansu = start_tansu(advertised_port=port)
    except TansuUnavailable as exc:
        pytest.skip(f"Tansu not available: {exc}")
    proxy = FaultProxy(("127.0.0.1", tansu.port), listen_port=port)
    proxy.start()
    try:
        yield tansu, proxy
    finally:
        proxy.close()
        tansu.stop()


def via_proxy(tansu: Tansu, proxy: FaultProxy, server: str, topic: str):
    config = bridge_config(
        tansu,
        server,
        topic,
        kafka={
            "bootstrap.servers": f"127.0.0.1:{proxy.port}",
            "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 500,
        },
        bridge={"backoff_max": 0.5},
    )
    return config


def produce_via(tansu: Tansu, proxy: FaultProxy, topic: str, numbers: range) -> None:
    values = json_values(beacon(i) for i in numbers)
    produce(tansu, topic, values, bootstrap=f"127.0.0.1:{proxy.port}")


async def receive_numbers(sub, count: int, timeout: float = 30) -> list[int]:
    got = []
    with trio.fail_after(timeout):
        while len(got) < count:
            got.append(json.loads((await sub.get()).payload)["n"])
    return got


async def test_kafka_unavailable_at_start_is_waited_for_without_loss(
    proxied: tuple[Tansu, FaultProxy], topic_name: str
) -> None:
    tansu, proxy = proxied
    tansu.create_topic(topic_name, 2)
    await trio.to_thread.run_sync(lambda: produce_via(tansu, proxy, topic_name, range(300)))
    proxy.cut()
    async with running_broker() as server:
        host, port = server.addresses[0]
        async with connect((host, port)) as client, client.subscribe("beacon/>") as sub:
            config = via_proxy(tansu, proxy, f"{host}:{port}", topic_name)
            async with running_bridge(config) as bridge:
                await wait_until(lambda: bridge.counters.kafka_errors > 0, what="an error")
                await trio.sleep(1.0)  # an outage that lasts: its length is the behaviour
                assert bridge.counters.records_in == 0
                proxy.restore()
                got = await receive_numbers(sub, 300)
                with trio.move_on_after(0.5):
                    got.append(await sub.get())  # one more would be a duplicate
    assert sorted(got) == list(range(300))


async def test_kafka_going_away_mid_stream_resumes_without_loss(
    proxied: tuple[Tansu, FaultProxy], topic_name: str
) -> None:
    tansu, proxy = proxied
    tansu.create_topic(topic_name, 2)
    async with running_broker() as server:
        host, port = server.addresses[0]
        async with connect((host, port)) as client, client.subscribe("beacon/>") as sub:
            config = via_proxy(tansu, proxy, f"{host}:{port}", topic_name)
            async with running_bridge(config) as bridge:
                await trio.to_thread.run_sync(
                    lambda: produce_via(tansu, proxy, topic_name, range(300))
                )
                got = await receive_numbers(sub, 300)
                errors_before = bridge.counters.kafka_errors
                proxy.cut()
                await wait_until(lambda: bridge.counters.kafka_errors > errors_before)
                await trio.sleep(1.0)  # an outage that lasts: its length is the behaviour
                proxy.restore()
                await trio.to_thread.run_sync(
                    lambda: produce_via(tansu, proxy, topic_name, range(300, 600))
                )
                got += await receive_numbers(sub, 300)
                with trio.move_on_after(0.5):
                    got.append(await sub.get())  # one more would be a duplicate
    assert sorted(got) == list(range(600))


async def test_a_broker_that_comes_back_refusing_the_token_ends_the_bridge(
    tansu: Tansu, topic_name: str
) -> None:
    """The bridge's client gives up on a refusal for good after a reconnect, and the bridge
    ends with it instead of retrying forever."""
    tansu.create_topic(topic_name, 1)
    port = free_port()
    config = bridge_config(
        tansu, f"127.0.0.1:{port}", topic_name, broker={"token": "old"}, bridge={"backoff_max": 0.2}
    )
    bridge = Bridge(config)
    with pytest.raises(BaseExceptionGroup) as ended:
        async with trio.open_nursery() as nursery:
            async with running_broker(port=port, auth_token="old") as first:
                token = {"token": "old"}
                async with connect(first.addresses[0], credentials=token) as client:
                    async with client.subscribe("beacon/>") as sub:
                        await nursery.start(bridge.run)
                        await trio.to_thread.run_sync(
                            lambda: produce(tansu, topic_name, json_values([beacon(0)]))
                        )
                        with trio.fail_after(30):
                            await sub.get()  # the bridge publishes to this broker
            async with running_broker(port=port, auth_token="new") as second:
                token = {"token": "new"}
                async with connect(second.addresses[0], credentials=token) as client:
                    async with client.subscribe("beacon/>"):  # so the bridge publishes again
                        await trio.to_thread.run_sync(
                            lambda: produce(tansu, topic_name, json_values([beacon(1)]))
                        )
                        with trio.fail_after(30):
                            await trio.sleep_forever()  # until the bridge ends the nursery
    refusals = ended.value.subgroup(BrokerError)
    assert refusals is not None, ended.value
    assert {leaf.code for leaf in _leaves(refusals)} == {"AUTH_FAILED"}


def _leaves(group: BaseExceptionGroup) -> list:  # type: ignore[type-arg]
    """The exceptions inside (nested) exception groups."""
    found = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found
