"""TLS against plain TCP, side by side in one run: fan-out throughput and connection set-up.

    python bench/tls.py [--messages N] [--subscribers S] [--connections C]
                        [--concurrent K] [--repeats R] [--seconds T] [--quick] [--json PATH]

One ``topiary serve`` process serves both: the plain native port and ``[tls]
listen_native``, with certificates made for the run by the openssl commands of
docs/security.md (EC P-256, TLS 1.3 as negotiated by default). The clients are the topiary
client library in this process (one trio thread), so the broker's CPU is its own. Plain and
TLS runs alternate, ``--repeats`` times each, and the table shows medians:

- fanout       1 publisher and S subscribers (default 4) on ``bench/tls/>``; the publisher
               sends N messages (default 100,000) of 200..800 bytes (seeded sizes, the same
               for both); time from the first publish to the last delivery at the last
               subscriber; messages/s is N / that time (deliveries/s is S times it). The
               broker's outbound queues are raised so that nothing is dropped, and
               correctness (exit 1 otherwise) is every subscriber getting all N, in order.
- sequential   C connections (default 300) one after another: connect, (TLS handshake),
               HELLO/WELCOME, close; connections/s.
- concurrent   K connections (default 100) opened at once, held until all are open, then
               closed; connections/s from the first connect to the last WELCOME.

Every run is bounded by ``--seconds`` (a run past it fails, and the benchmark with it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness.report import (  # noqa: E402
    arg_parser,
    format_columns,
    machine_info,
    write_report,
)
from broker.client import connect, tls_context  # noqa: E402
from broker.log import configure_logging  # noqa: E402

FULL: dict[str, Any] = {
    "messages": 100_000,
    "subscribers": 4,
    "connections": 300,
    "concurrent": 100,
    "repeats": 3,
    "seconds": 120.0,
}
QUICK: dict[str, Any] = {
    "messages": 2_000,
    "subscribers": 2,
    "connections": 20,
    "concurrent": 10,
    "repeats": 1,
    "seconds": 30.0,
}
SIZES = (200, 800)  # payload bytes, uniform in this range
TOPIC = "bench/tls/fan"
MODES = ("plain", "tls")

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("workload", "workload", ""),
    ("plain", "plain", ",.0f"),
    ("tls", "tls", ",.0f"),
    ("unit", "unit", ""),
    ("tls/plain", "ratio", ".2f"),
    ("correct", "correct", ""),
)

# The openssl commands of docs/security.md ("From scratch"), for 127.0.0.1
CERTIFICATES = """
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout ca.key -out ca.crt -days 2 -subj "/O=bench/CN=bench CA"
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout server.key -out server.csr -subj "/O=bench/CN=broker"
printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
  -out server.crt -days 2 -extfile server.ext
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certificates(directory: Path) -> None:
    subprocess.run(
        ["sh", "-ec", CERTIFICATES], cwd=directory, check=True, capture_output=True, timeout=60
    )


