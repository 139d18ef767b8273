"""The Kafka bridge: an aggregate topic in, filtered hierarchical events out.

Per batch of records: decode each value, derive its topic from the template, drop it when no
broker anywhere wants the topic (``RouteWatcher``), publish the rest with confirmation and
the message id ``kafka/{topic}/{partition}/{offset}``, send what cannot be mapped (or that
the broker refuses for good) to the dead-letter topic, and only then store the batch's
offsets, which librdkafka commits. So a record's offset is committed only once the broker
has it or the dead-letter topic has it; a crash replays at most the uncommitted records and
the broker's duplicate filter drops the ones it already routed.

Tasks and owners: ``Bridge.run`` owns one nursery holding the route watcher, the stats
logger, and one delivery task per batch in flight. Batches are published in the order they
were read (one broker connection, FIFO), and offsets are stored strictly in that order, so a
batch confirmed early never commits past one still in flight. Every call into the consumer
runs in a worker thread under one limiter: librdkafka blocks, trio must not.

Backpressure: at most ``in_flight_max`` records (and ``in_flight_bytes``) are between Kafka
and a confirmation; past that the bridge stops reading, and librdkafka's own prefetch is
bounded by ``queued.max.messages.kbytes``. A slow broker slows the bridge, memory stays put.
"""

from __future__ import annotations

import math
import signal
import time
from collections import Counter, deque
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import trio

from bridges.config import BridgeConfig
from bridges.mapping import DECODERS, DecodeError, MappingError
from bridges.routes import RouteWatcher
from broker.client import BrokerError, Client, ConnectionLost, connect
from broker.errors import ErrorCode
from broker.log import get_logger

log = get_logger("topiary.bridge")

#: The broker's refusals that no retry can change: such a record goes to the dead letters.
PERMANENT_REFUSALS = {ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.INVALID_TOPIC}
CONSUME_WAIT = 0.02  # seconds a consume call waits for a batch to fill (latency at low rates)
ROUTE_WAIT_WARNING = 10.0
ERROR_LOG_INTERVAL = 5.0


@dataclass(slots=True)
class BridgeCounters:
    records_in: int = 0  # records read from the aggregate topic
    bytes_in: int = 0
    published: int = 0  # confirmed by the broker
    unwanted_dropped: int = 0  # no broker wants the topic: never published
    malformed: int = 0  # did not decode or map (by reason in ``malformed_by_reason``)
    refused: int = 0  # refused by the broker for good (too large, ...)
    dead_lettered: int = 0  # delivered to the dead-letter topic
    publish_retries: int = 0  # records published again after a passing refusal
    dead_letter_retries: int = 0
    batches: int = 0
    offsets_stored: int = 0  # partition offsets handed to librdkafka to commit
    offsets_not_stored: int = 0  # the partition had moved to another member meanwhile
    kafka_errors: int = 0
    rebalances: int = 0


@dataclass(slots=True)
class _Batch:
    """Records read together; done once each is confirmed or dead-lettered."""

    publish: list[tuple[str, bytes, str | None]]
    sources: list[Any]  # the Kafka message behind each entry of ``publish``
    dead: list[tuple[Any, str, str]]  # (kafka message, reason, text)
    offsets: dict[int, int]  # partition -> next offset to read
    size: int
    payload_bytes: int
    done: bool = False
    finished: trio.Event = field(default_factory=trio.Event)


