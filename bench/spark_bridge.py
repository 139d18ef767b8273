"""Spark pipeline benchmark: ``topiary bridge spark`` against the plain bridge, side by side.

    python bench/spark_bridge.py [--quick] [--json PATH] [--events N] [--only RUNS]
                                 [--max-offsets M] [--live-rate R] [--live-seconds S]
                                 [--trigger SECONDS] [--log-dir DIR]

Why: the Spark pipeline (bridges/spark, docs/spark.md) is the bridge as a Structured
Streaming job, for scale-out. On one machine it can only show what it costs against the
plain bridge (bench/bridge.py): steady events/s, time to the first batch and end-to-end
latency, for the same stream and the same filters, in one run.

The stream is bench/bridge.py's: 500-byte JSON beacons in 4 partitions, the record at
offset o of a partition has site ``s{o % 100:02d}`` and the last one of each partition is a
sentinel (site s00), so ``beacon/*/*/s0*/>`` wants exactly 10% and ``beacon/>`` 100%.
Every run gets its own topic, fresh broker and subscriber (a lean raw reader in this
process), and one pipeline as a subprocess: the plain bridge (``python -m broker.cli bridge
kafka``, fresh ``group.id``) or the Spark pipeline (``python -m broker.cli bridge spark``,
fresh checkpoint, ``master = "local[2]"``, ``trigger = 0`` (back to back),
``max_offsets_per_trigger`` M = 200,000 (the bridge's default), ``filter = "table"`` or
``"regex"``).

Runs (``--only``): ``{plain,table,regex}-{10,100}`` and, at 10%, ``-1k``: the subscriber
holds 999 more filters ``beacon/*/*/zz{i}/>`` that match nothing in the stream, so the
route table has 1,000 filters (a regex alternation of 1,000 branches that share the
``beacon/`` prefix and fail at the fourth level, against one SubscriptionTable lookup per
distinct topic).

The driver JVM starts with the bridge's class cache (``[spark] class_cache``,
bridges/spark/classcache.py) as ``topiary bridge spark`` does: the first Spark run that finds
no archive writes one when it stops ("jvm cold" in the table), the later ones map it ("jvm
warm"). ``--class-cache ''`` turns it off; a quick run has it off.

``table-10-small`` is table-10 with batches of M/4 (50,000): every micro-batch has a fixed
cost (planning, task start, commits; about half a second here), which smaller batches pay
more often.

Phase 1, throughput: N records (1,000,000) are produced before the pipeline starts.

- time to first batch = spawning the pipeline -> the subscriber's first delivery (Python,
  JVM and SparkSession start-up, the route table, the first micro-batch or, for the plain
  bridge, the consumer group join and the first 5,000-record batch).
- steady events/s = records after the first batch / (the last delivery of the first batch
  -> the last delivery of the stream). Spark's first micro-batch holds the first M records,
  ``fair_share`` over the partitions (the source's own split: offsets < M/4 in each), so
  its last delivery is known from the message ids (``kafka/{topic}/{partition}/{offset}``).
  The plain bridge's first batch is its first 5,000 records; which ones is up to
  librdkafka, so its end is taken at the k-th delivery, k = 5,000 x W / N (the selectivity
  is uniform along every partition). The last record of every partition is wanted, so the
  last delivery ends the stream.

Phase 2, latency: with the pipeline caught up, R records/s (5,000) for S seconds (10) are
produced into the same topic on a fixed schedule (a producer thread in this process,
``linger.ms = 1``); each value carries ``time.time()`` at its ``produce()`` call in
microseconds (field ``ts``), and latency = the subscriber's read returning - that, over
every wanted live record: p50 / p90 / p99 / max.

Exact, every run: the subscriber got exactly the expected message ids of both phases (none
missing, duplicated or unexpected, nothing more within 0.5 s), the broker's ``messages_in``
equals the wanted count (nothing unwanted was published), and the pipeline stopped on
SIGTERM with status 0 (the plain bridge's counters must match too).

Where the time goes: CPU seconds of each process over the steady window from /proc,
sampled every 0.25 s (Spark: the Python driver, the JVM, the Python workers; the plain
bridge; the broker; Tansu; this process; the machine), and, for Spark, the query progress
of every micro-batch (``durationMs``: latestOffset, getBatch, queryPlanning, addBatch,
walCommit, commitOffsets, triggerExecution), logged by the driver JVM at INFO into a file
through a log4j2 configuration this script passes in ``spark.driver.extraJavaOptions``
(after the session's usual ``-XX`` options).

Goals (issue "bench/spark_bridge.py"): >= 25,000 events/s steady through Spark into the
broker, first batch < 15 s; checked for information, not in a quick run. The exit status
is 0 unless a run failed or was not exact, 2 if Tansu or Spark is unavailable.

Processes are always stopped in a ``finally``: the plain bridge with SIGTERM; the Spark
driver is started in its own session, gets SIGTERM, and then every process group seen in
its process tree (the driver's, with the JVM, and pyspark's worker daemon, which makes its
own) is killed. Every wait is bounded. ``--quick``: 3,000 records, M = 1,000, 1,000/s for
1 s, runs plain-10 and table-10 (the CI smoke test, one Spark start).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import trio  # noqa: E402

from bench.bridge import (  # noqa: E402
    BATCH_MAX,
    DEAD_LETTER_TOPIC,
    EVENT_SIZE,
    KAFKA_GROUP_TIMEOUTS,
    PARTITIONS,
    PEER_KEEPALIVE,
    SELECTIVITIES,
    TEMPLATE,
    BridgeProcess,
    bridge_log,
    event_value,
    start_bridge,
    stop_bridge,
    stream_plan,
    write_broker_config,
)
from bench.bridge import machine_info as bridge_machine_info  # noqa: E402
from bench.harness import BenchError  # noqa: E402
from bench.harness.logs import scan_log  # noqa: E402
from bench.harness.processes import (  # noqa: E402
    HOST,
    BrokerProcess,
    broker_stats,
    start_broker,
    stop_broker,
    tail,
    terminate,
)
from bench.harness.procfs import cpu_seconds, machine_cpu  # noqa: E402
from bench.harness.report import Goals, arg_parser, fmt, percentile, print_ending, write_report  # noqa: E402
from bench.harness.wire import RECEIVE_SIZE, open_raw  # noqa: E402
from bench.kafkaload import produce_confirmed  # noqa: E402
from bridges.config import SparkSettings  # noqa: E402
from bridges.spark.session import FAST_JVM  # noqa: E402
from bridges.tansu import Tansu, TansuUnavailable, start_tansu  # noqa: E402
from broker.wire.frames import Pong, Sub  # noqa: E402
from routing import parse_filter  # noqa: E402

MASTER = "local[2]"
SPARK_TRIGGER = 0.0
EXTRA_FILTERS = 999  # the "-1k" runs: 1 + 999 filters in the route table
LIVE_LINGER_MS = 1
SAMPLE_EVERY = 0.25  # seconds between CPU samples
TS_PLACEHOLDER = 10**15  # 16 digits, as time.time() in microseconds until 2286
FIRST_DELIVERY_TIMEOUT = 120.0  # JVM and SparkSession start on a busy 2-core machine
IDLE_TIMEOUT = 60.0  # no delivery for this long (mid-stream): give up
PHASE_TIMEOUT = 600.0
LIVE_DRAIN_TIMEOUT = 60.0  # after the last live record was produced
EXTRA_WAIT = 0.5  # anything more than expected would come right behind
STOP_TIMEOUT = 45.0  # the Spark driver stops the query and the session on SIGTERM
SUB_TIMEOUT = 30.0
SPARK_PARTS = ("driver", "jvm", "py_tasks", "py_other")
GROUP_GRACE = 10.0  # seconds the Spark driver's other processes get to exit by themselves
QUIET_BUSY = 0.3  # cores busy (all processes) below which the machine counts as quiet
QUIET_PROBE = 2.0  # seconds per look
NOISY_OTHERS = 0.25  # other processes' CPU share in a steady window that calls for a rerun
GOAL_STEADY = 25_000
GOAL_FIRST_BATCH = 15.0

#: M is the bridge's own default, so the figures are what `topiary bridge spark` does as
#: shipped; N gives four steady micro-batches after the first.
FULL: dict[str, Any] = {"events": 1_000_000,
                        "max_offsets": SparkSettings().max_offsets_per_trigger,
                        "live_rate": 5_000, "live_seconds": 10.0}  # fmt: skip
#: table-10-small's batches (M/4: 50,000 in a full run), to show the fixed cost per batch.
SMALL_BATCHES = 0.25
QUICK: dict[str, Any] = {"events": 3_000, "max_offsets": 1_000, "live_rate": 1_000,
                         "live_seconds": 1.0}  # fmt: skip
QUICK_RUNS = ("plain-10", "table-10")


@dataclass(frozen=True)
class RunSpec:
    pipeline: str  # "plain" or "spark"
    label: str  # a key of SELECTIVITIES
    mode: str | None = None  # Spark's [spark] filter
    extra_filters: int = 0
    c1_jit: bool = False  # the driver JVM with FAST_JVM (what the tests use), not the default
    #: max_offsets_per_trigger for this run as a fraction of the run's M (small batches).
    batch_fraction: float = 1.0


def max_offsets(spec: RunSpec, params: dict[str, Any]) -> int:
    return max(1, int(params["max_offsets"] * spec.batch_fraction))


RUNS: dict[str, RunSpec] = {
    "plain-10": RunSpec("plain", "10%"),
    "table-10": RunSpec("spark", "10%", "table"),
    "regex-10": RunSpec("spark", "10%", "regex"),
    "plain-100": RunSpec("plain", "100%"),
    "table-100": RunSpec("spark", "100%", "table"),
    "regex-100": RunSpec("spark", "100%", "regex"),
    "plain-10-1k": RunSpec("plain", "10%", None, EXTRA_FILTERS),
    "table-10-1k": RunSpec("spark", "10%", "table", EXTRA_FILTERS),
    "regex-10-1k": RunSpec("spark", "10%", "regex", EXTRA_FILTERS),
    "table-10-c1": RunSpec("spark", "10%", "table", c1_jit=True),
    "table-10-small": RunSpec("spark", "10%", "table", batch_fraction=SMALL_BATCHES),
}

#: The driver JVM's logging: Spark's usual console output at WARN, and the streaming
#: query's progress (one JSON document per micro-batch) at INFO into its own file.
LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss.SSS}} %p %c{{1}}: %m%n%ex
appender.progress.type = File
appender.progress.name = progress
appender.progress.fileName = {path}
appender.progress.layout.type = PatternLayout
appender.progress.layout.pattern = %d{{UNIX_MILLIS}} %c{{1}}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
logger.progress.name = org.apache.spark.sql.execution.streaming
logger.progress.level = info
logger.progress.additivity = false
logger.progress.appenderRef.progress.ref = progress
"""
PROGRESS_MARK = "made progress: "
DURATIONS = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit",
             "commitOffsets", "triggerExecution")  # fmt: skip


