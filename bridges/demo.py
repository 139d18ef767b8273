"""``make demo``: the whole picture on one machine, in about fifteen seconds.

An embedded Kafka-protocol broker (Tansu) holds an aggregate topic of synthetic web beacons;
``topiary bridge kafka`` maps each beacon to ``beacon/{region}/{country}/{site}/{section}/
{event}``, drops the ones nobody wants and publishes the rest to ``topiary serve``, where
three wildcard subscribers (native and MQTT dialects) receive just their slice. A few
malformed records show the dead-letter topic at work. At the end it prints what each
subscriber received and the message economy next to the flat-topic way, where every
consumer reads the whole aggregate stream.

Everything runs on 127.0.0.1 on free ports; every process is stopped at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from bridges.tansu import Tansu, TansuUnavailable, free_port, start_tansu
from broker.client import Subscription, connect
from routing import parse_filter

TOPIC = "beacons"
TEMPLATE = "beacon/{region}/{country}/{site}/{section}/{event}"
REGIONS = {"eu": ["de", "fr", "es", "it"], "na": ["us", "ca"], "ap": ["jp", "sg"]}
SECTIONS = ["home", "search", "product", "cart", "checkout"]
EVENTS = ["view", "click", "add_to_cart", "purchase", "error"]
SUBSCRIBERS = [
    ("checkout-eu", "beacon/eu/*/*/checkout/>", "native"),
    ("purchases-anywhere", "beacon/+/+/+/+/purchase", "mqtt"),
    ("site07-errors", "beacon/*/*/site07/*/error", "native"),
]
MALFORMED = [b"{not json", b'{"region": "eu"}', b"[1, 2, 3]"]


def beacon(rng: random.Random, n: int) -> dict[str, Any]:
    region = rng.choice(list(REGIONS))
    return {
        "region": region,
        "country": rng.choice(REGIONS[region]),
        "site": f"site{int(rng.paretovariate(1.2)) % 50:02d}",
        "section": rng.choices(SECTIONS, weights=[30, 25, 20, 15, 10])[0],
        "event": rng.choices(EVENTS, weights=[50, 25, 12, 8, 5])[0],
        "n": n,
        "ts": time.time(),
        "page": {"path": "/" + "x" * rng.randrange(50, 300)},
    }


def produce_stream(tansu: Tansu, seconds: float, rate: int, produced: list[int]) -> None:
    """The aggregate stream: ~``rate`` beacons a second for ``seconds``, plus a few bad ones."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 5, "log_level": 0})
    rng = random.Random(7)
    count = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(rate // 20):
            record = beacon(rng, count)
            producer.produce(TOPIC, json.dumps(record).encode(), key=record["site"].encode())
            count += 1
        if count // (rate // 20) % 40 == 1:
            producer.produce(TOPIC, MALFORMED[count % len(MALFORMED)])
            produced[1] += 1
        producer.poll(0)
        time.sleep(0.05)
    producer.flush(30)
    produced[0] = count


def expected_counts(seconds_count: int) -> dict[str, int]:
    """What each subscriber should get: the same beacons, matched here."""
    rng = random.Random(7)
    filters = {name: parse_filter(flt, dialect) for name, flt, dialect in SUBSCRIBERS}
    counts = dict.fromkeys(filters, 0)
    for n in range(seconds_count):
        topic = TEMPLATE.format(**beacon(rng, n))
        for name, flt in filters.items():
            counts[name] += flt.matches(topic)
    return counts


@contextlib.contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    with trio.fail_after(15):
        while True:
            if proc.poll() is not None:
                raise SystemExit("the broker exited during start-up")
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.05)
                continue
            await stream.aclose()
            return


async def collect(sub: Subscription, counts: collections.Counter[str]) -> None:
    async for message in sub:
        levels = message.topic.split("/")
        counts[f"{levels[1]}/{levels[2]} {levels[4]} {levels[5]}"] += 1


async def _subscribe(client: Any, flt: str, dialect: str, task_status: Any) -> None:
    async with client.subscribe(flt, dialect) as sub:
        task_status.started(sub)
        await trio.sleep_forever()


