"""The Kafka bridge's operators' port: /metrics counts what was produced, lag reaches 0.

Real parts: the session's Tansu, a topiary broker on loopback, the bridge in this process
with its HTTP port on 127.0.0.1:0, and prometheus_client's own parser for the scrape.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from bridges.cli import with_http
from bridges.config import bridge_config_from_dict
from bridges.kafka import serve_operators
from bridges.lag import NO_OFFSET, LogEnds
from bridges.tansu import Tansu
from broker.client import connect
from broker.config import ConfigError
from tests.bridgekit import (
    beacon,
    bridge_config,
    config_dict,
    json_values,
    produce,
    running_bridge,
)
from tests.conftest import running_broker

N = 600  # beacons; region cycles eu, us, ap, so a third of them are wanted
MALFORMED = 30
PARTITIONS = 3
FILTER = "beacon/eu/>"


async def get(address: tuple[str, int], path: str) -> tuple[int, str]:
    """One GET on a fresh connection; (status, body)."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()
        )
        chunks = []
        with trio.fail_after(5):
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape by (name, sorted labels), parsed by prometheus_client."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def lags(
    scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[int, float]:
    return {
        int(dict(labels)["partition"]): value
        for (metric, labels), value in scrape.items()
        if metric == name
    }


async def test_metrics_count_what_was_produced_and_lag_reaches_zero(
    tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, PARTITIONS)
    tansu.create_topic(f"{topic_name}.dlq", 1)
    records = [beacon(i) for i in range(N)]
    wanted = sum(r["region"] == "eu" for r in records)
    values = [*json_values(records), *(b"{not json %d" % i for i in range(MALFORMED))]
    total = len(values)
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, values))
    true_ends = {p: tansu.log_end(topic_name, p) for p in range(PARTITIONS)}
    assert sum(true_ends.values()) == total

    async with running_broker() as server, connect(_text(server)) as client:
        async with client.subscribe(FILTER) as sub:
            config = bridge_config(tansu, _text(server), topic_name)
            async with running_bridge(config) as bridge, trio.open_nursery() as nursery:
                serve = partial(serve_operators, bridge, "127.0.0.1:0", lag_interval=0.1)
                [address] = await nursery.start(serve)
                assert await get(address, "/healthz") == (200, "ok\n")
                assert (await get(address, "/readyz"))[0] == 200
                assert (await get(address, "/nope"))[0] == 404

                scrape: dict[Any, float] = {}

                def done() -> bool:
                    lag = lags(scrape, "topiary_bridge_consumer_lag")
                    return (
                        scrape.get(("topiary_bridge_dead_lettered_total", ())) == MALFORMED
                        and scrape.get(("topiary_bridge_published_total", ())) == wanted
                        and len(lag) == PARTITIONS
                        and not any(lag.values())
                    )

                with trio.fail_after(30):  # bounded polling on the metric itself
                    while not done():
                        status, body = await get(address, "/metrics")
                        assert status == 200
                        scrape = samples(body)
                        await trio.sleep(0.1)
                got = 0
                with trio.move_on_after(5):
                    while got < wanted:
                        await sub.get()
                        got += 1
                nursery.cancel_scope.cancel()
    assert got == wanted

    def value(name: str) -> float:
        return scrape[(name, ())]

    assert value("topiary_bridge_records_in_total") == total
    assert value("topiary_bridge_malformed_total") == MALFORMED
    assert value("topiary_bridge_dead_lettered_total") == MALFORMED
    assert value("topiary_bridge_unwanted_dropped_total") == N - wanted
    assert value("topiary_bridge_published_total") == wanted
    assert value("topiary_bridge_records_wanted_total") == wanted
    assert value("topiary_bridge_refused_total") == 0
    assert value("topiary_bridge_moved_per_wanted") == 1.0
    assert value("topiary_bridge_read_per_wanted") == pytest.approx(total / wanted)
    assert value("topiary_bridge_in_flight_records") == 0
    assert lags(scrape, "topiary_bridge_log_end_offset") == true_ends
    assert lags(scrape, "topiary_bridge_consumer_position") == true_ends
    labels = {dict(k[1])["topic"] for k in scrape if k[0] == "topiary_bridge_consumer_lag"}
    assert labels == {topic_name}


def test_log_ends_read_past_a_short_watermark(tansu: Tansu, topic_name: str) -> None:
    """One Kafka batch of 40 records: Tansu's watermark says 1, the log ends at 40."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    tansu.create_topic(topic_name, 1)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 50, "log_level": 0})
    for i in range(40):
        producer.produce(topic_name, b"v%d" % i, partition=0)
    assert producer.flush(10) == 0
    probe = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": "w", "log_level": 0})
    try:
        _lo, hi = probe.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=5)
    finally:
        probe.close()
    if hi >= 40:
        pytest.skip(f"the watermark is not short here ({hi}): nothing to read past")
    reader = LogEnds(bridge_config(tansu, "127.0.0.1:1", topic_name))
    try:
        ends = reader.read([0])
        assert (ends[0].low, ends[0].end, ends[0].committed) == (0, 40, NO_OFFSET)
        assert reader.read([0])[0].end == 40  # the watermark did not move: no new probe
    finally:
        reader.close()


def test_http_listen_is_checked_and_the_flag_wins(tansu: Tansu) -> None:
    document = config_dict(tansu.bootstrap, "127.0.0.1:7474", "t", http={"listen": "nowhere"})
    with pytest.raises(ConfigError, match=r"^\[http\] listen must be HOST:PORT, got 'nowhere'$"):
        bridge_config_from_dict(document)
    document["http"] = {"listen": "127.0.0.1:9474"}
    config = bridge_config_from_dict(document)
    assert config.http_listen == "127.0.0.1:9474"
    flag = type("Args", (), {"http": "127.0.0.1:0"})()
    assert with_http(config, flag).http_listen == "127.0.0.1:0"  # type: ignore[arg-type]
    assert bridge_config_from_dict(config_dict(tansu.bootstrap, "h:1", "t")).http_listen is None


def _text(server: Any) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"
