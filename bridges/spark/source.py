"""Kafka as a Spark stream: Spark's own connector when present, else a Python data source.

On a real cluster ``spark-sql-kafka`` (``spark.jars.packages``) is the better reader. Where
its jar cannot be had, :class:`KafkaSource` reads Kafka through confluent-kafka inside
Spark's Python data source API (PySpark 4.2+, read limits). :func:`kafka_stream` picks one
and returns the same six columns either way: topic, partition, offset, timestamp, key, value.

Offsets are Kafka's own (``{"<partition>": next offset}``), so Spark's checkpoint holds them
and a restarted query goes on where the last committed batch ended; nothing is committed to
Kafka. Every client only ``assign()``s partitions: a group consumer waits seconds for its
first assignment on Tansu, and Spark, not Kafka, owns the positions.

Two things keep the reader correct on brokers whose high watermark lags the log end (Tansu
reports the first offset of the last batch plus one): the driver learns the end by reading
from ``hi - 1`` up to the partition EOF (cheap, and only when ``hi`` moved), and a task
reads ``[start, end)`` by offsets, stopping at the first record at or past ``end - 1`` or an
EOF at or past ``end``, never on a watermark; a range that stops arriving fails the task.

confluent-kafka clients cannot be pickled and only exist where they are used: built lazily
on the driver (metadata, watermarks, probes) and inside ``read()`` on executors.
"""

from __future__ import annotations

import json
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Consumer
    from pyspark.sql import DataFrame, SparkSession

#: The columns both readers yield, in this order.
COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value")
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
    ]
)
#: Spark's own Kafka source; on the classpath when spark-sql-kafka is.
SPARK_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

CHUNK_ROWS = 10_000  # rows per Arrow batch handed to Spark
#: A task's first Arrow batch: small, so its rows are mapped and published while the rest
#: is read (a fresh query's first delivery comes ~0.5 s sooner on 2 cores).
FIRST_CHUNK_ROWS = 1_000
DEFAULT_POLL_MS = 60_000  # a task fails after this long without a record
DEFAULT_PROBE_MS = 10_000  # the driver's log-end probe gives up after this
PROBE_GRACE = 0.2  # seconds a probed partition may keep reading after its first record
METADATA_TIMEOUT = 30.0

# Spark Kafka options this source does not implement: failing beats silently ignoring them.
_UNSUPPORTED = {
    "assign": "only 'subscribe' with one topic is supported",
    "subscribepattern": "only 'subscribe' with one topic is supported",
    "startingtimestamp": "use startingOffsets",
    "startingoffsetsbytimestamp": "use startingOffsets",
    "minoffsetspertrigger": "only maxOffsetsPerTrigger is supported",
    "maxtriggerdelay": "only maxOffsetsPerTrigger is supported",
    "endingoffsets": "this source only streams",
}
# Client settings the source must own (Spark's Kafka source refuses the same ones).
_OWNED_CLIENT_SETTINGS = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint, never in Kafka",
    "enable.partition.eof": "the source needs partition EOF events to find the log end",
    "key.deserializer": "keys are always bytes",
    "value.deserializer": "values are always bytes",
}


@dataclass(frozen=True)
class KafkaOptions:
    """The source options, checked once on the driver; picklable, so tasks get them too."""

    bootstrap: str
    topic: str
    client: dict[str, str] = field(default_factory=dict)  # kafka.* minus the prefix
    #: "earliest", "latest", or {partition: offset} with -2 earliest and -1 latest.
    starting: str | dict[int, int] = "earliest"
    max_per_trigger: int | None = None
    poll_timeout: float = DEFAULT_POLL_MS / 1000
    probe_timeout: float = DEFAULT_PROBE_MS / 1000

    def consumer_config(self, **extra: Any) -> dict[str, Any]:
        """confluent-kafka settings for an assign-only consumer that never commits."""
        return {
            # Required by the client, never joined: the consumers only assign().
            "group.id": f"topiary-spark-{uuid.uuid4().hex}",
            # Spark's Kafka source reads uncommitted too (the Java client's default).
            "isolation.level": "read_uncommitted",
            "log_level": 3,
            **extra,
            **self.client,
            "bootstrap.servers": self.bootstrap,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # A range below the log start (deleted by retention) fails instead of skipping.
            "auto.offset.reset": "error",
        }


