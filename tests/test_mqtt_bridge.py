"""The Kafka bridge's events reach MQTT subscribers (a real Tansu, a real broker, paho).

The bridge learns what is wanted from the broker's routes, and an MQTT subscription is one
of them: records nobody wants are dropped at the source, the rest arrive over MQTT.
"""

from __future__ import annotations

import json

import trio

from bridges.tansu import Tansu
from tests.bridgekit import (
    beacon,
    beacon_topic,
    bridge_config,
    json_values,
    produce,
    running_bridge,
    wait_until,
)
from tests.conftest import running_broker
from tests.mqttkit import Paho
from tests.reference import ref_matches

N = 300
FILTER = "beacon/+/+/+/checkout/#"


async def test_bridged_events_reach_an_mqtt_subscriber_and_the_rest_are_dropped_at_the_source(
    tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 2)
    records = [beacon(i) for i in range(N)]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, json_values(records)))
    wanted = sorted(r["n"] for r in records if ref_matches(FILTER, "mqtt", beacon_topic(r)))
    assert 0 < len(wanted) < N
    async with running_broker(mqtt_listen="127.0.0.1:0") as server:
        subscriber = Paho(server.mqtt_addresses[0][1], "dashboard")
        await trio.to_thread.run_sync(subscriber.connect)
        await trio.to_thread.run_sync(lambda: subscriber.subscribe(FILTER, qos=1))
        host, port = server.addresses[0]
        async with running_bridge(bridge_config(tansu, f"{host}:{port}", topic_name)) as bridge:
            got = []
            for _ in wanted:
                message = await trio.to_thread.run_sync(subscriber.receive)
                got.append(json.loads(message.payload)["n"])
            await wait_until(lambda: bridge.counters.records_in == N)
            stats = bridge.stats()
        await trio.to_thread.run_sync(subscriber.disconnect)
    assert sorted(got) == wanted
    assert stats["published"] == len(wanted)
    assert stats["unwanted_dropped"] == N - len(wanted)
