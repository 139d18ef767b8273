"""The Tansu test broker and the fault proxy: what Kafka-facing tests can rely on."""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bridges.tansu import Tansu, TansuUnavailable, free_port, start_tansu
from tests.conftest import unique_topic
from tests.faultproxy import FaultProxy

N = 1000
PARTITIONS = 3

# Reconnect quickly after a cut: librdkafka's default backoff grows to 10 s (1 s for retries).
FAST_RECONNECT = {
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 200,
    "retry.backoff.ms": 20,
    "retry.backoff.max.ms": 200,
}


def produce(
    bootstrap: str, topic: str, values: Iterable[int], batch: int = N, **config: Any
) -> Counter[int]:
    """Send each value to partition ``value % PARTITIONS`` (flushing every ``batch``).

    Returns records acknowledged per partition.
    """
    acked: Counter[int] = Counter()

    def on_delivery(err: Any, msg: Message) -> None:
        assert err is None, err
        acked[msg.partition()] += 1

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    for count, value in enumerate(values, 1):
        partition = value % PARTITIONS
        producer.produce(topic, str(value).encode(), partition=partition, on_delivery=on_delivery)
        if count % batch == 0:
            assert producer.flush(10) == 0
    assert producer.flush(10) == 0
    return acked


def new_consumer(bootstrap: str, **config: Any) -> Consumer:
    """A consumer for manual assign(): a group consumer would wait out a session timeout."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",  # required, never joined
            "enable.auto.commit": False,
            **config,
        }
    )


def read(consumer: Consumer, count: int, timeout: float = 10) -> list[Message]:
    """Up to ``count`` records from the consumer's assignment, within ``timeout`` seconds."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.consume(count - len(got), timeout=0.05):
            assert msg.error() is None, msg.error()
            got.append(msg)
    return got


def from_start(topic: str, partitions: int = PARTITIONS) -> list[TopicPartition]:
    return [TopicPartition(topic, p, 0) for p in range(partitions)]


# -- the broker -------------------------------------------------------------------------


def test_reads_back_every_record_from_three_partitions(tansu: Tansu) -> None:
    topic = unique_topic("roundtrip")
    tansu.create_topic(topic, PARTITIONS)
    acked = produce(tansu.bootstrap, topic, range(N))
    assert sum(acked.values()) == N

    consumer = new_consumer(tansu.bootstrap)
    try:
        consumer.assign(from_start(topic))
        got = read(consumer, N)
    finally:
        consumer.close()

    assert sorted(int(m.value()) for m in got) == list(range(N))
    for partition in range(PARTITIONS):
        offsets = [m.offset() for m in got if m.partition() == partition]
        assert offsets == list(range(acked[partition]))


def test_create_topic_twice_is_fine(tansu: Tansu) -> None:
    topic = unique_topic("twice")
    tansu.create_topic(topic, PARTITIONS)
    tansu.create_topic(topic, PARTITIONS)


def test_log_end_counts_records_produced_in_batches(tansu: Tansu) -> None:
    # Several flushed batches per partition: Tansu's watermark may stop inside the last one.
    topic = unique_topic("logend")
    tansu.create_topic(topic, PARTITIONS)
    acked = produce(tansu.bootstrap, topic, range(N), batch=97)

    ends = {p: tansu.log_end(topic, p) for p in range(PARTITIONS)}

    assert ends == dict(acked)
    assert sum(ends.values()) == N


def test_log_end_of_an_empty_partition_is_zero(tansu: Tansu) -> None:
    topic = unique_topic("empty")
    tansu.create_topic(topic)
    started = time.monotonic()
    assert tansu.log_end(topic, 0) == 0
    assert time.monotonic() - started < 2  # answered, not timed out


def test_start_tansu_on_a_taken_port_says_why() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        try:
            broker = start_tansu(port, ready_timeout=5)
        except TansuUnavailable as exc:
            assert "exited" in str(exc)
            assert "Address in use" in str(exc)  # the tail of Tansu's own log
        else:
            broker.stop()
            pytest.fail("Tansu started on a port another socket holds")


# -- the fault proxy --------------------------------------------------------------------


@pytest.fixture
def proxied(tansu: Tansu) -> Iterator[tuple[Tansu, FaultProxy]]:
    """A private Tansu that advertises a FaultProxy, so every client goes through the proxy.

    Depends on the session broker only so that both skip together when Tansu cannot run.
    """
    port = free_port()
    with FaultProxy(("127.0.0.1", port)) as proxy:
        try:
            broker = start_tansu(port, advertised_port=proxy.port)
        except TansuUnavailable as exc:
            pytest.skip(f"Tansu not available: {exc}")
        with broker:
            yield broker, proxy


def via(proxy: FaultProxy) -> str:
    return f"127.0.0.1:{proxy.port}"


def test_proxy_forwards_kafka_traffic(proxied: tuple[Tansu, FaultProxy]) -> None:
    broker, proxy = proxied
    topic = unique_topic("proxy")
    broker.create_topic(topic, PARTITIONS)
    produce(via(proxy), topic, range(30))

    consumer = new_consumer(via(proxy))
    try:
        consumer.assign(from_start(topic))
        got = read(consumer, 30)
    finally:
        consumer.close()

    assert sorted(int(m.value()) for m in got) == list(range(30))
    assert proxy.connections > 0


def test_cut_drops_connections_and_refuses_until_restore(
    proxied: tuple[Tansu, FaultProxy],
) -> None:
    _broker, proxy = proxied
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as open_conn:
        deadline = time.monotonic() + 2
        while proxy.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.005)  # the proxy's thread has no event to wait on: poll
        proxy.cut()
        with contextlib.suppress(ConnectionResetError):  # a reset also means "gone"
            assert open_conn.recv(1) == b"", "the open connection ends"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()

    proxy.restore()
    socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()


def test_clients_resume_after_cut_and_restore(proxied: tuple[Tansu, FaultProxy]) -> None:
    broker, proxy = proxied
    topic = unique_topic("resume")
    broker.create_topic(topic)
    producer = Producer({"bootstrap.servers": via(proxy), "linger.ms": 0, **FAST_RECONNECT})
    consumer = new_consumer(via(proxy), **FAST_RECONNECT)
    try:
        consumer.assign(from_start(topic, 1))
        for i in range(5):
            producer.produce(topic, b"before-%d" % i, partition=0)
        assert producer.flush(10) == 0
        assert [m.value() for m in read(consumer, 5)] == [b"before-%d" % i for i in range(5)]

        proxy.cut()
        for i in range(5):
            producer.produce(topic, b"during-%d" % i, partition=0)
        assert producer.flush(0.3) == 5, "nothing can be delivered while the broker is gone"
        assert read(consumer, 1, timeout=0.3) == []
        accepted = proxy.connections

        proxy.restore()
        # Nobody reconnects the clients by hand: librdkafka does it on its own.
        assert producer.flush(10) == 0
        got = read(consumer, 5)
    finally:
        consumer.close()

    assert [m.value() for m in got] == [b"during-%d" % i for i in range(5)]
    assert [m.offset() for m in got] == list(range(5, 10))
    assert proxy.connections > accepted