def parse_options(options: Mapping[str, str]) -> KafkaOptions:
    """Check the options the way Spark's Kafka source names them; ValueError says what's off."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    for key, reason in _UNSUPPORTED.items():
        if key in opts:
            raise ValueError(f"topiary_kafka: option {key!r} is not supported: {reason}")
    bootstrap = opts.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise ValueError("topiary_kafka: option 'kafka.bootstrap.servers' is required")
    topic = opts.get("subscribe", "").strip()
    if not topic:
        raise ValueError("topiary_kafka: option 'subscribe' (one topic) is required")
    if "," in topic:
        raise ValueError(f"topiary_kafka: 'subscribe' takes one topic, got {topic!r}")
    client: dict[str, str] = {}
    for key, value in opts.items():
        if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
            continue
        name = key.removeprefix("kafka.")
        if name in _OWNED_CLIENT_SETTINGS:
            raise ValueError(
                f"topiary_kafka: option {key!r} is not supported: {_OWNED_CLIENT_SETTINGS[name]}"
            )
        client[name] = value
    if opts.get("failondataloss", "true").lower() != "true":
        raise ValueError("topiary_kafka: failOnDataLoss=false is not supported")
    if opts.get("includeheaders", "false").lower() != "false":
        raise ValueError("topiary_kafka: includeHeaders is not supported (no headers column)")
    return KafkaOptions(
        bootstrap=bootstrap,
        topic=topic,
        client=client,
        starting=_parse_starting(opts.get("startingoffsets", "earliest"), topic),
        max_per_trigger=_positive_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
        poll_timeout=_timeout(
            opts, "kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_MS
        ),
        probe_timeout=_timeout(opts, "probetimeoutms", "probeTimeoutMs", DEFAULT_PROBE_MS),
    )


def _parse_starting(text: str, topic: str) -> str | dict[int, int]:
    """'earliest', 'latest' or Spark's JSON ({"topic": {"0": 23, "1": -2}})."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    bad = (
        f"topiary_kafka: startingOffsets must be 'earliest', 'latest' or JSON like "
        f'{{"{topic}": {{"0": 23, "1": -2}}}} (-2 earliest, -1 latest), got {text!r}'
    )
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ValueError(bad) from None
    if not isinstance(parsed, dict) or not parsed:
        raise ValueError(bad)
    if set(parsed) != {topic}:
        raise ValueError(
            f"topiary_kafka: startingOffsets names topics {sorted(parsed)}, "
            f"but the source subscribes to {topic!r} only"
        )
    per_partition = parsed[topic]
    if not isinstance(per_partition, dict) or not per_partition:
        raise ValueError(bad)
    starting: dict[int, int] = {}
    for key, offset in per_partition.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"{bad}: partition {key!r} is not a partition number")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
            raise ValueError(f"{bad}: offset {offset!r} for partition {key} is not >= -2")
        starting[int(key)] = offset
    return starting


def _positive_int(opts: Mapping[str, str], key: str, name: str) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"topiary_kafka: {name} must be a positive integer, got {opts[key]!r}")
    return value


def _timeout(opts: Mapping[str, str], key: str, name: str, default_ms: int) -> float:
    value = _positive_int(opts, key, name)
    return (default_ms if value is None else value) / 1000


