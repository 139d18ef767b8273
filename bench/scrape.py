"""What a Prometheus scrape costs: fan-out throughput with /metrics fetched every second vs without.

    python bench/scrape.py [--quick] [--json PATH] [--rounds N] [--first plain|scraped]
                           [--scrape-interval S] [--only NAMES] [--seed N]

Each scenario (``fanout-50`` and ``wild-1k``, exactly as in bench/e2e.py: a fresh broker
process, subscriber and publisher processes, a throughput phase then a 2,000 msg/s latency
phase) runs in two variants on the same machine in the same run:

- ``plain``    the broker as it runs by default, no HTTP port;
- ``scraped``  the broker with ``[http] listen`` on a free 127.0.0.1 port and a scraper
               process that GETs ``/metrics`` every ``--scrape-interval`` seconds (1 s; an
               absolute schedule) from the broker's start to the end of both phases, over
               one keep-alive connection as Prometheus does (h11 on the client side too). It
               records each scrape's start, duration, size and status, and parses the last
               body with prometheus_client's parser.

Rounds alternate the order (ABBA: round 1 runs ``--first`` first, round 2 the other, ...), so
that a drift in the machine's load does not favour one variant. The ratio per scenario is
the median scraped delivered/s over the median plain delivered/s; the goal (issue 21) is
>= 0.97 for fan-out. Scrapes are counted "in phase" when they started between the first
publish of the throughput phase and the last subscriber's marker.

On a shared machine two runs of the same variant differ by far more than 3 %, so each
scraped run also measures the cost directly: after the phases (subscribers still
connected, no traffic) the scraper fetches /metrics 200 times back to back and the broker's
CPU time (utime + stime from /proc) around them gives CPU ms per scrape. A broker that is
CPU-bound (one trio loop) loses that share of the interval: "implied" = 1 - CPU per scrape /
interval, the second goal line.

Every party shares the machine (2 cores here): the figures are as noisy as e2e's, and the
load average at start and end is printed. ``--quick`` runs one round of e2e's tiny counts
with a scrape every 0.25 s (the smoke test). The exit status is 0 unless a run failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import h11  # noqa: E402
import trio  # noqa: E402

from bench.e2e import FULL, QUICK, run_publish_scenario  # noqa: E402
from bench.harness import BenchError  # noqa: E402
from bench.harness.processes import HOST, BrokerProcess, free_port  # noqa: E402
from bench.harness.procfs import cpu_times  # noqa: E402
from bench.harness.report import (  # noqa: E402
    Goals,
    arg_parser,
    fmt,
    machine_info,
    percentile,
    print_ending,
    write_report,
)
from bench.harness.workers import Worker  # noqa: E402

SCENARIOS = ("fanout-50", "wild-1k")
VARIANTS = ("plain", "scraped")
GOAL_RATIO = 0.97
SCRAPE_TIMEOUT = 10.0  # Prometheus' default scrape_timeout
SCRAPE_INTERVAL = 1.0
QUICK_SCRAPE_INTERVAL = 0.25
BURST = 200  # back-to-back scrapes for the CPU cost of one (/proc counts in 10 ms ticks)
QUICK_BURST = 20
METRICS_PATH = "/metrics"
FAILURES = (OSError, trio.BrokenResourceError, trio.TooSlowError, h11.ProtocolError, BenchError)


# -- the scraper (a worker process) -----------------------------------------------------------


class MetricsClient:
    """GETs over one keep-alive HTTP/1.1 connection, reopened when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.conn = h11.Connection(h11.CLIENT)

    async def get(self, path: str) -> tuple[int, bytes]:
        if self.stream is None:
            self.stream = await trio.open_tcp_stream(HOST, self.port)
            self.conn = h11.Connection(h11.CLIENT)
        request = h11.Request(method="GET", target=path, headers=[("Host", "bench")])
        await self.stream.send_all(self.conn.send(request) + self.conn.send(h11.EndOfMessage()))
        status, body = 0, bytearray()
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(256 * 1024))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise BenchError("the broker closed the connection mid-response")
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        else:
            await self.close()
        return status, bytes(body)

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None


