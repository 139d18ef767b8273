"""Kafka bridge benchmark: hierarchical routing against the flat-topic way, side by side.

    python bench/bridge.py [--quick] [--json PATH] [--events N] [--only 1%,10%,100%]
                           [--kafka KEY=VALUE ...] [--dedup-window N] [--peer-keepalive S]
                           [--log-dir DIR] [--profile-bridge DIR]

The point of the bridge (docs/bridge.md, /work/shared/DESIGN.md): with a flat Kafka topic,
a consumer that wants a slice of the stream must read all of it and filter locally, so it
moves N messages for the W it wants (N / W per wanted message); through the bridge, the
broker moves only the wanted ones (goal 1.0). This script measures both, and how many
events per second the bridge gets through, for 1%, 10% and 100% of the stream wanted.

The stream. One memory-only Tansu (``bridges.tansu.start_tansu``), topic ``beacons`` with 4
partitions, N records (200,000 by default) of exactly 500 bytes of JSON: region, country,
site, section, event, ts, seq, offset and a padding field. The record at offset o of a
partition has site ``s{o % 100:02d}``, so every partition holds every site in turn and the
native filters

    1%    beacon/*/*/s00/>     (site == "s00")
    10%   beacon/*/*/s0*/>     (site starts with "s0": a prefix wildcard)
    100%  beacon/>             (everything)

want exactly 1%, 10% and 100% of the regular records, evenly spread over the partitions.
The last record of each partition is a sentinel with site ``s00``, wanted by all three
filters (and counted in W), so the last record the bridge reads on every partition is
delivered. The records are produced before any timing (one producer, explicit partitions,
``linger.ms`` batching); the delivery reports give every record's partition and offset,
from which the expected message ids (``kafka/beacons/{partition}/{offset}``) of each filter
are known exactly, and the sum of the partitions' log ends (``Tansu.log_end``) must be N.

Bridge path, per selectivity: a fresh broker (``python -m broker.cli serve --config``, as in
bench/e2e.py), a subscriber in this process on the filter (a lean raw reader as in
bench/e2e.py rather than ``broker.client``, so that its CPU, shared with the bridge on a
small machine, stays low), then the bridge (``python -m broker.cli bridge kafka --config
... --log-format json``) with a fresh ``group.id``, so it reads from the start. Its config
(written to the log directory)::

    [kafka]   "session.timeout.ms" = 1500, "heartbeat.interval.ms" = 300  (a ~1 s join),
              plus every --kafka KEY=VALUE
    [source]  topic = "beacons", format = "json", dead_letter_topic = "beacons.dlq"
    [mapping] template = "beacon/{region}/{country}/{site}/{section}/{event}"
    [bridge]  stats_interval = 0, the rest at the defaults (batch_max 5000, ...)

The broker's config sets ``[peering] keepalive`` (``--peer-keepalive``, 2 s by default as
in the broker) and, with --dedup-window, ``[limits] dedup_window``.

events/s = N / (first delivery -> last delivery), both taken when the subscriber's read
returns. Why this is the bridge's rate over the whole stream: the first wanted record of
every partition is at offset 0 (site s00), so the first delivery comes from the first batch
the bridge reads, and the last record of every partition is wanted (the sentinels), so the
last delivery is the bridge's last record; between them the bridge has read, decoded,
mapped and filtered all N records but the first batch, so the rate is overstated by at
most batch_max / N (2.5% at the defaults). What comes before the first delivery (Python
start-up, the route table, the consumer group join) is reported apart as the time to first
delivery, from spawning the bridge. So is the rate of wanted messages in the first and the
second half of them: a cost that grows with what a process has seen shows there.

Checked: the subscriber got exactly the expected message ids (none missing, duplicated or
unexpected; every topic matches the filter; nothing more within 0.3 s of the last), the
broker's ``messages_in`` equals W (the bridge published nothing unwanted), and the bridge's
own counters (its "bridge stopped" log line: records_in == N, published == W,
unwanted_dropped == N - W, nothing malformed, refused or dead-lettered). The bridge is
stopped with SIGTERM and must exit 0. The CPU time of the bridge, the broker, Tansu, this
process and the whole machine between first and last delivery is read from /proc, to tell
which one limits the rate.

Flat path, per selectivity: a plain confluent-kafka ``Consumer`` in this process assigns all
partitions from offset 0 by hand (no group join) and reads the whole topic, decodes each
value with ``json.loads`` and keeps the records whose site passes the same test, the way a
consumer of a flat topic must. It reads batches as big as the bridge's (5,000) with the
bridge's prefetch bound (``queued.max.messages.kbytes`` = 32768) and every --kafka setting.
events/s = N / (the first batch returned -> the last one processed); messages moved per
wanted = N / W.

Messages moved per wanted message: for the bridge, MSGs delivered to the subscriber / W
(1.0 is the goal; the broker's messages_in / W is reported too). The bridge itself reads
the whole stream from Kafka once, but once for all subscribers, whereas every flat
consumer reads all of it again.

Goals (issue "bench/bridge.py"): the bridge keeps up with >= 50,000 events/s of 500-byte
JSON on this machine, and moves <= 1.05 messages per wanted message. They are checked for
information (the rate not in a quick run); the exit status is 0 unless a part failed to
run or the counts were not exact, 2 if Tansu is unavailable.

Processes (Tansu, brokers, bridges) are always stopped in a ``finally`` (SIGTERM, SIGINT
for Tansu, then SIGKILL), also on errors and Ctrl-C; their output goes to log files (a
temporary directory unless ``--log-dir``), whose tail is shown when something fails. Every
wait is bounded in time. ``--profile-bridge DIR`` runs each bridge under cProfile
(DIR/bridge-<label>.prof; slows it). ``--quick`` uses 3,000 records (the CI smoke test,
~10 s, most of it three group joins).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import trio  # noqa: E402

from bench.harness import BenchError  # noqa: E402
from bench.harness.logs import scan_log  # noqa: E402
from bench.harness.processes import (  # noqa: E402
    HOST,
    BrokerProcess,
    broker_stats,
    spawn_logged,
    start_broker,
    stop_broker,
    stop_logged,
    tail,
)
from bench.harness.procfs import cpu_seconds, machine_cpu  # noqa: E402
from bench.harness.report import Goals, arg_parser, fmt, print_ending, write_report  # noqa: E402
from bench.harness.report import machine_info as common_machine_info  # noqa: E402
from bench.harness.wire import RECEIVE_SIZE, open_raw  # noqa: E402
from bench.kafkaload import produce_confirmed  # noqa: E402
from bridges.config import KAFKA_DEFAULTS  # noqa: E402
from bridges.tansu import Tansu, TansuUnavailable, start_tansu  # noqa: E402
from broker.wire.connection import NEED_DATA, ConnectionClosed  # noqa: E402
from broker.wire.frames import Error, Pong, Sub, SubAck  # noqa: E402
from routing import parse_filter  # noqa: E402

TOPIC = "beacons"
DEAD_LETTER_TOPIC = "beacons.dlq"
PARTITIONS = 4
EVENT_SIZE = 500
SITES = 100
TEMPLATE = "beacon/{region}/{country}/{site}/{section}/{event}"
SENTINEL_SITE = "s00"
REGIONS = (("eu", ("de", "fr", "nl", "es")), ("na", ("us", "ca", "mx", "pr")),
           ("ap", ("jp", "in", "au", "sg")), ("sa", ("br", "ar", "cl", "co")))  # fmt: skip
SECTIONS = ("home", "search", "product", "cart", "checkout", "account", "help")
EVENT_TYPES = ("view", "click", "scroll", "add", "purchase")

#: label -> (native filter, the flat consumer's test on the record's site)
SELECTIVITIES: dict[str, tuple[str, Callable[[str], bool]]] = {
    "1%": ("beacon/*/*/s00/>", lambda site: site == "s00"),
    "10%": ("beacon/*/*/s0*/>", lambda site: site.startswith("s0")),
    "100%": ("beacon/>", lambda site: True),
}

KAFKA_GROUP_TIMEOUTS = {"session.timeout.ms": 1500, "heartbeat.interval.ms": 300}
BRIDGE_SETTINGS = {"stats_interval": 0}  # everything else at the defaults
BATCH_MAX = 5000  # the bridge's default batch_max: the flat consumer reads batches as big
PREFETCH_KBYTES = KAFKA_DEFAULTS["queued.max.messages.kbytes"]
FIRST_DELIVERY_TIMEOUT = 60.0  # bridge start-up, route table and group join
IDLE_TIMEOUT = 15.0  # no delivery for this long after the first: give up
RUN_TIMEOUT = 600.0  # one bridge run, all in
FLAT_TIMEOUT = 300.0
BRIDGE_STOP_TIMEOUT = 20.0  # the bridge waits up to shutdown_timeout (10 s) for confirms
#: The brokers' [peering] keepalive: the broker's default. (Until the route watcher got one
#: writer per link, 2 s crashed it under load and this benchmark ran with 300 s.)
PEER_KEEPALIVE = 2.0
GOAL_EVENTS_PER_SECOND = 50_000
GOAL_MOVED_PER_WANTED = 1.05

FULL: dict[str, Any] = {"events": 200_000}
QUICK: dict[str, Any] = {"events": 3_000}


# -- the stream ---------------------------------------------------------------------------


def event_value(index: int, offset: int, site: str) -> bytes:
    """The JSON of record ``index`` (at ``offset`` in its partition), exactly 500 bytes."""
    region, countries = REGIONS[index % len(REGIONS)]
    record = {
        "region": region,
        "country": countries[(index // len(REGIONS)) % len(countries)],
        "site": site,
        "section": SECTIONS[(index // 7) % len(SECTIONS)],
        "event": EVENT_TYPES[(index // 3) % len(EVENT_TYPES)],
        "ts": 1_795_000_000_000 + index,
        "seq": index,
        "offset": offset,
        "pad": "",
    }
    size = len(json.dumps(record, separators=(",", ":")))
    record["pad"] = "x" * (EVENT_SIZE - size)
    value = json.dumps(record, separators=(",", ":")).encode()
    assert len(value) == EVENT_SIZE, len(value)
    return value


def stream_plan(events: int, partitions: int = PARTITIONS) -> list[tuple[int, str]]:
    """(partition, site) of each record in produce order: round robin over the partitions,
    site ``s{offset % 100}``, and a sentinel (site s00) as the last record of each."""
    if events < 2 * partitions:
        raise ValueError(f"need at least {2 * partitions} events")
    regular = events - partitions
    plan = [(i % partitions, f"s{(i // partitions) % SITES:02d}") for i in range(regular)]
    plan += [(p, SENTINEL_SITE) for p in range(partitions)]
    return plan


def produce(tansu: Tansu, events: int) -> dict[str, Any]:
    """Create the topics and produce the stream; returns where each record went."""
    tansu.create_topic(TOPIC, PARTITIONS)
    tansu.create_topic(DEAD_LETTER_TOPIC, 1)
    plan = stream_plan(events)
    offsets = [0] * PARTITIONS

    def values() -> Iterator[bytes]:
        for index, (partition, site) in enumerate(plan):
            yield event_value(index, offsets[partition], site)
            offsets[partition] += 1

    produced = produce_confirmed(tansu, TOPIC, [p for p, _site in plan], values())
    where, seconds = produced.placed, produced.seconds
    log_end = [tansu.log_end(TOPIC, p) for p in range(PARTITIONS)]
    if sum(log_end) != events:
        raise BenchError(f"produce: log ends {log_end} sum to {sum(log_end)}, not {events}")
    last = [-1] * PARTITIONS
    for (planned, _site), (partition, offset) in zip(plan, where, strict=True):
        if partition != planned:
            raise BenchError(f"produce: a record for partition {planned} went to {partition}")
        last[partition] = max(last[partition], offset)
    for partition, offset in where[-PARTITIONS:]:
        if offset != last[partition]:
            raise BenchError(f"the sentinel of partition {partition} is not its last record")
    return {
        "records": [(p, o, site) for (p, o), (_, site) in zip(where, plan, strict=True)],
        "seconds": round(seconds, 3),
        "per_second": round(events / seconds),
        "log_end": log_end,
        "value_bytes": EVENT_SIZE,
    }


def expected_ids(records: list[tuple[int, int, str]], label: str) -> set[str]:
    """The message ids the bridge gives the records that ``label``'s filter wants."""
    _filter, wanted = SELECTIVITIES[label]
    return {f"kafka/{TOPIC}/{p}/{o}" for p, o, site in records if wanted(site)}


