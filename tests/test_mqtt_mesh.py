"""MQTT in a mesh of brokers: MQTT subscriptions propagate to peers like native ones.

Two brokers in threads, b dialling a. An MQTT client's subscription on b becomes one of
b's routes, so a publish on a crosses the link to it; an MQTT publish on b reaches a
native subscriber on a.
"""

from __future__ import annotations

import trio

from broker.client import connect as native_connect
from tests.mqttkit import WAIT, Paho, broker_in_thread


async def knows(address: tuple[str, int], origin: str, flt: str) -> None:
    """Wait (bounded) until the broker at ``address`` routes ``flt`` towards ``origin``."""
    async with native_connect(address) as client:
        with trio.fail_after(WAIT):
            while True:
                origins = (await client.routes())["origins"]
                entry = origins.get(origin, {})
                if entry.get("reachable") and [flt, "mqtt"] in entry.get("filters", []):
                    return
                await trio.sleep(0.02)  # a bounded poll: routes flood from another broker


def test_an_mqtt_subscription_on_one_broker_draws_messages_from_its_peer() -> None:
    with broker_in_thread(server_id="a") as a:
        host, port = a.native
        with broker_in_thread(server_id="b", peers=(f"{host}:{port}",)) as b:
            far = Paho(b.mqtt_port, "far")
            far.connect()
            far.subscribe("site/+/temp", qos=1)

            async def publish_on_a() -> None:
                await knows(a.native, "b", "site/+/temp")  # b's MQTT route is at a
                async with native_connect(a.native) as client:
                    await client.publish("site/1/humidity", b"60", confirm=True)
                    await client.publish("site/1/temp", b"21", confirm=True)

            trio.run(publish_on_a)
            message = far.receive()
            assert (message.topic, message.payload) == ("site/1/temp", b"21")
            far.disconnect()


def test_an_mqtt_publish_on_one_broker_reaches_a_native_subscriber_on_its_peer() -> None:
    with broker_in_thread(server_id="a") as a:
        host, port = a.native
        with broker_in_thread(server_id="b", peers=(f"{host}:{port}",)) as b:
            got: list[tuple[str, bytes]] = []

            async def subscribe_on_a() -> None:
                async with native_connect(a.native) as client:
                    async with client.subscribe("site/+/temp", "mqtt") as sub:
                        await knows(b.native, "a", "site/+/temp")  # a's route is at b
                        publisher = Paho(b.mqtt_port, "near")
                        await trio.to_thread.run_sync(publisher.connect)
                        await trio.to_thread.run_sync(publisher.publish, "site/2/temp", b"19", 1)
                        message = await sub.get()
                        got.append((message.topic, message.payload))
                        await trio.to_thread.run_sync(publisher.disconnect)

            trio.run(subscribe_on_a)
            assert got == [("site/2/temp", b"19")]
