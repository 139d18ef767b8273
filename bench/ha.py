"""Confirmed-publish throughput of a hot-spare pair (``[ha] sync = true``) vs a single broker.

    python bench/ha.py [--quick] [--json PATH] [--seconds S] [--tasks N]

In one run, each party its own process on 127.0.0.1: (1) a single ``topiary serve
--data-dir``; (2) a primary and a standby (``[ha]``, ``failover = "manual"``, sync on),
the primary's standby in sync before the load. Each time a durable session (filter
``bench/ha/>``, away: every message is stored for it) and a publisher process running N
trio tasks on one connection, each awaiting ``publish(..., confirm=True)`` in a loop for S
seconds. confirmed/s = PUBACKs / S. The pair's row also says how many of its batches were
confirmed alone (no standby in sync: must be 0) from the primary's ``stats``. Goal
(issue 20): pair >= 0.75 x single.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from broker.client import connect  # noqa: E402

TOPIC = "bench/ha/t"
SESSION = "bench-ha"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], log: Path, port: int) -> subprocess.Popen:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", *args, "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the broker exited at start-up (log: {log})") from None
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the broker did not start (log: {log})")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _prepare(port: int) -> None:
    async with (
        connect(("127.0.0.1", port), client_id=SESSION, durable=True) as c,
        c.subscribe("bench/ha/>"),
    ):
        await c.ping()


async def _stats(port: int) -> dict[str, Any]:
    async with connect(("127.0.0.1", port)) as c:
        stats: dict[str, Any] = await c.stats()
        return stats


def _measure(port: int, tasks: int, seconds: float) -> int:
    """Run the publisher in its own process; the PUBACKs it counted."""
    out = subprocess.run(
        [sys.executable, __file__, "--publisher", str(port), "--tasks", str(tasks),
         "--seconds", str(seconds)],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=seconds + 60,
    )  # fmt: skip
    return int(json.loads(out.stdout)["confirmed"])


async def _publisher(port: int, tasks: int, seconds: float) -> int:
    confirmed = 0
    payload = b"x" * 500
    async with connect(("127.0.0.1", port)) as client:
        deadline = trio.current_time() + seconds

        async def one() -> None:
            nonlocal confirmed
            while trio.current_time() < deadline:
                await client.publish(TOPIC, payload, confirm=True)
                confirmed += 1

        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(one)
    return confirmed


def _wait_logged(log: Path, text: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        time.sleep(0.05)
    raise SystemExit(f"{text!r} not logged in {log}")


def run(tasks: int, seconds: float, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"benchmark": "ha", "tasks": tasks, "seconds": seconds}
    port = _free_port()
    single = _start(["--port", str(port), "--data-dir", str(work / "single")], work / "s.log", port)
    try:
        trio.run(_prepare, port)
        results["single_per_second"] = _measure(port, tasks, seconds) / seconds
    finally:
        _stop(single)
    ports = {"a": _free_port(), "b": _free_port()}
    link = _free_port()
    procs = []
    try:
        for name, role, partner in (("a", "primary", "b"), ("b", "standby", "a")):
            (work / name).mkdir()
            config = work / f"{name}.toml"
            config.write_text(
                f'[server]\nport = {ports[name]}\nhost = "127.0.0.1"\n'
                f'data_dir = "{work / name}"\n[ha]\nrole = "{role}"\n'
                f'partner = "127.0.0.1:{ports[partner]}"\nwitness = "127.0.0.1:1"\n'
                f'secret = "bench"\nfailover = "manual"\nlink_port = {link}\nsync = true\n'
            )
            procs.append(_start(["--config", str(config)], work / f"{name}.log", ports[name]))
        _wait_logged(work / "a.log", "standby in sync")
        trio.run(_prepare, ports["a"])
        results["pair_per_second"] = _measure(ports["a"], tasks, seconds) / seconds
        ha = trio.run(_stats, ports["a"]).get("ha", {})
        results["pair_confirms_alone"] = ha.get("confirms_alone")
        results["pair_confirms_waited"] = ha.get("confirms_waited")
    finally:
        for proc in procs:
            _stop(proc)
    results["ratio"] = results["pair_per_second"] / results["single_per_second"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s per measurement")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--tasks", type=int, default=128)
    parser.add_argument("--publisher", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publisher is not None:
        count = trio.run(_publisher, args.publisher, args.tasks, args.seconds)
        print(json.dumps({"confirmed": count}))
        return
    seconds = 1.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory(prefix="topiary-bench-ha-") as work:
        results = run(args.tasks, seconds, Path(work))
    print(f"{'setup':<28} {'confirmed/s':>12}")
    print(f"{'single broker':<28} {results['single_per_second']:>12.0f}")
    print(f"{'pair, sync = true':<28} {results['pair_per_second']:>12.0f}")
    print(f"ratio {results['ratio']:.2f} (goal >= 0.75); batches confirmed alone in the pair: "
          f"{results['pair_confirms_alone']}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