# -- processes ------------------------------------------------------------------------------


@dataclass
class BridgeProcess:
    popen: subprocess.Popen
    log_path: Path
    log_file: Any

    @property
    def pid(self) -> int:
        return self.popen.pid


def write_broker_config(path: Path, peer_keepalive: float, dedup_window: int | None) -> None:
    text = f"[peering]\nkeepalive = {peer_keepalive!r}\n"
    if dedup_window is not None:
        text += f"\n[limits]\ndedup_window = {dedup_window}\n"
    path.write_text(text)


def write_bridge_config(
    path: Path, tansu: Tansu, broker_port: int, label: str, kafka_extra: dict[str, Any]
) -> str:
    """A bridge config with a fresh group id (so it reads from offset 0); returns the id."""
    group = f"bench-bridge-{uuid.uuid4().hex[:12]}"
    settings = "\n".join(f"{key} = {value!r}" for key, value in BRIDGE_SETTINGS.items())
    kafka = {**KAFKA_GROUP_TIMEOUTS, **kafka_extra}
    kafka_lines = "\n".join(f'"{key}" = {json.dumps(value)}' for key, value in kafka.items())
    path.write_text(
        f"""# bench/bridge.py, selectivity {label}
[kafka]
"bootstrap.servers" = "{tansu.bootstrap}"
"group.id" = "{group}"
{kafka_lines}

[source]
topic = "{TOPIC}"
format = "json"
dead_letter_topic = "{DEAD_LETTER_TOPIC}"

[mapping]
template = "{TEMPLATE}"

[broker]
server = "{HOST}:{broker_port}"
observer_id = "bench-bridge"
report_interval = 0  # the exact-count check compares the broker's messages_in with W

[bridge]
{settings}
"""
    )
    return group


