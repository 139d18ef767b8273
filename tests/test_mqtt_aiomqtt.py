"""aiomqtt (asyncio) against topiary's MQTT port: a second Python client family, both versions.

The broker runs in a thread (tests/mqttkit.py); each test drives aiomqtt in its own asyncio
loop, every wait bounded by ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest

from tests.mqttkit import WAIT, Running, broker_in_thread

VERSIONS = {4: aiomqtt.ProtocolVersion.V311, 5: aiomqtt.ProtocolVersion.V5}


@pytest.fixture
def broker() -> Running:
    with broker_in_thread() as running:
        yield running


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_an_asyncio_service_subscribes_with_wildcards_and_gets_its_messages_in_order(
    broker: Running, version: int
) -> None:
    async def main() -> list[tuple[str, bytes, int]]:
        options = {"hostname": "127.0.0.1", "port": broker.mqtt_port}
        protocol = VERSIONS[version]
        async with asyncio.timeout(WAIT):
            async with aiomqtt.Client(**options, identifier="svc", protocol=protocol) as sub:
                await sub.subscribe("orders/+/paid", qos=1)
                async with aiomqtt.Client(**options, identifier="shop", protocol=protocol) as pub:
                    for i, topic in enumerate(["orders/1/paid", "orders/1/new", "orders/2/paid"]):
                        await pub.publish(topic, f"#{i}".encode(), qos=i % 2 + 1)
                got = []
                async for message in sub.messages:
                    got.append((str(message.topic), message.payload, message.qos))
                    if len(got) == 2:
                        return got
        raise AssertionError("unreachable")

    assert asyncio.run(main()) == [("orders/1/paid", b"#0", 1), ("orders/2/paid", b"#2", 1)]


def test_an_asyncio_client_gets_the_retained_state_of_every_matching_topic(
    broker: Running,
) -> None:
    async def main() -> dict[str, bytes]:
        options = {"hostname": "127.0.0.1", "port": broker.mqtt_port}
        async with asyncio.timeout(WAIT):
            async with aiomqtt.Client(**options, identifier="lights") as pub:
                await pub.publish("home/kitchen/light", b"on", qos=1, retain=True)
                await pub.publish("home/hall/light", b"off", qos=1, retain=True)
            async with aiomqtt.Client(**options, identifier="panel") as sub:
                await sub.subscribe("home/+/light", qos=1)
                state = {}
                async for message in sub.messages:
                    assert message.retain
                    state[str(message.topic)] = message.payload
                    if len(state) == 2:
                        return state
        raise AssertionError("unreachable")

    assert asyncio.run(main()) == {"home/kitchen/light": b"on", "home/hall/light": b"off"}