def fair_share(available: Mapping[int, int], max_rows: int) -> dict[int, int]:
    """Split ``max_rows`` across partitions max-min fairly: small backlogs are read whole,
    the rest share what is left equally. Never more than ``max_rows`` in total, and at
    least one row when any is available (so a tight limit still makes progress)."""
    take = {p: 0 for p in available}
    waiting = sorted((n, p) for p, n in available.items() if n > 0)
    budget = max(1, max_rows) if waiting else 0
    for i, (n, p) in enumerate(waiting):
        share = min(n, budget // (len(waiting) - i))
        take[p] = share
        budget -= share
    return take


def limit_rows(available: Mapping[int, int], limit: ReadLimit) -> dict[int, int]:
    """Rows to read per partition under Spark's ``limit``."""
    if isinstance(limit, ReadAllAvailable):
        return dict(available)
    if isinstance(limit, ReadMaxRows):
        return fair_share(available, limit.max_rows)
    if isinstance(limit, ReadMinRows):
        enough = sum(available.values()) >= limit.min_rows
        return dict(available) if enough else {p: 0 for p in available}
    raise ValueError(f"topiary_kafka: read limit {limit!r} is not supported")


def _offsets(by_partition: Mapping[int, int]) -> dict[str, int]:
    """Spark's form: string keys, in partition order (equal offsets must serialise equal)."""
    return {str(p): int(by_partition[p]) for p in sorted(by_partition)}


def _partition_offsets(offsets: Mapping[str, int]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offsets.items()}


class KafkaInputPartition(InputPartition):
    """One task: records ``[start, end)`` of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class KafkaSource(DataSource):
    """``spark.readStream.format("topiary_kafka")``: Kafka through confluent-kafka."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.kafka = parse_options(options)  # fail at load(), not in the first batch

    @classmethod
    def name(cls) -> str:
        return "topiary_kafka"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(self.kafka)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans ranges of Kafka offsets on the driver and reads them in tasks."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None  # driver only, created on first use
        # Per partition, the high watermark at the last probe and the end it found: while
        # the watermark stays put the end does, so a quiet partition is not probed again.
        self._probed: dict[int, tuple[int, int]] = {}
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow's stopping point
        self._latest: dict[int, int] | None = None  # for reportLatestOffset

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None  # Spark pickles the reader into its tasks
        return state

    # -- driver side ----------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        starting = self.options.starting
        watermarks = self._watermarks(self._partitions())
        if starting == "earliest":
            return _offsets({p: lo for p, (lo, _hi) in watermarks.items()})
        if starting == "latest":
            return _offsets(self._ends(watermarks))
        assert isinstance(starting, dict)
        missing = sorted(set(watermarks) - set(starting))
        unknown = sorted(set(starting) - set(watermarks))
        if missing or unknown:
            raise ValueError(
                f"topiary_kafka: startingOffsets for {self.options.topic!r} must name every "
                f"partition {sorted(watermarks)}; missing {missing}, unknown {unknown}"
            )
        latest = [p for p, offset in starting.items() if offset == -1]
        ends = self._ends({p: watermarks[p] for p in latest})
        resolved = {
            p: watermarks[p][0] if offset == -2 else ends[p] if offset == -1 else offset
            for p, offset in starting.items()
        }
        return _offsets(resolved)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end now: an availableNow query stops there, whatever arrives meanwhile."""
        self._target = self._ends(self._watermarks(self._partitions()))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_per_trigger)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The end of the next batch: the true log end (or the availableNow target), cut
        down to ``limit``. Partitions new since ``start`` join at their earliest offset and
        are read from the next batch on."""
        begin = _partition_offsets(start)
        if self._target is not None:
            ends = dict(self._target)
            new = [p for p in ends if p not in begin]
            lows = {p: lo for p, (lo, _hi) in self._watermarks(new).items()}
        else:
            watermarks = self._watermarks(self._partitions())
            ends = self._ends(watermarks)
            self._latest = ends
            lows = {p: lo for p, (lo, _hi) in watermarks.items() if p not in begin}
        available = {p: max(0, ends[p] - offset) for p, offset in begin.items() if p in ends}
        take = limit_rows(available, limit)
        end = {p: offset + take.get(p, 0) for p, offset in begin.items()}
        return _offsets(end | lows)

    def reportLatestOffset(self) -> dict[str, int] | None:
        latest = self._latest if self._target is None else self._target
        return None if latest is None else _offsets(latest)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        begin, stop = _partition_offsets(start), _partition_offsets(end)
        topic = self.options.topic
        return [
            KafkaInputPartition(topic, p, begin[p], stop[p])
            for p in sorted(stop)
            if p in begin and begin[p] < stop[p]
        ]

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, which is what a restart
        reads; committing them to Kafka too would only be a second, weaker copy."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _driver(self) -> Consumer:
        if self._consumer is None:
            from confluent_kafka import Consumer

            # Short fetch waits: a probe's EOF arrives after one empty fetch.
            self._consumer = Consumer(self.options.consumer_config(**{"fetch.wait.max.ms": 10}))
        return self._consumer

    def _partitions(self) -> list[int]:
        """The topic's partitions; none while it does not exist (it may be created later)."""
        from confluent_kafka import KafkaError

        topic = self.options.topic
        metadata = self._driver().list_topics(topic, timeout=METADATA_TIMEOUT)
        info = metadata.topics.get(topic)
        if info is None:
            return []
        if info.error is not None:
            if info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return []
            raise RuntimeError(f"topiary_kafka: metadata for {topic!r}: {info.error}")
        return sorted(info.partitions)

    def _watermarks(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        from confluent_kafka import TopicPartition

        consumer = self._driver()
        marks: dict[int, tuple[int, int]] = {}
        for p in partitions:
            tp = TopicPartition(self.options.topic, p)
            lo, hi = consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT, cached=False)
            marks[p] = (int(lo), int(hi))
        return marks

    def _ends(self, watermarks: Mapping[int, tuple[int, int]]) -> dict[int, int]:
        """The offset after the last record of each partition: the watermark, raised by a
        probe wherever the watermark moved since the last probe."""
        ends: dict[int, int] = {}
        to_probe: dict[int, int] = {}
        for p, (lo, hi) in watermarks.items():
            seen = self._probed.get(p)
            if hi <= lo:
                ends[p] = hi  # empty: nothing was written, or retention removed it all
            elif seen is not None and seen[0] == hi:
                ends[p] = max(hi, seen[1])
            else:
                to_probe[p] = hi
        if to_probe:
            ends |= self.probe_ends(to_probe)
        return ends

    def probe_ends(self, highs: Mapping[int, int]) -> dict[int, int]:
        """Read every partition from its ``hi - 1`` to the EOF, all at once.

        The fetch at ``hi - 1`` returns the whole batch holding it, so the EOF position (or
        the last offset seen + 1) is the log end even where the watermark lags. On Kafka the
        watermark is right and this costs one small fetch. A partition that shows no EOF
        within ``probe_timeout`` keeps what it saw and is probed again next time.
        """
        from confluent_kafka import KafkaError, TopicPartition

        consumer = self._driver()
        topic = self.options.topic
        ends = dict(highs)
        first_seen: dict[int, float] = {}
        pending = set(highs)
        consumer.assign([TopicPartition(topic, p, hi - 1) for p, hi in highs.items()])
        deadline = time.monotonic() + self.options.probe_timeout
        try:
            while pending and (now := time.monotonic()) < deadline:
                for message in consumer.consume(10_000, timeout=min(0.05, deadline - now)):
                    p = message.partition()
                    error = message.error()
                    if error is None:
                        ends[p] = max(ends[p], message.offset() + 1)
                        first_seen.setdefault(p, time.monotonic())
                    elif error.code() == KafkaError._PARTITION_EOF:
                        ends[p] = max(ends[p], message.offset())
                        if p in pending:
                            self._probed[p] = (highs[p], ends[p])
                            pending.discard(p)
                    elif _fails(message, topic):
                        raise RuntimeError(f"topiary_kafka: probing {topic}[{p}]: {error}")
                # Busy partitions may never show an EOF; what they showed so far exists.
                now = time.monotonic()
                pending -= {p for p, t in first_seen.items() if now - t >= PROBE_GRACE}
        finally:
            consumer.unassign()
        return ends

    # -- task side ------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Records ``[start, end)`` of one partition as Arrow batches of CHUNK_ROWS rows
        (the first one FIRST_CHUNK_ROWS).

        Done at the first record at or past ``end - 1`` (compaction may have removed
        ``end - 1`` itself) or an EOF at or past ``end`` (a transaction marker may hold the
        last offsets). No record for ``poll_timeout`` fails the task: a short range
        silently returned would be data loss that the checkpoint then makes permanent.
        """
        assert isinstance(partition, KafkaInputPartition)
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        topic, p, start, end = partition.topic, partition.partition, partition.start, partition.end
        consumer = Consumer(self.options.consumer_config())
        rows = _Rows(topic, p)
        try:
            consumer.assign([TopicPartition(topic, p, start)])
            position = start  # next offset wanted
            chunk = FIRST_CHUNK_ROWS
            last_progress = time.monotonic()
            while position < end:
                messages = consumer.consume(min(chunk - len(rows), end - position), timeout=0.5)
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            if not _fails(message, topic):
                                continue  # the client retries; poll_timeout bounds the wait
                            raise RuntimeError(
                                f"topiary_kafka: reading {topic}[{p}] offsets [{start}, {end}) "
                                f"at {position}: {error}"
                            )
                        if message.offset() >= end:
                            position = end
                        continue
                    offset = message.offset()
                    if offset < position:
                        continue  # before the range (or a repeat)
                    if offset < end:
                        rows.add(message)
                    position = offset + 1 if offset < end - 1 else end
                    if position >= end:
                        break
                now = time.monotonic()
                if messages:
                    last_progress = now
                elif now - last_progress > self.options.poll_timeout:
                    raise RuntimeError(
                        f"topiary_kafka: {topic}[{p}] offsets [{start}, {end}): read up to "
                        f"{position}, then nothing for {self.options.poll_timeout:g} s; "
                        "the planned records are missing (deleted, or the broker lags)"
                    )
                if len(rows) >= chunk:
                    yield rows.batch()
                    chunk = CHUNK_ROWS
            if len(rows):
                yield rows.batch()
        finally:
            consumer.close()


def _fails(message: Any, topic: str) -> bool:
    """Whether a consumer error event is final for our partition. Connection trouble comes
    as client-wide (no topic) or retriable events that librdkafka recovers from itself."""
    error = message.error()
    return bool(error.fatal()) or (message.topic() == topic and not error.retriable())


class _Rows:
    """Column buffers for one partition's records, cut into Arrow batches."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, message: Any) -> None:
        kind, millis = message.timestamp()
        self.offsets.append(message.offset())
        self.timestamps.append(millis * 1000 if kind else None)  # 0: TIMESTAMP_NOT_AVAILABLE
        self.keys.append(message.key())
        self.values.append(message.value())

    def batch(self) -> pa.RecordBatch:
        import pyarrow as pa

        n = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.topic] * n, pa.string()),
                pa.array([self.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
            ],
            names=list(COLUMNS),
        )
        self.offsets, self.timestamps, self.keys, self.values = [], [], [], []
        return batch


# -- choosing a reader -----------------------------------------------------------------------

_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Make ``format("topiary_kafka")`` available in this session."""
    spark.dataSource.register(KafkaSource)
    _registered.add(spark)


def spark_kafka_available(spark: SparkSession) -> bool:
    """Whether Spark's own Kafka source (spark-sql-kafka) is on the driver's classpath."""
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(SPARK_KAFKA_PROVIDER, False, loader)
    except Exception:  # no JVM (Spark Connect) or class not found
        return False
    return True


def kafka_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """A streaming DataFrame of ``options["subscribe"]`` with :data:`COLUMNS`, read by
    Spark's Kafka source when it is there, else by :class:`KafkaSource`."""
    if spark_kafka_available(spark):
        fmt = "kafka"
    else:
        parse_options(options)  # a clear ValueError here, not a wrapped one from a worker
        if spark not in _registered:  # registering again logs a warning each time
            register(spark)
        fmt = KafkaSource.name()
    frame = spark.readStream.format(fmt).options(**dict(options)).load()
    return frame.select(*COLUMNS)