def start_bridge(config: Path, log_path: Path, profile: Path | None) -> BridgeProcess:
    command = [sys.executable, "-m", "broker.cli", "bridge", "kafka",
               "--config", str(config), "--log-format", "json"]  # fmt: skip
    if profile is not None:
        command[1:1] = ["-m", "cProfile", "-o", str(profile)]
    popen, log_file = spawn_logged(command, log_path)
    return BridgeProcess(popen, log_path, log_file)


def stop_bridge(bridge: BridgeProcess) -> dict[str, Any]:
    """SIGTERM (the bridge finishes its batches and commits), SIGKILL after a grace time."""
    return stop_logged(bridge.popen, bridge.log_file, BRIDGE_STOP_TIMEOUT, 10)


def bridge_log(path: Path) -> dict[str, Any]:
    """The bridge's final counters (its "bridge stopped" line) and any problems logged."""
    scanned = scan_log(path)
    final: dict[str, Any] | None = None
    try:
        for line in path.read_text(errors="replace").splitlines():
            if '"bridge stopped"' in line:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                final = {k: v for k, v in record.items() if isinstance(v, int)}
    except OSError:
        pass
    return {"final_counters": final, "problems": scanned.get("problems", []),
            "levels": scanned.get("levels", {})}  # fmt: skip