async def _scrape_loop(
    client: MetricsClient, interval: float, records: list[dict[str, Any]], last: list[bytes]
) -> None:
    """GET /metrics on an absolute schedule; each finished scrape's figures into
    ``records`` (one cancelled in flight, when the coordinator says "enough", is not one),
    the latest good body as ``last[0]``."""
    start = trio.current_time()
    for index in range(sys.maxsize):
        await trio.sleep_until(start + index * interval)
        record: dict[str, Any] = {"at_ns": time.monotonic_ns(), "status": None, "bytes": 0}
        began = time.perf_counter()
        try:
            with trio.fail_after(SCRAPE_TIMEOUT):
                record["status"], body = await client.get(METRICS_PATH)
            record["bytes"] = len(body)
            if record["status"] == 200:
                last[:] = [body]
        except FAILURES as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            await client.close()
        record["seconds"] = time.perf_counter() - began
        records.append(record)


async def _until_serving(client: MetricsClient, timeout: float) -> None:
    """The HTTP port is bound after the broker's own: wait until it answers /healthz."""
    with trio.fail_after(timeout):
        while True:
            try:
                if (await client.get("/healthz"))[0] == 200:
                    return
            except FAILURES:
                await client.close()
            await trio.sleep(0.05)


def _families(body: bytes) -> int:
    """Metric families in an exposition, by Prometheus' own parser (raises if it is bad)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(1 for _ in text_string_to_metric_families(body.decode()))


async def scraper_main(pipe: Pipe, port: int, interval: float) -> None:
    """Scrape until told "enough"; answer with every scrape's figures."""
    records: list[dict[str, Any]] = []
    last: list[bytes] = []
    client = MetricsClient(port)
    await _until_serving(client, 30)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_scrape_loop, client, interval, records, last)
        pipe.send(("ready", {"pid": os.getpid()}))
        await trio.to_thread.run_sync(pipe.recv)  # ("enough",)
        nursery.cancel_scope.cancel()
    await client.close()
    families = _families(last[0]) if last else None
    pipe.send(("scrapes", {"records": records, "last_families": families}))
    while (command := await trio.to_thread.run_sync(pipe.recv))[0] == "burst":
        began = time.perf_counter()
        for _ in range(command[1]):  # back to back: what one scrape costs the broker
            await client.get(METRICS_PATH)
        pipe.send(("burst", time.perf_counter() - began))
    await client.close()


# -- the coordinator --------------------------------------------------------------------------


def http_config(log_dir: Path, name: str, port: int) -> Path:
    """A broker config file that opens the HTTP port on 127.0.0.1:``port``."""
    path = log_dir / f"{name}.toml"
    path.write_text(f'[http]\nlisten = "{HOST}:{port}"\n')
    return path


def scraping(
    ctx: Any, port: int, interval: float, burst: int, name: str
) -> Callable[[BrokerProcess], AbstractContextManager[dict[str, Any]]]:
    """For ``run_publish_scenario``: a scraper process beside the broker while it runs; at
    the end (subscribers still connected, no traffic) ``burst`` scrapes back to back, with
    the broker's CPU time (/proc) around them."""

    @contextmanager
    def scraper(broker: BrokerProcess) -> Iterator[dict[str, Any]]:
        figures: dict[str, Any] = {"interval": interval, "port": port}
        worker = Worker(ctx, scraper_main, (port, interval), f"{name}-scraper")
        figures["pid"] = worker.pid
        try:
            worker.expect("ready", 60)
            yield figures
            worker.send(("enough",))
            figures.update(worker.expect("scrapes", SCRAPE_TIMEOUT + 30)[1])
            cpu_before = sum(cpu_times(broker.pid))
            worker.send(("burst", burst))
            wall = worker.expect("burst", SCRAPE_TIMEOUT * burst)[1]
            cpu = sum(cpu_times(broker.pid)) - cpu_before
            figures["burst"] = {"scrapes": burst, "seconds": wall, "broker_cpu_seconds": cpu}
        finally:
            worker.stop()

    return scraper


def scrape_summary(result: dict[str, Any]) -> dict[str, Any] | None:
    """Scrape counts, durations and sizes of one scraped run; those during the throughput
    phase apart."""
    figures = result.get("alongside")
    if not figures or "records" not in figures:
        return None
    records = figures["records"]
    phase = result.get("throughput", {})
    first, span = phase.get("first_publish_ns"), phase.get("seconds_to_last_marker")
    in_phase = [
        r
        for r in records
        if first is not None and span and first <= r["at_ns"] <= first + span * 1e9
    ]
    good = [r for r in records if r.get("status") == 200]
    burst = figures.get("burst")
    cpu_ms = burst["broker_cpu_seconds"] * 1000 / burst["scrapes"] if burst else None
    ms = sorted(round(r["seconds"] * 1e6) for r in good)  # microseconds, for percentile()
    return {
        "scrapes": len(records),
        "in_throughput_phase": len(in_phase),
        "ok": len(good),
        "errors": [r.get("error") or f"status {r['status']}" for r in records if r not in good],
        "ms_p50": percentile(ms, 0.5) / 1000 if ms else None,
        "ms_max": ms[-1] / 1000 if ms else None,
        "bytes_last": good[-1]["bytes"] if good else None,
        "bytes_max": max(r["bytes"] for r in good) if good else None,
        "last_families": figures.get("last_families"),
        "broker_cpu_ms_per_scrape": cpu_ms,
        # the share of one core a scrape every interval takes from a CPU-bound broker
        "cpu_share": cpu_ms / 1000 / figures["interval"] if cpu_ms is not None else None,
    }


