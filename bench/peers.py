"""Peer brokers benchmark: a line of brokers against one, link frames, propagation, failover.

    python bench/peers.py [--quick] [--json PATH] [--events N] [--log-dir DIR]

Every broker is a real ``python -m broker.cli serve`` subprocess on a free 127.0.0.1 port,
``--broker-id`` A, B, C, ... and ``--log-format json`` (stdout and stderr to a log file that
is scanned for warnings, errors and tracebacks afterwards), all with one config file::

    [peering]
    keepalive = 0.3      # a silent link is closed after 3 x 0.3 s
    flush = 0.005        # local route changes are coalesced for 5 ms
    backoff_max = 0.5    # a dialler retries at least every ~0.5 s

Brokers are stopped with SIGTERM (SIGCONT first, in case one is stopped; SIGKILL after 10 s),
always, in a ``finally``. Every wait below is bounded in time.

Measured in one run:

1. Throughput. N events (100,000 by default) of 100 bytes, published by one publisher
   process (``broker.client``, ``publish`` without confirm, pipelined as in bench/e2e.py) to
   a wildcard subscriber (``bench/peers/>``, a lean raw reader in its own process):

   - ``single``: publisher and subscriber on one broker (no peers);
   - ``line``: brokers A-B-C plus D on B (B dials nobody; A, C and D dial B); publisher on
     A, subscriber on C, so every event crosses A->B->C; D has no subscriber;
   - ``line_keepalive_2`` (not with ``--quick``): the same line with the default
     ``keepalive = 2.0``, as a control. With 0.3 s, A closes its link to B as silent when B
     falls more than ~1 s behind (seen with 300,000 events, and with 100,000 on a loaded
     machine): A's PING waits in the link's queue behind the FWDs, so B's PONG comes too
     late, although B is alive and working; the events in flight are lost.

   events/s = events received / (first publish -> last receipt at the subscriber), both
   taken with CLOCK_MONOTONIC (system-wide on Linux). The subscriber checks every event's
   sequence number (no duplicate, none missing, in order). The subscriber's SUB uses
   ``sync`` so that the route is in place everywhere before the first publish.

2. Link frames per delivered event. The brokers' ``stats()["peering"]["links"][peer]
   ["fwd_out"]`` before and after the line run, per directed link, divided by the events
   delivered: 1.0 on A->B and B->C, 0 on every other direction (B->D above all).

3. Propagation, on the same line. ``subscribe`` without sync on C (a fresh exact filter per
   sample), then a probe published on A every 1 ms until the first arrives at C: the time
   from SUBACK (and from sending SUB) to that arrival, median and max over the samples. The
   same with ``sync=True``: the time until SUBACK, then one probe published on A after the
   SUBACK, which must arrive.

4. Convergence, in a ring A-B-C-D-A (A dials B, B dials C, C dials D, D dials A).
   Subscriber on C (sync), publisher on A publishing every 2 ms an event with a unique
   sequence number, A's route table polled every 5 ms (``routes()``). A's next hop to C is
   B (both B and D are on a shortest path; the lowest id wins). Five cycles of kill and
   restart, then three of stop and continue (one each with ``--quick``):

   - ``kill -9 B``: time until the first event published after the kill reaches C, and
     until A's table routes C via D;
   - restart B (same id, port, config): time until B accepts clients, until A's table
     lists B reachable again, and until A routes C via B again;
   - ``SIGSTOP B`` (a hung broker, not a dead one: its sockets stay open, so only the
     keepalive can tell): as for the kill; then ``SIGCONT`` and the time until A's table
     lists B reachable and routes C via B again.

   Events lost, duplicated, out of order or late (> 100 ms end to end) are counted per
   phase (by publish time); a phase starts at its action and ends at the next one, except
   that a kill or a stop starts 20 ms early, so that events in flight when it happened are
   lost to it (``lost_at_ms``: publish times relative to the action). A broker that
   crashes is recorded with its last words (brokers have been seen to crash after B's
   SIGCONT): B is started again and the cycles go on; a crash of A, C or D (the bench's
   connections are on A and C) ends this part with what was measured so far.

The machine is shared by every broker, the publisher and the subscriber: on 2 cores a line
of three brokers has less CPU per broker than a single broker, which is part of what the
comparison shows. ``--quick`` uses tiny counts (the CI smoke test, ~10 s). The exit status is
0 unless a part failed to run; what the brokers did wrong (lost events, a crash, errors in
their logs) is reported as a FAIL check or a note, not as a failure of the benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import trio  # noqa: E402

from bench.harness import BenchError  # noqa: E402
from bench.harness.mesh import BrokerMesh, write_config  # noqa: E402
from bench.harness.procfs import cpu_seconds  # noqa: E402
from bench.harness.report import (  # noqa: E402
    Goals,
    arg_parser,
    fmt,
    print_ending,
    write_report,
)
from bench.harness.report import machine_info as common_machine_info  # noqa: E402
from bench.harness.wire import next_frame, open_raw  # noqa: E402
from bench.harness.workers import Worker  # noqa: E402
from broker.client import BrokerError, Client, ConnectionLost, ProtocolError, connect  # noqa: E402
from broker.wire.frames import Error, Pong, Sub, SubAck  # noqa: E402

HOST = "127.0.0.1"
PAYLOAD_SIZE = 100
TOPIC_PREFIX = "bench/peers/"
TOPICS = 16  # the publisher cycles through bench/peers/t0 .. t15
WILDCARD = "bench/peers/>"
PROBE_PREFIX = "bench/probe/"
SYNC_PREFIX = "bench/sync/"
CONVERGENCE_FILTER = "bench/conv/>"
CONVERGENCE_TOPIC = "bench/conv/e"
RECEIVE_SIZE = 256 * 1024
KEEPALIVE = 600.0  # client keepalive: the bench clients only read or only write
PEERING = {"keepalive": 0.3, "flush": 0.005, "backoff_max": 0.5}
CONTROL_KEEPALIVE = 2.0  # the default: the line's throughput again, as a control
IN_FLIGHT_MS = 20.0  # a failure phase starts this much before its action (events in flight)
MESH_TIMEOUT = 20.0
WORKER_READY_TIMEOUT = 60.0
IDLE_TIMEOUT = 5.0  # the subscriber gives up this long after its last event
PROBE_INTERVAL = 0.001
PROBE_TIMEOUT = 5.0
SAMPLE_PAUSE = 0.05  # between propagation samples, so one sample's UNSUB is flushed
CONVERGENCE_INTERVAL = 0.002
ROUTE_POLL = 0.005
LATE_MS = 100.0  # an event slower than this end to end is counted as late
CONVERGE_TIMEOUT = 10.0
RESTART_TIMEOUT = 20.0
STEADY_SECONDS = 0.3
SETTLE_SECONDS = 1.0

LINE = {"A": ["B"], "B": [], "C": ["B"], "D": ["B"]}
RING = {"A": ["B"], "B": ["C"], "C": ["D"], "D": ["A"]}
PATH_LINKS = ("A->B", "B->C")
CONTROL = "line_keepalive_2"  # the throughput key of the control run

FULL: dict[str, Any] = {
    "events": 100_000,
    "probe_samples": 20,
    "sync_samples": 20,
    "kill_cycles": 5,
    "stop_cycles": 3,
    "control_keepalive": CONTROL_KEEPALIVE,
}
QUICK: dict[str, Any] = {
    "events": 2_000,
    "probe_samples": 3,
    "sync_samples": 3,
    "kill_cycles": 1,
    "stop_cycles": 1,
    "control_keepalive": None,
}


# -- worker processes: publisher and subscriber of the throughput runs ----------------------


async def publisher_main(pipe: Pipe, port: int, count: int) -> None:
    """Publish ``count`` events (8-byte sequence number + filler) without confirm."""
    filler = bytes(range(256))[: max(0, PAYLOAD_SIZE - 8)]
    topics = [f"{TOPIC_PREFIX}t{k}" for k in range(TOPICS)]
    payloads = [seq.to_bytes(8, "big") + filler for seq in range(count)]
    async with connect((HOST, port), keepalive=KEEPALIVE) as client:
        pipe.send(("ready", {"pid": os.getpid()}))
        command = await trio.to_thread.run_sync(pipe.recv)
        if command[0] != "go":
            return
        cpu = time.process_time()
        publish = client.publish
        first = time.monotonic_ns()
        for seq in range(count):
            await publish(topics[seq % TOPICS], payloads[seq])
        last = time.monotonic_ns()
        await client.ping()  # every PUB before it has been processed by the broker
        processed = time.monotonic_ns()
        pipe.send(
            (
                "published",
                {
                    "sent": count,
                    "first_ns": first,
                    "last_ns": last,
                    "processed_ns": processed,
                    "cpu_seconds": time.process_time() - cpu,
                },
            )
        )
        await trio.to_thread.run_sync(pipe.recv)  # "stop"


async def subscriber_main(pipe: Pipe, port: int, count: int, overall: float) -> None:
    """Subscribe to the wildcard with sync, then count events until all ``count`` came."""
    stream, proto = await open_raw(port)
    try:
        await stream.send_all(proto.send(Sub(id=1, filter=WILDCARD, sync=True)))
        event = await next_frame(stream, proto, "the broker closed the subscriber's connection")
        if isinstance(event, Error):
            raise BenchError(f"SUB refused: {event.code} {event.text}")
        if not isinstance(event, SubAck):
            raise BenchError(f"expected SUBACK, got {event!r}")
        if proto.buffered:
            raise BenchError("unexpected bytes after SUBACK")
        pipe.send(("ready", {"pid": os.getpid()}))
        command = await trio.to_thread.run_sync(pipe.recv)
        if command[0] != "go":
            return
        cpu = time.process_time()
        seen = bytearray(count)
        received = duplicates = out_of_order = foreign = 0
        next_seq = 0
        first_ns = last_ns = None
        error = None
        buf = bytearray()
        unpack = msgpack.unpackb
        with trio.move_on_after(overall) as overall_scope:
            while received < count:
                with trio.move_on_after(IDLE_TIMEOUT) as idle:
                    data = await stream.receive_some(RECEIVE_SIZE)
                if idle.cancelled_caught:
                    if received:
                        error = f"no event for {IDLE_TIMEOUT:g} s after {received:,}"
                        break
                    continue
                if not data:
                    error = "EOF: the broker closed the connection"
                    break
                now = time.monotonic_ns()
                buf += data
                pos = 0
                size = len(buf)
                while size - pos >= 4:
                    end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
                    if end > size:
                        break
                    body = unpack(buf[pos + 4 : end])
                    pos = end
                    kind = body.get("type")
                    if kind == "MSG":
                        seq = int.from_bytes(body["payload"][:8], "big")
                        if seq >= count:
                            foreign += 1
                            continue
                        if seen[seq]:
                            duplicates += 1
                            continue
                        seen[seq] = 1
                        received += 1
                        if seq < next_seq:
                            out_of_order += 1
                        else:
                            next_seq = seq + 1
                        if first_ns is None:
                            first_ns = now
                        last_ns = now
                    elif kind == "PING":
                        await stream.send_all(proto.send(Pong(id=body.get("id", 0))))
                    elif kind == "ERROR":
                        error = f"ERROR {body.get('code')}: {body.get('text')}"
                del buf[:pos]
                if error is not None:
                    break
        if overall_scope.cancelled_caught:
            error = f"not all events within {overall:g} s ({received:,} of {count:,})"
        pipe.send(
            (
                "result",
                {
                    "received": received,
                    "duplicates": duplicates,
                    "out_of_order": out_of_order,
                    "foreign": foreign,
                    "first_ns": first_ns,
                    "last_ns": last_ns,
                    "error": error,
                    "cpu_seconds": time.process_time() - cpu,
                },
            )
        )
        await trio.to_thread.run_sync(pipe.recv)  # "stop"
    finally:
        await trio.aclose_forcefully(stream)


# -- broker logs ----------------------------------------------------------------------------


def log_summary(cluster: BrokerMesh) -> dict[str, Any]:
    """Every launch's log of every broker, scanned."""
    return {
        name: [scan_log(path) for path in node.log_paths] for name, node in cluster.nodes.items()
    }


