"""One workload over topiary, Mosquitto and NATS: filters, workers, exactness, latency.

What bench/storm.py and bench/sidebyside.py share. Every party is a worker process
(bench/harness/workers.py) running the same trio code for every broker, with only the codec
of bench/harness/clients differing:

- ``subscriber_main``: some subscriber connections (trio tasks of one process), each
  holding its filters plus ``CONTROL_TOPIC``; on ``("count", phase, timeout, latency)``
  each reads until the first marker of ``phase`` on the control topic and records, per
  message, its index (and, with ``latency``, the publisher's timestamp and the time the
  read that brought it returned), and the time of the read that brought the last one.
- ``publisher_main``: one connection publishing ``workload.topics(n, seed)`` in order
  (message ``i`` has topic ``topics[i % n]`` and index ``offset + i``), either paced
  (``("paced", phase, offset, rate, seconds, count)``: an absolute schedule, message ``i``
  due at ``start + i / rate``, every message due at a wake-up written in one batch; until
  ``count``, ``seconds`` or ``("halt",)``) or as fast as it can (``("flood", phase, offset,
  count)``); then a PING round trip (the broker has read everything), ``("published",
  info)``, and the marker ``done:PHASE:k`` on the control topic every 100 ms until told
  ``("enough",)``: a marker can be lost where a broker drops, and the brokers keep each
  publisher's order, so a subscriber that has a marker has every earlier message that was
  not dropped. Markers name their phase, so a late one is never taken for the next phase's;
  indices are offset per phase, so a late message is counted as unexpected, not as owed.

Payloads: bytes 0-7 are ``time.monotonic_ns()`` when the batch holding the message was
built (CLOCK_MONOTONIC is system-wide on Linux, so it compares across processes), bytes
8-15 the message's index, then filler up to the message's size.

Exactness (``Expectation``): the topics published and each connection's filters, matched
with ``routing.SubscriptionTable`` in the native dialect, give how many copies of message
``i`` each connection is owed: 1 if any of its filters matches (topiary, Mosquitto with
``allow_duplicate_messages false``), or one per matching filter (NATS: one MSG per matching
subscription; ``brokers.DELIVERY``). Per connection: missing, duplicated and unexpected
copies, message by message, not only a total.
"""

from __future__ import annotations

import os
import random
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from multiprocessing.connection import Connection as Pipe
from typing import Any, Final

import trio

from bench import workload
from bench.harness.clients.shell import ConnectionLost, LeanClient
from bench.harness.clients.topics import check_topic, portable
from bench.harness.report import percentile
from routing import SubscriptionTable

CONTROL_TOPIC: Final = "bench/control/done"
HEADER: Final = 16  # timestamp + index
FILLER: Final = bytes(range(256)) * 8  # 2 KiB to cut payloads from
DONE_RESEND_SECONDS: Final = 0.1
DONE_RESEND_LIMIT: Final = 120.0  # the publisher stops repeating the marker after this
MAX_BATCH: Final = 1_000  # messages per write at most (a paced publisher catching up)
FLOOD_BATCH: Final = 256  # messages per write for a publisher going as fast as it can
CONNECT_TIMEOUT: Final = 60.0


def brief(error: str, limit: int = 200) -> str:
    """An error (perhaps a worker's whole traceback) in one line: its first line and, when
    there is more, the last line that says something (not a traceback's frame)."""
    lines = [line.strip().lstrip("+-| ") for line in error.splitlines()]  # exception groups
    said = [line for line in lines if line and not line.startswith(("File ", "Traceback"))]
    if not said:
        return error[:limit]
    text = said[0] if len(said) == 1 or said[-1] == said[0] else f"{said[0]} ... {said[-1]}"
    return text[:limit]


def marker_prefix(phase: str) -> bytes:
    """The payload prefix of a phase's markers: ``done:PHASE:`` then the repeat number."""
    return f"done:{phase}:".encode()


# -- filters -----------------------------------------------------------------------------------