@contextlib.contextmanager
def broker_process(directory: Path, messages: int) -> Iterator[dict[str, tuple[str, int]]]:
    """``topiary serve`` with a plain and a TLS native port; their addresses by mode."""
    plain, secure = free_port(), free_port()
    queue_room = messages + 1_000
    config = directory / "broker.toml"
    config.write_text(
        f"[server]\nport = {plain}\n[limits]\noutbound_messages = {queue_room}\n"
        f"outbound_bytes = {queue_room * 1024}\nhello_timeout = 30.0\n"
        f'[tls]\ncert = "server.crt"\nkey = "server.key"\n'
        f'listen_native = "127.0.0.1:{secure}"\n'
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker.cli",
            "serve",
            "--config",
            str(config),
            "--log-format",
            "json",
        ],
        cwd=directory,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    listening = threading.Event()

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with contextlib.suppress(json.JSONDecodeError):
                if json.loads(line).get("event") == "listening":
                    listening.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        if not listening.wait(30):
            raise RuntimeError("the broker did not start listening within 30 s")
        yield {"plain": ("127.0.0.1", plain), "tls": ("127.0.0.1", secure)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def payloads(messages: int) -> list[bytes]:
    rng = random.Random(19)
    return [rng.randbytes(rng.randint(*SIZES)) for _ in range(messages)]


async def fanout(
    address: tuple[str, int], tls: Any, bodies: list[bytes], subscribers: int
) -> tuple[float, bool]:
    """Seconds from the first publish to the last delivery; whether all arrived in order."""
    count = len(bodies)
    done: list[bool] = []
    last = [0.0]

    async def receive(sub: Any) -> None:
        ok = True
        for i in range(count):
            message = await sub.get()
            ok &= message.payload == bodies[i]
        last[0] = max(last[0], time.perf_counter())
        done.append(ok)

    async with contextlib.AsyncExitStack() as stack:
        subs = []
        for _ in range(subscribers):
            client = await stack.enter_async_context(connect(address, tls=tls))
            subs.append(await stack.enter_async_context(client.subscribe(f"{TOPIC}/>")))
        publisher = await stack.enter_async_context(connect(address, tls=tls))
        async with trio.open_nursery() as nursery:
            for sub in subs:
                nursery.start_soon(receive, sub)
            began = time.perf_counter()
            for body in bodies:
                await publisher.publish(f"{TOPIC}/x", body)
    return last[0] - began, len(done) == subscribers and all(done)


async def sequential(address: tuple[str, int], tls: Any, count: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        async with connect(address, tls=tls):
            pass
    return count / (time.perf_counter() - began)


async def concurrent(address: tuple[str, int], tls: Any, count: int) -> float:
    opened = 0
    all_open = trio.Event()
    finished = [0.0]

    async def one() -> None:
        nonlocal opened
        async with connect(address, tls=tls):
            opened += 1
            if opened == count:
                finished[0] = time.perf_counter()
                all_open.set()
            await all_open.wait()

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return count / (finished[0] - began)


async def measure(
    addresses: dict[str, tuple[str, int]], ca: str, counts: dict[str, Any]
) -> dict[str, Any]:
    """Every workload, plain and TLS alternating, ``repeats`` times: the raw figures."""
    bodies = payloads(counts["messages"])
    contexts = {"plain": None, "tls": tls_context(ca)}
    figures: dict[str, dict[str, list[float]]] = {
        workload: {mode: [] for mode in MODES}
        for workload in ("fanout", "sequential", "concurrent")
    }
    correct = True
    for repeat in range(counts["repeats"]):
        for mode in MODES:
            address, tls = addresses[mode], contexts[mode]
            with trio.fail_after(counts["seconds"]):
                seconds, ok = await fanout(address, tls, bodies, counts["subscribers"])
            figures["fanout"][mode].append(counts["messages"] / seconds)
            correct &= ok
            with trio.fail_after(counts["seconds"]):
                figures["sequential"][mode].append(
                    await sequential(address, tls, counts["connections"])
                )
            with trio.fail_after(counts["seconds"]):
                figures["concurrent"][mode].append(
                    await concurrent(address, tls, counts["concurrent"])
                )
            print(f"  repeat {repeat + 1} {mode}: done", file=sys.stderr, flush=True)
    return {"figures": figures, "correct": correct}


def rows_from(measured: dict[str, Any], counts: dict[str, Any]) -> list[dict[str, Any]]:
    units = {
        "fanout": f"messages/s (x{counts['subscribers']} deliveries)",
        "sequential": "connections/s",
        "concurrent": "connections/s",
    }
    rows = []
    for workload, by_mode in measured["figures"].items():
        plain, tls = statistics.median(by_mode["plain"]), statistics.median(by_mode["tls"])
        rows.append(
            {
                "workload": workload,
                "plain": plain,
                "tls": tls,
                "unit": units[workload],
                "ratio": tls / plain,
                "runs": by_mode,
                "correct": measured["correct"] if workload == "fanout" else True,
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    return format_columns(rows, COLUMNS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__, "2,000 messages to 2 subscribers, 20 and 10 connections, once")
    for name, what in (
        ("messages", "messages published per fan-out run"),
        ("subscribers", "subscribers in the fan-out"),
        ("connections", "sequential connections per run"),
        ("concurrent", "concurrent connections per run"),
        ("repeats", "runs of each workload per mode"),
    ):
        parser.add_argument(f"--{name}", type=int, help=f"{what} (default {FULL[name]:,})")
    parser.add_argument("--seconds", type=float, help="time limit of each run (default 120)")
    args = parser.parse_args(argv)
    counts = dict(QUICK if args.quick else FULL)
    for key in FULL:
        if getattr(args, key) is not None:
            counts[key] = getattr(args, key)
    if min(counts[k] for k in FULL if k != "seconds") < 1 or counts["seconds"] <= 0:
        parser.error("every count must be >= 1 and --seconds > 0")
    args.counts = counts
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(level=logging.WARNING)
    started = time.perf_counter()
    counts = args.counts
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as scratch:
        directory = Path(scratch)
        make_certificates(directory)
        with broker_process(directory, counts["messages"]) as addresses:
            measured = trio.run(measure, addresses, str(directory / "ca.crt"), counts)
    rows = rows_from(measured, counts)
    print(format_table(rows))
    correct = measured["correct"]
    print()
    print(f"total {time.perf_counter() - started:.1f} s; correct: {'yes' if correct else 'NO'}")
    if args.json:
        report = {
            "benchmark": "tls",
            "machine": machine_info(),
            "parameters": {
                "quick": args.quick,
                "counts": counts,
                "payload_bytes": list(SIZES),
                "broker": "topiary serve subprocess, plain and [tls] listen_native ports",
                "clients": "topiary client library, one trio thread in the benchmark process",
                "certificates": "openssl, EC P-256 (docs/security.md)",
                "statistic": "median of the repeats",
            },
            "results": rows,
            "correct": correct,
        }
        write_report(report, args.json, sort_keys=False)
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
