"""The Kafka bridge as a Spark Structured Streaming query.

    Kafka (topiary_kafka source, or Spark's own)         offsets in Spark's checkpoint
      -> topic and reason columns from the template       Spark SQL, no Python per row
      -> foreachBatch: drop rows nobody wants *now*       route table snapshot per batch
      -> sink "topiary": publish confirmed, with ids      kafka/{topic}/{partition}/{offset}

Exactly once into durable sessions: a micro-batch that is run again after a crash reads the
same offsets (Spark's offset log), so it publishes the same message ids, and the broker's
duplicate filter drops the ones it already has. The route table is taken afresh for every
micro-batch from a ``RouteFeed`` (the bridge's read-only peer link, in a driver thread).
Two ways to apply it, chosen by ``[spark] filter``: ``regex`` (one Java regex, ``rlike`` in
the JVM) or ``table`` (the filters go to the sink, which asks a SubscriptionTable per
distinct topic of each Arrow batch); bench/spark_bridge.py measures both.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from bridges.config import BridgeConfig
from bridges.spark.compiler import compile_topic
from bridges.spark.filtering import filters_regex
from bridges.spark.routes import RouteFeed, WantedFilters
from broker.log import get_logger

if TYPE_CHECKING:
    from bridges.spark.metrics import SparkFigures

log = get_logger("topiary.bridge.spark")

QUERY_NAME = "topiary-bridge"


def source_options(config: BridgeConfig) -> dict[str, str]:
    """The Kafka source's options from the bridge's [kafka] table (group settings dropped:
    Spark's checkpoint, not a consumer group, holds the offsets)."""
    from bridges.config import KAFKA_DEFAULTS, consumer_only

    kafka = {**KAFKA_DEFAULTS, **config.kafka}
    options = {
        f"kafka.{key}": str(value)
        for key, value in kafka.items()
        if not consumer_only(key) and key != "log.connection.close"
    }
    options["subscribe"] = config.topic
    options["startingOffsets"] = str(kafka.get("auto.offset.reset", "earliest"))
    options["maxOffsetsPerTrigger"] = str(config.spark.max_offsets_per_trigger)
    return options


def sink_options(config: BridgeConfig) -> dict[str, str]:
    options = {
        "server": config.server,
        "backoff_max": str(config.settings.backoff_max),
        "dead_letter_topic": config.dead_letter_topic,
    }
    if config.token is not None:
        options["token"] = config.token
    if config.username is not None and config.password is not None:
        options["username"] = config.username
        options["password"] = config.password
    if config.tls:  # paths, not a context: each executor (another process) makes its own
        options["tls"] = "true"
        for name in ("ca", "cert", "key"):
            if getattr(config, name) is not None:
                options[name] = getattr(config, name)
    for key, value in config.producer_config().items():
        options[f"kafka.{key}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return options


def mapped(df: Any, config: BridgeConfig) -> Any:
    """Kafka rows -> the sink's columns: the topic (or the reason it has none), the value,
    the message id, and the key of a record that has no topic."""
    compiled = compile_topic(config.template, value_column="value")
    ids = df.selectExpr(
        "key", "value", "concat('kafka/', topic, '/', partition, '/', offset) AS msg_id"
    )
    with_topic = compiled.select(ids)
    # Only dead letters need the key (and their source, which the sink takes from msg_id):
    # every column handed to the sink's Python costs per row, wanted or not.
    return with_topic.selectExpr(
        "topic", "value", "msg_id", "reason", "IF(reason IS NULL, NULL, key) AS key"
    )


class BatchWriter:
    """The foreachBatch function: the route table of the moment, then the sink."""

    def __init__(
        self, config: BridgeConfig, feed: RouteFeed, figures: SparkFigures | None = None
    ) -> None:
        self.config = config
        self.feed = feed
        self.figures = figures  # the driver's metrics, fed with the sink's totals
        self.options = sink_options(config)
        self.mode = config.spark.filter
        self._compiled: tuple[int, str] | None = None

    def __call__(self, batch: Any, batch_id: int) -> None:
        wanted = self.feed.snapshot()
        options = dict(self.options)
        if self.mode == "regex":
            from pyspark.sql import functions as F

            regex = self._regex(wanted)
            batch = batch.where(F.col("reason").isNotNull() | F.col("topic").rlike(regex))
        else:
            options["filters"] = json.dumps([[f.text, f.dialect] for f in wanted.filters])
        if self.figures is not None:
            options["report"] = self.figures.report_path(batch_id)
        batch.write.format("topiary").options(**options).mode("append").save()
        if self.figures is not None:
            self.figures.batch_written(batch_id)
        log.debug("micro-batch written", batch=batch_id, filters=len(wanted.filters))

    def _regex(self, wanted: WantedFilters) -> str:
        if self._compiled is None or self._compiled[0] != wanted.version:
            self._compiled = (wanted.version, filters_regex(wanted.filters))
        return self._compiled[1]


def start_query(
    spark: Any,
    config: BridgeConfig,
    feed: RouteFeed,
    *,
    checkpoint: str,
    available_now: bool = False,
    figures: SparkFigures | None = None,
) -> Any:
    """Start the bridge query (the caller waits on it or stops it); ``figures``, when
    given, collects the sink's totals for the driver's metrics."""
    from bridges.spark.sink import TopiarySink
    from bridges.spark.source import kafka_stream

    # Both steps are mostly a cold JVM on one thread each; side by side they use two cores.
    with ThreadPoolExecutor(1, thread_name_prefix="topiary-register") as pool:
        registered = pool.submit(spark.dataSource.register, TopiarySink)
        rows = mapped(kafka_stream(spark, source_options(config)), config)
        registered.result()
    writer = rows.writeStream.foreachBatch(BatchWriter(config, feed, figures)).queryName(QUERY_NAME)
    writer = writer.option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif config.spark.trigger > 0:
        writer = writer.trigger(processingTime=f"{config.spark.trigger} seconds")
    return writer.start()