class Bridge:
    def __init__(self, config: BridgeConfig, *, watcher: RouteWatcher | None = None) -> None:
        self.config = config
        self.settings = config.settings
        self.watcher = watcher or RouteWatcher(
            config.server,
            observer_id=config.observer_id,
            secret=config.peer_secret,
            backoff_max=config.settings.backoff_max,
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
        self._logged_at: dict[str, float] = {}
        self._assigned: set[int] = set()

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the batches in flight, commit their offsets, leave the group, return."""
        self._stopping.set()
        self._room.set()

    def stats(self) -> dict[str, Any]:
        counters = {name: getattr(self.counters, name) for name in BridgeCounters.__slots__}
        return {
            **counters,
            "malformed_by_reason": dict(self.malformed_by_reason),
            "in_flight": self._in_flight_records,
            "in_flight_bytes": self._in_flight_bytes,
            "assigned_partitions": sorted(self._assigned),
            "routes": self.watcher.describe(),
        }

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
        credentials = {"token": config.token} if config.token is not None else None
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
                    )
                )
            except (OSError, ConnectionLost) as exc:
                log.warning("broker unreachable", server=config.server, error=str(exc),
                            retry_in=round(backoff, 2))  # fmt: skip
            except BrokerError as exc:
                if exc.code in (ErrorCode.AUTH_FAILED, ErrorCode.VERSION_MISMATCH):
                    raise
                log.warning("broker refused", code=str(exc.code), text=exc.text)
            with trio.move_on_after(backoff):
                await self._stopping.wait()
            backoff = min(backoff * 2, self.settings.backoff_max)
        return None

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
        publish: list[tuple[str, bytes, str | None]] = []
        sources: list[Any] = []
        dead: list[tuple[Any, str, str]] = []
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
                dead.append((record, "decode", "the record has no value"))
                continue
            nbytes += len(value)
            try:
                topic = topic_for(decode(value))
            except DecodeError as exc:
                dead.append((record, "decode", str(exc)))
                continue
            except MappingError as exc:
                dead.append((record, exc.reason, str(exc)))
                continue
            if wants(topic):
                publish.append((topic, value, f"{prefix}{partition}/{offset}"))
                sources.append(record)
            else:
                unwanted += 1
        counters.records_in += size
        counters.bytes_in += nbytes
        counters.unwanted_dropped += unwanted
        counters.malformed += len(dead)
        counters.batches += 1
        for _record, reason, _text in dead:
            self.malformed_by_reason[reason] += 1
        return _Batch(publish, sources, dead, offsets, size, nbytes)

    async def _deliver(self, client: Client, batch: _Batch) -> None:
        pending = list(range(len(batch.publish)))
        backoff = 0.05
        while pending:
            results = await client.publish_confirmed([batch.publish[i] for i in pending])
            retry = []
            for index, error in zip(pending, results, strict=True):
                if error is None:
                    continue
                if error.code in PERMANENT_REFUSALS:
                    self.counters.refused += 1
                    batch.dead.append((batch.sources[index], f"broker:{error.code}", error.text))
                else:
                    retry.append(index)
            self.counters.published += len(pending) - len(retry)
            if retry:
                self.counters.publish_retries += len(retry)
                first = next(e for e in results if e is not None)
                if self._may_log("refused"):
                    log.warning("broker refused records; retrying", records=len(retry),
                                code=str(first.code), text=first.text,
                                retries=self.counters.publish_retries)  # fmt: skip
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max)
            pending = retry
        if batch.dead:
            await self._dead_letter(batch.dead)
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
                except KafkaException as exc:
                    # Revoked meanwhile: its new owner reads these records again and the
                    # broker drops the ones it already has.
                    self.counters.offsets_not_stored += 1
                    log.info("offset not stored", partition=partition, error=str(exc))
        self._room.set()

    async def _dead_letter(self, dead: list[tuple[Any, str, str]]) -> None:
        """Deliver every record to the dead-letter topic, retrying until Kafka takes it."""
        producer = self._producer
        topic = self.config.dead_letter_topic
        pending = dead
        backoff = 0.1
        while pending:
            failed: list[tuple[Any, str, str]] = []
            for item in pending:
                record, reason, text = item
                headers = [
                    ("topiary.reason", reason.encode()),
                    ("topiary.error", text.encode("utf-8", "replace")[:1000]),
                    (
                        "topiary.source",
                        f"{record.topic()}/{record.partition()}/{record.offset()}".encode(),
                    ),
                ]
                while True:
                    try:
                        producer.produce(
                            topic,
                            value=record.value(),
                            key=record.key(),
                            headers=headers,
                            on_delivery=_note_failure(failed, item),
                        )
                        break
                    except BufferError:
                        await trio.to_thread.run_sync(producer.poll, 0.1)
            remaining = await trio.to_thread.run_sync(producer.flush, 30.0)
            if remaining:
                log.warning("dead-letter topic slow to confirm", waiting=remaining)
                continue
            self.counters.dead_lettered += len(pending) - len(failed)
            if failed:
                self.counters.dead_letter_retries += len(failed)
                if self._may_log("dead-letter"):
                    log.warning("dead-letter delivery failed; retrying", records=len(failed))
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.backoff_max)
            pending = failed

    # -- kafka callbacks (in the consumer's worker thread) ----------------------------------

    def _on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        self.counters.rebalances += 1
        self._assigned |= {p.partition for p in partitions}
        log.info("partitions assigned", partitions=sorted(p.partition for p in partitions))

    def _on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        self._assigned -= {p.partition for p in partitions}
        log.info("partitions revoked", partitions=sorted(p.partition for p in partitions))

    def _kafka_error(self, error: Any) -> None:
        self.counters.kafka_errors += 1
        if self._may_log("kafka"):
            log.warning("kafka", error=str(error), errors=self.counters.kafka_errors)

    def _may_log(self, what: str) -> bool:
        """At most one warning of a kind per ERROR_LOG_INTERVAL: an outage is one story,
        not thousands of lines."""
        now = time.monotonic()
        if now - self._logged_at.get(what, -math.inf) < ERROR_LOG_INTERVAL:
            return False
        self._logged_at[what] = now
        return True

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
        return {name: getattr(self.counters, name) for name in BridgeCounters.__slots__}

    async def _stats_loop(self) -> None:
        while True:
            await trio.sleep(self.settings.stats_interval)
            log.info("bridge stats", in_flight=self._in_flight_records, **self.stats_line())


def _note_failure(failed: list[Any], item: Any) -> Any:
    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(item)

    return delivered


async def _set_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()




async def run_bridge(config: BridgeConfig) -> None:
    """Run a bridge until SIGINT or SIGTERM, then shut it down cleanly (the CLI's entry)."""
    bridge = Bridge(config)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, bridge)
        await bridge.run()
        nursery.cancel_scope.cancel()


async def _stop_on_signal(bridge: Bridge) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for signum in received:
            log.info("signal", signal=signal.Signals(signum).name)
            bridge.stop()
