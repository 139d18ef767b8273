"""Getting records out for sure: confirmed publishing with retries, and the dead letters.

Shared by the Kafka bridge (bridges/kafka.py) and the Spark sink (bridges/spark/sink.py):
both may only move on (commit an offset, finish a micro-batch) once every record is either
confirmed by the broker or taken by the dead-letter topic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from broker.client import BrokerError, Client
from broker.errors import ErrorCode
from broker.log import get_logger
from broker.security.tls import describe_failure

log = get_logger("topiary.bridge")

#: The broker's refusals that no retry can change: such a record goes to the dead letters.
PERMANENT_REFUSALS = {ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.INVALID_TOPIC}
LOG_INTERVAL = 5.0
FLUSH_SECONDS = 30.0


def connect_failure(exc: BaseException) -> str:
    """Why connecting to the broker failed, for the log: a failed TLS handshake says why
    (a certificate that does not verify, a name it lacks), which its own text does not."""
    if isinstance(exc, trio.BrokenResourceError):
        return describe_failure(exc)
    return str(exc)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record for the dead-letter topic: as it came, plus why and where from."""

    value: bytes | None
    key: bytes | None
    source: str  # "topic/partition/offset"
    reason: str
    text: str

    def headers(self) -> list[tuple[str, bytes]]:
        return [
            ("topiary.reason", self.reason.encode()),
            ("topiary.error", self.text.encode("utf-8", "replace")[:1000]),
            ("topiary.source", self.source.encode()),
        ]


@dataclass(slots=True)
class DeliveryCounters:
    published: int = 0  # confirmed by the broker
    refused: int = 0  # refused by the broker for good (too large, ...): dead-lettered
    publish_retries: int = 0  # records published again after a passing refusal
    dead_lettered: int = 0  # delivered to the dead-letter topic
    dead_letter_retries: int = 0


@dataclass(slots=True)
class RateLimit:
    """At most one warning of a kind per interval: an outage is one story, not thousands
    of lines."""

    interval: float = LOG_INTERVAL
    _last: dict[str, float] = field(default_factory=dict)

    def __call__(self, what: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(what, -math.inf) < self.interval:
            return False
        self._last[what] = now
        return True


async def publish_all(
    client: Client,
    items: Sequence[tuple[str, bytes, str | None]],
    *,
    counters: DeliveryCounters,
    backoff_max: float,
    may_log: Callable[[str], bool],
) -> list[tuple[int, BrokerError]]:
    """Publish ``(topic, payload, msg_id)`` items with confirmation until each is confirmed
    or refused for good; passing refusals (a full durable session that rejects publishes,
    a storage error) are retried with backoff, which is how a slow broker slows the caller.

    Returns ``(index, refusal)`` for the items refused for good.
    """
    pending = list(range(len(items)))
    refused: list[tuple[int, BrokerError]] = []
    backoff = 0.05
    while pending:
        results = await client.publish_confirmed([items[i] for i in pending])
        retry = []
        for index, error in zip(pending, results, strict=True):
            if error is None:
                counters.published += 1
            elif error.code in PERMANENT_REFUSALS:
                refused.append((index, error))
            else:
                retry.append(index)
        if retry:
            counters.publish_retries += len(retry)
            first = next(e for e in results if e is not None and e.code not in PERMANENT_REFUSALS)
            if may_log("refused"):
                log.warning("broker refused records; retrying", records=len(retry),
                            code=str(first.code), text=first.text,
                            retries=counters.publish_retries)  # fmt: skip
            await trio.sleep(backoff)
            backoff = min(backoff * 2, backoff_max)
        pending = retry
    counters.refused += len(refused)
    return refused


async def send_dead_letters(
    producer: Any,
    topic: str,
    letters: Sequence[DeadLetter],
    *,
    counters: DeliveryCounters,
    backoff_max: float,
    may_log: Callable[[str], bool],
) -> None:
    """Produce every letter to ``topic`` and wait until Kafka has each; failed deliveries
    are produced again with backoff, for as long as it takes."""
    pending = list(letters)
    backoff = 0.1
    while pending:
        failed: list[DeadLetter] = []
        for letter in pending:
            while True:
                try:
                    producer.produce(
                        topic,
                        value=letter.value,
                        key=letter.key,
                        headers=letter.headers(),
                        on_delivery=_note_failure(failed, letter),
                    )
                    break
                except BufferError:  # librdkafka's queue is full: let it drain
                    await trio.to_thread.run_sync(producer.poll, 0.1)
        while await trio.to_thread.run_sync(producer.flush, FLUSH_SECONDS):
            if may_log("dead-letter-slow"):
                log.warning("dead-letter topic slow to confirm; still waiting", topic=topic)
        counters.dead_lettered += len(pending) - len(failed)
        if failed:
            counters.dead_letter_retries += len(failed)
            if may_log("dead-letter"):
                log.warning("dead-letter delivery failed; retrying", records=len(failed))
            await trio.sleep(backoff)
            backoff = min(backoff * 2, backoff_max)
        pending = failed


def _note_failure(failed: list[DeadLetter], letter: DeadLetter) -> Callable[[Any, Any], None]:
    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(letter)

    return delivered
