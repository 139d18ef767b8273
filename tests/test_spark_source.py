"""The Kafka stream source: Spark's checkpoint owns Kafka offsets, every record exactly once.

Spark queries cost a second or two each, so only the behaviours that need the engine
(exactly once, read limits, restart) start one; the rest call the source's methods directly.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("confluent_kafka")

from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from bridges.spark.source import (
    COLUMNS,
    SCHEMA,
    KafkaInputPartition,
    KafkaSource,
    KafkaStreamReader,
    fair_share,
    kafka_stream,
    spark_kafka_available,
)
from bridges.tansu import Tansu

PARTITIONS = 3


def options(tansu: Tansu, topic: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": topic, **extra}


@pytest.fixture
def reader_for(tansu: Tansu) -> Iterator[Any]:
    """Build stream readers the way Spark does (DataSource(options).streamReader) and stop
    them afterwards, so their driver-side consumers close."""
    readers: list[KafkaStreamReader] = []

    def make(topic: str, **extra: str) -> KafkaStreamReader:
        source = KafkaSource(options(tansu, topic, **extra))
        reader = source.streamReader(source.schema())
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        reader.stop()


def produce(
    tansu: Tansu, topic: str, counts: dict[int, int], *, batch: int = 1000, first: int = 0
) -> list[tuple[int, bytes, bytes]]:
    """``counts[p]`` records into partition p (one Kafka batch per ``batch`` records);
    returns (partition, key, value) in produce order. Keys and values carry the number."""
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 50, "log_level": 0})
    sent: list[tuple[int, bytes, bytes]] = []
    failures: list[Any] = []
    n = first
    for partition, count in counts.items():
        for i in range(count):
            key, value = f"k{n}".encode(), f"v{n}".encode() * 3
            producer.produce(
                topic,
                value,
                key,
                partition=partition,
                on_delivery=lambda e, _m: failures.append(e) if e else None,
            )
            sent.append((partition, key, value))
            n += 1
            if (i + 1) % batch == 0:
                assert producer.flush(10) == 0
    assert producer.flush(10) == 0
    assert not failures, failures[:3]
    return sent


def run_available_now(spark: Any, frame: Any, name: str, checkpoint: Path) -> Any:
    """Run an availableNow query into the memory table ``name``; returns the finished query."""
    query = (
        frame.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "availableNow query did not finish in 120 s"
    assert query.exception() is None, query.exception()
    return query


def table_name(topic: str) -> str:
    return "t_" + "".join(c if c.isalnum() else "_" for c in topic)


# -- through Spark ---------------------------------------------------------------------------


def test_every_record_once_with_kafka_columns(
    spark: Any, tansu: Tansu, topic_name: str, tmp_path: Path
) -> None:
    tansu.create_topic(topic_name, PARTITIONS)
    before = time.time()
    sent = produce(tansu, topic_name, {0: 120, 1: 80, 2: 50}, batch=40)
    after = time.time()

    frame = kafka_stream(spark, options(tansu, topic_name))
    assert frame.isStreaming
    assert frame.schema == SCHEMA
    name = table_name(topic_name)
    run_available_now(spark, frame, name, tmp_path / "checkpoint")

    result = spark.table(name)
    assert tuple(result.columns) == COLUMNS
    rows = result.selectExpr("*", "CAST(timestamp AS DOUBLE) AS epoch").collect()
    assert {row.topic for row in rows} == {topic_name}
    got = sorted((row.partition, row.offset, row.key, row.value) for row in rows)
    expected = sorted(
        (partition, offset, key, value)
        for partition in range(PARTITIONS)
        for offset, (key, value) in enumerate((k, v) for p, k, v in sent if p == partition)
    )
    assert got == expected  # every record once, at its Kafka offset
    assert all(before - 5 <= row.epoch <= after + 5 for row in rows)


def test_max_offsets_per_trigger_splits_a_backlog(
    spark: Any, tansu: Tansu, topic_name: str, tmp_path: Path
) -> None:
    tansu.create_topic(topic_name, PARTITIONS)
    produce(tansu, topic_name, {0: 70, 1: 20, 2: 10}, batch=25)

    frame = kafka_stream(spark, options(tansu, topic_name, maxOffsetsPerTrigger="30"))
    name = table_name(topic_name)
    query = run_available_now(spark, frame, name, tmp_path / "checkpoint")

    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(sizes) >= 4, sizes
    assert max(sizes) <= 30, sizes
    assert sum(sizes) == 100
    assert spark.table(name).select("partition", "offset").distinct().count() == 100


def test_restart_reads_only_new_records(
    spark: Any, tansu: Tansu, topic_name: str, tmp_path: Path
) -> None:
    tansu.create_topic(topic_name, PARTITIONS)
    checkpoint = tmp_path / "checkpoint"
    seen: list[list[tuple[int, int, bytes]]] = []

    def run() -> None:
        """One availableNow run from the shared checkpoint (the memory sink cannot
        recover from a checkpoint in append mode; foreachBatch can)."""
        rows: list[tuple[int, int, bytes]] = []
        seen.append(rows)

        def collect(batch: Any, _batch_id: int) -> None:
            rows.extend((r.partition, r.offset, bytes(r.key)) for r in batch.collect())

        query = (
            kafka_stream(spark, options(tansu, topic_name))
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "availableNow query did not finish in 120 s"
        assert query.exception() is None, query.exception()

    first = produce(tansu, topic_name, {0: 30, 1: 20, 2: 10}, batch=7)
    run()
    second = produce(tansu, topic_name, {0: 5, 1: 0, 2: 12}, batch=4, first=len(first))
    run()

    assert sorted(key for _p, _o, key in seen[0]) == sorted(key for _p, key, _v in first)
    assert sorted(key for _p, _o, key in seen[1]) == sorted(key for _p, key, _v in second)
    assert sorted((p, o) for p, o, _k in seen[1] if p == 0) == [(0, o) for o in range(30, 35)]


def test_spark_kafka_connector_is_not_here_so_the_python_source_reads(spark: Any) -> None:
    assert spark_kafka_available(spark) is False


def test_kafka_stream_rejects_bad_options_before_starting(spark: Any) -> None:
    with pytest.raises(ValueError, match="'subscribe'"):
        kafka_stream(spark, {"kafka.bootstrap.servers": "127.0.0.1:9"})


# -- the source's methods, without a query ---------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"subscribe": ""}, "'subscribe' .* is required"),
        ({"subscribe": "a,b"}, "one topic"),
        ({"kafka.bootstrap.servers": " "}, "'kafka.bootstrap.servers' is required"),
        ({"subscribePattern": "a.*"}, "'subscribepattern' is not supported"),
        ({"startingOffsets": "newest"}, "startingOffsets must be"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "subscribes to 't' only"),
        ({"startingOffsets": '{"t": {"x": 1}}'}, "not a partition number"),
        ({"startingOffsets": '{"t": {"0": -3}}'}, "not >= -2"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be a positive integer"),
        ({"maxOffsetsPerTrigger": "lots"}, "maxOffsetsPerTrigger must be a positive integer"),
        ({"kafka.auto.offset.reset": "latest"}, "startingOffsets"),
        ({"kafka.enable.auto.commit": "true"}, "checkpoint"),
        ({"failOnDataLoss": "false"}, "failOnDataLoss"),
    ],
)
def test_bad_options_say_what_is_wrong(extra: dict[str, str], message: str) -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
    with pytest.raises(ValueError, match=message):
        KafkaSource({**base, **extra})


def test_options_are_case_insensitive_and_kafka_settings_pass_through() -> None:
    source = KafkaSource(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "127.0.0.1:9",
            "Subscribe": "t",
            "kafka.client.id": "pipeline",
            "MAXOFFSETSPERTRIGGER": "5",
        }
    )
    reader = source.streamReader(source.schema())
    assert reader.getDefaultReadLimit() == ReadMaxRows(5)
    config = source.kafka.consumer_config()
    assert config["client.id"] == "pipeline"
    assert config["bootstrap.servers"] == "127.0.0.1:9"
    assert config["enable.auto.commit"] is False
    default = KafkaSource({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"})
    assert default.streamReader(SCHEMA).getDefaultReadLimit() == ReadAllAvailable()


def test_starting_offsets_latest_and_json(reader_for: Any, tansu: Tansu, topic_name: str) -> None:
    tansu.create_topic(topic_name, PARTITIONS)
    produce(tansu, topic_name, {0: 10, 1: 10, 2: 10}, batch=4)
    ends = {str(p): tansu.log_end(topic_name, p) for p in range(PARTITIONS)}

    assert reader_for(topic_name).initialOffset() == {"0": 0, "1": 0, "2": 0}
    assert reader_for(topic_name, startingOffsets="LATEST").initialOffset() == ends
    spec = json.dumps({topic_name: {"0": 3, "1": -2, "2": -1}})
    assert reader_for(topic_name, startingOffsets=spec).initialOffset() == {
        "0": 3,
        "1": 0,
        "2": ends["2"],
    }
    partial = json.dumps({topic_name: {"0": 3}})
    with pytest.raises(ValueError, match=r"every partition \[0, 1, 2\]; missing \[1, 2\]"):
        reader_for(topic_name, startingOffsets=partial).initialOffset()


def test_latest_offset_finds_the_log_end_past_a_short_watermark(
    reader_for: Any, tansu: Tansu, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tansu.create_topic(topic_name, 2)
    produce(tansu, topic_name, {0: 25, 1: 9}, batch=10)  # last batches: 5 and 9 records
    reader = reader_for(topic_name)
    watermarks = reader._watermarks([0, 1])
    true_ends = {p: tansu.log_end(topic_name, p) for p in (0, 1)}
    assert true_ends == {0: 25, 1: 9}
    assert all(watermarks[p][1] < true_ends[p] for p in (0, 1)), (
        f"Tansu's watermark is no longer short ({watermarks}): this test needs a broker "
        "whose high watermark lags the log end"
    )

    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 25, "1": 9}
    assert reader.reportLatestOffset() == {"0": 25, "1": 9}

    # The watermarks did not move, so the next call reuses the probe instead of reading.
    def no_probe(_highs: Any) -> Any:
        raise AssertionError("probed although no watermark moved")

    monkeypatch.setattr(reader, "probe_ends", no_probe)
    assert reader.latestOffset({"0": 25, "1": 9}, ReadAllAvailable()) == {"0": 25, "1": 9}


def test_read_limit_is_split_fairly(reader_for: Any, tansu: Tansu, topic_name: str) -> None:
    tansu.create_topic(topic_name, PARTITIONS)
    produce(tansu, topic_name, {0: 100, 1: 3, 2: 50}, batch=100)
    reader = reader_for(topic_name)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadMaxRows(30)) == {"0": 14, "1": 3, "2": 13}
    assert reader.latestOffset(start, ReadMaxRows(2)) == {"0": 1, "1": 0, "2": 1}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 100, "1": 3, "2": 50}
    assert reader.latestOffset({"0": 100, "1": 3, "2": 50}, ReadMaxRows(30)) == {
        "0": 100,
        "1": 3,
        "2": 50,
    }


@pytest.mark.parametrize(
    ("available", "limit"),
    [({0: 5, 1: 5, 2: 5}, 1), ({0: 0, 1: 7}, 3), ({0: 1000, 1: 1, 2: 999}, 100), ({}, 4)],
)
def test_fair_share_never_exceeds_the_limit_and_always_progresses(
    available: dict[int, int], limit: int
) -> None:
    take = fair_share(available, limit)
    assert all(0 <= take[p] <= available[p] for p in available)
    total = sum(available.values())
    assert sum(take.values()) == min(limit, total)


def test_new_partitions_join_at_their_earliest_offset(
    reader_for: Any, tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 2)
    produce(tansu, topic_name, {0: 4, 1: 6})
    reader = reader_for(topic_name)
    # As if the checkpoint was written while the topic had one partition.
    end = reader.latestOffset({"0": 0}, ReadAllAvailable())
    assert end == {"0": 4, "1": 0}
    assert reader.latestOffset(end, ReadAllAvailable()) == {"0": 4, "1": 6}


def test_available_now_stops_at_the_end_it_saw_first(
    reader_for: Any, tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 1)
    produce(tansu, topic_name, {0: 10})
    reader = reader_for(topic_name)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    produce(tansu, topic_name, {0: 5})
    assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 10}
    assert reader.latestOffset({"0": 10}, ReadAllAvailable()) == {"0": 10}


def test_read_returns_exactly_the_range_as_arrow(
    reader_for: Any, tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 1)
    sent = produce(tansu, topic_name, {0: 30}, batch=10)
    reader = pickle.loads(pickle.dumps(reader_for(topic_name)))  # as a task gets it
    # 12 and 17 fall inside Tansu batches: the read must skip 10-11 and stop before 18.
    batches = list(reader.read(KafkaInputPartition(topic_name, 0, 12, 18)))
    assert all(batch.schema.names == list(COLUMNS) for batch in batches)
    table = [row for batch in batches for row in batch.to_pylist()]
    assert [row["offset"] for row in table] == list(range(12, 18))
    assert [(row["key"], row["value"]) for row in table] == [(k, v) for _p, k, v in sent[12:18]]
    assert {(row["topic"], row["partition"]) for row in table} == {(topic_name, 0)}


def test_read_of_missing_records_fails_with_the_range(
    reader_for: Any, tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 1)
    produce(tansu, topic_name, {0: 3})
    reader = reader_for(topic_name, **{"kafkaConsumer.pollTimeoutMs": "500"})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"{topic_name}\[0\] offsets \[0, 10\): read up to 3"):
        list(reader.read(KafkaInputPartition(topic_name, 0, 0, 10)))
    assert time.monotonic() - started < 10


def test_reader_pickles_after_use(reader_for: Any, tansu: Tansu, topic_name: str) -> None:
    tansu.create_topic(topic_name, 1)
    reader = reader_for(topic_name)
    reader.initialOffset()  # creates the driver-side consumer
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._consumer is None
    assert copy.partitions({"0": 0}, {"0": 0}) == []


def test_a_task_hands_over_a_small_first_batch_then_full_ones(
    reader_for: Any, tansu: Tansu, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridges.spark import source

    monkeypatch.setattr(source, "FIRST_CHUNK_ROWS", 100)
    monkeypatch.setattr(source, "CHUNK_ROWS", 1000)
    tansu.create_topic(topic_name, 1)
    produce(tansu, topic_name, {0: 2500})
    reader = reader_for(topic_name)
    batches = list(reader.read(KafkaInputPartition(topic_name, 0, 0, 2500)))
    assert [b.num_rows for b in batches] == [100, 1000, 1000, 400]
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(2500))
