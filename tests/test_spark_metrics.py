"""The Spark driver's operators' port: the sink's totals and the lag, after a real query.

The session's SparkSession (local) runs the pipeline with ``availableNow`` over a Tansu
topic; the driver's port (``DriverPort``, its own trio loop in a thread) is scraped with
prometheus_client's parser until the last batch's figures are in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from bridges.config import bridge_config_from_dict
from bridges.spark.metrics import DriverPort, SparkFigures
from bridges.spark.pipeline import start_query
from bridges.spark.routes import RouteFeed
from bridges.tansu import Tansu
from broker.client import connect
from tests.bridgekit import beacon, config_dict, json_values, produce
from tests.conftest import running_broker
from tests.test_bridge_metrics import get, lags, samples

PARTITIONS = 2


async def test_driver_metrics_count_the_sinks_results_and_lag_reaches_zero(
    spark: Any, tansu: Tansu, topic_name: str, tmp_path: Path
) -> None:
    tansu.create_topic(topic_name, PARTITIONS)
    tansu.create_topic(f"{topic_name}.dlq", 1)
    records = [beacon(i) for i in range(300)]
    wanted = sum(r["region"] == "eu" for r in records)
    values = [*json_values(records), b"{not json", json.dumps({"region": "eu"}).encode()]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, values))
    ends = {p: tansu.log_end(topic_name, p) for p in range(PARTITIONS)}
    async with running_broker() as server, connect(_text(server)) as client:
        async with client.subscribe("beacon/eu/>"):
            document = config_dict(tansu.bootstrap, _text(server), topic_name)
            document["spark"] = {"checkpoint": str(tmp_path / "checkpoint"), "trigger": 0}
            config = bridge_config_from_dict(document)
            feed = RouteFeed(config.server, observer_id="spark-metrics").start()
            figures = SparkFigures(config)
            port = DriverPort(config, figures, "127.0.0.1:0")
            [address] = await trio.to_thread.run_sync(port.start)
            try:
                assert await get(address, "/healthz") == (200, "ok\n")
                assert (await get(address, "/readyz"))[0] == 503
                assert await trio.to_thread.run_sync(lambda: feed.wait_ready(10))

                def run() -> Any:
                    checkpoint = str(tmp_path / "checkpoint")
                    query = start_query(spark, config, feed, checkpoint=checkpoint,
                                        available_now=True, figures=figures)  # fmt: skip
                    figures.query = query
                    query.awaitTermination(120)
                    assert query.exception() is None, query.exception()
                    return query

                await trio.to_thread.run_sync(run)
                assert (await get(address, "/readyz"))[0] == 200
                scrape: dict[Any, float] = {}
                total = len(values)
                with trio.fail_after(20):  # bounded polling on the metric itself
                    while not (
                        scrape.get(("topiary_bridge_records_in_total", ())) == total
                        and lags(scrape, "topiary_bridge_consumer_lag") == dict.fromkeys(ends, 0)
                    ):
                        scrape = samples((await get(address, "/metrics"))[1])
                        await trio.sleep(0.1)
            finally:
                await trio.to_thread.run_sync(port.stop)
                await trio.to_thread.run_sync(feed.stop)
                figures.close()

    def value(name: str) -> float:
        return scrape[(name, ())]

    assert value("topiary_bridge_published_total") == wanted
    assert value("topiary_bridge_malformed_total") == 2
    assert value("topiary_bridge_dead_lettered_total") == 2
    assert value("topiary_bridge_unwanted_dropped_total") == len(records) - wanted
    assert value("topiary_bridge_moved_per_wanted") == 1.0
    assert lags(scrape, "topiary_bridge_log_end_offset") == ends
    assert lags(scrape, "topiary_bridge_consumer_position") == ends
    assert ("topiary_bridge_bytes_in_total", ()) not in scrape  # not known on the driver


def _text(server: Any) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"
