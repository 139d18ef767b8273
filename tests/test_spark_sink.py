"""The Spark sink (format "topiary") against a real broker and a real local SparkSession."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import trio

from bridges.tansu import Tansu
from broker.client import connect
from broker.config import BrokerConfig
from broker.server import run_broker
from tests import streams
from tests.bridgekit import read_all
from tests.conftest import running_broker
from tests.faultproxy import FaultProxy
from tests.streams import quiet

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


# A Spark job takes seconds to start: wait longer than tests.streams does by default.
take = partial(streams.take, seconds=30.0)


async def test_every_row_of_every_partition_is_published_once_with_its_id(spark) -> None:
    async with running_broker() as server:
        async with connect(server_text(server)) as client, client.subscribe("beacon/>") as sub:
            data = rows(500)
            await trio.to_thread.run_sync(lambda: write(spark, data, server=server_text(server)))
            got = await take(sub, 500)
            assert await quiet(sub)
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
            assert await quiet(sub)
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
            assert await quiet(sub)
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


async def test_a_write_waits_out_a_broker_that_is_down_and_publishes_every_row_once_back(
    spark, tmp_path: Path
) -> None:
    """A streaming job outlives a broker restart: tasks that find no broker retry with
    backoff instead of failing the batch (a failed task fails the query on local[N])."""
    data_dir = str(tmp_path / "data")
    async with trio.open_nursery() as nursery:
        first = await nursery.start(run_broker, BrokerConfig(port=0, data_dir=data_dir))
        port = first.addresses[0][1]
        address = f"127.0.0.1:{port}"
        async with (
            connect(address, client_id="keeper", durable=True, reconnect=True,
                    backoff=(0.05, 0.2)) as client,
            client.subscribe("beacon/>") as sub,
        ):  # fmt: skip
            # Warm Python workers, so the write below reaches the broker within ~0.1 s of
            # its tasks starting: they look for it while it is down.
            warm = rows(10, start=1000)
            await trio.to_thread.run_sync(lambda: write(spark, warm, server=address))
            await client.ack((await take(sub, 10))[-1].seq)  # not to come again after the restart
            first.shutdown()
            with trio.fail_after(5):
                while client._connected.is_set():  # no "disconnected" event: poll
                    await trio.sleep(0.01)
            written = trio.Event()

            async def write_while_down() -> None:
                data = rows(300)
                await trio.to_thread.run_sync(
                    lambda: write(spark, data, server=address, backoff_max="0.3")
                )
                written.set()

            nursery.start_soon(write_while_down)
            tracker = spark.sparkContext.statusTracker()
            with trio.fail_after(30):  # the sink's tasks are running, finding no broker
                while not tracker.getActiveStageIds():  # Spark's tracker: poll
                    await trio.sleep(0.05)
            await trio.sleep(1.0)  # the broker stays away a while: its length is the behaviour
            assert not written.is_set(), "the write finished without a broker"
            second = await nursery.start(run_broker, BrokerConfig(port=port, data_dir=data_dir))
            got = await take(sub, 300)
            with trio.fail_after(30):
                await written.wait()
            assert await quiet(sub)
        second.shutdown()
    assert sorted(json.loads(m.payload)["n"] for m in got) == list(range(300))
    assert len({m.id for m in got}) == 300


async def test_a_write_cut_off_from_the_broker_midway_resends_and_nothing_arrives_twice(
    spark,
) -> None:
    """The sink's client reconnects and sends its unconfirmed PUBs again; the broker's
    duplicate filter drops those it had routed before the cut."""
    total = 40_000
    # The subscriber shares this process with the test; room for all of it, so the broker
    # never drops for it as a slow consumer.
    async with running_broker(outbound_messages=total) as server:
        with FaultProxy(server.addresses[0]) as proxy:
            async with connect(server_text(server)) as client, client.subscribe("beacon/>") as sub:
                written = trio.Event()

                async def write_through_proxy() -> None:
                    data = rows(total)
                    address = f"127.0.0.1:{proxy.port}"
                    await trio.to_thread.run_sync(
                        lambda: write(spark, data, server=address, backoff_max="0.3")
                    )
                    written.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(write_through_proxy)
                    got = await take(sub, 2_000, seconds=60)
                    assert not written.is_set(), "the write was done before the cut"
                    proxy.cut()
                    await trio.sleep(0.5)  # a cut that lasts: its length is the behaviour
                    proxy.restore()
                    got += await take(sub, total - len(got), seconds=60)
                    with trio.fail_after(30):
                        await written.wait()
                assert await quiet(sub)
                stats = await client.stats()
        assert proxy.connections > 2, "the sink's tasks did not reconnect"
    assert sorted(json.loads(m.payload)["n"] for m in got) == list(range(total))
    assert stats["messages_in"] == total and stats["dropped"] == 0


# -- finding the broker (sink._connect, no Spark) ----------------------------------------


async def test_a_task_connects_after_a_broker_that_hung_up_mid_handshake_then_was_not_there() -> (
    None
):
    from contextlib import AsyncExitStack

    from bridges.spark.sink import _connect

    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    hung_up = 0
    servers: list = []

    async def hang_up_twice_then_start_the_broker(nursery: trio.Nursery) -> None:
        nonlocal hung_up
        with listener:
            while hung_up < 2:
                connection, _ = await listener.accept()
                connection.close()  # the handshake ends: ConnectionLost
                hung_up += 1
        await trio.sleep(0.3)  # nothing listens for a while (wall-clock): refused, OSError
        servers.append(await nursery.start(run_broker, BrokerConfig(port=port)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hang_up_twice_then_start_the_broker, nursery)
        with trio.fail_after(10):  # outside the stack: it holds the client's own nursery
            async with AsyncExitStack() as stack:
                client = await _connect(stack, {"server": f"127.0.0.1:{port}"}, 0.2)
                await client.ping()
        servers[0].shutdown()
    assert hung_up == 2


async def test_a_task_the_broker_refuses_for_good_fails_at_once() -> None:
    from contextlib import AsyncExitStack

    from bridges.spark.sink import _connect
    from broker.client import BrokerError

    async with running_broker(auth_token="s3cr3t") as server:
        options = {"server": server_text(server), "token": "wrong"}
        with trio.fail_after(5), pytest.raises(BrokerError) as refused:
            async with AsyncExitStack() as stack:
                await _connect(stack, options, 0.2)
    assert refused.value.code == "AUTH_FAILED"
