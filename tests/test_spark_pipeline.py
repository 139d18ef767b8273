"""The Spark pipeline end to end: Tansu -> Spark (local[2]) -> broker -> wildcard subscribers.

In-process queries run with ``availableNow``; the crash test runs ``topiary bridge spark``
as its own process, kills it with SIGKILL in the middle of the stream and restarts the
query on the same checkpoint in the test session's SparkSession.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from bridges.config import bridge_config_from_dict
from bridges.spark.pipeline import start_query
from bridges.spark.routes import RouteFeed
from bridges.spark.session import FAST_JVM
from bridges.tansu import Tansu
from broker.client import connect
from tests.bridgekit import (
    beacon,
    beacon_topic,
    config_dict,
    json_values,
    produce,
    read_all,
    write_config,
)
from tests.conftest import running_broker
from tests.reference import ref_matches

FILTERS = [("beacon/eu/>", "native"), ("beacon/+/+/site3/#", "mqtt")]


def server_text(server) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"


def spark_config(tansu: Tansu, server: str, topic: str, tmp_path: Path, **spark: object):
    document = config_dict(tansu.bootstrap, server, topic)
    document["spark"] = {"checkpoint": str(tmp_path / "checkpoint"), "trigger": 0, **spark}
    return document


def run_available_now(spark, config, feed) -> None:
    query = start_query(spark, config, feed, checkpoint=config.spark.checkpoint,
                        available_now=True)  # fmt: skip
    query.awaitTermination(120)
    assert not query.isActive, "the query did not finish"
    assert query.exception() is None, query.exception()


async def collect(sub, count: int, into: list, timeout: float = 60) -> None:
    with trio.fail_after(timeout):
        while len(into) < count:
            into.append(await sub.get())


async def nothing_more(sub, seconds: float = 0.3) -> bool:
    with trio.move_on_after(seconds):
        await sub.get()
        return False
    return True


@pytest.mark.parametrize("mode", ["table", "regex"])
async def test_each_subscriber_gets_exactly_its_events_through_spark(
    spark, tansu: Tansu, topic_name: str, tmp_path: Path, mode: str
) -> None:
    tansu.create_topic(topic_name, 2)
    tansu.create_topic(f"{topic_name}.dlq", 1)
    records = [beacon(i) for i in range(600)]
    values = [*json_values(records), b"{not json", json.dumps({"region": "eu"}).encode()]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, values))
    expected = {
        flt: sorted(r["n"] for r in records if ref_matches(flt, d, beacon_topic(r)))
        for flt, d in FILTERS
    }
    async with (
        running_broker() as server,
        connect(server_text(server)) as client,
        contextlib.AsyncExitStack() as stack,
    ):
        subs = [
            await stack.enter_async_context(client.subscribe(flt, dialect=dialect))
            for flt, dialect in FILTERS
        ]
        document = spark_config(tansu, server_text(server), topic_name, tmp_path, filter=mode)
        config = bridge_config_from_dict(document)
        feed = RouteFeed(config.server, observer_id=f"spark-{mode}").start()
        try:
            assert await trio.to_thread.run_sync(lambda: feed.wait_ready(10))
            await trio.to_thread.run_sync(lambda: run_available_now(spark, config, feed))
        finally:
            await trio.to_thread.run_sync(feed.stop)
        for (flt, _), sub in zip(FILTERS, subs, strict=True):
            got: list = []
            await collect(sub, len(expected[flt]), got)
            assert await nothing_more(sub), f"{flt} got more than it wanted"
            assert sorted(json.loads(m.payload)["n"] for m in got) == expected[flt]
        stats = await client.stats()
    wanted = sum(any(ref_matches(f, d, beacon_topic(r)) for f, d in FILTERS) for r in records)
    assert stats["messages_in"] == wanted  # nothing unwanted was published
    dead = await trio.to_thread.run_sync(lambda: read_all(tansu, f"{topic_name}.dlq", 2))
    reasons = sorted(dict(d.headers())["topiary.reason"] for d in dead)
    assert reasons == [b"decode", b"missing_field"]
    # Each dead letter names the record it came from (the sink takes it from the msg_id).
    originals = await trio.to_thread.run_sync(lambda: read_all(tansu, topic_name, len(values)))
    where = {m.value(): f"{topic_name}/{m.partition()}/{m.offset()}" for m in originals}
    for letter in dead:
        assert dict(letter.headers())["topiary.source"].decode() == where[letter.value()]


def start_bridge(config: Path, log: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "broker.cli", "bridge", "spark", "--config", str(config)]
    with open(log, "ab") as out:
        return subprocess.Popen([*command, *extra], stdout=out, stderr=subprocess.STDOUT)


async def test_a_killed_driver_and_a_stopped_query_deliver_everything_exactly_once(
    spark, tansu: Tansu, topic_name: str, tmp_path: Path
) -> None:
    """kill -9 of `topiary bridge spark` inside its first micro-batch; the query restarted
    on the same checkpoint in this process's session (no second driver start) and stopped
    inside a later batch; restarted again, availableNow, to the end of the topic."""
    events = 3_000
    tansu.create_topic(topic_name, 2)
    await trio.to_thread.run_sync(
        lambda: produce(tansu, topic_name, json_values(beacon(i) for i in range(events)))
    )
    log = tmp_path / "bridge.log"
    async with running_broker(data_dir=str(tmp_path / "data")) as server:
        document = spark_config(
            tansu, server_text(server), topic_name, tmp_path, max_offsets_per_trigger=1000,
            conf={"spark.sql.shuffle.partitions": "1", "spark.driver.extraJavaOptions": FAST_JVM},
            class_cache="",
        )  # fmt: skip
        config_file = write_config(tmp_path / "bridge.toml", document)
        async with connect(server_text(server), client_id="keeper", durable=True) as client:
            async with client.subscribe("beacon/>") as sub:
                ids: list[str] = []

                async def receive(until: int) -> None:
                    while len(set(ids)) < until:
                        message = await sub.get()
                        ids.append(message.id)
                        if len(ids) % 100 == 0:
                            await client.ack(message.seq)

                bridge = start_bridge(config_file, log)
                try:
                    with trio.fail_after(120):
                        await receive(300)  # in the first batch of 1,000
                finally:
                    bridge.send_signal(signal.SIGKILL)
                    bridge.wait(10)
                assert bridge.returncode == -signal.SIGKILL, log.read_text()[-3000:]
                config = bridge_config_from_dict(document)
                feed = RouteFeed(config.server, observer_id="spark-restarted").start()
                try:
                    assert await trio.to_thread.run_sync(lambda: feed.wait_ready(10))
                    query = await trio.to_thread.run_sync(
                        lambda: start_query(spark, config, feed, checkpoint=config.spark.checkpoint)
                    )
                    try:
                        with trio.fail_after(60):
                            await receive(1_300)  # in the second batch: 1,000..1,999
                    finally:
                        await trio.to_thread.run_sync(query.stop)
                    await trio.to_thread.run_sync(lambda: run_available_now(spark, config, feed))
                finally:
                    await trio.to_thread.run_sync(feed.stop)
                with trio.fail_after(30):
                    await receive(events)
                # Everything the restart published is confirmed, so a duplicate would be
                # on its way to us by now.
                with trio.move_on_after(1):
                    while True:
                        ids.append((await sub.get()).id)
        with trio.fail_after(10):
            async with connect(server_text(server)) as observer:
                stats = await observer.stats()
    assert len(ids) == len(set(ids)) == events, "a duplicate reached the durable session"
    # Each restart resumed from the checkpoint: at most the batch in flight came again.
    assert stats["duplicates_dropped"] <= 2 * 1000