def scan_log(path: Path) -> dict[str, Any]:
    """Warnings and errors in a broker log, counted by event; tracebacks and non-JSON lines."""
    problems: Counter[str] = Counter()
    first: dict[str, str] = {}
    lines = 0
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return {"path": path.name, "error": str(exc)}
    for line in text.splitlines():
        if not line.strip():
            continue
        lines += 1
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            key = "non-JSON line"
        elif record.get("level") in ("warning", "error", "critical", "exception"):
            key = f"{record['level']}: {record.get('event')}"
        else:
            continue
        problems[key] += 1
        first.setdefault(key, line[:300])
    return {"path": path.name, "lines": lines, "problems": dict(problems), "first": first}


# -- talking to brokers ---------------------------------------------------------------------


async def _stats_of(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with trio.fail_after(15):
        for name, port in ports.items():
            async with connect((HOST, port), keepalive=KEEPALIVE) as client:
                out[name] = await client.stats()
    return out


async def _stats_of_live(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    """As ``_stats_of``, leaving out a broker that does not answer (dead, or starting)."""
    out: dict[str, dict[str, Any]] = {}
    for name, port in ports.items():
        with contextlib.suppress(OSError, ConnectionLost, BrokerError, trio.TooSlowError):
            with trio.fail_after(5):
                async with connect((HOST, port), keepalive=KEEPALIVE) as client:
                    out[name] = await client.stats()
    return out


def stats_of(ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    return trio.run(_stats_of, ports)


def origin(routes: dict[str, Any], name: str) -> dict[str, Any]:
    return routes.get("origins", {}).get(name) or {}


async def wait_mesh(ports: dict[str, int], check: Callable[[str, dict], bool]) -> float:
    """Poll every broker's routes until ``check(name, routes)`` holds for all of them."""
    started = trio.current_time()
    with trio.fail_after(MESH_TIMEOUT):
        for name, port in ports.items():
            async with connect((HOST, port), keepalive=KEEPALIVE) as client:
                while not check(name, await client.routes()):
                    await trio.sleep(0.02)
    return trio.current_time() - started


def all_reachable(names: list[str]) -> Callable[[str, dict], bool]:
    return lambda _name, routes: all(origin(routes, n).get("reachable") for n in names)


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def summary(values: list[float]) -> dict[str, Any]:
    clean = [v for v in values if v is not None]
    if not clean:
        return {"samples": 0, "median": None, "max": None, "min": None}
    return {
        "samples": len(clean),
        "median": round(statistics.median(clean), 4),
        "max": round(max(clean), 4),
        "min": round(min(clean), 4),
    }


# -- 1 + 2: throughput and link frames ------------------------------------------------------


def run_throughput(cluster: BrokerMesh, pub: str, sub: str, count: int, ctx: Any) -> dict[str, Any]:
    """One publisher on ``pub``, one wildcard subscriber on ``sub``; stats deltas of all."""
    ports = cluster.ports
    overall = max(60.0, count / 2_000)
    workers: list[Worker] = []
    try:
        subscriber = Worker(ctx, subscriber_main, (ports[sub], count, overall), "subscriber")
        workers.append(subscriber)
        publisher = Worker(ctx, publisher_main, (ports[pub], count), "publisher")
        workers.append(publisher)
        sub_ready = subscriber.expect("ready", WORKER_READY_TIMEOUT)[1]
        pub_ready = publisher.expect("ready", WORKER_READY_TIMEOUT)[1]
        before = stats_of(ports)
        pids = cluster.pids()
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        wall_start = time.monotonic()
        subscriber.send(("go",))
        publisher.send(("go",))
        published = publisher.expect("published", overall + 30)[1]
        got = subscriber.expect("result", overall + 30)[1]
        wall = time.monotonic() - wall_start
        cpu_after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        after = stats_of(ports)
    finally:
        for worker in workers:
            worker.stop()
    end_ns = got["last_ns"] or published["processed_ns"]
    seconds = (end_ns - published["first_ns"]) / 1e9
    result: dict[str, Any] = {
        "publisher": pub,
        "subscriber": sub,
        "sent": published["sent"],
        "received": got["received"],
        "lost": published["sent"] - got["received"],
        "duplicates": got["duplicates"],
        "out_of_order": got["out_of_order"],
        "foreign": got["foreign"],
        "subscriber_error": got["error"],
        "seconds": round(seconds, 4),
        "events_per_second": round(got["received"] / seconds, 1) if seconds > 0 else None,
        "published_per_second": round(
            published["sent"] / ((published["last_ns"] - published["first_ns"]) / 1e9), 1
        ),
        "publisher_cpu_seconds": round(published["cpu_seconds"], 3),
        "subscriber_cpu_seconds": round(got["cpu_seconds"], 3),
        "worker_pids": [sub_ready["pid"], pub_ready["pid"]],
        "broker_cpu_utilisation": {
            name: round((cpu_after[name] - cpu_before[name]) / wall, 3) for name in pids
        },
        "phase_wall_seconds": round(wall, 3),
        "brokers": {name: _delta(before[name], after[name]) for name in ports},
    }
    result["links"] = _link_frames(before, after, got["received"])
    return result


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out = {
        key: after[key] - before[key]
        for key in ("messages_in", "messages_out", "dropped", "messages_unrouted")
    }
    errors = Counter(after.get("errors", {}))
    errors.subtract(before.get("errors", {}))
    out["errors"] = {k: v for k, v in errors.items() if v}
    p_before, p_after = before.get("peering"), after.get("peering")
    if p_after is not None:
        p_before = p_before or {}
        out["peering"] = {
            key: p_after[key] - p_before.get(key, 0)
            for key in (
                "fwd_out", "fwd_in", "delivered_from_peers", "unreachable_dropped",
                "link_dropped", "hop_limit_dropped", "duplicates_dropped", "links_opened",
            )
        }  # fmt: skip
    return out


def _link_frames(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], delivered: int
) -> dict[str, Any]:
    """FWD frames per directed link during the run, and per delivered event."""
    links: dict[str, Any] = {}
    for name, stats in after.items():
        for peer, link in (stats.get("peering") or {}).get("links", {}).items():
            old = ((before[name].get("peering") or {}).get("links") or {}).get(peer, {})
            frames = link["fwd_out"] - old.get("fwd_out", 0)
            links[f"{name}->{peer}"] = {
                "fwd_out": frames,
                "dropped": link["dropped"] - old.get("dropped", 0),
                "per_event": round(frames / delivered, 6) if delivered else None,
            }
    return dict(sorted(links.items()))


# -- 3: propagation -------------------------------------------------------------------------


async def _probe_sample(pub: Client, sub_client: Client, index: int) -> dict[str, Any]:
    """SUB without sync on C, a probe on A every 1 ms until one arrives."""
    topic = f"{PROBE_PREFIX}{index}"
    sent: list[int] = []
    sample: dict[str, Any] = {"filter": topic}
    t0 = time.monotonic_ns()
    async with sub_client.subscribe(topic) as sub:
        t1 = time.monotonic_ns()

        async def probe() -> None:
            start = trio.current_time()
            for k in range(int(PROBE_TIMEOUT / PROBE_INTERVAL)):
                await trio.sleep_until(start + k * PROBE_INTERVAL)
                sent.append(time.monotonic_ns())
                await pub.publish(topic, str(k).encode())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            with trio.move_on_after(PROBE_TIMEOUT + 1):
                message = await sub.get()
                t2 = time.monotonic_ns()
                k = int(message.payload)
                sample.update(
                    {
                        "after_suback_ms": _ms(t2 - t1),
                        "after_sub_ms": _ms(t2 - t0),
                        "suback_ms": _ms(t1 - t0),
                        "first_probe": k,
                        "probes_sent": len(sent),
                        "probe_transit_ms": _ms(t2 - sent[k]),
                    }
                )
            nursery.cancel_scope.cancel()
    if "after_suback_ms" not in sample:
        sample["error"] = f"no probe arrived within {PROBE_TIMEOUT:g} s"
    return sample


async def _sync_sample(pub: Client, sub_client: Client, index: int) -> dict[str, Any]:
    """SUB with sync on C; then one probe on A, which must arrive."""
    topic = f"{SYNC_PREFIX}{index}"
    sample: dict[str, Any] = {"filter": topic}
    t0 = time.monotonic_ns()
    async with sub_client.subscribe(topic, sync=True) as sub:
        t1 = time.monotonic_ns()
        sample["suback_ms"] = _ms(t1 - t0)
        await pub.publish(topic, b"after-suback")
        with trio.move_on_after(2.0):
            await sub.get()
            sample["probe_delivered"] = True
            sample["probe_ms"] = _ms(time.monotonic_ns() - t1)
        sample.setdefault("probe_delivered", False)
    return sample


async def _propagation(ports: dict[str, int], probes: int, syncs: int) -> dict[str, Any]:
    async with (
        connect((HOST, ports["A"]), keepalive=KEEPALIVE) as pub,
        connect((HOST, ports["C"]), keepalive=KEEPALIVE) as sub_client,
    ):
        nosync = []
        for i in range(probes):
            nosync.append(await _probe_sample(pub, sub_client, i))
            await trio.sleep(SAMPLE_PAUSE)
        synced = []
        for i in range(syncs):
            synced.append(await _sync_sample(pub, sub_client, i))
            await trio.sleep(SAMPLE_PAUSE)
    return {
        "nosync": {
            "after_suback_ms": summary([s.get("after_suback_ms") for s in nosync]),
            "after_sub_ms": summary([s.get("after_sub_ms") for s in nosync]),
            "probe_transit_ms": summary([s.get("probe_transit_ms") for s in nosync]),
            "errors": sum("error" in s for s in nosync),
            "samples": nosync,
        },
        "sync": {
            "suback_ms": summary([s["suback_ms"] for s in synced]),
            "probe_delivered": sum(s["probe_delivered"] for s in synced),
            "samples": synced,
        },
    }


# -- 4: convergence in a ring ----------------------------------------------------------------


class EventFlow:
    """Events published on A every 2 ms and received on C: send and receive times."""

    def __init__(self) -> None:
        self.sent: list[int] = []  # monotonic ns per sequence number
        self.receipts: list[tuple[int, int]] = []  # (seq, monotonic ns)
        self.running = True

    async def publish(self, client: Client) -> None:
        start = trio.current_time()
        k = 0
        while self.running:
            await trio.sleep_until(start + k * CONVERGENCE_INTERVAL)
            k += 1
            seq = len(self.sent)
            self.sent.append(time.monotonic_ns())
            await client.publish(CONVERGENCE_TOPIC, str(seq).encode())

    async def receive(self, sub: Any) -> None:
        async for message in sub:
            self.receipts.append((int(message.payload), time.monotonic_ns()))

    def first_receipt_after(self, t0: int, start_index: int = 0) -> int | None:
        """Receive time of the first event published after ``t0`` to arrive."""
        sent = self.sent
        for seq, at in self.receipts[start_index:]:
            if sent[seq] > t0:
                return at
        return None

    def phases(self, marks: list[tuple[str, int]]) -> dict[str, dict[str, Any]]:
        """Per phase (by publish time): published, lost, duplicates, out of order, late."""
        # A failure phase starts a little before its action: what was in flight then is
        # lost to the failure, not to the phase before.
        early = int(IN_FLIGHT_MS * 1e6)
        bounds = [
            t - early if name.endswith((":kill", ":stop")) else t for name, t in marks[1:]
        ] + [self.sent[-1] + 1 if self.sent else 0]
        out = {}
        counts: Counter[int] = Counter(seq for seq, _ in self.receipts)
        phase_of = []
        index = 0
        for at in self.sent:
            while index < len(bounds) - 1 and at >= bounds[index]:
                index += 1
            phase_of.append(index)
        for name, _ in marks:
            out[name] = {
                "published": 0, "received": 0, "lost": 0, "duplicates": 0, "out_of_order": 0,
                "late": 0, "max_latency_ms": 0.0, "lost_at_ms": [],
            }  # fmt: skip
        for seq, i in enumerate(phase_of):
            row = out[marks[i][0]]
            row["published"] += 1
            if counts[seq]:
                row["received"] += 1
                row["duplicates"] += counts[seq] - 1
            else:
                row["lost"] += 1
                if len(row["lost_at_ms"]) < 20:
                    start = marks[i][1]
                    row["lost_at_ms"].append(round((self.sent[seq] - start) / 1e6, 1))
        highest = -1
        for seq, at in self.receipts:
            row = out[marks[phase_of[seq]][0]]
            if seq < highest:
                row["out_of_order"] += 1
            highest = max(highest, seq)
            latency = (at - self.sent[seq]) / 1e6
            if latency > LATE_MS:
                row["late"] += 1
            row["max_latency_ms"] = round(max(row["max_latency_ms"], latency), 3)
        return out


async def _watch(
    route_client: Client,
    t0: int,
    timeout: float,
    route_checks: dict[str, Callable[[dict], bool]],
    flow: EventFlow | None = None,
    extra: dict[str, Callable[[], Any]] | None = None,
    abort: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Seconds from ``t0`` until each check first held (None: not within ``timeout``).

    Route checks are evaluated on A's routes, polled every 5 ms (the time is the poll's
    reply); ``events`` (with ``flow``) is the receipt of the first event published after
    ``t0``; ``extra`` checks are awaited concurrently and return the time they held. If
    ``abort`` returns a reason (a broker died), the watch stops with ``aborted`` set.
    """
    found: dict[str, Any] = {name: None for name in route_checks}
    start_index = len(flow.receipts) if flow is not None else 0
    if flow is not None:
        found["events"] = None
    extra = extra or {}
    for name in extra:
        found[name] = None
    aborted = None

    async def run_extra(name: str, check: Callable[[], Any]) -> None:
        at = await check()
        found[name] = round((at - t0) / 1e9, 4)

    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            for name, check in extra.items():
                nursery.start_soon(run_extra, name, check)
            while True:
                if flow is not None and found["events"] is None:
                    # receipts before start_index were received before t0
                    at = flow.first_receipt_after(t0, max(0, start_index - 50))
                    if at is not None:
                        found["events"] = round((at - t0) / 1e9, 4)
                pending = [name for name in route_checks if found[name] is None]
                if pending:
                    routes = await route_client.routes()
                    now = time.monotonic_ns()
                    for name in pending:
                        if route_checks[name](routes):
                            found[name] = round((now - t0) / 1e9, 4)
                if all(v is not None for v in found.values()):
                    nursery.cancel_scope.cancel()
                    break
                if abort is not None:
                    aborted = abort()
                    if aborted is not None:
                        nursery.cancel_scope.cancel()
                        break
                await trio.sleep(ROUTE_POLL)
    if aborted is not None:
        found["aborted"] = aborted
    return found


def _next_hop(routes: dict[str, Any], name: str) -> str | None:
    return origin(routes, name).get("next_hop")


async def _accepting(port: int) -> int:
    """Wait until a broker on ``port`` answers HELLO; the monotonic ns it did."""
    while True:
        try:
            async with connect((HOST, port), keepalive=KEEPALIVE):
                return time.monotonic_ns()
        except OSError:
            await trio.sleep(0.01)


def _died(cluster: BrokerMesh, names: list[str]) -> dict[str, Any] | None:
    """The first of ``names`` whose process has exited: its exit status and last words."""
    for name in names:
        node = cluster.nodes[name]
        if node.popen is not None and node.popen.poll() is not None:
            last = ""
            with contextlib.suppress(OSError):
                lines = node.log_paths[-1].read_text(errors="replace").splitlines()
                plain = [line for line in lines if line.strip() and not line.startswith("{")]
                last = (plain or lines or [""])[-1][:300]
            return {"broker": name, "exit_status": node.popen.returncode, "message": last}
    return None


# what the bench's clients raise when their broker goes away (a LocalProtocolError too: the
# client may try to send on a connection it has not yet seen closed)
CLIENT_ERRORS = (ConnectionLost, BrokerError, ProtocolError, OSError, trio.BrokenResourceError)
UNKNOWN_CRASH = {"broker": "?", "exit_status": None, "message": "(its process was not found dead)"}


def _crash_text(crash: dict[str, Any]) -> str:
    return f"broker {crash['broker']} exited with status {crash['exit_status']}: {crash['message']}"


async def _convergence(cluster: BrokerMesh, kill_cycles: int, stop_cycles: int) -> dict[str, Any]:
    ports = cluster.ports
    flow = EventFlow()
    marks: list[tuple[str, int]] = []
    cycles: list[dict[str, Any]] = []
    crashes: list[dict[str, Any]] = []
    result: dict[str, Any] = {"cycles": cycles, "crashes": crashes}
    others = ["A", "C", "D"]  # the bench's clients are on A and C

    def crashed(cycle: dict[str, Any], crash: dict[str, Any], fatal: bool) -> None:
        cycle["crash"] = _crash_text(crash)
        crashes.append({**crash, "cycle": cycle["cycle"], "kind": cycle["kind"], "fatal": fatal})

    def via(hop: str) -> Callable[[dict], bool]:
        return lambda routes: _next_hop(routes, "C") == hop

    def b_reachable(routes: dict) -> bool:
        return bool(origin(routes, "B").get("reachable"))

    def b_unreachable(routes: dict) -> bool:
        return not origin(routes, "B").get("reachable")

    def others_died() -> str | None:
        crash = _died(cluster, others)
        return None if crash is None else _crash_text(crash)

    def any_died() -> str | None:
        crash = _died(cluster, [*others, "B"])
        return None if crash is None else _crash_text(crash)

    async def run_cycles(route_client: Client) -> None:
        plan = ["kill"] * kill_cycles + ["stop"] * stop_cycles
        for number, kind in enumerate(plan, 1):
            cycle: dict[str, Any] = {"cycle": number, "kind": kind}
            cycles.append(cycle)
            ready = await _watch(
                route_client, time.monotonic_ns(), CONVERGE_TIMEOUT, {"via_B": via("B")},
                abort=any_died,
            )  # fmt: skip
            if ready["via_B"] is None:
                crash = _died(cluster, [*others, "B"])
                if crash is not None:
                    crashed(cycle, crash, fatal=True)
                else:
                    cycle["error"] = "A does not route C via B before the cycle"
                return
            await trio.sleep(STEADY_SECONDS)
            t_fail = time.monotonic_ns()
            if kind == "kill":
                marks.append((f"{number}:kill", t_fail))
                cluster.kill("B")
            else:
                marks.append((f"{number}:stop", t_fail))
                cluster.pause("B")
            failed = await _watch(
                route_client,
                t_fail,
                CONVERGE_TIMEOUT,
                {"route_via_D": via("D"), "B_unreachable": b_unreachable},
                flow,
                abort=others_died,
            )
            cycle["failure"] = failed
            if "aborted" in failed:
                crashed(cycle, _died(cluster, others) or UNKNOWN_CRASH, fatal=True)
                return
            t_back = time.monotonic_ns()
            if kind == "kill":
                marks.append((f"{number}:restart", t_back))
                cluster.launch("B")
                extra = {"B_accepting": lambda: _accepting(ports["B"])}
            else:
                marks.append((f"{number}:cont", t_back))
                cluster.resume("B")
                extra = None
            back = await _watch(
                route_client,
                t_back,
                RESTART_TIMEOUT,
                {"B_reachable": b_reachable, "route_via_B": via("B")},
                extra=extra,
                abort=any_died,
            )
            cycle["recovery"] = back
            if "aborted" in back:
                other = _died(cluster, others)
                if other is not None:
                    crashed(cycle, other, fatal=True)
                    return
                # B itself died: say so, start it again and go on with the next cycle
                crashed(cycle, _died(cluster, ["B"]) or UNKNOWN_CRASH, fatal=False)
                t_again = time.monotonic_ns()
                marks.append((f"{number}:relaunch", t_again))
                cluster.launch("B")
                again = await _watch(
                    route_client, t_again, RESTART_TIMEOUT,
                    {"B_reachable": b_reachable, "route_via_B": via("B")}, abort=any_died,
                )  # fmt: skip
                cycle["recovery_after_crash"] = again
                if again["route_via_B"] is None:
                    if "aborted" not in again:
                        cycle["error"] = "A did not route C via B after B was started again"
                    return
            elif back["route_via_B"] is None:
                cycle["error"] = "A did not route C via B again"
                return

    lost_clients = None
    try:
        async with (
            connect((HOST, ports["C"]), keepalive=KEEPALIVE) as sub_client,
            connect((HOST, ports["A"]), keepalive=KEEPALIVE) as pub_client,
            connect((HOST, ports["A"]), keepalive=KEEPALIVE) as route_client,
            sub_client.subscribe(CONVERGENCE_FILTER, sync=True, buffer=1_000_000) as sub,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(flow.receive, sub)
            marks.append(("start", time.monotonic_ns()))
            nursery.start_soon(flow.publish, pub_client)
            with trio.fail_after(5):
                while not flow.receipts:
                    await trio.sleep(0.01)
            routes = await route_client.routes()
            result["next_hop_to_C_before"] = _next_hop(routes, "C")
            result["distance_to_C"] = origin(routes, "C").get("distance")
            await run_cycles(route_client)
            await trio.sleep(STEADY_SECONDS)
            flow.running = False
            marks.append(("end", time.monotonic_ns()))
            await trio.sleep(SETTLE_SECONDS)  # what is still in flight arrives
            nursery.cancel_scope.cancel()
    except* CLIENT_ERRORS as group:
        # The bench's connections to A or C broke: only a crashed broker explains that
        # (its sockets close a moment before its exit status can be collected).
        crash = None
        for _ in range(40):
            crash = _died(cluster, others)
            if crash is not None:
                break
            await trio.sleep(0.05)
        if crash is None:
            raise
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        lost_clients = f"{type(leaf).__name__}: {leaf}"
        if cycles and "crash" not in cycles[-1]:
            crashed(cycles[-1], crash, fatal=True)
        elif not cycles:
            crashes.append({**crash, "cycle": 0, "kind": "start", "fatal": True})
    if lost_clients is not None:
        result["clients_lost"] = lost_clients
    if not marks or marks[-1][0] != "end":
        marks.append(("end", time.monotonic_ns()))
    result["brokers_at_end"] = {
        name: (stats.get("peering") or {}) for name, stats in (await _stats_of_live(ports)).items()
    }
    for counters in result["brokers_at_end"].values():
        counters.pop("links", None)
    phases = flow.phases(marks[:-1]) if flow.sent else {}
    result["phases"] = phases
    result["published"] = len(flow.sent)
    result["received"] = len({seq for seq, _ in flow.receipts})
    result["receipts"] = len(flow.receipts)

    def collect(kind: str, part: str, key: str) -> list[float]:
        return [
            c[part][key]
            for c in cycles
            if c["kind"] == kind
            and part in c
            and not (part == "recovery" and "crash" in c)
            and c[part].get(key) is not None
        ]

    def lost(kind: str) -> list[int]:
        return [
            phases[f"{c['cycle']}:{kind}"]["lost"]
            for c in cycles
            if c["kind"] == kind and f"{c['cycle']}:{kind}" in phases
        ]

    stops = [c for c in cycles if c["kind"] == "stop" and "recovery" in c]
    result["summary"] = {
        "kill": {
            "events_resume_s": summary(collect("kill", "failure", "events")),
            "route_via_D_s": summary(collect("kill", "failure", "route_via_D")),
            "B_accepting_s": summary(collect("kill", "recovery", "B_accepting")),
            "B_reachable_s": summary(collect("kill", "recovery", "B_reachable")),
            "route_via_B_s": summary(collect("kill", "recovery", "route_via_B")),
            "lost": lost("kill"),
        },
        "stop": {
            "events_resume_s": summary(collect("stop", "failure", "events")),
            "route_via_D_s": summary(collect("stop", "failure", "route_via_D")),
            "B_reachable_s": summary(collect("stop", "recovery", "B_reachable")),
            "route_via_B_s": summary(collect("stop", "recovery", "route_via_B")),
            "lost": lost("stop"),
            "cycles": len(stops),
            "crashed_after_sigcont": sum("crash" in c for c in stops),
        },
    }
    result["errors"] = [c["error"] for c in cycles if "error" in c]
    return result


# -- report ----------------------------------------------------------------------------------


def table_lines(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    tput = report.get("throughput", {})
    params = report["parameters"]
    if tput:
        lines.append(
            f"throughput: {params['events']:,} events of {PAYLOAD_SIZE} B, publisher "
            "pipelining without confirm, wildcard subscriber"
        )
        header = (
            f"{'setup':<34} {'events/s':>9} {'published/s':>11} {'received':>9} {'lost':>6} "
            f"{'dup':>4} {'order':>5} {'relinks':>7}  broker CPU"
        )
        lines += [header, "-" * len(header)]
        control = params.get("control_keepalive")
        rows = [
            ("single", "single broker"),
            ("line", f"line A->B->C (+D), keepalive {PEERING['keepalive']:g}"),
            (CONTROL, f"line A->B->C (+D), keepalive {control or 0:g}"),
        ]
        for key, label in rows:
            r = tput.get(key)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"{label:<34} failed: {r['error'].splitlines()[-1][:80]}")
                continue
            cpu = " ".join(
                f"{name} {share:.0%}" for name, share in r["broker_cpu_utilisation"].items()
            )
            relinks = sum(
                (b.get("peering") or {}).get("links_opened", 0) for b in r["brokers"].values()
            )
            lines.append(
                f"{label:<34} {fmt(r['events_per_second'], ',.0f'):>9} "
                f"{fmt(r['published_per_second'], ',.0f'):>11} {r['received']:>9,} "
                f"{r['lost']:>6,} {r['duplicates']:>4} "
                f"{'ok' if not r['out_of_order'] else r['out_of_order']:>5} {relinks:>7}  {cpu}"
            )
        ratios = [
            f"{label} / single: {tput[key]:.2f}"
            for key, label in (("line_vs_single", "line"), ("control_vs_single", "control"))
            if tput.get(key) is not None
        ]
        if ratios:
            lines.append("; ".join(ratios) + " (relinks: peer links opened during the run)")
        for key, title in (
            ("link_frames", f"keepalive {PEERING['keepalive']:g}"),
            ("link_frames_control", f"keepalive {control or 0:g}"),
        ):
            frames = report.get(key)
            if not frames:
                continue
            lines.append("")
            lines.append(
                f"FWD frames per delivered event, line with {title} ({frames['delivered']:,} "
                "delivered on C; stats peering.links[peer].fwd_out)"
            )
            header = f"{'link':<6} {'fwd_out':>9} {'per event':>9} {'dropped':>7}  role"
            lines += [header, "-" * len(header)]
            for link, row in frames["links"].items():
                role = "on path" if link in PATH_LINKS else "idle"
                lines.append(
                    f"{link:<6} {row['fwd_out']:>9,} {fmt(row['per_event'], '.3f'):>9} "
                    f"{row['dropped']:>7}  {role}"
                )
    prop = report.get("propagation")
    if prop and "error" not in prop:
        ns, sy = prop["nosync"], prop["sync"]
        lines.append("")
        lines.append("propagation on the line (subscriber on C, publisher on A, 2 hops)")
        header = f"{'measure':<54} {'median ms':>9} {'max ms':>8} {'n':>3}"
        lines += [header, "-" * len(header)]
        for label, s in (
            ("no sync: SUBACK -> first probe (1 ms apart) at C", ns["after_suback_ms"]),
            ("no sync: SUB sent -> first probe at C", ns["after_sub_ms"]),
            ("no sync: transit of the probe that arrived", ns["probe_transit_ms"]),
            ("sync=True: SUB sent -> SUBACK", sy["suback_ms"]),
        ):
            lines.append(
                f"{label:<54} {fmt(s['median'], '.2f'):>9} {fmt(s['max'], '.2f'):>8} "
                f"{s['samples']:>3}"
            )
        lines.append(
            f"sync=True: probe published on A right after SUBACK delivered in "
            f"{sy['probe_delivered']} of {sy['suback_ms']['samples']} samples"
        )
    elif prop:
        lines.append(f"propagation failed: {prop['error'].splitlines()[-1][:100]}")
    conv = report.get("convergence")
    if conv and "summary" in conv:
        kill, stop = conv["summary"]["kill"], conv["summary"]["stop"]
        lines.append("")
        lines.append(
            "convergence in the ring A-B-C-D-A (subscriber on C, events from A every 2 ms, "
            "A's next hop to C: "
            f"{conv.get('next_hop_to_C_before')}; A's routes polled every 5 ms)"
        )
        header = f"{'after':<12} {'until':<42} {'median s':>8} {'max s':>7} {'n':>3}"
        lines += [header, "-" * len(header)]
        rows = [
            ("kill -9 B", "an event published after it reaches C", kill["events_resume_s"]),
            ("kill -9 B", "A routes C via D", kill["route_via_D_s"]),
            ("restart B", "B answers HELLO", kill["B_accepting_s"]),
            ("restart B", "A lists B reachable", kill["B_reachable_s"]),
            ("restart B", "A routes C via B", kill["route_via_B_s"]),
            ("SIGSTOP B", "an event published after it reaches C", stop["events_resume_s"]),
            ("SIGSTOP B", "A routes C via D", stop["route_via_D_s"]),
            ("SIGCONT B", "A lists B reachable", stop["B_reachable_s"]),
            ("SIGCONT B", "A routes C via B", stop["route_via_B_s"]),
        ]
        for after, until, s in rows:
            lines.append(
                f"{after:<12} {until:<42} {fmt(s['median'], '.3f'):>8} "
                f"{fmt(s['max'], '.3f'):>7} {s['samples']:>3}"
            )
        if stop["crashed_after_sigcont"]:
            lines.append(
                f"a broker CRASHED after SIGCONT in {stop['crashed_after_sigcont']} of "
                f"{stop['cycles']} SIGSTOP cycles (left out of the SIGCONT rows; B is started "
                "again, a crash of A, C or D ends the run)"
            )
        for crash in conv["crashes"]:
            lines.append(f"  cycle {crash['cycle']} ({crash['kind']}): {_crash_text(crash)}")
        lines.append(
            f"events lost per kill: {kill['lost']}; per SIGSTOP: {stop['lost']} "
            f"(one every {CONVERGENCE_INTERVAL * 1000:g} ms); "
            f"{conv['published']:,} published, {conv['received']:,} received"
        )
    elif conv:
        lines.append(f"convergence failed: {conv.get('error', '?').splitlines()[-1][:100]}")
    return lines


def check_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    goals = Goals()
    add = goals.add

    control = report["parameters"].get("control_keepalive")
    for frames_key, key, suffix in (
        ("link_frames", "line", ""),
        ("link_frames_control", CONTROL, f" (control: keepalive {control or 0:g})"),
    ):
        frames = report.get(frames_key)
        if frames:
            path = {k: frames["links"].get(k, {}).get("per_event") for k in PATH_LINKS}
            add("1 FWD frame per delivered event on each path link" + suffix, path,
                all(v == 1.0 for v in path.values()))  # fmt: skip
            idle = {k: v["fwd_out"] for k, v in frames["links"].items() if k not in PATH_LINKS}
            add("0 FWD frames on every other link (B->D above all)" + suffix, idle,
                "B->D" in idle and not any(idle.values()))  # fmt: skip
        line = report.get("throughput", {}).get(key)
        if line and "error" not in line:
            add("line: every event delivered once, in order" + suffix,
                {"lost": line["lost"], "duplicates": line["duplicates"],
                 "out_of_order": line["out_of_order"]},
                line["lost"] == line["duplicates"] == line["out_of_order"] == 0)  # fmt: skip
    prop = report.get("propagation")
    if prop and "sync" in prop:
        sy = prop["sync"]
        add("sync=True: a probe published after SUBACK is delivered",
            sy["probe_delivered"], sy["probe_delivered"] == sy["suback_ms"]["samples"])  # fmt: skip
    conv = report.get("convergence", {}).get("summary")
    if conv:
        worst = conv["kill"]["events_resume_s"]["max"]
        add("kill -9: events reach C again within 1 s", worst,
            None if worst is None else worst < 1.0)  # fmt: skip
        limit = 3 * PEERING["keepalive"] + 0.5
        worst = conv["stop"]["events_resume_s"]["max"]
        add(f"SIGSTOP: events reach C again within 3 x keepalive + 0.5 s ({limit:g} s)",
            worst, None if worst is None else worst < limit)  # fmt: skip
        stop = report["convergence"]["summary"]["stop"]
        crashed = stop["crashed_after_sigcont"]
        add("no broker crashes when B is SIGSTOPped and continued",
            f"crashed in {crashed} of {stop['cycles']} cycles",
            None if not stop["cycles"] else crashed == 0)  # fmt: skip
    if report["parameters"]["quick"]:
        for goal in goals:
            goal["note"] = "quick run"
    return goals


EXPECTED_LOG = {
    # in the ring, a SIGSTOPped peer goes silent: its neighbours close the link, and it
    # closes theirs once it runs again (anywhere else, the warning is a finding)
    "warning: peer link silent, closing",
}


def notes(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for part in ("throughput", "propagation", "convergence"):
        value = report.get(part) or {}
        if "error" in value:
            out.append(f"{part}: FAILED: {value['error'].splitlines()[-1][:200]}")
    for key, r in report.get("throughput", {}).items():
        if not isinstance(r, dict):
            continue
        if "error" in r:
            out.append(f"throughput {key}: FAILED: {r['error'].splitlines()[-1][:200]}")
            continue
        if r["subscriber_error"]:
            out.append(f"throughput {key}: subscriber: {r['subscriber_error']}")
        for name, delta in r["brokers"].items():
            if delta["dropped"] or delta["errors"]:
                out.append(f"throughput {key}: broker {name}: dropped {delta['dropped']}, "
                           f"errors {delta['errors']}")  # fmt: skip
            peering = delta.get("peering") or {}
            bad = {k: v for k, v in peering.items() if k.endswith("dropped") and v}
            if bad:
                out.append(f"throughput {key}: broker {name} peering drops: {bad}")
            if peering.get("links_opened"):
                out.append(
                    f"throughput {key}: broker {name} opened {peering['links_opened']} peer "
                    "link(s) during the run (a link was closed and dialled again)"
                )
    prop = report.get("propagation") or {}
    if prop.get("nosync", {}).get("errors"):
        out.append(f"propagation: {prop['nosync']['errors']} samples without a probe")
    conv = report.get("convergence") or {}
    for error in conv.get("errors", []):
        out.append(f"convergence: {error}")
    for crash in conv.get("crashes", []):
        out.append(
            f"convergence cycle {crash['cycle']} ({crash['kind']}): {_crash_text(crash)}"
            + (" (the run ended there)" if crash["fatal"] else " (B started again)")
        )
    for name, phase in (conv.get("phases") or {}).items():
        if phase["duplicates"] or phase["out_of_order"] or phase["late"]:
            out.append(
                f"convergence phase {name}: {phase['duplicates']} duplicates, "
                f"{phase['out_of_order']} out of order, {phase['late']} late (max "
                f"{phase['max_latency_ms']:.0f} ms)"
            )
        if name.endswith(("restart", "cont")) and phase["lost"]:
            out.append(
                f"convergence phase {name}: {phase['lost']} events lost while B rejoined "
                f"(published {phase['lost_at_ms']} ms after it began)"
            )
    for cluster, nodes in (report.get("broker_logs") or {}).items():
        for name, logs in nodes.items():
            for log in logs:
                expected = EXPECTED_LOG if cluster == "ring" else set()
                unexpected = {k: v for k, v in log.get("problems", {}).items() if k not in expected}
                if unexpected:
                    first = next(iter(unexpected))
                    out.append(
                        f"{cluster} broker {name} ({log['path']}): {unexpected}; first: "
                        f"{log['first'][first][:200]}"
                    )
    for cluster, stops in (report.get("broker_stops") or {}).items():
        for name, entries in stops.items():
            for entry in entries:
                if entry["how"] == "SIGTERM" and (entry["exit_status"] != 0 or entry["killed"]):
                    out.append(f"{cluster} broker {name}: stop {entry}")
    return out


def machine_info() -> dict[str, Any]:
    return common_machine_info(trio=trio.__version__, msgpack=".".join(map(str, msgpack.version)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__)
    parser.add_argument("--events", type=int, help="events per throughput run")
    parser.add_argument(
        "--log-dir", help="keep the broker logs here (default: a temporary directory, removed)"
    )
    args = parser.parse_args(argv)
    if args.events is not None and args.events < 1:
        parser.error("--events must be at least 1")
    return args


def _run_part(report: dict[str, Any], key: str, run: Callable[[], Any]) -> bool:
    try:
        report[key] = run()
        return "error" not in report[key]
    except Exception:
        report[key] = {"error": traceback.format_exc()}
        print(f"  {key} failed:\n{report[key]['error']}", file=sys.stderr, flush=True)
        return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    if args.events is not None:
        params["events"] = args.events
    ctx = multiprocessing.get_context("spawn")
    report: dict[str, Any] = {
        "benchmark": "peers",
        "machine": machine_info(),
        "parameters": {
            **params,
            "quick": args.quick,
            "payload_size": PAYLOAD_SIZE,
            "peering_config": PEERING,
            "probe_interval_s": PROBE_INTERVAL,
            "convergence_interval_s": CONVERGENCE_INTERVAL,
            "route_poll_s": ROUTE_POLL,
            "line": LINE,
            "ring": RING,
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "throughput": {},
        "broker_logs": {},
        "broker_stops": {},
        "broker_pids": {},
    }
    started = time.monotonic()
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix="topiary-peers-")
    log_dir = Path(args.log_dir or temp_dir)  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    config = write_config(log_dir / "peering.toml", PEERING)
    ok = True
    print(
        f"peers: {report['machine']['cpu_count']} CPUs, Python {report['machine']['python']}, "
        f"load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )

    def with_cluster(
        label: str,
        links: dict[str, list[str]],
        body: Callable[[BrokerMesh], Any],
        config_path: Path = config,
    ) -> Any:
        cluster = BrokerMesh(label, links, config_path, log_dir)
        try:
            cluster.start()
            return body(cluster)
        finally:
            cluster.close()
            report["broker_logs"][label] = log_summary(cluster)
            report["broker_stops"][label] = cluster.stops
            report["broker_pids"][label] = {n: node.pids for n, node in cluster.nodes.items()}

    try:
        print("  single broker throughput ...", flush=True)
        ok &= _run_part(
            report["throughput"], "single",
            lambda: with_cluster(
                "single", {"S": []},
                lambda c: run_throughput(c, "S", "S", params["events"], ctx),
            ),
        )  # fmt: skip

        def line_body(cluster: BrokerMesh) -> dict[str, Any]:
            mesh = trio.run(wait_mesh, cluster.ports, all_reachable(list(LINE)))
            print("  line throughput ...", flush=True)
            result = run_throughput(cluster, "A", "C", params["events"], ctx)
            result["mesh_seconds"] = round(mesh, 3)
            print("  propagation ...", flush=True)
            _run_part(
                report, "propagation",
                lambda: trio.run(
                    _propagation, cluster.ports, params["probe_samples"], params["sync_samples"]
                ),
            )  # fmt: skip
            return result

        ok &= _run_part(report["throughput"], "line", lambda: with_cluster("line", LINE, line_body))
        if "propagation" not in report:
            report["propagation"] = {"error": "not run: the line did not start"}
            ok = False
        elif "error" in report["propagation"]:
            ok = False
        control = params["control_keepalive"]
        if control is not None:
            control_config = write_config(
                log_dir / "peering-control.toml", {**PEERING, "keepalive": control}
            )

            def control_body(cluster: BrokerMesh) -> dict[str, Any]:
                mesh = trio.run(wait_mesh, cluster.ports, all_reachable(list(LINE)))
                print(f"  line throughput, keepalive {control:g} s ...", flush=True)
                result = run_throughput(cluster, "A", "C", params["events"], ctx)
                result["mesh_seconds"] = round(mesh, 3)
                return result

            ok &= _run_part(
                report["throughput"], CONTROL,
                lambda: with_cluster("line-control", LINE, control_body, control_config),
            )  # fmt: skip
        single = report["throughput"]["single"]
        for key, frames_key, ratio_key in (
            ("line", "link_frames", "line_vs_single"),
            (CONTROL, "link_frames_control", "control_vs_single"),
        ):
            line = report["throughput"].get(key) or {}
            if "links" in line:
                report[frames_key] = {"delivered": line["received"], "links": line["links"]}
            if line.get("events_per_second") and single.get("events_per_second"):
                report["throughput"][ratio_key] = round(
                    line["events_per_second"] / single["events_per_second"], 3
                )

        def ring_body(cluster: BrokerMesh) -> dict[str, Any]:
            mesh = trio.run(
                wait_mesh,
                cluster.ports,
                lambda name, routes: (
                    all_reachable(list(RING))(name, routes)
                    and (name != "A" or _next_hop(routes, "C") == "B")
                ),
            )
            print("  convergence ...", flush=True)
            result = trio.run(_convergence, cluster, params["kill_cycles"], params["stop_cycles"])
            result["mesh_seconds"] = round(mesh, 3)
            return result

        ok &= _run_part(report, "convergence", lambda: with_cluster("ring", RING, ring_body))
        if report["convergence"].get("errors"):
            ok = False
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = round(time.monotonic() - started, 2)
    report["goals"] = check_goals(report)
    report["notes"] = notes(report)

    print()
    for line_text in table_lines(report):
        print(line_text)
    print()
    print(
        f"brokers: {' '.join(f'{k} = {v}' for k, v in PEERING.items())} in [peering]; "
        "failure detection: a killed broker's sockets are closed by the kernel (EOF at once), "
        f"a stopped one is found by the keepalive (silence > 3 x {PEERING['keepalive']:g} s)"
    )
    print_ending(report)
    write_report(report, args.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