def portable_subscriptions(
    size: int,
    seed: int = 0,
    *,
    n_sites: int = workload.N_SITES,
    broad: bool = True,
    prefix: str = "svc",
) -> tuple[list[str], dict[str, int]]:
    """The first ``size`` distinct portable filters of ``workload.subscriptions`` (in its
    order, native form), and how they were obtained: entries ``drawn``, ``dropped`` (not
    portable: prefix wildcards), ``mapped`` (MQTT-dialect ones rewritten with ``*``/``>``)
    and ``duplicates`` (the same filter again after mapping)."""
    draw = size + size // 4 + 16
    while True:
        kept: dict[str, None] = {}
        counts = {"drawn": 0, "dropped": 0, "mapped": 0, "duplicates": 0}
        entries = workload.subscriptions(draw, seed, prefix=prefix, broad=broad, n_sites=n_sites)
        for text, _, dialect in entries:
            counts["drawn"] += 1
            native = portable(text, dialect)
            if native is None:
                counts["dropped"] += 1
                continue
            if native in kept:
                counts["duplicates"] += 1
                continue
            if native != text:
                counts["mapped"] += 1
            kept[native] = None
            if len(kept) == size:
                return list(kept), counts
        draw *= 2  # workload.subscriptions(n) is a prefix of a longer draw: same entries