# -- the stream -----------------------------------------------------------------------------


def backlog_plan(events: int) -> list[tuple[int, int, str]]:
    """(partition, offset, site) of the pre-produced records, bench/bridge.py's stream."""
    offsets = [0] * PARTITIONS
    plan = []
    for partition, site in stream_plan(events):
        plan.append((partition, offsets[partition], site))
        offsets[partition] += 1
    return plan


def live_plan(backlog: list[tuple[int, int, str]], count: int) -> list[tuple[int, int, str]]:
    """The live records: round robin, offsets going on after the backlog, the same sites."""
    ends = [0] * PARTITIONS
    for partition, offset, _site in backlog:
        ends[partition] = max(ends[partition], offset + 1)
    plan = []
    for i in range(count):
        partition = i % PARTITIONS
        offset = ends[partition] + i // PARTITIONS
        plan.append((partition, offset, f"s{offset % 100:02d}"))
    return plan


def live_template(index: int, offset: int, site: str) -> bytes:
    """A 500-byte value whose ``ts`` is a 16-digit placeholder, replaced at produce time."""
    record = json.loads(event_value(index, offset, site))
    record["ts"], record["pad"] = TS_PLACEHOLDER, ""
    record["pad"] = "x" * (EVENT_SIZE - len(json.dumps(record, separators=(",", ":"))))
    value = json.dumps(record, separators=(",", ":")).encode()
    assert len(value) == EVENT_SIZE, len(value)
    return value


