"""The Spark sink: each partition of a micro-batch published to a broker, confirmed.

``TopiarySink`` is a Python data source (format ``"topiary"``) with a batch writer (used
per micro-batch from ``foreachBatch``, where the pipeline applies the route table of the
moment) and a stream writer (for ``writeStream.format("topiary")`` directly). Each task
opens one broker connection, publishes its rows as pipelined confirmed batches with the
row's message id (``kafka/{topic}/{partition}/{offset}``), and returns only when every row
is confirmed or dead-lettered. A micro-batch replayed after a crash publishes the same ids
again, and the broker's duplicate filter drops them: exactly once into durable sessions.

Rows (columns by name): ``topic`` (STRING; NULL for a malformed record), ``value``
(BINARY), ``msg_id`` (STRING), ``reason`` (STRING; NULL unless malformed), ``key``
(BINARY; only dead letters use it) and, optionally, ``source`` (STRING
``topic/partition/offset``; without it a dead letter's source is ``msg_id`` without its
``kafka/`` prefix).

Options: ``server`` (HOST:PORT, required), ``token``, ``username`` with ``password``
(HELLO credentials), ``tls`` ("true": TLS to ``server``, verified against ``ca`` or the
system's CAs, with ``cert`` and ``key`` as a client certificate: file paths each task
reads, so they must exist on every executor), ``backoff_max`` (seconds),
``dead_letter_topic`` with ``kafka.*`` settings for its producer, ``filters`` (JSON
``[[text, dialect], ...]``): when given, rows whose topic matches none are dropped here
(``routing.SubscriptionTable`` over the Arrow batch) instead of by the query, and
``report`` (a file path): the batch writer's commit writes the summed ``SinkCommit`` of all
tasks there as JSON, for the driver's metrics (the commit runs in a Python worker on the
driver's machine, not in the driver's interpreter).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from broker.log import get_logger

log = get_logger("topiary.bridge.spark.sink")

CHUNK = 5000  # rows per confirmed batch on the wire


@dataclass
class SinkCommit(WriterCommitMessage):
    rows: int = 0
    published: int = 0
    unwanted: int = 0
    dead_lettered: int = 0
    refused: int = 0


class TopiarySink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "topiary"

    def writer(self, schema: Any, overwrite: bool) -> TopiaryWriter:
        return TopiaryWriter(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> TopiaryStreamWriter:
        return TopiaryStreamWriter(dict(self.options))


class TopiaryWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        if "server" not in options:
            raise ValueError("the topiary sink needs option 'server' (HOST:PORT)")
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        return write_partition(self.options, iterator)

    def commit(self, messages: list[Any]) -> None:
        """Nothing to finish: every row was confirmed (or dead-lettered) by its task. (The
        commit runs in a Python worker, not in the driver's interpreter.) With the
        ``report`` option, the tasks' totals go to that file for the driver."""
        if self.options.get("report"):
            write_report(self.options["report"], messages)


class TopiaryStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        if "server" not in options:
            raise ValueError("the topiary sink needs option 'server' (HOST:PORT)")
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        return write_partition(self.options, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        """Nothing to finish: every row was confirmed (or dead-lettered) by its task."""


def write_report(path: str, messages: list[Any]) -> None:
    """The sum of the tasks' ``SinkCommit`` messages as JSON at ``path`` (atomically)."""
    total = {f.name: 0 for f in fields(SinkCommit)}
    for message in messages:
        if isinstance(message, SinkCommit):
            for name, value in asdict(message).items():
                total[name] += value
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        json.dump(total, out)
    os.replace(temporary, path)


def write_partition(options: dict[str, str], batches: Iterator[Any]) -> SinkCommit:
    """Publish one task's rows; runs in a Spark Python worker (its own trio loop)."""
    import trio

    return trio.run(_write, options, batches)


async def _write(options: dict[str, str], batches: Iterator[Any]) -> SinkCommit:
    from contextlib import AsyncExitStack

    from bridges.delivery import (
        DeadLetter,
        DeliveryCounters,
        RateLimit,
        publish_all,
        send_dead_letters,
    )

    counters = DeliveryCounters()
    commit = SinkCommit()
    may_log = RateLimit()
    backoff_max = float(options.get("backoff_max", "5"))
    wanted = _wanted_table(options.get("filters"))
    producer = None
    async with AsyncExitStack() as stack:
        client = await _connect(stack, options, backoff_max)
        for batch in batches:
            topics = batch.column("topic").to_pylist()
            values = batch.column("value").to_pylist()
            ids = batch.column("msg_id").to_pylist()
            reasons = batch.column("reason").to_pylist()
            commit.rows += len(topics)
            keep = wanted.mask(topics) if wanted is not None else [t is not None for t in topics]
            items = [
                (topic, value, msg_id)
                for topic, value, msg_id, ok in zip(topics, values, ids, keep, strict=True)
                if ok
            ]
            commit.unwanted += sum(
                1 for topic, ok in zip(topics, keep, strict=True) if topic is not None and not ok
            )
            dead = []
            if any(reason is not None for reason in reasons):
                keys = batch.column("key").to_pylist()
                sources = (
                    batch.column("source").to_pylist()
                    if "source" in batch.schema.names
                    else [(msg_id or "").removeprefix("kafka/") for msg_id in ids]
                )
                dead = [
                    DeadLetter(values[i], keys[i], sources[i], reasons[i], reasons[i])
                    for i, reason in enumerate(reasons)
                    if reason is not None
                ]
            for start in range(0, len(items), CHUNK):
                chunk = items[start : start + CHUNK]
                for index, error in await publish_all(
                    client, chunk, counters=counters, backoff_max=backoff_max, may_log=may_log
                ):
                    _topic, value, msg_id = chunk[index]
                    source = (msg_id or "").removeprefix("kafka/")
                    dead.append(DeadLetter(value, None, source, f"broker:{error.code}", error.text))
            if dead:
                if producer is None:
                    producer = _dead_letter_producer(options)
                await send_dead_letters(
                    producer, options["dead_letter_topic"], dead,
                    counters=counters, backoff_max=backoff_max, may_log=may_log,
                )  # fmt: skip
    commit.published = counters.published
    commit.dead_lettered = counters.dead_lettered
    commit.refused = counters.refused
    return commit


async def _connect(stack: Any, options: dict[str, str], backoff_max: float) -> Any:
    """The broker, waited for with backoff: a streaming job outlives a broker restart.

    Not there, going away mid-handshake or refusing for the moment: tried again. A bad
    token or another protocol version will not pass by waiting, so it fails the task, and
    with it the query, loudly."""
    import trio

    from bridges.config import broker_tls_context, hello_credentials
    from bridges.delivery import connect_failure
    from broker.client import BrokerError, ConnectionLost, connect, worth_retrying

    credentials = hello_credentials(
        options.get("token"), options.get("username"), options.get("password")
    )
    tls = broker_tls_context(
        options.get("tls") == "true", options.get("ca"), options.get("cert"), options.get("key")
    )
    delay = 0.1
    while True:
        try:
            client = connect(
                options["server"], credentials=credentials, reconnect=True,
                backoff=(0.05, backoff_max), tls=tls,
            )  # fmt: skip
            return await stack.enter_async_context(client)
        except (OSError, ConnectionLost, BrokerError, trio.BrokenResourceError) as exc:
            if not worth_retrying(exc):
                raise
            log.warning("broker unreachable", server=options["server"],
                        error=connect_failure(exc), retry_in=round(delay, 2))  # fmt: skip
        await trio.sleep(delay)
        delay = min(delay * 2, backoff_max)


_TABLES: dict[str, Any] = {}  # filters JSON -> WantedTable, reused by a reused Python worker


def _wanted_table(filters: str | None) -> Any:
    if filters is None:
        return None
    table = _TABLES.get(filters)
    if table is None:
        from bridges.spark.filtering import WantedTable
        from routing import parse_filter

        table = WantedTable(parse_filter(text, dialect) for text, dialect in json.loads(filters))
        _TABLES.clear()
        _TABLES[filters] = table
    return table


def _dead_letter_producer(options: dict[str, str]) -> Any:
    if not options.get("dead_letter_topic"):
        raise RuntimeError("malformed records but no 'dead_letter_topic' option: refusing to drop")
    from confluent_kafka import Producer

    settings = {k.removeprefix("kafka."): v for k, v in options.items() if k.startswith("kafka.")}
    return Producer({"acks": "all", "log.connection.close": False, **settings})