def split(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Round-robin: part ``k`` holds items ``k::parts`` (so the broad filters, first in the
    workload, land on different connections)."""
    return [list(items[k::parts]) for k in range(parts)]


def publisher_topics(count: int, seed: int) -> list[str]:
    """The publisher's topics (native form), each checked to be portable."""
    topics = workload.topics(count, seed)
    for topic in set(topics):
        check_topic(topic)
    return topics


def payload_sizes(count: int, seed: int, low: int, high: int) -> list[int]:
    """``count`` payload sizes in ``low..high`` bytes, uniform, the same for every broker."""
    if not HEADER <= low <= high <= len(FILLER) + HEADER:
        raise ValueError(f"payload sizes must be within {HEADER}..{len(FILLER) + HEADER}")
    rng = random.Random(f"payload-sizes:{seed}:{low}:{high}")
    return [rng.randint(low, high) for _ in range(count)]


# -- exactness ---------------------------------------------------------------------------------


class Expectation:
    """How many copies of each published message each connection is owed."""

    def __init__(self, per_position: list[list[int]], delivery: str) -> None:
        #: Per connection, the copies owed for each position of the publisher's topic list.
        self.per_position = per_position
        self.delivery = delivery
        self.connections = len(per_position)

    @classmethod
    def build(
        cls, connections: list[list[str]], topics: list[str], deliveries: Sequence[str]
    ) -> dict[str, Expectation]:
        """One Expectation per delivery kind in ``deliveries`` ("connection": one copy if
        any filter of the connection matches; "subscription": one per matching filter),
        from one matching pass over the distinct topics."""
        unknown = set(deliveries) - {"connection", "subscription"}
        if unknown:
            raise ValueError(f"unknown delivery {sorted(unknown)}")
        table = SubscriptionTable(cache_size=0)
        for conn, filters in enumerate(connections):
            for index, text in enumerate(filters):
                table.add(text, (conn, index))
        n = len(connections)
        per_filter: dict[str, list[int]] = {}
        for topic in set(topics):
            counts = [0] * n
            for conn, _ in table.match_uncached(topic):
                counts[conn] += 1
            per_filter[topic] = counts
        out = {}
        for delivery in deliveries:
            if delivery == "connection":
                owed = {t: [min(c, 1) for c in counts] for t, counts in per_filter.items()}
            else:
                owed = per_filter
            rows = [[owed[t][conn] for t in topics] for conn in range(n)]
            out[delivery] = cls(rows, delivery)
        return out

    def expected(self, conn: int, sent: int) -> int:
        """Copies owed to ``conn`` for messages ``0 .. sent - 1``."""
        row = self.per_position[conn]
        cycles, rest = divmod(sent, len(row))
        return cycles * sum(row) + sum(row[:rest])

    def check(
        self, conn: int, indices: Sequence[int], sent: int, offset: int = 0
    ) -> dict[str, int]:
        """Message by message: the copies ``conn`` received (``indices``, one entry per copy,
        message ``i`` carrying index ``offset + i``) against those it is owed for messages
        ``0 .. sent - 1``."""
        row = self.per_position[conn]
        n = len(row)
        got = Counter(indices)
        if offset:
            got = Counter({index - offset: copies for index, copies in got.items()})
        missing = duplicates = unexpected = 0
        for index in range(sent):
            want = row[index % n]
            have = got.pop(index, 0)
            if have < want:
                missing += want - have
            elif have > want:
                if want:
                    duplicates += have - want
                else:
                    unexpected += have
        unexpected += sum(got.values())  # indices never published
        return {
            "expected": self.expected(conn, sent),
            "received": len(indices),
            "missing": missing,
            "duplicates": duplicates,
            "unexpected": unexpected,
        }


def latency_summary(samples_ns: list[int]) -> dict[str, float] | None:
    """p50 / p90 / p99 / p99.9 / max / min / mean in ms (None without samples)."""
    if not samples_ns:
        return None
    ordered = sorted(samples_ns)
    return {
        "samples": len(ordered),
        "p50": percentile(ordered, 0.50) / 1e6,
        "p90": percentile(ordered, 0.90) / 1e6,
        "p99": percentile(ordered, 0.99) / 1e6,
        "p999": percentile(ordered, 0.999) / 1e6,
        "max": ordered[-1] / 1e6,
        "min": ordered[0] / 1e6,
        "mean": sum(ordered) / len(ordered) / 1e6,
    }


# -- subscriber worker -------------------------------------------------------------------------


class Reader:
    """One subscriber connection's records for one count."""

    def __init__(self) -> None:
        self.indices = array("q")
        self.sent_ns = array("q")
        self.read_ns = array("q")
        self.last_ns: int | None = None  # the read that brought the last message
        self.marker_ns: int | None = None
        self.marker: bytes | None = None
        self.late = 0  # after the marker, in the same read
        self.stale_markers = 0
        self.malformed = 0
        self.error: str | None = None

    def result(self) -> dict[str, Any]:
        return {
            "count": len(self.indices),
            "indices": self.indices.tobytes(),
            "sent_ns": self.sent_ns.tobytes(),
            "read_ns": self.read_ns.tobytes(),
            "last_ns": self.last_ns,
            "marker_ns": self.marker_ns,
            "marker": self.marker.decode(errors="replace") if self.marker else None,
            "late": self.late,
            "stale_markers": self.stale_markers,
            "malformed": self.malformed,
            "error": self.error,
        }


async def read_until_marker(client: LeanClient, reader: Reader, phase: str, latency: bool) -> None:
    control = client.wire_topic(CONTROL_TOPIC)
    marker = marker_prefix(phase)
    add_index = reader.indices.append
    add_sent = reader.sent_ns.append
    add_read = reader.read_ns.append
    from_bytes = int.from_bytes
    try:
        while reader.marker_ns is None:
            now, messages = await client.receive()
            for position, (topic, payload) in enumerate(messages):
                if topic == control:
                    if payload.startswith(marker):
                        reader.marker_ns = now
                        reader.marker = payload
                        reader.late += len(messages) - position - 1
                        break
                    reader.stale_markers += 1  # an earlier phase's
                    continue
                if len(payload) < HEADER:
                    reader.malformed += 1
                    continue
                add_index(from_bytes(payload[8:16], "big"))
                reader.last_ns = now
                if latency:
                    add_sent(from_bytes(payload[:8], "big"))
                    add_read(now)
    except ConnectionLost as exc:
        reader.error = str(exc)


async def subscriber_main(
    pipe: Pipe,
    protocol: str,
    port: int,
    connections: list[list[str]],
    name: str,
    own: str | None = None,
) -> None:
    """Worker: connect and subscribe every connection, then count on command. With
    ``own`` (a filter with ``{client}`` in it), each connection also subscribes to it with
    its own client id put in (bench/acl.py: a rule with ``%c`` grants it); the ids are in
    the ``ready`` message."""
    clients: list[LeanClient] = []
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            for k in range(len(connections)):
                clients.append(await LeanClient.connect(protocol, port, f"{name}-{k}"))
            timings = []
            for client, filters in zip(clients, connections, strict=True):
                extra = [own.format(client=client.client_id)] if own is not None else []
                timings.append(await client.subscribe([*filters, *extra, CONTROL_TOPIC]))
        pipe.send(
            (
                "ready",
                {
                    "pid": os.getpid(),
                    "subscribed": [t.count for t in timings],
                    "refused": [t.refused for t in timings],
                    "first_refusal": next((c.first_refusal for c in clients if c.refused), None),
                    "subscribe_seconds": [t.seconds for t in timings],
                    "client_ids": [c.client_id for c in clients],
                },
            )
        )
        while True:
            command = await trio.to_thread.run_sync(pipe.recv)
            if command[0] == "stop":
                return
            _, phase, timeout, latency = command
            readers = [Reader() for _ in clients]
            cpu = time.process_time()
            pipe.send(("armed",))
            with trio.move_on_after(timeout):
                async with trio.open_nursery() as nursery:
                    for client, reader in zip(clients, readers, strict=True):
                        nursery.start_soon(read_until_marker, client, reader, phase, latency)
            for reader in readers:
                if reader.marker_ns is None and reader.error is None:
                    reader.error = f"no marker within {timeout:g} s"
            pipe.send(("result", [r.result() for r in readers], time.process_time() - cpu))
    finally:
        for client in clients:
            await client.aclose()


# -- publisher worker --------------------------------------------------------------------------


class Publisher:
    def __init__(self, client: LeanClient, topics: list[str], sizes: list[int]) -> None:
        self.client = client
        self.topics = [client.wire_topic(t) for t in topics]
        self.sizes = sizes
        self.n = len(topics)

    def _batch(self, first: int, end: int, stamp: int, offset: int) -> None:
        publish = self.client.publish
        topics, sizes, n = self.topics, self.sizes, self.n
        head = stamp.to_bytes(8, "big")
        for i in range(first, end):
            position = i % n
            index = (offset + i).to_bytes(8, "big")
            publish(topics[position], b"".join((head, index, FILLER[: sizes[position] - HEADER])))

    async def paced(
        self,
        pipe: Pipe,
        offset: int,
        rate: float,
        seconds: float,
        count: int,
        start_delay: float = 0.05,
    ) -> dict[str, Any]:
        """Message ``i`` due at ``start + i / rate``: at each wake-up every message due is
        built and written in one batch (at most MAX_BATCH). Until ``count`` messages,
        ``seconds`` or a ``("halt",)`` on the pipe (left there for the caller to read);
        its index is ``offset + i``."""
        client = self.client
        clock = time.monotonic_ns
        start = trio.current_time() + start_delay
        start_ns = clock() + int(start_delay * 1e9)
        lags: list[float] = []
        long_writes: list[tuple[float, float]] = []
        blocked_total = blocked_max = 0
        sent = 0
        batches = 0
        stopped_by = "count"
        first_ns = last_ns = 0
        while sent < count:
            now = trio.current_time()
            if now - start >= seconds:
                stopped_by = "seconds"
                break
            due = min(count, int((now - start) * rate) + 1)
            if due > sent:
                lags.append((now - start, now - (start + sent / rate)))
                end = min(due, sent + MAX_BATCH)
                stamp = clock()
                if not sent:
                    first_ns = stamp
                self._batch(sent, end, stamp, offset)
                await client.flush()
                blocked = clock() - stamp  # building is microseconds; the rest is the write
                blocked_total += blocked
                if blocked > blocked_max:
                    blocked_max = blocked
                if blocked > 5_000_000:
                    long_writes.append(
                        (round((stamp - start_ns) / 1e9, 3), round(blocked / 1e6, 1))
                    )
                last_ns = stamp
                sent = end
                batches += 1
                if not batches % 16 and pipe.poll():
                    stopped_by = "told"
                    break
                continue
            await trio.sleep_until(start + sent / rate)
        window = max((last_ns - first_ns) / 1e9, 1e-9)
        ordered = sorted(lag for _, lag in lags)
        return {
            "mode": "paced",
            "rate": rate,
            "offset": offset,
            "sent": sent,
            "start_ns": start_ns,  # message i was due at start_ns + i * 1e9 / rate
            "first_ns": first_ns,
            "last_ns": last_ns,
            "batches": batches,
            "stopped_by": stopped_by,
            "achieved_rate": (sent - 1) / window if sent > 1 else None,
            "lag_ms": {
                "p50": percentile(ordered, 0.5) * 1e3 if ordered else None,
                "p99": percentile(ordered, 0.99) * 1e3 if ordered else None,
                "max": ordered[-1] * 1e3 if ordered else None,
            },
            # Time spent in writes (the broker not reading, or the socket full), and when:
            # (seconds since the start, ms) of writes longer than 5 ms.
            "blocked_ms": {"total": blocked_total / 1e6, "max": blocked_max / 1e6},
            "long_writes": long_writes[:2000],
            # When it fell behind: (seconds since the start, ms late) of batches > 5 ms late.
            "late_batches": [
                (round(at, 3), round(lag * 1e3, 2)) for at, lag in lags if lag > 0.005
            ][:2000],
        }

    async def flood(self, offset: int, count: int) -> dict[str, Any]:
        """``count`` messages as fast as the connection takes them, FLOOD_BATCH per write;
        message ``i`` has index ``offset + i``."""
        client = self.client
        clock = time.monotonic_ns
        first_ns = clock()
        sent = 0
        while sent < count:
            end = min(count, sent + FLOOD_BATCH)
            self._batch(sent, end, clock(), offset)
            await client.flush()
            sent = end
        last_ns = clock()
        return {
            "mode": "flood",
            "offset": offset,
            "sent": sent,
            "first_ns": first_ns,
            "last_ns": last_ns,
        }


async def _publish_on_command(
    pipe: Pipe, client: LeanClient, publisher: Publisher, control: str
) -> bool:
    """One command of the publisher worker; False once told to stop. A ``("halt",)`` or
    ``("enough",)`` that comes after the run it was meant for had ended is dropped."""
    command = await trio.to_thread.run_sync(pipe.recv)
    if command[0] == "stop":
        return False
    if command[0] in ("halt", "enough"):
        return True
    kind, phase, *args = command
    cpu = time.process_time()
    if kind == "paced":
        info = await publisher.paced(pipe, *args)
        if info["stopped_by"] == "told" and pipe.recv()[0] == "stop":  # else the "halt"
            return False
    else:
        info = await publisher.flood(*args)
    info["ping_seconds"] = await client.ping()  # the broker has read it all
    info["barrier_ns"] = time.monotonic_ns()
    info["cpu_seconds"] = time.process_time() - cpu
    info["stray_messages"] = client.stray_messages
    pipe.send(("published", info))
    # The marker, again and again until every subscriber has one (told by "enough").
    marker = marker_prefix(phase)
    resent = 0
    give_up = trio.current_time() + DONE_RESEND_LIMIT
    while True:
        if trio.current_time() < give_up:
            client.publish(control, marker + str(resent).encode())
            await client.flush()
            resent += 1
        if await trio.to_thread.run_sync(pipe.poll, DONE_RESEND_SECONDS):
            answer = pipe.recv()[0]
            if answer == "stop":
                return False
            if answer == "enough":
                break
    pipe.send(("stopped", {"markers": resent}))
    return True


async def publisher_main(
    pipe: Pipe,
    protocol: str,
    port: int,
    topic_count: int,
    seed: int,
    sizes: tuple[int, int],
    name: str,
) -> None:
    """Worker: one publishing connection; see the module docstring."""
    topics = publisher_topics(topic_count, seed)
    publisher_sizes = payload_sizes(topic_count, seed, *sizes)
    with trio.fail_after(CONNECT_TIMEOUT):
        client = await LeanClient.connect(protocol, port, name)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.read_forever)
            publisher = Publisher(client, topics, publisher_sizes)
            control = client.wire_topic(CONTROL_TOPIC)
            pipe.send(("ready", {"pid": os.getpid(), "topics": len(topics)}))
            while await _publish_on_command(pipe, client, publisher, control):
                pass
            nursery.cancel_scope.cancel()
    finally:
        await client.aclose()