def produce(
    tansu: Tansu,
    topic: str,
    plan: list[tuple[int, int, str]],
    values: Iterable[bytes],
    *,
    rate: float | None = None,
    stamp: bool = False,
) -> dict[str, Any]:
    """Produce ``values`` to the planned partitions (paced to ``rate`` records/s if given,
    with the produce time in ``ts`` if ``stamp``); every record must land at its offset."""
    placeholder = b'"ts":%d,' % TS_PLACEHOLDER

    def stamped(value: bytes) -> bytes:
        return value.replace(placeholder, b'"ts":%d,' % (time.time_ns() // 1000), 1)

    produced = produce_confirmed(
        tansu, topic, [partition for partition, _offset, _site in plan], values, rate=rate,
        linger_ms=LIVE_LINGER_MS if rate else 20, before_send=stamped if stamp else None,
    )  # fmt: skip
    for (partition, offset, _site), where in zip(plan, produced.placed, strict=True):
        if where != (partition, offset):
            raise BenchError(f"produce: a record for {partition}/{offset} landed at {where}")
    seconds = produced.sending_seconds
    return {"records": len(plan), "seconds": round(seconds, 3),
            "per_second": round(len(plan) / seconds) if seconds > 0 else None}  # fmt: skip


def wanted_ids(topic: str, plan: list[tuple[int, int, str]], label: str) -> set[str]:
    """The message ids the pipelines give the planned records that ``label`` wants."""
    want = SELECTIVITIES[label][1]
    return {f"kafka/{topic}/{p}/{o}" for p, o, site in plan if want(site)}


def extra_filters(count: int) -> list[str]:
    """Filters that match nothing in the stream, sharing its ``beacon/`` prefix."""
    return [f"beacon/*/*/zz{i}/>" for i in range(count)]


# -- processes --------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int, str, str, float] | None:
    """(ppid, pgrp, state, comm, CPU seconds) of ``pid`` from /proc, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (
        int(fields[1]),
        int(fields[2]),
        fields[0],
        comm,
        (int(fields[11]) + int(fields[12])) / tick,
    )


def process_tree(root: int) -> dict[int, tuple[int, int, str, str, float]]:
    """``root`` and its descendants: pid -> (ppid, pgrp, state, comm, CPU seconds)."""
    table: dict[int, tuple[int, int, str, str, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _stat(int(entry))
            if info is not None:
                table[int(entry)] = info
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info[0], []).append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in tree:
            tree[pid] = table[pid]
            todo += children.get(pid, [])
    return tree


def live_groups(pgids: Iterable[int]) -> set[int]:
    """The process groups in ``pgids`` that still have a live (not zombie) member."""
    wanted, live = set(pgids), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _stat(int(entry))
            if info is not None and info[1] in wanted and info[2] != "Z":
                live.add(info[1])
    return live


def kill_groups(pgids: Iterable[int], grace: float = GROUP_GRACE) -> list[int]:
    """SIGKILL every process group in ``pgids`` still alive after ``grace`` seconds (the
    JVM leaves by itself once the driver closed its gateway; killing it at once would
    also lose what it writes on exit)."""
    deadline = time.monotonic() + grace
    while (live := live_groups(pgids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid in sorted(live):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return sorted(live)


@dataclass
class SparkDriver:
    """``topiary bridge spark`` in its own session, and every process group it spawned."""

    popen: subprocess.Popen
    log_path: Path
    log_file: Any
    groups: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.popen.pid


def start_spark(config: Path, log_path: Path) -> SparkDriver:
    command = [sys.executable, "-m", "broker.cli", "bridge", "spark",
               "--config", str(config), "--log-format", "json"]  # fmt: skip
    log_file = open(log_path, "wb")  # noqa: SIM115 (closed in stop_spark)
    try:
        popen = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            start_new_session=True,
        )  # fmt: skip
    except BaseException:
        log_file.close()
        raise
    return SparkDriver(popen, log_path, log_file, {popen.pid})


def stop_spark(driver: SparkDriver) -> dict[str, Any]:
    """SIGTERM (the driver stops the query and the session), SIGKILL to its process group
    after a grace time; then whatever is left of every group seen in its tree."""
    popen = driver.popen
    started = time.monotonic()
    killed = False
    try:
        driver.groups |= {info[1] for info in process_tree(driver.pid).values()}
        killed = terminate(popen, STOP_TIMEOUT, 10)
        left = kill_groups(driver.groups)
    finally:
        driver.log_file.close()
    return {"exit_status": popen.returncode, "stop_seconds": round(time.monotonic() - started, 3),
            "killed": killed, "groups_killed_after": left}  # fmt: skip


def spark_log_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def read_progress(path: Path) -> list[dict[str, Any]]:
    """The query progress documents the driver JVM logged, one per micro-batch."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    decoder = json.JSONDecoder()
    out, pos = [], 0
    while (found := text.find(PROGRESS_MARK, pos)) >= 0:
        pos = found + len(PROGRESS_MARK)
        try:
            document, end = decoder.raw_decode(text, pos)
        except ValueError:
            continue
        pos = end
        if isinstance(document, dict) and "batchId" in document:
            out.append(document)
    return out


def progress_summary(progress: list[dict[str, Any]], backlog: int) -> dict[str, Any]:
    """Per-batch durations of the backlog's batches but the first: the steady part."""
    batches, rows = [], 0
    for doc in progress:
        n = int(doc.get("numInputRows") or 0)
        if n == 0:
            continue
        if rows >= backlog:
            break
        batches.append((rows, n, doc))
        rows += n
    steady = [doc for start, _n, doc in batches if start > 0]
    summary: dict[str, Any] = {
        "backlog_batches": len(batches),
        "first_batch_rows": batches[0][1] if batches else None,
        "first_batch_ms": batches[0][2].get("durationMs") if batches else None,
        "all_batches": len(progress),
    }
    if steady:
        total = {k: sum(int(d.get("durationMs", {}).get(k, 0)) for d in steady) for k in DURATIONS}
        summary["steady_batches"] = len(steady)
        summary["steady_rows"] = sum(int(d.get("numInputRows") or 0) for d in steady)
        summary["steady_ms_per_batch"] = {k: round(v / len(steady)) for k, v in total.items()}
        trigger = total["triggerExecution"] or 1
        summary["steady_share"] = {k: round(v / trigger, 3) for k, v in total.items()
                                   if k != "triggerExecution"}  # fmt: skip
    return summary


# -- configs ----------------------------------------------------------------------------------


def write_config(
    path: Path, spec: RunSpec, tansu: Tansu, topic: str, broker_port: int, log_dir: Path,
    slug: str, params: dict[str, Any],
) -> str:  # fmt: skip
    """The bridge TOML for one run (with a [spark] table for Spark); returns its group id."""
    group = f"bench-spark-{uuid.uuid4().hex[:12]}"
    kafka = {**(KAFKA_GROUP_TIMEOUTS if spec.pipeline == "plain" else {}), **params["kafka"]}
    kafka_lines = "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in kafka.items())
    text = f"""# bench/spark_bridge.py, run {slug}
[kafka]
"bootstrap.servers" = "{tansu.bootstrap}"
"group.id" = "{group}"
{kafka_lines}
[source]
topic = "{topic}"
format = "json"
dead_letter_topic = "{DEAD_LETTER_TOPIC}"

[mapping]
template = "{TEMPLATE}"

[broker]
server = "{HOST}:{broker_port}"
observer_id = "bench-{slug}"
report_interval = 0  # the exact-count check compares the broker's messages_in with wanted

[bridge]
stats_interval = 0
"""
    if spec.pipeline == "spark":
        log4j = log_dir / f"log4j2-{slug}.properties"
        log4j.write_text(LOG4J2.format(path=log_dir / f"progress-{slug}.log"))
        options = params["java_options"]
        if options is None:
            options = FAST_JVM if spec.c1_jit or params["quick"] else ""
        java = f"{options} -Dlog4j2.configurationFile=file:{log4j}".strip()
        conf = {"spark.driver.extraJavaOptions": java, **params["spark_conf"]}
        conf_lines = "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in conf.items())
        cache = params["class_cache"]
        class_cache = "" if cache is None else f"class_cache = {json.dumps(cache)}\n"
        text += f"""
[spark]
master = "{MASTER}"
checkpoint = "{log_dir / f"checkpoint-{slug}"}"
trigger = {params["trigger"]!r}
max_offsets_per_trigger = {max_offsets(spec, params)}
filter = "{spec.mode}"
{class_cache}
[spark.conf]
{conf_lines}"""
    path.write_text(text)
    return group


# -- subscriber ---------------------------------------------------------------------------------


class Subscriber:
    """A raw subscriber connection that records every delivery (id, read time) and, in the
    live phase, the produce time carried in the payload."""

    def __init__(self, stream: trio.SocketStream, proto: Any) -> None:
        self.stream = stream
        self.proto = proto
        self.buf = bytearray()
        self.ids: list[str] = []
        self.times: list[float] = []
        self.topics: list[str] = []
        self.latencies_us: list[int] = []
        self.live_from: int | None = None  # deliveries from this index on are live
        self.error: str | None = None

    @classmethod
    async def open(cls, port: int, filters: list[str]) -> Subscriber:
        """Connect and SUB every filter (pipelined), after all SUBACKs."""
        stream, proto = await open_raw(port)
        try:
            data = b"".join(
                proto.send(Sub(id=i + 1, filter=f, dialect="native")) for i, f in enumerate(filters)
            )
            acks = 0
            buf = bytearray()
            with trio.fail_after(SUB_TIMEOUT):
                await stream.send_all(data)
                while acks < len(filters):
                    for body in await cls._frames_from(stream, buf):
                        kind = body.get("type")
                        if kind == "SUBACK":
                            acks += 1
                        elif kind == "ERROR":
                            raise BenchError(f"SUB refused: {body}")
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        sub = cls(stream, proto)
        sub.buf = buf
        return sub

    @staticmethod
    async def _frames_from(stream: trio.SocketStream, buf: bytearray) -> list[dict]:
        # Only used before any MSG can arrive (no pipeline yet); ``buf`` keeps partial frames.
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                raise BenchError("the broker closed the subscriber's connection")
            buf += data
            out, pos = [], 0
            while len(buf) - pos >= 4:
                end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
                if end > len(buf):
                    break
                out.append(msgpack.unpackb(buf[pos + 4 : end]))
                pos = end
            del buf[:pos]
            if out:
                return out

    async def receive_until(
        self, count: int, *, first_wait: float, idle: float, limit: float,
        alive: Callable[[], str | None], tick: Callable[[], None],
    ) -> str | None:  # fmt: skip
        """Read until ``count`` deliveries in all; returns why it stopped short, or None."""
        unpack = msgpack.unpackb
        ids, times, topics = self.ids, self.times, self.topics
        started = time.monotonic()
        last = started
        marker = b'"ts":'
        while len(ids) < count:
            now = time.monotonic()
            tick()
            why = alive()
            if why is not None:
                return why
            if now - started > limit:
                return f"{len(ids)} of {count} deliveries after {limit:g} s"
            if now - last > (first_wait if not ids else idle):
                return f"no delivery for {now - last:.0f} s ({len(ids)} of {count})"
            data = b""
            with trio.move_on_after(SAMPLE_EVERY):
                data = await self.stream.receive_some(RECEIVE_SIZE)
                if not data:
                    return "the broker closed the subscriber's connection"
            if not data:
                continue
            now = time.monotonic()
            wall_us = time.time_ns() // 1000
            buf = self.buf
            buf += data
            pos, size = 0, len(buf)
            got = len(ids)
            while size - pos >= 4:
                end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
                if end > size:
                    break
                body = unpack(buf[pos + 4 : end])
                pos = end
                kind = body.get("type")
                if kind == "MSG":
                    ids.append(body["msg_id"])
                    topics.append(body["topic"])
                    if self.live_from is not None:
                        payload = body["payload"]
                        at = payload.find(marker) + 5
                        self.latencies_us.append(wall_us - int(payload[at : at + 16]))
                elif kind == "PING":
                    await self.stream.send_all(self.proto.send(Pong(id=body.get("id", 0))))
                elif kind == "ERROR":
                    return f"ERROR {body.get('code')}: {body.get('text')}"
            del buf[:pos]
            if len(ids) > got:
                times.extend([now] * (len(ids) - got))
                last = now
        return None

    async def extra(self, seconds: float) -> int:
        """Bytes that arrive within ``seconds`` (expected: none)."""
        got = len(self.buf)
        with trio.move_on_after(seconds):
            while True:
                data = await self.stream.receive_some(RECEIVE_SIZE)
                if not data:
                    break
                got += len(data)
        return got

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


# -- CPU ----------------------------------------------------------------------------------------


class CpuSampler:
    """CPU seconds of every party, sampled over time, to read any window afterwards."""

    def __init__(self, pipeline: int, spark: bool, others: dict[str, int]) -> None:
        self.pipeline = pipeline
        self.spark = spark
        self.others = others
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.groups: set[int] = set()
        self.pids: set[int] = set()  # every process seen in the pipeline's tree
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (part, CPU seconds last seen)
        self.kinds: dict[int, str] = {}
        self.next_at = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self.next_at:
            self.next_at = now + SAMPLE_EVERY
            self.sample()

    def sample(self) -> None:
        cpu = {"machine": machine_cpu(), "bench": time.process_time()}
        tree = process_tree(self.pipeline)
        self.groups |= {info[1] for info in tree.values()}
        self.pids |= set(tree)
        for pid, (_ppid, _pgrp, _state, comm, seconds) in tree.items():
            self.seen[pid] = (self._category(pid, comm), seconds)
        names = SPARK_PARTS if self.spark else ("bridge",)
        for name in names:
            cpu.setdefault(name, 0.0)
        # Exited processes keep their last reading: Spark forks short-lived Python workers
        # (pyspark's daemon reaps them, so their time shows nowhere else).
        for name, seconds in self.seen.values():
            cpu[name] += seconds
        for name, pid in self.others.items():
            try:
                cpu[name] = cpu_seconds(pid)
            except (OSError, IndexError, ValueError):
                cpu[name] = float("nan")
        self.samples.append((time.monotonic(), cpu))

    def _category(self, pid: int, comm: str) -> str:
        if not self.spark:
            return "bridge"
        if pid == self.pipeline:
            return "driver"
        if comm == "java":
            return "jvm"
        if pid not in self.kinds:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                args = []
            # pyspark.daemon's workers: "-m pyspark.daemon pyspark.worker" runs the tasks
            # (the Kafka read and the sink); the others plan data source reads and writes.
            self.kinds[pid] = "py_tasks" if b"pyspark.worker" in args else "py_other"
        return self.kinds[pid]

    def at(self, when: float) -> tuple[float, dict[str, float]] | None:
        if not self.samples:
            return None
        return min(self.samples, key=lambda s: abs(s[0] - when))

    def share(self, start: float, end: float) -> dict[str, float] | None:
        """Each party's CPU over [start, end] as a share of one core (nearest samples)."""
        a, b = self.at(start), self.at(end)
        if a is None or b is None or b[0] - a[0] <= 0:
            return None
        window = b[0] - a[0]
        share = {k: (b[1][k] - a[1].get(k, 0.0)) / window for k in b[1]}
        # whatever else ran on the machine meanwhile (another benchmark, say): the noise
        share["others"] = share["machine"] - sum(v for k, v in share.items() if k != "machine")
        return {k: round(v, 3) for k, v in share.items()}


# -- one run ------------------------------------------------------------------------------------


def wait_quiet(limit: float, busy_max: float = QUIET_BUSY) -> dict[str, float]:
    """Wait (at most ``limit`` seconds) until the machine is nearly idle: other agents'
    work on a shared machine would otherwise be measured as the pipeline's."""
    started = time.monotonic()
    while True:
        before = machine_cpu()
        time.sleep(QUIET_PROBE)
        busy = (machine_cpu() - before) / QUIET_PROBE
        waited = time.monotonic() - started
        if busy < busy_max or waited >= limit:
            return {"waited_seconds": round(waited, 1), "busy_cores": round(busy, 2)}


def _latency(samples_us: list[int], rate: float, seconds: float) -> dict[str, Any]:
    if not samples_us:
        return {"count": 0}
    ordered = sorted(samples_us)
    ms = lambda us: round(us / 1000, 1)  # noqa: E731
    return {"count": len(ordered), "rate": rate, "seconds": seconds,
            "p50_ms": ms(percentile(ordered, 0.50)), "p90_ms": ms(percentile(ordered, 0.90)),
            "p99_ms": ms(percentile(ordered, 0.99)), "max_ms": ms(ordered[-1]),
            "min_ms": ms(ordered[0])}  # fmt: skip


def _first_batch_end(
    spec: RunSpec, ids: list[str], times: list[float], events: int, wanted: int,
    params: dict[str, Any],
) -> tuple[float | None, int]:  # fmt: skip
    """When the first batch's last delivery came, and how many records that batch held."""
    if spec.pipeline == "plain":
        batch = min(BATCH_MAX, events)
        k = round(batch * wanted / events)
        if batch >= events or k < 1:
            return None, batch
        return times[k - 1], batch
    from bridges.spark.source import fair_share

    first = fair_share(params["partition_sizes"], max_offsets(spec, params))
    end = None
    for msg_id, when in zip(ids, times, strict=True):
        _topic, partition, offset = msg_id.rsplit("/", 2)
        if int(offset) < first[int(partition)]:
            end = when if end is None else max(end, when)
    records = sum(first.values())
    return (end if records < events else None), records


def run_one(
    name: str, spec: RunSpec, tansu: Tansu, params: dict[str, Any], log_dir: Path
) -> dict[str, Any]:
    """One pipeline, one selectivity: produce, start, throughput phase, latency phase."""
    events = params["events"]
    slug = name
    topic = f"beacons-{slug}-{uuid.uuid4().hex[:6]}"
    filter_text = SELECTIVITIES[spec.label][0]
    filters = [filter_text, *extra_filters(spec.extra_filters)]
    result: dict[str, Any] = {"pipeline": spec.pipeline, "label": spec.label,
                              "filter": filter_text, "filters": len(filters),
                              "filter_mode": spec.mode, "topic": topic}  # fmt: skip
    if spec.pipeline == "spark":
        result["max_offsets_per_trigger"] = max_offsets(spec, params)
    tansu.create_topic(topic, PARTITIONS)
    backlog = backlog_plan(events)
    live_count = int(params["live_rate"] * params["live_seconds"])
    live = live_plan(backlog, live_count)
    result["produce"] = produce(
        tansu, topic, backlog, (event_value(i, o, s) for i, (_p, o, s) in enumerate(backlog))
    )
    expect_backlog = wanted_ids(topic, backlog, spec.label)
    expect_live = wanted_ids(topic, live, spec.label)
    result.update(wanted_backlog=len(expect_backlog), wanted_live=len(expect_live))
    live_values = [live_template(events + i, o, s) for i, (_p, o, s) in enumerate(live)]

    broker: BrokerProcess | None = None
    bridge: BridgeProcess | None = None
    driver: SparkDriver | None = None
    stopped: dict[str, Any] | None = None
    try:
        _clear_run_files(log_dir, slug)
        broker_config = log_dir / f"broker-{slug}.toml"
        write_broker_config(broker_config, PEER_KEEPALIVE, None)
        broker = start_broker(log_dir / f"broker-{slug}.log", config=broker_config)
        result["broker_pid"] = broker.pid
        config = log_dir / f"bridge-{slug}.toml"
        write_config(config, spec, tansu, topic, broker.port, log_dir, slug, params)
        pipeline_log = log_dir / f"{spec.pipeline}-{slug}.log"

        async def measure() -> dict[str, Any]:
            nonlocal bridge, driver
            sub = await Subscriber.open(broker.port, filters)  # type: ignore[union-attr]
            result["subscriber"] = sub
            try:
                spawned = time.monotonic()
                if spec.pipeline == "spark":
                    driver = start_spark(config, pipeline_log)
                    process: subprocess.Popen = driver.popen
                else:
                    bridge = start_bridge(config, pipeline_log, None)
                    process = bridge.popen
                result["pipeline_pid"] = process.pid
                sampler = CpuSampler(process.pid, spec.pipeline == "spark",
                                     {"broker": broker.pid,  # type: ignore[union-attr]
                                      "tansu": tansu.process.pid})  # fmt: skip
                running: list[float] = []

                def tick() -> None:
                    sampler.tick()
                    if driver is not None:
                        driver.groups |= sampler.groups
                    if not running and spec.pipeline == "spark" and not sub.ids:
                        with open(pipeline_log, "rb") as f:
                            if b'"spark bridge running"' in f.read():
                                running.append(time.monotonic())

                def alive() -> str | None:
                    code = process.poll()
                    return None if code is None else f"the pipeline exited with status {code}"

                why = await sub.receive_until(
                    len(expect_backlog), first_wait=FIRST_DELIVERY_TIMEOUT, idle=IDLE_TIMEOUT,
                    limit=PHASE_TIMEOUT, alive=alive, tick=tick,
                )  # fmt: skip
                sampler.sample()
                got: dict[str, Any] = {
                    "spawned": spawned,
                    "running": running,
                    "error": why,
                    "sampler": sampler,
                    "backlog_done": len(sub.ids),
                }
                if why is not None:
                    return got
                # Phase 2: live records at a fixed rate, the subscriber reading meanwhile.
                sub.live_from = len(sub.ids)
                live_result: dict[str, Any] = {}

                def produce_live() -> None:
                    try:
                        live_result.update(
                            produce(
                                tansu,
                                topic,
                                live,
                                live_values,
                                rate=params["live_rate"],
                                stamp=True,
                            )
                        )
                    except Exception:
                        live_result["error"] = traceback.format_exc()

                thread = threading.Thread(target=produce_live, name="live-producer")
                thread.start()
                try:
                    limit = params["live_seconds"] + LIVE_DRAIN_TIMEOUT
                    why = await sub.receive_until(
                        len(expect_backlog) + len(expect_live), first_wait=limit, idle=limit,
                        limit=limit, alive=alive, tick=tick,
                    )  # fmt: skip
                finally:
                    await trio.to_thread.run_sync(thread.join)
                got["live_produce"] = live_result
                got["error"] = why or live_result.get("error")
                if got["error"] is None:
                    got["extra_bytes"] = await sub.extra(EXTRA_WAIT)
                return got
            finally:
                await sub.aclose()

        got = trio.run(measure)
        sub: Subscriber = result.pop("subscriber")
        result["pipeline_tree"] = sorted(got["sampler"].pids)
        stats = broker_stats(broker.port)
        if driver is not None:
            stopped = stop_spark(driver)
        elif bridge is not None:
            stopped = stop_bridge(bridge)
        result["pipeline_stop"] = stopped
        if got["error"] is not None or (stopped or {}).get("exit_status") != 0:
            result["pipeline_log_tail"] = tail(pipeline_log)
        result.update(_evaluate(spec, sub, got, stats, expect_backlog, expect_live, params))
        if driver is not None:
            progress = read_progress(log_dir / f"progress-{slug}.log")
            result["spark_progress"] = progress_summary(progress, events)
            lines = spark_log_lines(pipeline_log)
            result["spark_stopped"] = [x for x in lines if x.get("event") == "spark bridge stopped"]
            result["class_cache"] = _class_cache_state(lines)
        elif bridge is not None:
            log = bridge_log(bridge.log_path)
            result["bridge_counters"] = log["final_counters"]
        result["pipeline_log_problems"] = scan_log(pipeline_log).get("problems", [])[:5]
        result["broker_log_problems"] = scan_log(broker.log_path).get("problems", [])
        return result
    except Exception:
        result["error"] = traceback.format_exc()
        return result
    finally:
        if driver is not None and stopped is None:
            result["pipeline_stop"] = stop_spark(driver)
        if bridge is not None and stopped is None:
            result["pipeline_stop"] = stop_bridge(bridge)
        if broker is not None:
            result["broker_stop"] = stop_broker(broker)


def _evaluate(
    spec: RunSpec, sub: Subscriber, got: dict[str, Any], stats: dict[str, Any],
    expect_backlog: set[str], expect_live: set[str], params: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Throughput, latency and exactness from what the subscriber recorded."""
    events = params["events"]
    out: dict[str, Any] = {"subscriber_error": got["error"]}
    ids, times = sub.ids, sub.times
    spawned = got["spawned"]
    n_backlog = got["backlog_done"]
    throughput: dict[str, Any] = {}
    if ids:
        throughput["first_batch_seconds"] = round(times[0] - spawned, 3)
    if got["running"]:
        throughput["running_seconds"] = round(got["running"][0] - spawned, 3)
    if n_backlog == len(expect_backlog) and ids:
        b_ids, b_times = ids[:n_backlog], times[:n_backlog]
        last = b_times[-1]
        throughput["drain_seconds"] = round(last - spawned, 3)
        end, first_records = _first_batch_end(spec, b_ids, b_times, events, n_backlog, params)
        throughput["first_batch_records"] = first_records
        if end is not None and last > end:
            window = last - end
            throughput.update(
                first_batch_done_seconds=round(end - spawned, 3),
                steady_window_seconds=round(window, 3),
                steady_events=events - first_records,
                steady_events_per_second=round((events - first_records) / window),
                steady_wanted_per_second=round(sum(1 for t in b_times if t > end) / window),
                cpu_share=got["sampler"].share(end, last),
            )
    out["throughput"] = throughput
    live_seconds = params["live_seconds"]
    out["latency"] = _latency(sub.latencies_us, params["live_rate"], live_seconds)
    out["live_produce"] = got.get("live_produce")
    expected = expect_backlog | expect_live
    unique = set(ids)
    matcher = parse_filter(SELECTIVITIES[spec.label][0])
    out["exact"] = {
        "expected": len(expected),
        "delivered": len(ids),
        "duplicates": len(ids) - len(unique),
        "missing": len(expected - unique),
        "unexpected": len(unique - expected),
        "wrong_topic": sum(1 for t in set(sub.topics) if not matcher.matches(t)),
        "extra_bytes_after": got.get("extra_bytes", 0),
        "broker_messages_in": stats["messages_in"],
        "broker_duplicates_dropped": stats["duplicates_dropped"],
        "broker_dropped": stats["dropped"],
    }
    return out


def run_problems(run: dict[str, Any], events: int, live: int) -> list[str]:
    """What was not exact in one run (empty: all exact)."""
    if "error" in run:
        return ["the run failed: " + run["error"].strip().splitlines()[-1]]
    problems = []
    if run.get("subscriber_error"):
        problems.append(f"subscriber: {run['subscriber_error']}")
    exact = run.get("exact", {})
    for key in ("duplicates", "missing", "unexpected", "wrong_topic", "extra_bytes_after"):
        if exact.get(key):
            problems.append(f"{key} = {exact[key]}")
    if exact.get("delivered") != exact.get("expected"):
        problems.append(f"delivered {exact.get('delivered')} != expected {exact.get('expected')}")
    if exact.get("broker_messages_in") != exact.get("expected"):
        problems.append(f"broker messages_in {exact.get('broker_messages_in')} != wanted")
    stop = run.get("pipeline_stop") or {}
    if stop.get("exit_status") != 0 or stop.get("killed"):
        problems.append(f"pipeline stop: {stop}")
    if run["pipeline"] == "spark":
        if not run.get("spark_stopped"):
            problems.append("no 'spark bridge stopped' line in the driver's log")
    else:
        counters = run.get("bridge_counters") or {}
        want = {"records_in": events + live, "published": exact.get("expected"),
                "malformed": 0, "refused": 0, "dead_lettered": 0}  # fmt: skip
        for key, value in want.items():
            if counters.get(key) != value:
                problems.append(f"bridge {key} = {counters.get(key)}, expected {value}")
    return problems


# -- report -------------------------------------------------------------------------------------


def table_lines(report: dict[str, Any]) -> list[str]:
    p = report["parameters"]
    lines = [
        f"{p['events']:,} records of {EVENT_SIZE} B JSON in {PARTITIONS} partitions, then "
        f"{p['live_rate']:,}/s for {p['live_seconds']:g} s; Spark: {MASTER}, trigger "
        f"{p['trigger']:g} s, max_offsets_per_trigger {p['max_offsets']:,} "
        f"(-small runs: {max(1, int(p['max_offsets'] * SMALL_BATCHES)):,})",
        "",
        f"{'run':<14} {'pipeline':<8} {'mode':<6} {'wanted':>6} {'filters':>7} "
        f"{'1st batch s':>11} {'jvm':>4} {'steady ev/s':>11} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'exact':>5}",
    ]
    for name, run in report["runs"].items():
        t, lat = run.get("throughput", {}), run.get("latency", {})
        lines.append(
            f"{name:<14} {run['pipeline']:<8} {run.get('filter_mode') or '-':<6} "
            f"{run['label']:>6} {run['filters']:>7,} "
            f"{fmt(t.get('first_batch_seconds'), '.2f'):>11} {run.get('class_cache', '-'):>4} "
            f"{fmt(t.get('steady_events_per_second')):>11} "
            f"{fmt(lat.get('p50_ms'), '.1f'):>7} {fmt(lat.get('p99_ms'), '.1f'):>7} "
            f"{'yes' if not run.get('problems') else 'NO':>5}"
        )
    lines += ["", "CPU over the steady window, share of one core:"]
    for name, run in report["runs"].items():
        share = run.get("throughput", {}).get("cpu_share")
        if share:
            text = ", ".join(f"{k} {v:.0%}" for k, v in share.items())
            lines.append(f"  {name:<14} {text}")
    spark = [(n, r["spark_progress"]) for n, r in report["runs"].items()
             if r.get("spark_progress", {}).get("steady_ms_per_batch")]  # fmt: skip
    if spark:
        lines += ["", "Spark micro-batches after the first (ms per batch, from query progress):"]
        for name, prog in spark:
            ms = prog["steady_ms_per_batch"]
            text = ", ".join(f"{k} {ms[k]:,}" for k in DURATIONS)
            lines.append(f"  {name:<14} {prog['steady_batches']} batches: {text}")
    return lines


def filter_verdict(report: dict[str, Any]) -> list[dict[str, Any]]:
    """table against regex, where both ran with the same selectivity and filters."""
    out = []
    for name, run in report["runs"].items():
        if run.get("filter_mode") != "table":
            continue
        other = report["runs"].get(name.replace("table", "regex", 1))
        if other is None:
            continue
        a = run.get("throughput", {}).get("steady_events_per_second")
        b = other.get("throughput", {}).get("steady_events_per_second")
        faster = None if not (a and b) else ("table" if a > b else "regex")
        out.append({"label": run["label"], "filters": run["filters"], "table": a, "regex": b,
                    "faster": faster, "ratio": round(max(a, b) / min(a, b), 3) if faster
                    else None})  # fmt: skip
    return out


def check_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    quick = report["parameters"]["quick"]
    goals = Goals()
    add = goals.add

    for name, run in report["runs"].items():
        t = run.get("throughput", {})
        if run["pipeline"] == "spark" and run["filters"] == 1:
            rate = t.get("steady_events_per_second")
            add(f"Spark >= {GOAL_STEADY:,} events/s steady, {name}", rate,
                None if quick or rate is None else rate >= GOAL_STEADY)  # fmt: skip
            first = t.get("first_batch_seconds")
            add(f"Spark first batch < {GOAL_FIRST_BATCH:g} s, {name}", first,
                None if quick or first is None else first < GOAL_FIRST_BATCH)  # fmt: skip
        add(f"exact counts, {name}", run.get("problems") or "exact", not run.get("problems"))
    if quick:
        for goal in goals:
            if goal["status"] == "not measured":
                goal["note"] = "quick run"
    return goals


def code_versions() -> dict[str, str]:
    """A short hash of each pipeline source file: the figures belong to this code (others
    may be changing it while the benchmark runs)."""
    import hashlib

    files = sorted((ROOT / "bridges" / "spark").glob("*.py"))
    files += [ROOT / "bridges" / name for name in ("kafka.py", "config.py", "routes.py")]
    return {
        str(path.relative_to(ROOT)): hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        for path in files
        if path.exists()
    }


def machine_info() -> dict[str, Any]:
    info = bridge_machine_info()
    try:
        import pyarrow
        import pyspark

        info |= {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__}
    except ImportError:
        pass
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        info["java"] = (java.stderr or java.stdout).splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        info["java"] = None
    return info


def _clear_run_files(log_dir: Path, slug: str) -> None:
    """A reused --log-dir still holds an earlier run's checkpoint (the query would resume
    it: another topic, nothing delivered) and logs (appended to, then misread)."""
    shutil.rmtree(log_dir / f"checkpoint-{slug}", ignore_errors=True)
    for name in ("progress", "spark", "plain", "broker"):
        (log_dir / f"{name}-{slug}.log").unlink(missing_ok=True)


def _class_cache_state(lines: list[dict[str, Any]]) -> str:
    """How the driver JVM started: "warm" (it used the class cache), "cold" (it had to write
    it, or another process was writing it) or "off"."""
    events = {x.get("event") for x in lines}
    if "class cache: using" in events:
        return "warm"
    cold = {"class cache: the JVM writes it at exit", "class cache: another process is writing it"}
    return "cold" if events & cold else "off"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__)
    parser.add_argument("--events", type=int, help="pre-produced records (default 1,000,000)")
    parser.add_argument("--max-offsets", type=int, help="[spark] max_offsets_per_trigger")
    parser.add_argument("--live-rate", type=int, help="records/s in the latency phase")
    parser.add_argument("--live-seconds", type=float, help="length of the latency phase")
    parser.add_argument(
        "--trigger",
        type=float,
        default=SPARK_TRIGGER,
        help="[spark] trigger in seconds (default %(default)g: back to back)",
    )
    parser.add_argument("--only", help=f"comma-separated runs, of {', '.join(RUNS)}")
    parser.add_argument(
        "--java-options", default=None, metavar="OPTIONS",
        help="the driver JVM's options for every Spark run (default: none, as "
        "`topiary bridge spark` runs; FAST_JVM for -c1 runs and --quick); the progress "
        "log setting is added",
    )  # fmt: skip
    parser.add_argument(
        "--class-cache", default=None, metavar="DIR",
        help="[spark] class_cache for every Spark run (default: the bridge's default place, "
        "~/.cache/topiary/spark, as `topiary bridge spark` uses it; off in a --quick run; "
        "'' for off). The first run that finds no archive writes it when it stops",
    )  # fmt: skip
    parser.add_argument(
        "--kafka", action="append", default=[], metavar="KEY=VALUE",
        help="a [kafka] setting for both pipelines (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE",
        help="a [spark.conf] setting for the Spark runs (repeatable)",
    )  # fmt: skip
    parser.add_argument("--log-dir", help="keep logs, configs and checkpoints here")
    parser.add_argument(
        "--retry-noisy", type=int, default=0, metavar="N",
        help="run again (up to N times) when other processes used more than "
        f"{NOISY_OTHERS:.0%}% of a core in the steady window (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--quiet-wait", type=float, default=0.0, metavar="SECONDS",
        help="before each run, wait up to this long for the machine to be nearly idle "
        f"(< {QUIET_BUSY} cores busy; default 0: don't)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    names = [x.strip() for x in (args.only or "").split(",") if x.strip()]
    if not names:
        names = list(QUICK_RUNS if args.quick else RUNS)
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    args.names = names
    for option in ("kafka", "spark_conf"):
        pairs: dict[str, Any] = {}
        for item in getattr(args, option):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                parser.error(f"--{option.replace('_', '-')} takes KEY=VALUE, got {item!r}")
            value = value.strip()
            pairs[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
        setattr(args, option, pairs)
    if args.events is not None and args.events < 2 * PARTITIONS:
        parser.error(f"--events must be at least {2 * PARTITIONS}")
    for key in ("max_offsets", "live_rate"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.live_seconds is not None and not 0 < args.live_seconds <= 600:
        parser.error("--live-seconds must be in (0, 600]")
    if not 0 <= args.retry_noisy <= 10:
        parser.error("--retry-noisy must be in [0, 10]")
    if not 0 <= args.quiet_wait <= 3600:
        parser.error("--quiet-wait must be in [0, 3600]")
    if not 0 <= args.trigger <= 60:
        parser.error("--trigger must be in [0, 60]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    for key in ("events", "max_offsets", "live_rate", "live_seconds"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    params["trigger"] = args.trigger
    params["kafka"] = args.kafka
    params["spark_conf"] = {k: str(v) for k, v in args.spark_conf.items()}
    params["java_options"] = args.java_options
    params["class_cache"] = "" if args.class_cache is None and args.quick else args.class_cache
    params["quick"] = args.quick
    sizes = [0] * PARTITIONS
    for partition, _site in stream_plan(params["events"]):
        sizes[partition] += 1
    params["partition_sizes"] = dict(enumerate(sizes))
    if any(RUNS[n].pipeline == "spark" for n in args.names):
        from bridges.spark.session import SparkUnavailable, check_spark

        try:
            check_spark()
        except SparkUnavailable as exc:
            print(f"Spark is unavailable: {exc}", file=sys.stderr)
            return 2
    report: dict[str, Any] = {
        "benchmark": "spark_bridge",
        "machine": machine_info(),
        "parameters": {
            **params,
            "quick": args.quick,
            "master": MASTER,
            "partitions": PARTITIONS,
            "value_bytes": EVENT_SIZE,
            "template": TEMPLATE,
            "plain_batch": BATCH_MAX,
            "live_linger_ms": LIVE_LINGER_MS,
            "extra_filters": EXTRA_FILTERS,
            "runs": args.names,
            "quiet_wait": args.quiet_wait,
            "retry_noisy": args.retry_noisy,
        },
        "code": code_versions(),
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": {},
    }
    started = time.monotonic()
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix="topiary-spark-bench-")
    log_dir = Path(args.log_dir or temp_dir).resolve()  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"spark_bridge: {report['machine']['cpu_count']} CPUs, Python "
        f"{report['machine']['python']}, load average "
        f"{' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    ok = True
    tansu: Tansu | None = None
    live = int(params["live_rate"] * params["live_seconds"])
    try:
        try:
            tansu = start_tansu(log_path=str(log_dir / "tansu.log"))
            report["tansu_pid"] = tansu.process.pid
        except TansuUnavailable as exc:
            print(f"Tansu is unavailable: {exc}", file=sys.stderr)
            return 2
        tansu.create_topic(DEAD_LETTER_TOPIC, 1)
        for name in args.names:
            print(f"  {name} ({time.monotonic() - started:.0f} s, load "
                  f"{os.getloadavg()[0]:.2f}) ...", flush=True)  # fmt: skip
            noisy: list[dict[str, Any]] = []
            for attempt in range(args.retry_noisy + 1):
                quiet = wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else None
                run = run_one(f"{name}" + (f"-{attempt}" if attempt else ""), RUNS[name],
                              tansu, params, log_dir)  # fmt: skip
                run["quiet_wait"] = quiet
                others = (run.get("throughput", {}).get("cpu_share") or {}).get("others")
                if attempt == args.retry_noisy or others is None or others <= NOISY_OTHERS:
                    break
                print(f"  {name}: others used {others:.0%} of a core; again", flush=True)
                noisy.append({k: run.get(k) for k in ("throughput", "latency")})
            run["noisy_attempts"] = noisy
            run["load_average"] = os.getloadavg()
            run["problems"] = run_problems(run, params["events"], live)
            report["runs"][name] = run
            if run["problems"]:
                ok = False
                print(f"  {name}: NOT EXACT: {run['problems']}", file=sys.stderr, flush=True)
                for key in ("error", "pipeline_log_tail"):
                    if key in run:
                        print(f"--- {key}:\n{run[key]}", file=sys.stderr)
    except Exception:
        report["error"] = traceback.format_exc()
        print(f"failed:\n{report['error']}", file=sys.stderr, flush=True)
        ok = False
    finally:
        if tansu is not None:
            tansu.stop()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["load_average_end"] = os.getloadavg()
    if code_versions() != report["code"]:
        report["code_changed"] = code_versions()
        print("warning: the pipeline's code changed during the run", file=sys.stderr)
    report["elapsed_seconds"] = round(time.monotonic() - started, 2)
    report["filter_verdict"] = filter_verdict(report)
    report["goals"] = check_goals(report)

    print()
    for line in table_lines(report):
        print(line)
    for v in report["filter_verdict"]:
        print(f"filter {v['label']} x{v['filters']:,}: table {fmt(v['table'])}, regex "
              f"{fmt(v['regex'])} events/s: {v['faster'] or '?'} faster")  # fmt: skip
    print_ending(report)
    write_report(report, args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
