"""Where each partition's log really ends, for the bridge's consumer-lag metric.

The trap (DESIGN.md): Tansu's high watermark can stop short of the log end (it reports the
first offset of the last produced batch plus one), so the watermark alone is only a lower
bound of the end, and lag computed from it reads 0 while a whole batch is still unread.
``LogEnds`` therefore reads the end: per partition it asks for the watermark ``hi`` and,
wherever ``hi`` moved since the last probe, reads the partition from ``hi - 1`` up to its
EOF; the fetch returns the whole batch holding ``hi - 1``, so the EOF position (or the last
offset seen plus one) is the true end. A partition whose watermark has not moved keeps the
end its last probe found (an append always raises the watermark), so a quiet partition
costs one watermark request per refresh. On Kafka the watermark is right and a probe is one
small fetch.

It owns a consumer of its own that only ``assign()``s (it never joins the bridge's group
and never commits), and it blocks: call it from a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bridges.config import BridgeConfig, consumer_only

METADATA_TIMEOUT = 2.0
PROBE_TIMEOUT = 2.0
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has committed nothing there


@dataclass(frozen=True, slots=True)
class PartitionEnds:
    """One partition as Kafka sees it now."""

    low: int  # the first offset still in the log
    end: int  # the offset the next record will get (the true log end)
    committed: int  # the bridge's group's committed offset; NO_OFFSET when none


class LogEnds:
    """Reads the true log end (and the group's committed offset) of a topic's partitions."""

    def __init__(self, config: BridgeConfig, *, probe_timeout: float = PROBE_TIMEOUT) -> None:
        self.topic = config.topic
        self.probe_timeout = probe_timeout
        # Connection and security settings of [kafka], none of the group's behaviour: the
        # group id only names whose committed offsets to read.
        self.settings: dict[str, Any] = {
            **{k: v for k, v in config.kafka.items() if not consumer_only(k)},
            "group.id": config.kafka["group.id"],
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "log.connection.close": False,
        }
        self._consumer: Any = None
        self._probed: dict[int, tuple[int, int]] = {}  # partition -> (watermark, end found)

    def read(self, partitions: Iterable[int]) -> dict[int, PartitionEnds]:
        """The ends of ``partitions`` (blocking: network round trips and maybe a probe)."""
        from confluent_kafka import TopicPartition

        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        consumer = self._open()
        marks: dict[int, tuple[int, int]] = {}
        for p in wanted:
            lo, hi = consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=METADATA_TIMEOUT, cached=False
            )
            marks[p] = (int(lo), int(hi))
        ends: dict[int, int] = {}
        to_probe: dict[int, int] = {}
        for p, (lo, hi) in marks.items():
            seen = self._probed.get(p)
            if hi <= lo:
                ends[p] = hi  # empty: nothing written, or retention removed it all
            elif seen is not None and seen[0] == hi:
                ends[p] = seen[1]
            else:
                to_probe[p] = hi
        if to_probe:
            ends |= self._probe(to_probe)
        committed = consumer.committed(
            [TopicPartition(self.topic, p) for p in wanted], timeout=METADATA_TIMEOUT
        )
        done = {tp.partition: int(tp.offset) for tp in committed}
        return {p: PartitionEnds(marks[p][0], ends[p], done.get(p, NO_OFFSET)) for p in wanted}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _open(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(self.settings)
        return self._consumer

    def _probe(self, highs: dict[int, int]) -> dict[int, int]:
        """Read every partition from ``hi - 1`` to its EOF, all at once. One that shows no
        EOF within ``probe_timeout`` keeps what it showed and is probed again next time."""
        from confluent_kafka import KafkaError, TopicPartition

        consumer = self._consumer
        ends = dict(highs)
        pending = set(highs)
        consumer.assign([TopicPartition(self.topic, p, hi - 1) for p, hi in highs.items()])
        deadline = time.monotonic() + self.probe_timeout
        try:
            while pending and (now := time.monotonic()) < deadline:
                for message in consumer.consume(10_000, timeout=min(0.05, deadline - now)):
                    p, error = message.partition(), message.error()
                    if error is None:
                        ends[p] = max(ends[p], message.offset() + 1)
                    elif error.code() == KafkaError._PARTITION_EOF:
                        ends[p] = max(ends[p], message.offset())
                        if p in pending:
                            self._probed[p] = (highs[p], ends[p])
                            pending.discard(p)
        finally:
            consumer.unassign()
        return ends
