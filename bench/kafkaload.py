"""Producing a benchmark's records to Tansu: every record confirmed and where it landed
known, optionally paced to a rate (a live phase). The Kafka bridge and Spark benchmarks
decide from those places which message ids the broker must deliver."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness import BenchError
from bridges.tansu import Tansu

PRODUCE_TIMEOUT = 120.0  # seconds for a backlog; a paced run gets its own length on top


@dataclass
class Produced:
    placed: list[tuple[int, int]]  # (partition, offset) of each record, in produce order
    sending_seconds: float  # first send to last send
    seconds: float  # first send until every record was confirmed


def produce_confirmed(
    tansu: Tansu,
    topic: str,
    partitions: Sequence[int],
    values: Iterable[bytes],
    *,
    rate: float | None = None,
    linger_ms: int = 20,
    before_send: Callable[[bytes], bytes] | None = None,
) -> Produced:
    """Send ``values`` to ``partitions`` (one each, in order) with acks=all; at most
    ``rate`` records/s if given; ``before_send`` edits a value right before its send (a
    latency stamp). Raises BenchError unless every record was confirmed."""
    from confluent_kafka import Producer

    placed: list[tuple[int, int] | None] = [None] * len(partitions)
    errors: list[str] = []

    def delivered(index: int) -> Callable[[Any, Any], None]:
        def report(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                placed[index] = (message.partition(), message.offset())

        return report

    producer = Producer(
        {
            "bootstrap.servers": tansu.bootstrap,
            "linger.ms": linger_ms,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 262_144,
            "acks": "all",
            "log_level": 0,
        }
    )
    started = time.monotonic()
    deadline = started + PRODUCE_TIMEOUT + (len(partitions) / rate if rate else 0)
    due = 0  # records the schedule allows so far
    for index, (partition, value) in enumerate(zip(partitions, values, strict=True)):
        while rate is not None and index >= due:
            due = int((time.monotonic() - started) * rate) + 1
            if index >= due:
                producer.poll(0)
                time.sleep(0.002)
        if before_send is not None:
            value = before_send(value)
        while True:
            try:
                producer.produce(topic, value, partition=partition, on_delivery=delivered(index))
                break
            except BufferError:
                producer.poll(0.05)
                if time.monotonic() > deadline:
                    raise BenchError("producing took too long (local queue full)") from None
        producer.poll(0)
    sent = time.monotonic()
    remaining = producer.flush(max(1.0, deadline - time.monotonic()))
    confirmed = time.monotonic()
    if remaining or errors:
        raise BenchError(f"produce: {remaining} unconfirmed, {len(errors)} failed: {errors[:3]}")
    where = [p for p in placed if p is not None]
    if len(where) != len(placed):
        raise BenchError(f"produce: {len(placed) - len(where)} records without a delivery report")
    return Produced(where, sent - started, confirmed - started)
