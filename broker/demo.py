"""``make demo``: a broker, two wildcard subscribers and a beacon publisher.

Starts ``topiary serve`` as its own process on a free 127.0.0.1 port, then,
in this process, two subscribers (one native, one mqtt dialect) and a
publisher of synthetic web-analytics beacons for a few seconds, and prints
what each subscriber received next to what a flat topic would have moved.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import socket
import subprocess
import sys
import time

import trio

from broker.client import Subscription, connect

REGIONS = {"eu": ["de", "fr", "es", "it"], "na": ["us", "ca"], "ap": ["jp", "sg"]}
SECTIONS = ["home", "search", "product", "cart", "checkout"]
EVENTS = ["view", "click", "add_to_cart", "purchase", "error"]
SUBSCRIBERS = [
    ("checkout-eu", "beacon/eu/*/*/checkout/>", "native"),
    ("purchases-anywhere", "beacon/+/+/+/+/purchase", "mqtt"),
]


def beacon(rng: random.Random) -> tuple[str, dict[str, object]]:
    region = rng.choice(list(REGIONS))
    country = rng.choice(REGIONS[region])
    site = f"site{int(rng.paretovariate(1.2)) % 50:02d}"
    section = rng.choices(SECTIONS, weights=[30, 25, 20, 15, 10])[0]
    event = rng.choices(EVENTS, weights=[50, 25, 12, 8, 5])[0]
    topic = f"beacon/{region}/{country}/{site}/{section}/{event}"
    return topic, {"site": site, "event": event, "ts": time.time()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_for(port: int, proc: subprocess.Popen[bytes]) -> None:
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
        counts[message.topic.split("/", 2)[1] + " " + message.topic.rsplit("/", 1)[1]] += 1


async def run(seconds: float, rate: int, port: int) -> dict[str, object]:
    address = ("127.0.0.1", port)
    received = {name: collections.Counter[str]() for name, _, _ in SUBSCRIBERS}
    published = 0
    rng = random.Random(7)
    async with connect(address) as subs_client, trio.open_nursery() as nursery:
        for name, flt, dialect in SUBSCRIBERS:
            sub = await nursery.start(_subscribe, subs_client, flt, dialect)
            nursery.start_soon(collect, sub, received[name])
        async with connect(address) as publisher:
            start = trio.current_time()
            while trio.current_time() - start < seconds:
                for _ in range(rate // 20):
                    topic, body = beacon(rng)
                    await publisher.publish(topic, json.dumps(body).encode())
                    published += 1
                await trio.sleep(0.05)
            await publisher.publish("beacon/eu/de/site00/checkout/view", b"{}", confirm=True)
            published += 1
            stats = await publisher.stats()
        await trio.sleep(0.3)
        nursery.cancel_scope.cancel()
    return {"published": published, "received": received, "stats": stats}


async def _subscribe(
    client, flt: str, dialect: str, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    async with client.subscribe(flt, dialect) as sub:
        task_status.started(sub)
        await trio.sleep_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="topiary-demo")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rate", type=int, default=2000, help="beacons per second")
    args = parser.parse_args(argv)
    port = free_port()
    print(f"starting topiary serve on 127.0.0.1:{port}")
    broker = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "serve", "--port", str(port), "--log-format", "json"],
        stderr=subprocess.DEVNULL,
    )
    try:
        trio.run(wait_for, port, broker)
        print(f"publishing ~{args.rate} beacons/s for {args.seconds:g} s ...\n")
        result = trio.run(run, args.seconds, args.rate, port)
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            broker.kill()
    published = result["published"]
    received = result["received"]
    assert isinstance(received, dict)
    for (name, flt, dialect), counter in zip(SUBSCRIBERS, received.values(), strict=True):
        total = sum(counter.values())
        print(f"{name}  ({dialect} filter {flt}): {total} messages")
        for key, count in counter.most_common(6):
            print(f"    {key:24s} {count}")
    delivered = sum(sum(c.values()) for c in received.values())
    print(
        f"\npublished {published}, delivered {delivered}; a flat topic would have moved "
        f"{published * len(SUBSCRIBERS)} (every subscriber reads everything) for the "
        f"{delivered} wanted: {delivered / max(published * len(SUBSCRIBERS), 1):.0%} of it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
