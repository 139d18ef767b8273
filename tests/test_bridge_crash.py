"""The bridge as its own process: kill -9 mid-stream loses and duplicates nothing; SIGTERM
finishes cleanly.

A producer thread writes beacons while the bridge runs. The bridge is killed with SIGKILL
twice while events flow, and restarted; Kafka hands the uncommitted records to the new
bridge, which publishes them again under the same message ids, and the broker drops the
ones it already had. A durable subscriber must see every event exactly once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import trio

from bridges.tansu import Tansu
from broker.client import connect
from tests.bridgekit import (
    beacon,
    committed,
    config_dict,
    json_values,
    produce,
    write_config,
)
from tests.conftest import running_broker

EVENTS = 12_000
CHUNK = 500
KILLS_AT = (3_000, 7_000)  # events the subscriber has seen when the bridge is killed


def start_bridge(config: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "bridge", "kafka", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def produce_slowly(tansu: Tansu, topic: str, done: threading.Event) -> None:
    """EVENTS beacons in chunks, ~2,000 a second (6 s in all), so that the kills land
    mid-stream even on a loaded machine: a bridge keeps up with this rate, so the
    subscriber's count follows the producer's."""
    try:
        for start in range(0, EVENTS, CHUNK):
            chunk = (beacon(i) for i in range(start, start + CHUNK))
            produce(tansu, topic, json_values(chunk))
            time.sleep(0.25)  # the producing rate is the workload (see the docstring)
    finally:
        done.set()


async def test_killing_the_bridge_mid_stream_loses_and_duplicates_nothing(
    tansu: Tansu, topic_name: str, tmp_path: Path
) -> None:
    tansu.create_topic(topic_name, 3)
    log = tmp_path / "bridge.log"
    async with running_broker(data_dir=str(tmp_path / "data")) as server:
        host, port = server.addresses[0]
        config = write_config(
            tmp_path / "bridge.toml",
            config_dict(tansu.bootstrap, f"{host}:{port}", topic_name),
        )
        async with connect((host, port), client_id="keeper", durable=True) as client:
            async with client.subscribe("beacon/>") as sub:
                ids: list[str] = []
                numbers: set[int] = set()
                bridge = start_bridge(config, log)
                produced = threading.Event()
                producer = threading.Thread(
                    target=produce_slowly, args=(tansu, topic_name, produced), daemon=True
                )
                producer.start()
                kills = list(KILLS_AT)
                try:
                    with trio.fail_after(90):
                        while len(numbers) < EVENTS:
                            message = await sub.get()
                            ids.append(message.id)
                            numbers.add(json.loads(message.payload)["n"])
                            if len(ids) % 100 == 0:
                                await client.ack(message.seq)
                            if kills and len(ids) >= kills[0]:
                                kills.pop(0)
                                bridge.send_signal(signal.SIGKILL)
                                bridge.wait(10)
                                bridge = start_bridge(config, log)
                    # Anything redelivered late would show up now.
                    with trio.move_on_after(1.5):
                        while True:
                            message = await sub.get()
                            ids.append(message.id)
                finally:
                    bridge.send_signal(signal.SIGKILL)
                    bridge.wait(10)
                    producer.join(30)
        with trio.fail_after(10):  # on its own connection: ours may be full of messages
            async with connect((host, port)) as observer:
                stats = await observer.stats()
    assert not kills, "the bridge was not killed as planned"
    assert numbers == set(range(EVENTS))
    assert len(ids) == len(set(ids)) == EVENTS, "a duplicate reached the durable session"
    assert stats["duplicates_dropped"] > 0, "the restarts replayed nothing: the test proved little"


async def test_sigterm_finishes_the_batch_commits_and_exits_zero(
    tansu: Tansu, topic_name: str, tmp_path: Path
) -> None:
    tansu.create_topic(topic_name, 2)
    await trio.to_thread.run_sync(
        lambda: produce(tansu, topic_name, json_values(beacon(i) for i in range(3_000)))
    )
    group = f"g-{topic_name}"
    log = tmp_path / "bridge.log"
    async with running_broker() as server:
        host, port = server.addresses[0]
        document = config_dict(tansu.bootstrap, f"{host}:{port}", topic_name, group=group)
        config = write_config(tmp_path / "bridge.toml", document)
        async with connect((host, port)) as client, client.subscribe("beacon/>") as sub:
            bridge = start_bridge(config, log)
            try:
                with trio.fail_after(30):
                    for _ in range(3_000):
                        await sub.get()
                bridge.send_signal(signal.SIGTERM)
                code = await trio.to_thread.run_sync(lambda: bridge.wait(15))
            finally:
                if bridge.poll() is None:
                    bridge.kill()
                    bridge.wait()
    assert code == 0, log.read_text()[-2000:]
    offsets = await trio.to_thread.run_sync(lambda: committed(tansu, group, topic_name, 2))
    assert sum(offsets.values()) == 3_000
    assert "bridge stopped" in log.read_text()