async def demo(tansu: Tansu, port: int, bridge_args: list[str], workdir: Path,
               seconds: float, rate: int) -> dict[str, Any]:  # fmt: skip
    received = {name: collections.Counter[str]() for name, _, _ in SUBSCRIBERS}
    produced = [0, 0]
    async with connect(("127.0.0.1", port)) as client, trio.open_nursery() as nursery:
        for name, flt, dialect in SUBSCRIBERS:
            sub = await nursery.start(_subscribe, client, flt, dialect)
            nursery.start_soon(collect, sub, received[name])
        with process(bridge_args, workdir / "bridge.log") as bridge:
            print(f"publishing ~{rate} beacons/s to Kafka topic {TOPIC!r} for {seconds:g} s ...")
            producer = threading.Thread(
                target=produce_stream, args=(tansu, seconds, rate, produced), daemon=True
            )
            producer.start()
            await trio.to_thread.run_sync(producer.join)
            expected = expected_counts(produced[0])
            with trio.move_on_after(30):
                while any(sum(received[n].values()) < expected[n] for n in expected):
                    await trio.sleep(0.1)
            bridge.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(bridge.wait, 15)
        stats = await client.stats()
        nursery.cancel_scope.cancel()
    return {"produced": produced, "received": received, "expected": expected, "stats": stats}


def bridge_counters(log: Path) -> dict[str, Any]:
    """The bridge's final counters, from its 'bridge stopped' JSON log line."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("event") == "bridge stopped":
                return entry
    return {}


def write_bridge_config(path: Path, bootstrap: str, port: int) -> None:
    path.write_text(
        "[kafka]\n"
        f'"bootstrap.servers" = "{bootstrap}"\n'
        '"group.id" = "topiary-demo"\n'
        '"session.timeout.ms" = 1500\n'
        '"heartbeat.interval.ms" = 300\n'
        '"log_level" = 0\n'
        "[source]\n"
        f'topic = "{TOPIC}"\n'
        'format = "json"\n'
        f'dead_letter_topic = "{TOPIC}.dlq"\n'
        "[mapping]\n"
        f'template = "{TEMPLATE}"\n'
        "[broker]\n"
        f'server = "127.0.0.1:{port}"\n'
        "[bridge]\n"
        "stats_interval = 0\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="topiary-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rate", type=int, default=4000, help="beacons per second")
    args = parser.parse_args(argv)
    if args.rate < 20 or not 0 < args.seconds <= 600:
        parser.error("--rate must be at least 20 and --seconds in (0, 600]")
    try:
        tansu = start_tansu()
    except TansuUnavailable as exc:
        print(f"topiary-demo: no Kafka-protocol broker: {exc}", file=sys.stderr)
        return 1
    with tansu, tempfile.TemporaryDirectory(prefix="topiary-demo-") as tmp:
        workdir = Path(tmp)
        tansu.create_topic(TOPIC, 4)
        tansu.create_topic(f"{TOPIC}.dlq", 1)
        print(f"Kafka-protocol broker (Tansu) on {tansu.bootstrap}")
        port = free_port()
        serve = [sys.executable, "-m", "broker.cli", "serve", "--port", str(port),
                 "--log-format", "json"]  # fmt: skip
        with process(serve, workdir / "broker.log") as broker:
            trio.run(wait_listening, port, broker)
            print(f"topiary serve on 127.0.0.1:{port}")
            config = workdir / "bridge.toml"
            write_bridge_config(config, tansu.bootstrap, port)
            bridge_args = [sys.executable, "-m", "broker.cli", "bridge", "kafka",
                           "--config", str(config), "--log-format", "json"]  # fmt: skip
            print(f"topiary bridge kafka: {TOPIC} -> {TEMPLATE}\n")
            result = trio.run(demo, tansu, port, bridge_args, workdir, args.seconds, args.rate)
        counters = bridge_counters(workdir / "bridge.log")
    report(result, counters)
    return 0


def report(result: dict[str, Any], counters: dict[str, Any]) -> None:
    received, expected = result["received"], result["expected"]
    print()
    for name, flt, dialect in SUBSCRIBERS:
        counter = received[name]
        total = sum(counter.values())
        mark = "" if total == expected[name] else f"  (expected {expected[name]})"
        print(f"{name}  ({dialect} filter {flt}): {total} messages{mark}")
        for key, count in counter.most_common(4):
            print(f"    {key:32s} {count}")
    beacons, malformed = result["produced"]
    stream = beacons + malformed
    delivered = sum(sum(c.values()) for c in received.values())
    flat = stream * len(SUBSCRIBERS)
    print("\nmessage economy")
    print(f"  events in the aggregate stream      {stream:>8}  ({malformed} malformed)")
    print(f"  read by the bridge                  {counters.get('records_in', '?'):>8}")
    print(f"  dropped at the source (unwanted)    {counters.get('unwanted_dropped', '?'):>8}")
    print(f"  sent to the dead-letter topic       {counters.get('dead_lettered', '?'):>8}")
    print(f"  forwarded to the broker             {counters.get('published', '?'):>8}")
    print(f"  delivered to {len(SUBSCRIBERS)} subscribers           {delivered:>8}")
    print(f"  flat topics: each subscriber reads all {flat:>5}  "
          f"({flat / max(delivered, 1):.1f} messages moved per message wanted; "
          f"here 1.0)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
