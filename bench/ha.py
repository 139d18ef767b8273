"""Confirmed-publish throughput of a hot-spare pair (``[ha] sync = true``) vs a single broker,
and the failover time of a pair with a witness over repeated kill -9 of the primary.

    python bench/ha.py [--quick] [--json PATH] [--seconds S] [--tasks N[,N...]]
                       [--latency M] [--kills K]

In one run, each party its own process on 127.0.0.1: (1) a single ``topiary serve
--data-dir``; (2) a primary and a standby (``[ha]``, ``failover = "manual"``, sync on),
the primary's standby in sync before the load. Each time a durable session (filter
``bench/ha/>``, away: every message is stored for it) and a publisher process running N
trio tasks on one connection, each awaiting ``publish(..., confirm=True)`` in a loop for S
seconds. confirmed/s = PUBACKs / S. The pair's row also says how many of its batches were
confirmed alone (no standby in sync: must be 0) from the primary's ``stats``. Goal
(issue 20): pair >= 0.75 x single. ``--tasks 128,512`` measures each number of tasks in
turn on the same brokers (a row per number): with few tasks in flight a confirmed publish's
round trip, not CPU, sets the rate (a task publishes again only once PUBACKed), so the
pair's extra wait for the standby shows in the rate too.

Latency (``--latency M``, default 2,000; 0 skips it): then one task publishes M messages
confirmed, one after the other, and times each ``publish`` call: p50 / p99 of a confirmed
publish's round trip on an idle broker, single and pair (what the pair's wait for the
standby's fsync adds to one publish).

CPU per confirmed message (us): each broker's user + system time from ``/proc/<pid>/stat``
over the measured interval (read just before the publisher starts and just after it
exits), and the publisher's own under the load (``resource.getrusage``), divided by the
PUBACKs. On a shared machine this moves much less than the rates do: it is the figure to
compare when the cores are busy with other work.

Failover (``--kills K``, default 5; 0 skips it): a witness and two brokers with the default
``[ha]`` timings (``failover = "witness"``, lease 1 s, failure timeout 0.6 s), a durable
session, and 4 trio tasks publishing confirmed through one client given both servers
(``connect([A, B], reconnect=True)``, the client's default backoff). Each round: kill -9 of
the primary under that load; the failover time is from the kill to the first PUBACK that
the promoted standby sends (the client's current server is the standby). Then the old
primary is started again on its data directory: it steps down and resynchronises, and the
next round waits until the new primary reports it in sync, so the primaries alternate. At
the end the durable session is read through the server list: every confirmed message must
be in it (missing: must be 0; duplicates are counted). Goal (issue 20): <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import socket
import statistics
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
from broker.log import configure_logging  # noqa: E402

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


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15


def _measure(
    port: int, tasks: int, seconds: float, watched: dict[str, subprocess.Popen]
) -> tuple[int, dict[str, float]]:
    """Run the publisher in its own process; the PUBACKs it counted, and the CPU seconds
    each ``watched`` process (and the publisher) spent meanwhile."""
    before = {name: _cpu_seconds(proc.pid) for name, proc in watched.items()}
    out = subprocess.run(
        [sys.executable, __file__, "--publisher", str(port), "--tasks", str(tasks),
         "--seconds", str(seconds)],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=seconds + 60,
    )  # fmt: skip
    cpu = {name: _cpu_seconds(proc.pid) - before[name] for name, proc in watched.items()}
    report = json.loads(out.stdout)
    cpu["publisher"] = float(report["cpu_seconds"])
    return int(report["confirmed"]), cpu


def _cpu_per_message(cpu: dict[str, float], confirmed: int) -> dict[str, float]:
    """Microseconds of CPU per confirmed message, per process."""
    return {name: seconds * 1e6 / max(confirmed, 1) for name, seconds in cpu.items()}


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _latencies(port: int, count: int) -> list[float]:
    """Seconds of each of ``count`` confirmed publishes, one at a time (after 50 unmeasured)."""
    payload = b"x" * 500
    times = []
    async with connect(("127.0.0.1", port)) as client:
        for i in range(count + 50):
            start = time.perf_counter()
            await client.publish(TOPIC, payload, confirm=True)
            if i >= 50:
                times.append(time.perf_counter() - start)
    return times


def _latency_ms(port: int, count: int) -> dict[str, float]:
    """p50 / p99 / max in ms of one task's confirmed publishes (``_latencies``)."""
    times = sorted(trio.run(_latencies, port, count))
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
        "max_ms": times[-1] * 1e3,
    }