def process_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each process, this one ("bench") and the whole machine."""
    out = {"machine": machine_cpu()}
    for name, pid in pids.items():
        try:
            out[name] = cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            out[name] = float("nan")
    out["bench"] = time.process_time()
    return out


# -- bridge path ----------------------------------------------------------------------------


async def _subscribe(port: int, filter: str) -> tuple[trio.SocketStream, Any]:
    """A raw subscriber connection on ``filter``, after its SUBACK."""
    stream, proto = await open_raw(port)
    try:
        with trio.fail_after(10):
            await stream.send_all(proto.send(Sub(id=1, filter=filter, dialect="native")))
            while True:
                event = proto.next_event()
                if event is NEED_DATA:
                    data = await stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        raise BenchError("the broker closed the subscriber's connection")
                    proto.receive_data(data)
                elif isinstance(event, SubAck):
                    break
                elif isinstance(event, Error):
                    raise BenchError(f"SUB {filter!r} refused: {event.code} {event.text}")
                elif isinstance(event, ConnectionClosed):
                    raise BenchError("the broker closed the subscriber's connection")
        if proto.buffered:
            raise BenchError("unexpected bytes after the SUBACK")
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream, proto


async def _receive(
    stream: trio.SocketStream,
    proto: Any,
    expected: int,
    bridge: BridgeProcess,
    spawned: float,
    pids: dict[str, int],
) -> dict[str, Any]:
    """Read MSGs until ``expected`` arrived (or the bridge died, or a timeout)."""
    buf = bytearray()
    unpack = msgpack.unpackb
    received: list[tuple[str, str]] = []
    append = received.append
    first = last = half = None
    half_count = max(1, expected // 2)
    cpu_first: dict[str, float] | None = None
    error: str | None = None
    deadline = spawned + RUN_TIMEOUT
    while len(received) < expected:
        now = time.monotonic()
        if first is None:
            wait = min(spawned + FIRST_DELIVERY_TIMEOUT, deadline) - now
            what = f"no delivery within {FIRST_DELIVERY_TIMEOUT:g} s of starting the bridge"
        else:
            wait = min(last + IDLE_TIMEOUT, deadline) - now  # type: ignore[operator]
            what = f"no delivery for {IDLE_TIMEOUT:g} s ({len(received)} of {expected})"
        if bridge.popen.poll() is not None:
            error = f"the bridge exited with status {bridge.popen.returncode}"
            break
        if wait <= 0:
            error = what
            break
        data = b""
        with trio.move_on_after(min(wait, 0.5)):
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                error = "the broker closed the subscriber's connection"
                break
        if not data:
            continue
        now = time.monotonic()
        buf += data
        pos = 0
        end_buf = len(buf)
        count_before = len(received)
        while end_buf - pos >= 4:
            end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
            if end > end_buf:
                break
            body = unpack(buf[pos + 4 : end])
            pos = end
            kind = body.get("type")
            if kind == "MSG":
                append((body["msg_id"], body["topic"]))
            elif kind == "PING":
                await stream.send_all(proto.send(Pong(id=body.get("id", 0))))
            elif kind == "ERROR":
                error = f"ERROR {body.get('code')}: {body.get('text')}"
        del buf[:pos]
        if len(received) > count_before:
            if first is None:
                first = now
                cpu_first = process_cpu(pids)
            if half is None and len(received) >= half_count:
                half = now
            last = now
        if error is not None:
            break
    cpu_last = process_cpu(pids) if first is not None else None
    cpu = None
    if cpu_first is not None and cpu_last is not None:
        cpu = {name: round(cpu_last[name] - cpu_first[name], 3) for name in cpu_first}
    return {"received": received, "first": first, "half": half, "last": last, "error": error,
            "cpu": cpu}  # fmt: skip


def run_bridge_path(
    label: str, tansu: Tansu, expected: set[str], events: int, log_dir: Path,
    profile_dir: Path | None, peer_keepalive: float, dedup_window: int | None,
    kafka_extra: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """One selectivity through Kafka -> bridge -> broker -> subscriber."""
    filter, _wanted = SELECTIVITIES[label]
    slug = {"1%": "p1", "10%": "p10", "100%": "p100"}[label]
    broker: BrokerProcess | None = None
    bridge: BridgeProcess | None = None
    result: dict[str, Any] = {"filter": filter}
    stopped: dict[str, Any] = {}
    try:
        broker_config = log_dir / f"broker-{slug}.toml"
        write_broker_config(broker_config, peer_keepalive, dedup_window)
        broker = start_broker(log_dir / f"broker-{slug}.log", config=broker_config)
        result["broker_pid"] = broker.pid
        config = log_dir / f"bridge-{slug}.toml"
        result["group_id"] = write_bridge_config(config, tansu, broker.port, label, kafka_extra)

        async def measure() -> dict[str, Any]:
            nonlocal bridge
            stream, proto = await _subscribe(broker.port, filter)  # type: ignore[union-attr]
            try:
                profile = None if profile_dir is None else profile_dir / f"bridge-{slug}.prof"
                spawned = time.monotonic()
                bridge = start_bridge(config, log_dir / f"bridge-{slug}.log", profile)
                result["bridge_pid"] = bridge.pid
                pids = {"bridge": bridge.pid, "broker": broker.pid,  # type: ignore[union-attr]
                        "tansu": tansu.process.pid}  # fmt: skip
                got = await _receive(stream, proto, len(expected), bridge, spawned, pids)
                got["spawned"] = spawned
                # Anything more than expected (a duplicate, say) would come right behind.
                if got["error"] is None:
                    with trio.move_on_after(0.3):
                        extra = await stream.receive_some(RECEIVE_SIZE)
                        got["extra_bytes"] = len(extra)
                return got
            finally:
                await trio.aclose_forcefully(stream)

        got = trio.run(measure)
        stats = broker_stats(broker.port)
        assert bridge is not None
        stopped = stop_bridge(bridge)
        result["bridge_stop"] = stopped
        if got["error"] is not None or stopped["exit_status"] != 0:
            result["bridge_log_tail"] = tail(bridge.log_path)
        ids = [msg_id for msg_id, _topic in got["received"]]
        unique = set(ids)
        matcher = parse_filter(filter)
        result.update(
            expected=len(expected),
            delivered=len(ids),
            duplicates=len(ids) - len(unique),
            missing=len(expected - unique),
            unexpected=len(unique - expected),
            wrong_topic=sum(1 for _id, topic in got["received"] if not matcher.matches(topic)),
            extra_bytes_after=got.get("extra_bytes", 0),
            subscriber_error=got["error"],
            broker_messages_in=stats["messages_in"],
            broker_messages_out=stats["messages_out"],
            broker_duplicates_dropped=stats["duplicates_dropped"],
            broker_dropped=stats["dropped"],
            cpu_seconds=got["cpu"],
        )
        if got["first"] is not None:
            result["first_delivery_seconds"] = round(got["first"] - got["spawned"], 3)
        if got["first"] is not None and got["error"] is None:  # a partial run has no rate
            window = got["last"] - got["first"]
            result["window_seconds"] = round(window, 4)
            result["events_per_second"] = round(events / window) if window > 0 else None
            result["wanted_per_second"] = round(len(ids) / window) if window > 0 else None
            if got["half"] is not None and got["last"] > got["half"] > got["first"]:
                # The rate should not change along the stream; a broker or bridge whose cost
                # grows with what it has seen shows here.
                result["wanted_per_second_halves"] = [
                    round(len(ids) / 2 / (got["half"] - got["first"])),
                    round(len(ids) / 2 / (got["last"] - got["half"])),
                ]
            if got["cpu"] and window > 0:
                result["cpu_share"] = {k: round(v / window, 3) for k, v in got["cpu"].items()}
        result["moved_per_wanted"] = round(len(ids) / len(expected), 4) if expected else None
        result["broker_in_per_wanted"] = (
            round(stats["messages_in"] / len(expected), 4) if expected else None
        )
        log = bridge_log(bridge.log_path)
        result["bridge_counters"] = log["final_counters"]
        result["bridge_log_problems"] = log["problems"]
        result["broker_log_problems"] = scan_log(broker.log_path).get("problems", [])
        return result
    except Exception:
        result["error"] = traceback.format_exc()
        for process, name in ((bridge, "bridge"), (broker, "broker")):
            if process is not None:
                result[f"{name}_log_tail"] = tail(process.log_path)
        return result
    finally:
        if bridge is not None and not stopped:
            result["bridge_stop"] = stop_bridge(bridge)
        if broker is not None:
            result["broker_stop"] = stop_broker(broker)


def bridge_exact(r: dict[str, Any], events: int) -> list[str]:
    """What was not exact in one bridge run (empty: all exact)."""
    problems = []
    if r.get("subscriber_error"):
        problems.append(f"subscriber: {r['subscriber_error']}")
    for key in ("duplicates", "missing", "unexpected", "wrong_topic", "extra_bytes_after"):
        if r.get(key):
            problems.append(f"{key} = {r[key]}")
    if r.get("delivered") != r.get("expected"):
        problems.append(f"delivered {r.get('delivered')} != expected {r.get('expected')}")
    if r.get("broker_messages_in") != r.get("expected"):
        problems.append(f"broker messages_in {r.get('broker_messages_in')} != W")
    stop = r.get("bridge_stop") or {}
    if stop.get("exit_status") != 0 or stop.get("killed"):
        problems.append(f"bridge stop: {stop}")
    counters = r.get("bridge_counters")
    if not counters:
        problems.append("no 'bridge stopped' line in the bridge's log")
    else:
        want = {"records_in": events, "published": r.get("expected"),
                "unwanted_dropped": events - (r.get("expected") or 0), "malformed": 0,
                "refused": 0, "dead_lettered": 0}  # fmt: skip
        for key, value in want.items():
            if counters.get(key) != value:
                problems.append(f"bridge {key} = {counters.get(key)}, expected {value}")
    return problems


# -- flat path ------------------------------------------------------------------------------


def run_flat_path(
    label: str, tansu: Tansu, expected: int, events: int, kafka_extra: dict[str, Any]
) -> dict[str, Any]:
    """Read the whole topic with a plain consumer and filter locally, as flat topics make
    every consumer that wants a slice do."""
    from confluent_kafka import Consumer, TopicPartition

    _filter, wanted = SELECTIVITIES[label]
    loads = json.loads
    consumer = Consumer(
        {
            "bootstrap.servers": tansu.bootstrap,
            "group.id": f"bench-flat-{uuid.uuid4().hex[:12]}",  # required; never joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "queued.max.messages.kbytes": PREFETCH_KBYTES,
            # the same prefetch behaviour as the bridge's defaults, so both read alike
            "fetch.queue.backoff.ms": KAFKA_DEFAULTS["fetch.queue.backoff.ms"],
            **kafka_extra,
            "log_level": 0,
        }
    )
    read = kept = errors = 0
    first = last = None
    cpu_first = cpu = 0.0
    try:
        started = time.monotonic()
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        deadline = started + FLAT_TIMEOUT
        while read < events and time.monotonic() < deadline:
            batch = consumer.consume(BATCH_MAX, 0.5)
            if not batch:
                continue
            if first is None:
                first = time.monotonic()
                cpu_first = time.process_time()
            for message in batch:
                if message.error() is not None:
                    errors += 1
                    continue
                read += 1
                if wanted(loads(message.value())["site"]):
                    kept += 1
            last = time.monotonic()
        cpu = time.process_time() - cpu_first
    finally:
        consumer.close()
    result: dict[str, Any] = {
        "read": read,
        "kept": kept,
        "expected": expected,
        "kafka_errors": errors,
        "moved_per_wanted": round(read / kept, 4) if kept else None,
    }
    if read < events:
        result["error"] = f"read {read} of {events} records within {FLAT_TIMEOUT:g} s"
    if first is not None and last is not None:
        window = last - first
        result["first_record_seconds"] = round(first - started, 3)
        result["window_seconds"] = round(window, 4)
        result["events_per_second"] = round(events / window) if window > 0 else None
        result["total_seconds"] = round(last - started, 4)
        if window > 0:  # this process: the consumer's Python thread and librdkafka's threads
            result["cpu_share"] = round(cpu / window, 3)
    return result


# -- report -------------------------------------------------------------------------------------


def table_lines(report: dict[str, Any]) -> list[str]:
    events = report["parameters"]["events"]
    lines = [
        f"{events:,} records of {EVENT_SIZE} B JSON in {PARTITIONS} partitions; "
        "bridge: Kafka -> bridge -> broker -> subscriber; flat: one consumer reads all, "
        "filters locally",
        "",
        f"{'wanted':<6} {'filter':<18} {'W':>8} {'bridge ev/s':>12} {'flat ev/s':>10} "
        f"{'moved/wanted':>13} {'flat moved/w':>13} {'1st deliv s':>11} {'broker in':>10} "
        f"{'exact':>6}",
    ]
    for label, run in report["runs"].items():
        b, f = run.get("bridge", {}), run.get("flat", {})
        exact = "yes" if not run.get("problems") else "NO"
        lines.append(
            f"{label:<6} {run['filter']:<18} {fmt(run.get('wanted')):>8} "
            f"{fmt(b.get('events_per_second')):>12} {fmt(f.get('events_per_second')):>10} "
            f"{fmt(b.get('moved_per_wanted'), '.3f'):>13} "
            f"{fmt(f.get('moved_per_wanted'), '.1f'):>13} "
            f"{fmt(b.get('first_delivery_seconds'), '.2f'):>11} "
            f"{fmt(b.get('broker_messages_in')):>10} {exact:>6}"
        )
    lines.append("")
    lines.append(
        "CPU share (of one core; machine: all processes, at most "
        f"{os.cpu_count()} cores) between the bridge's first and last delivery:"
    )
    for label, run in report["runs"].items():
        share = run.get("bridge", {}).get("cpu_share")
        if share:
            text = ", ".join(f"{name} {value:.0%}" for name, value in share.items())
            halves = run["bridge"].get("wanted_per_second_halves")
            if halves:
                text += f"; wanted/s in the first and second half {halves[0]:,} / {halves[1]:,}"
            lines.append(f"  {label:<6} {text}")
    flat = [
        f"{label}: {run['flat']['cpu_share']:.0%}"
        for label, run in report["runs"].items()
        if run.get("flat", {}).get("cpu_share") is not None
    ]
    if flat:
        lines.append(f"flat consumer's process (all its threads): {', '.join(flat)}")
    return lines


def check_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    goals = Goals()
    add = goals.add

    for label, run in report["runs"].items():
        b = run.get("bridge") or {}
        rate = b.get("events_per_second")
        judged = rate is not None and not report["parameters"]["quick"]  # too few to time
        add(f"bridge >= {GOAL_EVENTS_PER_SECOND:,} events/s, {label} wanted", rate,
            rate >= GOAL_EVENTS_PER_SECOND if judged else None)  # fmt: skip
        moved = b.get("moved_per_wanted")
        add(f"bridge moves <= {GOAL_MOVED_PER_WANTED} messages per wanted, {label} wanted",
            moved, None if moved is None else moved <= GOAL_MOVED_PER_WANTED)  # fmt: skip
        add(f"exact counts, {label} wanted", run.get("problems") or "exact",
            None if "bridge" not in run else not run.get("problems"))  # fmt: skip
    if report["parameters"]["quick"]:
        for goal in goals:
            goal["note"] = "quick run"
    return goals


def machine_info() -> dict[str, Any]:
    import confluent_kafka

    return common_machine_info(
        trio=trio.__version__,
        msgpack=".".join(map(str, msgpack.version)),
        confluent_kafka=getattr(confluent_kafka, "__version__", None),
        librdkafka=confluent_kafka.libversion()[0],
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__)
    parser.add_argument("--events", type=int, help="records in the stream (default 200,000)")
    parser.add_argument(
        "--only", default=",".join(SELECTIVITIES),
        help="comma-separated selectivities to run (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--log-dir", help="keep logs and configs here (default: a temporary directory, removed)"
    )
    parser.add_argument(
        "--profile-bridge", metavar="DIR",
        help="run each bridge under cProfile, writing DIR/bridge-<label>.prof (slows it)",
    )  # fmt: skip
    parser.add_argument(
        "--peer-keepalive", type=float, default=PEER_KEEPALIVE, metavar="SECONDS",
        help="the brokers' [peering] keepalive (default %(default)g, as in the broker)",
    )  # fmt: skip
    parser.add_argument(
        "--kafka", action="append", default=[], metavar="KEY=VALUE",
        help="a librdkafka setting for both the bridge ([kafka]) and the flat consumer, "
        "e.g. fetch.queue.backoff.ms=10 (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--dedup-window", type=int, metavar="N",
        help="the brokers' [limits] dedup_window (default: the broker's default, 100,000)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    kafka: dict[str, Any] = {}
    for item in args.kafka:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            parser.error(f"--kafka takes KEY=VALUE, got {item!r}")
        value = value.strip()
        kafka[key.strip()] = int(value) if value.lstrip("-").isdigit() else value
    args.kafka = kafka
    if args.dedup_window is not None and args.dedup_window < 0:
        parser.error("--dedup-window must be at least 0")
    if not 0 < args.peer_keepalive <= 3600:
        parser.error("--peer-keepalive must be in (0, 3600]")
    if args.events is not None and args.events < 2 * PARTITIONS:
        parser.error(f"--events must be at least {2 * PARTITIONS}")
    labels = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(labels) - set(SELECTIVITIES))
    if unknown or not labels:
        parser.error(f"unknown selectivities {unknown}; known: {', '.join(SELECTIVITIES)}")
    args.labels = [x for x in SELECTIVITIES if x in labels]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    if args.events is not None:
        params["events"] = args.events
    events = params["events"]
    report: dict[str, Any] = {
        "benchmark": "bridge",
        "machine": machine_info(),
        "parameters": {
            **params,
            "quick": args.quick,
            "partitions": PARTITIONS,
            "value_bytes": EVENT_SIZE,
            "sites": SITES,
            "template": TEMPLATE,
            "filters": {label: SELECTIVITIES[label][0] for label in args.labels},
            "bridge_kafka": {**KAFKA_GROUP_TIMEOUTS, **args.kafka},
            "kafka_both": args.kafka,
            "bridge_settings": BRIDGE_SETTINGS,
            "flat_batch": BATCH_MAX,
            "bridge_profiled": bool(args.profile_bridge),
            "broker_peer_keepalive": args.peer_keepalive,
            "broker_dedup_window": args.dedup_window,
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": {},
    }
    started = time.monotonic()
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix="topiary-bridge-")
    log_dir = Path(args.log_dir or temp_dir)  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    profile_dir = Path(args.profile_bridge) if args.profile_bridge else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    ok = True
    print(
        f"bridge: {report['machine']['cpu_count']} CPUs, Python {report['machine']['python']}, "
        f"load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    tansu: Tansu | None = None
    try:
        try:
            tansu = start_tansu(log_path=str(log_dir / "tansu.log"))
            report["tansu_pid"] = tansu.process.pid
        except TansuUnavailable as exc:
            print(f"Tansu is unavailable: {exc}", file=sys.stderr)
            return 2
        print(f"  producing {events:,} records ...", flush=True)
        produced = produce(tansu, events)
        records = produced.pop("records")
        report["produce"] = produced
        for label in args.labels:
            expected = expected_ids(records, label)
            run: dict[str, Any] = {"filter": SELECTIVITIES[label][0], "wanted": len(expected)}
            report["runs"][label] = run
            print(f"  {label}: flat consumer ...", flush=True)
            try:
                run["flat"] = run_flat_path(label, tansu, len(expected), events, args.kafka)
            except Exception:
                run["flat"] = {"error": traceback.format_exc()}
            print(f"  {label}: bridge ...", flush=True)
            run["bridge"] = run_bridge_path(
                label, tansu, expected, events, log_dir, profile_dir,
                args.peer_keepalive, args.dedup_window, args.kafka,
            )  # fmt: skip
            problems = [] if "error" in run["bridge"] else bridge_exact(run["bridge"], events)
            if "error" in run["bridge"]:
                problems.append("bridge run failed")
            flat = run["flat"]
            if "error" in flat:
                problems.append(f"flat: {flat['error'].strip().splitlines()[-1]}")
            elif flat["kept"] != len(expected) or flat["read"] != events:
                problems.append(f"flat kept {flat['kept']} of {flat['read']}")
            run["problems"] = problems
            if problems:
                ok = False
                print(f"  {label}: NOT EXACT: {problems}", file=sys.stderr, flush=True)
                for key in ("bridge_log_tail", "broker_log_tail"):
                    if key in run["bridge"]:
                        print(f"--- {key}:\n{run['bridge'][key]}", file=sys.stderr)
                if "error" in run["bridge"]:
                    print(run["bridge"]["error"], file=sys.stderr)
    except Exception:
        report["error"] = traceback.format_exc()
        print(f"failed:\n{report['error']}", file=sys.stderr, flush=True)
        if tansu is not None:
            print(f"--- Tansu log tail:\n{tail(Path(tansu.log_path))}", file=sys.stderr)
        ok = False
    finally:
        if tansu is not None:
            tansu.stop()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = round(time.monotonic() - started, 2)
    report["goals"] = check_goals(report)

    print()
    for line in table_lines(report):
        print(line)
    if "produce" in report:
        p = report["produce"]
        print(f"produced in {p['seconds']:.2f} s ({p['per_second']:,}/s); log ends {p['log_end']}")
    print_ending(report)
    write_report(report, args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
