"""What the Kafka bridge tests share: beacon records, Kafka reads and writes, a running bridge.

Kafka clients block, so the async tests call these helpers through ``trio.to_thread``.
Reads use manual ``assign()`` (instant on Tansu); only the bridge itself joins a group.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import trio

from bridges.config import BridgeConfig, bridge_config_from_dict
from bridges.kafka import Bridge
from bridges.tansu import Tansu

TEMPLATE = "beacon/{region}/{country}/{site}/{section}/{event}"
REGIONS = {"eu": ("de", "fr"), "us": ("ca", "ny"), "ap": ("jp",)}
SECTIONS = ("home", "checkout", "search")
EVENTS = ("view", "click", "purchase")
#: Group settings that make the first assignment on Tansu take ~1 s instead of ~3 s.
FAST_GROUP = {"session.timeout.ms": 1500, "heartbeat.interval.ms": 300}
QUIET = {"log_level": 0}


def beacon(i: int) -> dict[str, Any]:
    """The i-th synthetic beacon event: every field cycles, so each filter has a known share."""
    region = list(REGIONS)[i % 3]
    countries = REGIONS[region]
    return {
        "region": region,
        "country": countries[(i // 3) % len(countries)],
        "site": f"site{i % 7}",
        "section": SECTIONS[(i // 7) % 3],
        "event": EVENTS[(i // 21) % 3],
        "n": i,
    }


def beacon_topic(record: dict[str, Any]) -> str:
    return "beacon/{region}/{country}/{site}/{section}/{event}".format(**record)


def produce(
    tansu: Tansu,
    topic: str,
    values: Iterable[bytes | None],
    *,
    bootstrap: str | None = None,
    keys: Iterable[bytes | None] | None = None,
    partition: int | None = None,
) -> int:
    """Produce every value (in order per key) and wait until Kafka has them all."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap or tansu.bootstrap, "linger.ms": 5, **QUIET}
    )
    failures: list[Any] = []
    count = 0
    key_iter = iter(keys) if keys is not None else None
    for value in values:
        key = next(key_iter) if key_iter is not None else str(count).encode()
        extra = {"partition": partition} if partition is not None else {}
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    on_delivery=lambda e, _m: failures.append(e) if e else None,
                    **extra,
                )
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0, "records still unsent after 30 s"
    assert not failures, failures[:3]
    return count


def json_values(records: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    for record in records:
        yield json.dumps(record).encode()


def read_all(tansu: Tansu, topic: str, expected: int, *, timeout: float = 15) -> list[Any]:
    """Every record of ``topic`` (all partitions, from the start) once ``expected`` arrived."""
    from confluent_kafka import Consumer, TopicPartition

    settings = {"bootstrap.servers": tansu.bootstrap, "group.id": "reader", **QUIET}
    consumer = Consumer({**settings, "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = list(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(records) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.1):
                if message.error() is None:
                    records.append(message)
        return records
    finally:
        consumer.close()


def committed(tansu: Tansu, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (-1001: none yet)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": group, **QUIET})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


def config_dict(
    bootstrap: str, server: str, topic: str, *, group: str | None = None, **sections: Any
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "kafka": {
            "bootstrap.servers": bootstrap,
            "group.id": group or f"bridge-{topic}",
            **FAST_GROUP,
        },
        "source": {"topic": topic, "dead_letter_topic": f"{topic}.dlq"},
        "mapping": {"template": TEMPLATE},
        # no reports unless a test asks: they would count in the broker's messages_in
        "broker": {"server": server, "report_interval": 0},
        "bridge": {"stats_interval": 0, "batch_max": 500, "shutdown_timeout": 5},
    }
    for name, values in sections.items():
        document.setdefault(name, {}).update(values)
    return document


def bridge_config(tansu: Tansu, server: str, topic: str, **sections: Any) -> BridgeConfig:
    return bridge_config_from_dict(config_dict(tansu.bootstrap, server, topic, **sections))


def write_config(path: Path, document: dict[str, Any]) -> Path:
    """The config as a TOML file, for a bridge in its own process."""
    lines = []
    for table, body in document.items():
        lines.append(f"[{table}]")
        for key, value in body.items():
            lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):  # an inline table
        pairs = (f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(pairs) + " }"
    return json.dumps(value)


@contextlib.asynccontextmanager
async def running_bridge(config: BridgeConfig) -> AsyncIterator[Bridge]:
    """A bridge in this process, consuming once it yields; stopped cleanly at the end."""
    bridge = Bridge(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        with trio.fail_after(20):
            await bridge.started.wait()
        try:
            yield bridge
        finally:
            bridge.stop()


async def wait_until(predicate: Any, timeout: float = 15, what: str = "condition") -> None:
    with trio.fail_after(timeout):
        while not predicate():  # bridge counters have no events: poll, bounded
            await trio.sleep(0.02)