async def _publisher(port: int, tasks: int, seconds: float) -> tuple[int, float]:
    """The PUBACKs counted, and the CPU seconds spent under the load (start-up excluded)."""
    confirmed = 0
    payload = b"x" * 500
    async with connect(("127.0.0.1", port)) as client:
        started = _own_cpu_seconds()
        deadline = trio.current_time() + seconds

        async def one() -> None:
            nonlocal confirmed
            while trio.current_time() < deadline:
                await client.publish(TOPIC, payload, confirm=True)
                confirmed += 1

        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(one)
        return confirmed, _own_cpu_seconds() - started


def _wait_logged(log: Path, text: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        time.sleep(0.05)
    raise SystemExit(f"{text!r} not logged in {log}")


def run(tasks: list[int], seconds: float, latency: int, work: Path) -> dict[str, Any]:
    """The throughput rows (one per number of tasks) and the latency, single then pair; the
    first number of tasks also fills the top-level keys (``ratio`` and the rest)."""
    results: dict[str, Any] = {
        "benchmark": "ha", "tasks": tasks[0], "seconds": seconds, "by_tasks": {}
    }  # fmt: skip
    rows: dict[int, dict[str, Any]] = {n: {} for n in tasks}
    port = _free_port()
    single = _start(["--port", str(port), "--data-dir", str(work / "single")], work / "s.log", port)
    try:
        trio.run(_prepare, port)
        for n in tasks:
            confirmed, cpu = _measure(port, n, seconds, {"broker": single})
            rows[n]["single_per_second"] = confirmed / seconds
            rows[n]["single_cpu_us"] = _cpu_per_message(cpu, confirmed)
        results["single_mean_batch"] = trio.run(_stats, port)["store"]["mean_batch"]
        if latency:
            results["single_latency"] = _latency_ms(port, latency)
    finally:
        _stop(single)
    ports = {"a": _free_port(), "b": _free_port()}
    links = {"a": _free_port(), "b": _free_port()}  # each binds its own at start
    procs = []
    try:
        for name, role, partner in (("a", "primary", "b"), ("b", "standby", "a")):
            (work / name).mkdir()
            config = work / f"{name}.toml"
            config.write_text(
                f'[server]\nport = {ports[name]}\nhost = "127.0.0.1"\n'
                f'data_dir = "{work / name}"\n[ha]\nrole = "{role}"\n'
                f'partner = "127.0.0.1:{ports[partner]}"\nwitness = "127.0.0.1:1"\n'
                f'secret = "bench"\nfailover = "manual"\nlink_port = {links[name]}\n'
                f"partner_link_port = {links[partner]}\nsync = true\n"
            )
            procs.append(_start(["--config", str(config)], work / f"{name}.log", ports[name]))
        _wait_logged(work / "a.log", "standby in sync")
        trio.run(_prepare, ports["a"])
        watched = {"primary": procs[0], "standby": procs[1]}
        for n in tasks:
            confirmed, cpu = _measure(ports["a"], n, seconds, watched)
            rows[n]["pair_per_second"] = confirmed / seconds
            rows[n]["pair_cpu_us"] = _cpu_per_message(cpu, confirmed)
            rows[n]["ratio"] = rows[n]["pair_per_second"] / rows[n]["single_per_second"]
        if latency:
            results["pair_latency"] = _latency_ms(ports["a"], latency)
        stats = trio.run(_stats, ports["a"])
        results["pair_mean_batch"] = stats["store"]["mean_batch"]
        ha = stats.get("ha", {})
        results["pair_confirms_alone"] = ha.get("confirms_alone")
        results["pair_confirms_waited"] = ha.get("confirms_waited")
    finally:
        for proc in procs:
            _stop(proc)
    results.update(rows[tasks[0]])
    results["by_tasks"] = {str(n): row for n, row in rows.items()}
    return results


FAILOVER_TASKS = 4
SECRET = "bench-ha"


class _Broker:
    """One broker of the failover pair: its config, data directory, log and process."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.link = _free_port()
        self.config = work / f"fo-{name}.toml"
        self.data_dir = work / f"fo-{name}"
        self.log = work / f"fo-{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def configure(self, role: str, partner: _Broker, witness: int) -> None:
        self.data_dir.mkdir()
        self.config.write_text(
            f'[server]\nport = {self.port}\nhost = "127.0.0.1"\ndata_dir = "{self.data_dir}"\n'
            f'[ha]\nrole = "{role}"\npartner = "{partner.address}"\n'
            f'witness = "127.0.0.1:{witness}"\nsecret = "{SECRET}"\n'
            f"link_port = {self.link}\npartner_link_port = {partner.link}\n"
        )

    def start(self) -> None:
        # [ha] role decides the first start only: later starts read DATA_DIR/ha-term
        self.proc = _start(["--config", str(self.config)], self.log, self.port)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


async def _until_in_sync(primary: _Broker, seconds: float = 60) -> None:
    """Wait (bounded) until ``primary`` serves and reports its standby in sync."""
    with trio.fail_after(seconds):
        while True:
            try:
                if (await _stats(primary.port)).get("ha", {}).get("in_sync") == 1:
                    return
            except Exception:  # a standby refuses, a promotion is under way
                pass
            await trio.sleep(0.05)  # polling another process (bounded by fail_after)


class _Round:
    """One kill: confirmed publishes until told to stop; the time from the kill to the
    first PUBACK sent by ``standby`` (the client's current server then)."""

    def __init__(self, client: Any, number: int, standby: _Broker, confirmed: list[str]) -> None:
        self.client = client
        self.number = number
        self.standby = ("127.0.0.1", standby.port)
        self.confirmed = confirmed
        self.count = 0
        self.warm = trio.Event()  # set after 200 confirms: the load is on
        self.killed_at: float | None = None
        self.failover: float | None = None
        self.first_on_standby = trio.Event()
        self.stop = False

    async def publish(self, task: int) -> None:
        while not self.stop:
            payload = f"r{self.number}-t{task}-{self.count}"
            self.count += 1
            await self.client.publish(TOPIC, payload, confirm=True)
            self.confirmed.append(payload)
            if self.count >= 200:
                self.warm.set()
            if (
                self.killed_at is not None
                and self.client.address == self.standby
                and not self.first_on_standby.is_set()
            ):
                self.failover = trio.current_time() - self.killed_at
                self.first_on_standby.set()


async def _failover_rounds(kills: int, brokers: list[_Broker]) -> dict[str, Any]:
    servers = [b.address for b in brokers]
    confirmed: list[str] = []
    times: list[float] = []
    primary, standby = brokers
    await _until_in_sync(primary)
    async with (
        connect(servers, client_id=SESSION, durable=True) as c,
        c.subscribe("bench/ha/>"),
    ):
        await c.ping()  # the session holds the filter: it stores from now on
    async with connect(servers, reconnect=True, reconnect_timeout=30) as client:
        for number in range(kills):
            one = _Round(client, number, standby, confirmed)
            async with trio.open_nursery() as nursery:
                for task in range(FAILOVER_TASKS):
                    nursery.start_soon(one.publish, task)
                with trio.fail_after(30):
                    await one.warm.wait()
                one.killed_at = trio.current_time()
                primary.kill()
                with trio.fail_after(30):
                    await one.first_on_standby.wait()
                await trio.sleep(0.2)  # a little load on the new primary, then stop
                one.stop = True
            assert one.failover is not None
            times.append(one.failover)
            primary.start()  # the old primary: steps down, resynchronises as standby
            primary, standby = standby, primary
            await _until_in_sync(primary)
            print(f"kill {number + 1}/{kills}: {one.failover:.3f} s", file=sys.stderr)
    received: list[str] = []
    seen: set[str] = set()
    wanted = set(confirmed)
    async with (
        connect(servers, client_id=SESSION, durable=True) as c,
        c.subscribe("bench/ha/>") as sub,
    ):
        with trio.move_on_after(60):
            while not wanted <= seen:
                payload = (await sub.get()).payload.decode()
                received.append(payload)
                seen.add(payload)
    return {
        "kills": kills,
        "failover_seconds": times,
        "failover_p50": statistics.median(times),
        "failover_max": max(times),
        "failover_confirmed": len(wanted),
        "failover_missing": len(wanted - seen),
        "failover_duplicates": len(received) - len(seen),
    }


def run_failover(kills: int, work: Path) -> dict[str, Any]:
    witness_port = _free_port()
    with (work / "witness.log").open("ab") as out:
        witness = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "witness", "--port", str(witness_port),
             "--data-dir", str(work / "witness"), "--secret", SECRET],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    brokers = [_Broker("a", work), _Broker("b", work)]
    try:
        brokers[0].configure("primary", brokers[1], witness_port)
        brokers[1].configure("standby", brokers[0], witness_port)
        for broker in brokers:
            broker.start()
        return trio.run(_failover_rounds, kills, brokers)
    finally:
        for broker in brokers:
            if broker.proc is not None:
                _stop(broker.proc)
        _stop(witness)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s per measurement")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--tasks", default="128", help="publisher tasks; a comma-separated list: a row each"
    )
    parser.add_argument(
        "--latency", type=int, default=2000, help="sequential confirmed publishes timed (0: none)"
    )
    parser.add_argument("--kills", type=int, default=5, help="kill -9 rounds (0: none)")
    parser.add_argument("--publisher", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publisher is not None:
        count, cpu = trio.run(_publisher, args.publisher, int(args.tasks), args.seconds)
        print(json.dumps({"confirmed": count, "cpu_seconds": cpu}))
        return
    seconds = 1.0 if args.quick else args.seconds
    configure_logging(level=logging.WARNING)  # the failing-over client's retries: not the table
    with tempfile.TemporaryDirectory(prefix="topiary-bench-ha-") as work:
        tasks = [int(n) for n in args.tasks.split(",")]
        latency = min(args.latency, 300) if args.quick else args.latency
        results = run(tasks, seconds, latency, Path(work))
        if args.kills > 0:
            results.update(run_failover(args.kills, Path(work)))
    _print(results)
    if args.kills > 0:
        print(f"failover over {results['kills']} kill -9 of the primary: "
              f"p50 {results['failover_p50']:.3f} s, max {results['failover_max']:.3f} s "
              f"(goal <= 2 s); confirmed {results['failover_confirmed']}, missing from the "
              f"durable session {results['failover_missing']}, duplicates "
              f"{results['failover_duplicates']}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


def _print(results: dict[str, Any]) -> None:
    head = f"{'tasks':>5} {'setup':<18} {'confirmed/s':>12} {'ratio':>6}"
    print(f"{head}   CPU us per confirmed message")
    for n, row in results["by_tasks"].items():
        single, pair = row["single_cpu_us"], row["pair_cpu_us"]
        print(f"{n:>5} {'single broker':<18} {row['single_per_second']:>12.0f} {'':>6}   "
              f"broker {single['broker']:.1f}, publisher {single['publisher']:.1f}")  # fmt: skip
        print(f"{n:>5} {'pair, sync = true':<18} {row['pair_per_second']:>12.0f} "
              f"{row['ratio']:>6.2f}   primary {pair['primary']:.1f}, standby "
              f"{pair['standby']:.1f}, publisher {pair['publisher']:.1f}")  # fmt: skip
    print(f"goal: ratio >= 0.75; messages per commit: single {results['single_mean_batch']}, "
          f"pair's primary {results['pair_mean_batch']}; batches confirmed alone in the pair: "
          f"{results['pair_confirms_alone']}")  # fmt: skip
    if "single_latency" in results:
        for name in ("single", "pair"):
            lat = results[f"{name}_latency"]
            print(f"one confirmed publish at a time, {name}: p50 {lat['p50_ms']:.2f} ms, "
                  f"p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
