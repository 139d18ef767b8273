"""The Kafka bridge: an aggregate topic in, filtered hierarchical events out.

Per batch of records: decode each value, derive its topic from the template, drop it when no
broker anywhere wants the topic (``RouteWatcher``), publish the rest with confirmation and
the message id ``kafka/{topic}/{partition}/{offset}``, send what cannot be mapped (or that
the broker refuses for good) to the dead-letter topic, and only then store the batch's
offsets, which librdkafka commits. So a record's offset is committed only once the broker
has it or the dead-letter topic has it; a crash replays at most the uncommitted records and
the broker's duplicate filter drops the ones it already routed.

Tasks and owners: ``Bridge.run`` owns one nursery holding the route watcher, the stats
logger, the reporter (its figures to ``$SYS/bridges/<id>``, never waited for), and one
delivery task per batch in flight. Batches are published in the order they
were read (one broker connection, FIFO), and offsets are stored strictly in that order, so a
batch confirmed early never commits past one still in flight. Every call into the consumer
runs in a worker thread under one limiter: librdkafka blocks, trio must not.

Backpressure: at most ``in_flight_max`` records (and ``in_flight_bytes``) are between Kafka
and a confirmation; past that the bridge stops reading, and librdkafka's own prefetch is
bounded by ``queued.max.messages.kbytes``. A slow broker slows the bridge, memory stays put.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, deque
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import trio

from bridges.config import BridgeConfig
from bridges.delivery import (
    DeadLetter,
    DeliveryCounters,
    RateLimit,
    connect_failure,
    publish_all,
    send_dead_letters,
)
from bridges.lag import LogEnds, PartitionEnds
from bridges.mapping import DECODERS, DecodeError, MappingError
from bridges.metrics import BridgeFigures, PartitionLag, bridge_routes, report, serve_http
from bridges.routes import RouteWatcher
from broker.client import BrokerError, Client, ConnectionLost, connect, worth_retrying
from broker.http import HttpServer
from broker.log import get_logger

log = get_logger("topiary.bridge")

CONSUME_WAIT = 0.02  # seconds a consume call waits for a batch to fill (latency at low rates)
ROUTE_WAIT_WARNING = 10.0
LAG_INTERVAL = 1.0  # seconds between reads of the log ends, with the operators' port on
EARLIEST = ("earliest", "smallest", "beginning")


@dataclass(slots=True)
class BridgeCounters(DeliveryCounters):
    records_in: int = 0  # records read from the aggregate topic
    bytes_in: int = 0
    unwanted_dropped: int = 0  # no broker wants the topic: never published
    malformed: int = 0  # did not decode or map (by reason in ``malformed_by_reason``)
    batches: int = 0
    offsets_stored: int = 0  # partition offsets handed to librdkafka to commit
    offsets_not_stored: int = 0  # the partition had moved to another member meanwhile
    kafka_errors: int = 0
    rebalances: int = 0


COUNTER_NAMES = tuple(BridgeCounters.__dataclass_fields__)


@dataclass(slots=True)
class _Batch:
    """Records read together; done once each is confirmed or dead-lettered."""

    publish: list[tuple[str, bytes, str | None]]
    sources: list[Any]  # the Kafka message behind each entry of ``publish``
    dead: list[DeadLetter]
    offsets: dict[int, int]  # partition -> next offset to read
    size: int
    payload_bytes: int
    done: bool = False
    finished: trio.Event = field(default_factory=trio.Event)


class Bridge:
    def __init__(self, config: BridgeConfig, *, watcher: RouteWatcher | None = None) -> None:
        self.config = config
        self.settings = config.settings
        self.tls = config.tls_context()  # one context for both connections to the broker
        self.watcher = watcher or RouteWatcher(
            config.server,
            observer_id=config.observer_id,
            secret=config.peer_secret,
            backoff_max=config.settings.backoff_max,
            tls=self.tls,
        )
        self.counters = BridgeCounters()
        self.malformed_by_reason: Counter[str] = Counter()
        self.started = trio.Event()  # the route table is ready and consuming has begun
        self._stopping = trio.Event()
        self._kafka = trio.CapacityLimiter(1)
        self._in_flight: deque[_Batch] = deque()
        self._in_flight_records = 0
        self._in_flight_bytes = 0
        self._room = trio.Event()
        self._consumer: Any = None
        self._producer: Any = None
        self._may_log = RateLimit()
        self._assigned: set[int] = set()
        # For the consumer-lag metric (bridges/metrics.py), per partition: the offset after
        # the last record read, after the last one done (stored for commit), and the log's
        # ends as last read by ``watch_lag``.
        self._read: dict[int, int] = {}
        self._done: dict[int, int] = {}
        self.log_ends: dict[int, PartitionEnds] = {}
        # Reports to the broker (``_report_loop``): written, and skipped for want of room.
        self.reports_sent = 0
        self.reports_skipped = 0

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the batches in flight, commit their offsets, leave the group, return."""
        self._stopping.set()
        self._room.set()

    def stats(self) -> dict[str, Any]:
        counters = {name: getattr(self.counters, name) for name in COUNTER_NAMES}
        return {
            **counters,
            "malformed_by_reason": dict(self.malformed_by_reason),
            "in_flight": self._in_flight_records,
            "in_flight_bytes": self._in_flight_bytes,
            "assigned_partitions": sorted(self._assigned),
            "routes": self.watcher.describe(),
        }

    def figures(self) -> BridgeFigures:
        """The counters and, per assigned partition whose end is known, the consumer lag.

        end = max(the probed log end, the offset after the last record read): the bridge
        may have read past the last probe. position = the offset after the last record
        done (confirmed, dropped or dead-lettered, and stored for commit); before the
        bridge stored one for the partition, the group's committed offset, and before any
        commit where ``auto.offset.reset`` starts (the first offset still in the log, or the
        end). So records read and not yet confirmed count as lag.
        """
        earliest = self.config.consumer_config().get("auto.offset.reset") in EARLIEST
        partitions = []
        for p in sorted(self._assigned):
            ends = self.log_ends.get(p)
            if ends is None:
                continue
            end = max(ends.end, self._read.get(p, 0))
            start = ends.committed if ends.committed >= 0 else ends.low if earliest else end
            position = self._done.get(p, start)
            partitions.append(PartitionLag(p, position, end))
        return BridgeFigures(
            self.config.topic, self.stats_line(), partitions, self._in_flight_records
        )

    async def watch_lag(self, interval: float = LAG_INTERVAL) -> None:
        """Read the true log ends of the assigned partitions every ``interval`` seconds
        (bridges/lag.py), with a consumer of its own in a worker thread, until cancelled."""
        from confluent_kafka import KafkaException

        reader = LogEnds(self.config)
        try:
            while True:
                try:
                    self.log_ends = await trio.to_thread.run_sync(
                        reader.read, sorted(self._assigned)
                    )
                except KafkaException as exc:
                    if self._may_log("log-ends"):
                        log.warning("reading the log ends failed", error=str(exc))
                await trio.sleep(interval)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(reader.close)

    # -- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bridge until ``stop()`` (or cancellation); always commits what was confirmed."""
        from confluent_kafka import Consumer, Producer

        config = self.config
        self._consumer = Consumer({**config.consumer_config(), "error_cb": self._kafka_error})
        self._producer = Producer({**config.producer_config(), "error_cb": self._kafka_error})
        task_status.started()
        try:
            async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
                nursery.start_soon(self.watcher.run)
                if self.settings.stats_interval:
                    nursery.start_soon(self._stats_loop)
                client = await self._connect(stack)
                if client is not None and config.report_interval:
                    nursery.start_soon(self._report_loop, client)
                if client is not None:
                    await self._pipeline(client)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._close()

    async def _connect(self, stack: AsyncExitStack) -> Client | None:
        """Connect to the broker, retrying with backoff until it answers or we stop.

        Later losses are the client's business (``reconnect=True``): unconfirmed PUBs are
        sent again, and their message ids make the repeats harmless.
        """
        config = self.config
        credentials = config.credentials()
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                return await stack.enter_async_context(
                    connect(
                        config.server,
                        client_id=f"{config.observer_id}-publisher",
                        credentials=credentials,
                        keepalive=5.0,
                        reconnect=True,
                        backoff=(0.05, self.settings.backoff_max),
                        tls=self.tls,
                    )
                )
            except (OSError, ConnectionLost, BrokerError, trio.BrokenResourceError) as exc:
                if not worth_retrying(exc):
                    raise
                log.warning("broker unreachable", server=config.server, error=connect_failure(exc),
                            retry_in=round(backoff, 2))  # fmt: skip
            with trio.move_on_after(backoff):
                await self._stopping.wait()
            backoff = min(backoff * 2, self.settings.backoff_max)
        return None

    async def _report_loop(self, client: Client) -> None:
        """Publish a report (``metrics.report``) to ``$SYS/bridges/<id>`` at once and then
        every ``report_interval`` seconds, unconfirmed; one that cannot be written without
        waiting (the broker is away, the write buffer is full) is skipped, never waited for.
        """
        config = self.config
        topic, bridge_id = config.report_topic, config.report_id
        while True:
            if client.publish_nowait(topic, report(self.figures(), bridge_id, time.time())):
                self.reports_sent += 1
            else:
                self.reports_skipped += 1
            await trio.sleep(config.report_interval)

    async def _pipeline(self, client: Client) -> None:
        await self._wait_for_routes()
        if self._stopping.is_set():
            return
        consumer = self._consumer
        consumer.subscribe(
            [self.config.topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        self.started.set()
        log.info("bridge consuming", topic=self.config.topic, broker=self.config.server)
        async with trio.open_nursery() as batches:
            while not self._stopping.is_set():
                await self._wait_for_room()
                if self._stopping.is_set():
                    break
                records = await trio.to_thread.run_sync(
                    consumer.consume, self.settings.batch_max, CONSUME_WAIT, limiter=self._kafka
                )
                if records:
                    batch = self._prepare(records)
                    self._in_flight.append(batch)
                    self._in_flight_records += batch.size
                    self._in_flight_bytes += batch.payload_bytes
                    batches.start_soon(self._deliver, client, batch)
            with trio.move_on_after(self.settings.shutdown_timeout) as waited:
                while self._in_flight:  # they finish in any order; offsets go in order
                    await self._in_flight[0].finished.wait()
                    self._store_done()
            if waited.cancelled_caught:
                log.warning(
                    "shutdown: batches still unconfirmed; their records will be read again",
                    records=self._in_flight_records,
                )
            batches.cancel_scope.cancel()

    async def _wait_for_routes(self) -> None:
        while not self.watcher.ready.is_set() and not self._stopping.is_set():
            with trio.move_on_after(ROUTE_WAIT_WARNING):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_set_when, self.watcher.ready, nursery.cancel_scope)
                    nursery.start_soon(_set_when, self._stopping, nursery.cancel_scope)
            if not self.watcher.ready.is_set() and not self._stopping.is_set():
                log.warning("waiting for the broker's route table", server=self.config.server)

    async def _wait_for_room(self) -> None:
        settings = self.settings
        while (
            self._in_flight_records + settings.batch_max > settings.in_flight_max
            or self._in_flight_bytes >= settings.in_flight_bytes
        ) and not self._stopping.is_set():
            self._room = trio.Event()
            await self._room.wait()

    # -- one batch --------------------------------------------------------------------------

    def _prepare(self, records: list[Any]) -> _Batch:
        """Decode, map and filter a batch: the hot loop, so everything is a local."""
        counters = self.counters
        decode = DECODERS[self.config.format]
        topic_for = self.config.template.topic
        wants = self.watcher.wants
        prefix = f"kafka/{self.config.topic}/"
        source = f"{self.config.topic}/"
        publish: list[tuple[str, bytes, str | None]] = []
        sources: list[Any] = []
        dead: list[DeadLetter] = []
        offsets: dict[int, int] = {}
        unwanted = size = nbytes = 0
        for record in records:
            if record.error() is not None:
                self._record_error(record)
                continue
            value = record.value()
            partition = record.partition()
            offset = record.offset()
            offsets[partition] = offset + 1
            size += 1
            if value is None:
                dead.append(DeadLetter(None, record.key(), f"{source}{partition}/{offset}",
                                       "decode", "the record has no value"))  # fmt: skip
                continue
            nbytes += len(value)
            try:
                topic = topic_for(decode(value))
            except (DecodeError, MappingError) as exc:
                reason = exc.reason if isinstance(exc, MappingError) else "decode"
                dead.append(DeadLetter(value, record.key(), f"{source}{partition}/{offset}",
                                       reason, str(exc)))  # fmt: skip
                continue
            if wants(topic):
                publish.append((topic, value, f"{prefix}{partition}/{offset}"))
                sources.append(record)
            else:
                unwanted += 1
        self._read |= offsets
        counters.records_in += size
        counters.bytes_in += nbytes
        counters.unwanted_dropped += unwanted
        counters.malformed += len(dead)
        counters.batches += 1
        for letter in dead:
            self.malformed_by_reason[letter.reason] += 1
        return _Batch(publish, sources, dead, offsets, size, nbytes)

    async def _deliver(self, client: Client, batch: _Batch) -> None:
        refused = await publish_all(
            client, batch.publish, counters=self.counters,
            backoff_max=self.settings.backoff_max, may_log=self._may_log,
        )  # fmt: skip
        for index, error in refused:
            record = batch.sources[index]
            batch.dead.append(
                DeadLetter(
                    record.value(),
                    record.key(),
                    f"{record.topic()}/{record.partition()}/{record.offset()}",
                    f"broker:{error.code}",
                    error.text,
                )
            )
        if batch.dead:
            await send_dead_letters(
                self._producer, self.config.dead_letter_topic, batch.dead,
                counters=self.counters, backoff_max=self.settings.backoff_max,
                may_log=self._may_log,
            )  # fmt: skip
        batch.done = True
        batch.finished.set()
        self._store_done()

    def _store_done(self) -> None:
        """Store the offsets of the finished batches at the head of the queue, in order."""
        from confluent_kafka import KafkaException, TopicPartition

        in_flight = self._in_flight
        while in_flight and in_flight[0].done:
            batch = in_flight.popleft()
            self._in_flight_records -= batch.size
            self._in_flight_bytes -= batch.payload_bytes
            for partition, offset in batch.offsets.items():
                try:
                    self._consumer.store_offsets(
                        offsets=[TopicPartition(self.config.topic, partition, offset)]
                    )
                    self.counters.offsets_stored += 1
                    self._done[partition] = offset
                except KafkaException as exc:
                    # Revoked meanwhile: its new owner reads these records again and the
                    # broker drops the ones it already has.
                    self.counters.offsets_not_stored += 1
                    log.info("offset not stored", partition=partition, error=str(exc))
        self._room.set()

    # -- kafka callbacks (in the consumer's worker thread) ----------------------------------

    def _on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        self.counters.rebalances += 1
        self._assigned |= {p.partition for p in partitions}
        log.info("partitions assigned", partitions=sorted(p.partition for p in partitions))

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        self._assigned -= {p.partition for p in partitions}
        for p in partitions:
            self._read.pop(p.partition, None)
            self._done.pop(p.partition, None)
        log.info("partitions revoked", partitions=sorted(p.partition for p in partitions))

    def _kafka_error(self, error: Any) -> None:
        self.counters.kafka_errors += 1
        if self._may_log("kafka"):
            log.warning("kafka", error=str(error), errors=self.counters.kafka_errors)

    def _record_error(self, record: Any) -> None:
        self._kafka_error(record.error())

    # -- the end ----------------------------------------------------------------------------

    async def _close(self) -> None:
        consumer, producer = self._consumer, self._producer
        if producer is not None:
            await trio.to_thread.run_sync(producer.flush, 5.0)
        if consumer is not None:
            # close() commits the stored offsets and leaves the group.
            await trio.to_thread.run_sync(consumer.close, limiter=self._kafka)
        log.info("bridge stopped", **self.stats_line())

    def stats_line(self) -> dict[str, int]:
        return {name: getattr(self.counters, name) for name in COUNTER_NAMES}

    async def _stats_loop(self) -> None:
        while True:
            await trio.sleep(self.settings.stats_interval)
            log.info("bridge stats", in_flight=self._in_flight_records, **self.stats_line())


async def _set_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def run_bridge(config: BridgeConfig) -> None:
    """Run a bridge until SIGINT or SIGTERM, then shut it down cleanly (the CLI's entry)."""
    bridge = Bridge(config)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, bridge)
        if config.http_listen is not None:
            await nursery.start(serve_operators, bridge, config.http_listen)
        await bridge.run()
        nursery.cancel_scope.cancel()


async def serve_operators(
    bridge: Bridge,
    listen: str,
    *,
    lag_interval: float = LAG_INTERVAL,
    task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The bridge's ``--http`` port (/metrics, /healthz, /readyz) and the log-end reader
    behind its lag metric, on the bridge's own trio loop, until cancelled."""
    http = HttpServer(bridge_routes(bridge.figures, bridge.started.is_set))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bridge.watch_lag, lag_interval)
        addresses = await nursery.start(serve_http, http, listen)
        log.info("bridge http listening", addresses=addresses)
        task_status.started(addresses)


async def _stop_on_signal(bridge: Bridge) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for signum in received:
            log.info("signal", signal=signal.Signals(signum).name)
            bridge.stop()
