"""The Spark sink (format "topiary") against a real broker and a real local SparkSession."""

from __future__ import annotations

import json

import trio

from bridges.tansu import Tansu
from broker.client import connect
from tests.bridgekit import read_all
from tests.conftest import running_broker

SCHEMA = "topic STRING, value BINARY, msg_id STRING, reason STRING, key BINARY, source STRING"


def server_text(server) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"


def rows(count: int, start: int = 0) -> list[tuple]:
    out = []
    for n in range(start, start + count):
        region = ("eu", "us")[n % 2]
        out.append(
            (
                f"beacon/{region}/x/site{n % 3}/home/view",
                json.dumps({"n": n}).encode(),
                f"kafka/t/0/{n}",
                None,
                None,
                f"t/0/{n}",
            )
        )
    return out


def write(spark, data: list[tuple], **options: str) -> None:
    from bridges.spark.sink import TopiarySink

    spark.dataSource.register(TopiarySink)
    df = spark.createDataFrame(data, SCHEMA).repartition(2)
    df.write.format("topiary").options(**options).mode("append").save()


async def take(sub, count: int, timeout: float = 30) -> list:
    got = []
    with trio.fail_after(timeout):
        while len(got) < count:
            got.append(await sub.get())
    return got


async def nothing_more(sub, seconds: float = 0.3) -> bool:
    with trio.move_on_after(seconds):
        await sub.get()
        return False
    return True


async def test_every_row_of_every_partition_is_published_once_with_its_id(spark) -> None:
    async with running_broker() as server:
        async with connect(server_text(server)) as client, client.subscribe("beacon/>") as sub:
            data = rows(500)
            await trio.to_thread.run_sync(lambda: write(spark, data, server=server_text(server)))
            got = await take(sub, 500)
            assert await nothing_more(sub)
    assert sorted(json.loads(m.payload)["n"] for m in got) == list(range(500))
    assert {m.id for m in got} == {f"kafka/t/0/{n}" for n in range(500)}


async def test_a_replayed_batch_is_dropped_by_the_brokers_duplicate_filter(spark) -> None:
    async with running_broker() as server:
        async with connect(server_text(server)) as client, client.subscribe("beacon/>") as sub:
            data = rows(200)
            for _ in range(2):
                await trio.to_thread.run_sync(
                    lambda: write(spark, data, server=server_text(server))
                )
            got = await take(sub, 200)
            assert await nothing_more(sub)
            assert (await client.stats())["duplicates_dropped"] == 200
    assert len({m.id for m in got}) == 200


async def test_with_a_filters_option_the_sink_drops_rows_nobody_wants(spark) -> None:
    filters = json.dumps([["beacon/eu/>", "native"]])
    async with running_broker() as server:
        async with connect(server_text(server)) as client, client.subscribe("beacon/>") as sub:
            data = rows(100)
            await trio.to_thread.run_sync(
                lambda: write(spark, data, server=server_text(server), filters=filters)
            )
            got = await take(sub, 50)
            assert await nothing_more(sub)
    assert all(m.topic.startswith("beacon/eu/") for m in got)
    assert len(got) == 50


async def test_without_a_source_column_a_dead_letter_names_the_record_from_its_id(
    spark, tansu: Tansu, topic_name: str
) -> None:
    from bridges.spark.sink import TopiarySink

    dlq = f"{topic_name}.dlq"
    tansu.create_topic(dlq, 1)
    async with running_broker() as server:
        spark.dataSource.register(TopiarySink)
        frame = spark.createDataFrame(
            [(None, b"{bad", "kafka/t/3/77", "decode", b"k")],
            "topic STRING, value BINARY, msg_id STRING, reason STRING, key BINARY",
        )
        options = {"server": server_text(server), "dead_letter_topic": dlq,
                   "kafka.bootstrap.servers": tansu.bootstrap}  # fmt: skip
        await trio.to_thread.run_sync(
            lambda: frame.write.format("topiary").options(**options).mode("append").save()
        )
    dead = await trio.to_thread.run_sync(lambda: read_all(tansu, dlq, 1))
    assert dict(dead[0].headers())["topiary.source"] == b"t/3/77"


async def test_malformed_rows_go_to_the_dead_letter_topic(
    spark, tansu: Tansu, topic_name: str
) -> None:
    dlq = f"{topic_name}.dlq"
    tansu.create_topic(dlq, 1)
    data = [*rows(3), (None, b"{bad", "kafka/t/0/9", "decode", b"k", "t/0/9")]
    async with running_broker() as server:
        async with connect(server_text(server)) as client, client.subscribe("beacon/>") as sub:
            await trio.to_thread.run_sync(
                lambda: write(
                    spark,
                    data,
                    server=server_text(server),
                    dead_letter_topic=dlq,
                    **{"kafka.bootstrap.servers": tansu.bootstrap},
                )
            )
            await take(sub, 3)
    dead = await trio.to_thread.run_sync(lambda: read_all(tansu, dlq, 1))
    assert [(d.value(), d.key()) for d in dead] == [(b"{bad", b"k")]
    headers = dict(dead[0].headers())
    assert headers["topiary.reason"] == b"decode"
    assert headers["topiary.source"] == b"t/0/9"