def run_one(
    name: str, variant: str, round_no: int, args: argparse.Namespace, ctx: Any, log_dir: Path
) -> dict[str, Any]:
    params = dict(QUICK if args.quick else FULL)
    label = f"{name}-{variant}-{round_no}"
    config = alongside = None
    if variant == "scraped":
        port = free_port()
        config = http_config(log_dir, label, port)
        burst = QUICK_BURST if args.quick else BURST
        alongside = scraping(ctx, port, args.scrape_interval, burst, label)
    result = run_publish_scenario(
        name, params, args.seed, ctx, log_dir, config=config, alongside=alongside, log_name=label
    )
    result.update(variant=variant, round=round_no)
    if variant == "scraped":
        result["scrape"] = scrape_summary(result)
    return result


def delivered(result: dict[str, Any]) -> float | None:
    return result.get("throughput", {}).get("delivered_per_second")


def compare(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario: the median delivered/s of each variant (and its range), scraped / plain,
    and the ratio implied by the broker's CPU per scrape (1 - its share of the interval)."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["name"] for r in runs):
        figures: dict[str, Any] = {}
        for variant in VARIANTS:
            mine = [r for r in runs if (r["name"], r["variant"]) == (name, variant)]
            values = [v for r in mine if (v := delivered(r)) is not None]
            figures[f"{variant}_delivered_per_second"] = median(values)
            figures[f"{variant}_range"] = [min(values), max(values)] if values else None
        plain, scraped = (
            figures["plain_delivered_per_second"],
            figures["scraped_delivered_per_second"],
        )
        figures["ratio"] = scraped / plain if plain and scraped else None
        scrapes = [r["scrape"] for r in runs if r["name"] == name and r.get("scrape")]
        share = median([s["cpu_share"] for s in scrapes if s["cpu_share"] is not None])
        figures["broker_cpu_ms_per_scrape"] = median(
            [
                s["broker_cpu_ms_per_scrape"]
                for s in scrapes
                if s["broker_cpu_ms_per_scrape"] is not None
            ]
        )
        figures["implied_ratio"] = None if share is None else 1 - share
        out[name] = figures
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_lines(runs: list[dict[str, Any]]) -> list[str]:
    header = (
        f"{'scenario':<10} {'variant':<8} {'round':>5} {'published/s':>12} {'delivered/s':>12} "
        f"{'p99 ms':>7} {'max ms':>7} {'CPU':>5} {'scrapes':>9} {'scrape ms':>11} {'KB':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in runs:
        start = f"{r['name']:<10} {r['variant']:<8} {r['round']:>5}"
        if "error" in r and "latency" not in r:
            lines.append(f"{start} failed: {r['error'].splitlines()[0][:70]}")
            continue
        a, lat = r["throughput"], r["latency"].get("latency_ms", {})
        s = r.get("scrape")
        scrapes = f"{s['in_throughput_phase']}/{s['scrapes']}" if s else "-"
        took = f"{fmt(s['ms_p50'], '.1f')}/{fmt(s['ms_max'], '.1f')}" if s else "-"
        size = fmt(s["bytes_max"] / 1024, ".1f") if s and s["bytes_max"] else "-"
        lines.append(
            f"{start} {fmt(a['published_per_second'], ',.0f'):>12} "
            f"{fmt(a['delivered_per_second'], ',.0f'):>12} {fmt(lat.get('p99'), '.2f'):>7} "
            f"{fmt(lat.get('max'), '.2f'):>7} {a['broker_cpu_utilisation']:>5.2f} "
            f"{scrapes:>9} {took:>11} {size:>6}"
        )
    return lines


def ratio_lines(comparison: dict[str, dict[str, Any]]) -> list[str]:
    header = (
        f"{'scenario':<10} {'plain delivered/s':>18} {'scraped delivered/s':>20} {'ratio':>7} "
        f"{'CPU ms/scrape':>14} {'implied':>8}"
    )
    lines = [header, "-" * len(header)]
    for name, c in comparison.items():
        lines.append(
            f"{name:<10} {fmt(c['plain_delivered_per_second'], ',.0f'):>18} "
            f"{fmt(c['scraped_delivered_per_second'], ',.0f'):>20} {fmt(c['ratio'], '.3f'):>7} "
            f"{fmt(c['broker_cpu_ms_per_scrape'], '.2f'):>14} {fmt(c['implied_ratio'], '.4f'):>8}"
        )
    return lines


def check_goals(comparison: dict[str, dict[str, Any]]) -> Goals:
    goals = Goals()
    for name, c in comparison.items():
        for key, how in (("ratio", "measured"), ("implied_ratio", "implied by CPU per scrape")):
            ratio = c[key]
            goals.add(
                f"{name} delivered/s scraped every second / plain >= {GOAL_RATIO} ({how})",
                ratio,
                None if ratio is None else ratio >= GOAL_RATIO,
            )
    return goals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__, quick="one round of e2e's tiny counts, a scrape every 0.25 s")
    parser.add_argument("--rounds", type=int, help="rounds of both variants (default 2; quick 1)")
    parser.add_argument(
        "--first", choices=VARIANTS, default="plain", help="the variant round 1 runs first"
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        help=f"seconds between scrapes (default {SCRAPE_INTERVAL:g})",
    )
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help="scenarios to run (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    args = parser.parse_args(argv)
    args.names = [n.strip() for n in args.only.split(",") if n.strip()]
    if not args.names or set(args.names) - set(SCENARIOS):
        parser.error(f"--only takes some of {', '.join(SCENARIOS)}")
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.scrape_interval is None:
        args.scrape_interval = QUICK_SCRAPE_INTERVAL if args.quick else SCRAPE_INTERVAL
    if args.rounds < 1 or args.scrape_interval <= 0:
        parser.error("--rounds must be >= 1 and --scrape-interval > 0")
    return args


def order(first: str, round_no: int) -> list[str]:
    """ABBA: odd rounds start with ``first``, even rounds with the other variant."""
    variants = [first, *(v for v in VARIANTS if v != first)]
    return variants if round_no % 2 else variants[::-1]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    params = dict(QUICK if args.quick else FULL)
    report: dict[str, Any] = {
        "benchmark": "scrape",
        "machine": machine_info(trio=trio.__version__, h11=h11.__version__),
        "parameters": {
            "quick": args.quick,
            "rounds": args.rounds,
            "first": args.first,
            "scrape_interval": args.scrape_interval,
            "scenarios": args.names,
            "seed": args.seed,
            "e2e": params,
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": [],
    }
    started = time.monotonic()
    print(
        f"scrape: {report['machine']['cpu_count']} CPUs, Python {report['machine']['python']}, "
        f"load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    log_dir = Path(tempfile.mkdtemp(prefix="topiary-scrape-"))
    failed = False
    try:
        for round_no in range(1, args.rounds + 1):
            for name in args.names:
                for variant in order(args.first, round_no):
                    print(f"  round {round_no}: {name} {variant} ...", flush=True)
                    result = run_one(name, variant, round_no, args, ctx, log_dir)
                    if "error" in result:
                        failed = True
                        print(f"  failed: {result['error']}", file=sys.stderr, flush=True)
                    report["runs"].append(result)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    report["comparison"] = compare(report["runs"])
    report["goals"] = check_goals(report["comparison"])
    report["notes"] = [
        "plain: no HTTP port; scraped: [http] listen and GET /metrics every "
        f"{args.scrape_interval:g} s over a keep-alive connection",
        "scrapes = in the throughput phase / in the whole run; scrape ms = p50/max; "
        "KB = the largest exposition; CPU = broker CPU utilisation in the throughput phase",
        "CPU ms/scrape = broker CPU (/proc) over back-to-back scrapes after the phases, "
        "subscribers connected; implied = 1 - that / the interval (a CPU-bound broker's loss)",
    ]
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = time.monotonic() - started
    print()
    for line in run_lines(report["runs"]):
        print(line)
    print()
    for line in ratio_lines(report["comparison"]):
        print(line)
    print_ending(report, lambda v: fmt(v, ".4f"))
    write_report(report, args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
