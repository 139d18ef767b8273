"""Filter matching throughput of ``routing.SubscriptionTable`` on a web-analytics workload.

    python bench/filter_throughput.py [--sizes 1000,10000,100000,1000000] [--quick]
                                      [--world scaled|fixed] [--json PATH] [--seed N]
                                      [--gc-off] [--in-process]

For each subscription-table size S (workload: ``bench/workload.py``):

0. world   the sites that topics and subscriptions talk about. With ``--world
           scaled`` (the default) S uses ``workload.scaled_sites(S)`` =
           max(20,000, S // 5) sites: 20,000 up to S = 100,000, 200,000 at
           S = 1,000,000. Tenants pick sites uniformly, so this keeps about the
           same number of filters watching each site, and so a comparable
           answer per match, as S grows; what changes with S is then the table,
           which is what the goals are about. ``--world fixed`` keeps 20,000
           sites for every S (the mean answer then grows from 1.65 at S = 1k to
           about 21.6 at S = 1M). In a scaled run that includes S = 1,000,000,
           that size runs a second time in the fixed 20,000-site world (build,
           bytes/sub, cold and warm only; row "1000000*"), so both are shown.
           The "sites" column and ``n_sites`` in the JSON give each row's world.
1. build   time to add all S entries to one ``SubscriptionTable()`` and the RSS
           delta around it (``/proc/self/statm``, after ``gc.collect()``; the
           workload is generated before the first reading), as bytes/subscription.
           The table has its cache on but empty while it is built, and a
           subscription change does not touch an empty cache, so this is the
           cost of a ``cache_size=0`` table; one table per S serves every step.
           The table builds its prefix index (pygtrie) at the first prefix
           question and keeps it current from then on, so the build does not
           include it: ``first_prefix_query_seconds`` is the time of that first
           question (``filters_under``, with an empty answer), index included.
2. cold    ``table.match_uncached(topic)`` (walks the trie, never touches the
           cache) over the Zipf topic stream: matches/s and mean answer size.
3. naive   (S <= 10,000) every entry's parsed filter ``matches_levels`` the topic,
           subscribers collected into a set; matches/s and trie/naive speed-up.
           Every topic the naive scan evaluates (the timed ones plus probe topics
           on sites tenants watch, so that agreement is not carried by the broad
           filters alone) is compared with ``match_uncached``.
4. warm    ``table.match(topic)`` over the warm stream (about 1,000 hot topics
           with Zipf weights); matches/s and the cache hit rate over the run.
5. churn   on the warmed table, add K fresh entries (other subscriber names, other
           seed), then remove the same K; ops/s each; the size must return to S.

The JSON also holds, for build / subscribe / unsubscribe, the slowest chunk of
``CHUNK`` operations, and a "stall:" line is printed when one chunk took more
than ten times the average (a full GC pass or a large resize, say).

Every timed loop is bounded by a count and by a time budget (the clock is read
every ``CHUNK`` operations). The cyclic GC stays enabled unless ``--gc-off``,
which disables it during the timed sections only.

With more than one row each row runs in a fresh child process, so RSS deltas
and timings do not inherit the previous row's heap; ``--in-process`` turns that
off. The exit status is 0 unless the trie and the naive scan disagreed (1).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import workload  # noqa: E402
from bench.harness.report import machine_info, write_report  # noqa: E402
from routing import SubscriptionTable, parse_filter  # noqa: E402
from routing.topics import split_topic  # noqa: E402

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000)
WORLDS = ("scaled", "fixed")
# In a scaled-world run that includes this size, it also runs in the fixed world.
COMPARISON_SIZE = 1_000_000
FOOTNOTE = f"* fixed {workload.N_SITES:,}-site world: mean answer grows with S"
CHUNK = 1024  # operations between clock reads in the timed loops
PREFIX_QUERY = "beacon/zz"  # a prefix question with an empty answer

FULL: dict[str, Any] = {
    "cold_max": 200_000,
    "cold_seconds": 3.0,
    "warm_max": 1_000_000,
    "warm_seconds": 3.0,
    "hot_topics": 1_000,
    "naive_max_size": 10_000,
    "naive_max": 300,
    "naive_seconds": 3.0,
    "probe_topics": 200,
    "churn_max": 20_000,
    "churn_seconds": 2.0,
}
QUICK: dict[str, Any] = {
    "cold_max": 5_000,
    "cold_seconds": 0.5,
    "warm_max": 20_000,
    "warm_seconds": 0.5,
    "hot_topics": 1_000,
    "naive_max_size": 10_000,
    "naive_max": 50,
    "naive_seconds": 0.5,
    "probe_topics": 50,
    "churn_max": 1_000,
    "churn_seconds": 0.5,
}

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, result key, format)
    ("S", "size", "d"),
    ("sites", "n_sites", "d"),
    ("build s", "build_seconds", ".2f"),
    ("bytes/sub", "bytes_per_subscription", ".0f"),
    ("cold match/s", "cold_matches_per_second", ",.0f"),
    ("mean answer", "cold_mean_answer", ".2f"),
    ("warm match/s", "warm_matches_per_second", ",.0f"),
    ("hit rate", "warm_hit_rate", ".3f"),
    ("naive match/s", "naive_matches_per_second", ",.0f"),
    ("trie/naive", "trie_over_naive", ",.0f"),
    ("agree", "agree", ""),
    ("sub/s", "subscribe_per_second", ",.0f"),
    ("unsub/s", "unsubscribe_per_second", ",.0f"),
)


# -- measuring helpers --------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def gc_mode(off: bool) -> Iterator[None]:
    """Disable the cyclic GC for a timed section when ``off``."""
    was_enabled = gc.isenabled()
    if off:
        gc.disable()
    try:
        yield
    finally:
        if off and was_enabled:
            gc.enable()


def timed_matches(
    match: Callable[[str], Any], topics: list[str], seconds: float
) -> tuple[int, int, float]:
    """Call ``match`` on ``topics`` in order until done or out of time.

    Returns (matches done, total answer size, elapsed seconds).
    """
    perf = time.perf_counter
    done = answers = 0
    start = perf()
    deadline = start + seconds
    for first in range(0, len(topics), CHUNK):
        chunk = topics[first : first + CHUNK]
        for topic in chunk:
            answers += len(match(topic))
        done += len(chunk)
        if perf() >= deadline:
            break
    return done, answers, perf() - start


def timed_ops(
    op: Callable[[str, str, str], Any], entries: list[tuple[str, str, str]], seconds: float
) -> tuple[int, float, float]:
    """Apply ``op`` to ``entries`` in order until done or out of time.

    Returns (ops done, elapsed seconds, slowest chunk of ``CHUNK`` ops in
    seconds); the last figure shows a stall that the average hides.
    """
    perf = time.perf_counter
    done = 0
    worst = 0.0
    start = last = perf()
    deadline = start + seconds
    for first in range(0, len(entries), CHUNK):
        chunk = entries[first : first + CHUNK]
        for text, subscriber, dialect in chunk:
            op(text, subscriber, dialect)
        done += len(chunk)
        now = perf()
        worst = max(worst, now - last)
        last = now
        if now >= deadline:
            break
    return done, last - start, worst


def naive_matcher(entries: list[tuple[str, str, str]]) -> Callable[[str], set[str]]:
    """Scan every entry's filter (parsed once, shared by equal texts) for each topic."""
    parsed: dict[tuple[str, str], Any] = {}
    scan = []
    for text, subscriber, dialect in entries:
        flt = parsed.get((text, dialect))
        if flt is None:
            flt = parsed[(text, dialect)] = parse_filter(text, dialect)
        scan.append((flt.matches_levels, subscriber))

    def match(topic: str) -> set[str]:
        levels = split_topic(topic)
        return {subscriber for matches, subscriber in scan if matches(levels)}

    return match


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


# -- one size -----------------------------------------------------------------


def world_sites(size: int, world: str) -> int:
    """The number of sites in the workload's world for table size ``size``."""
    if world not in WORLDS:
        raise ValueError(f"unknown world {world!r}; expected one of {WORLDS}")
    return workload.scaled_sites(size) if world == "scaled" else workload.N_SITES


def plan_rows(sizes: list[int], world: str) -> list[dict[str, Any]]:
    """The rows to measure, in order: one per size in ``world``, plus the
    fixed-world comparison row right after S = ``COMPARISON_SIZE`` when the
    world is scaled."""
    rows = []
    for size in sizes:
        rows.append({"size": size, "n_sites": world_sites(size, world), "world": world})
        if size == COMPARISON_SIZE and world == "scaled":
            rows.append(
                {"size": size, "n_sites": workload.N_SITES, "world": "fixed", "comparison": True}
            )
    return rows


def row_label(result: dict[str, Any]) -> str:
    """The S column: the size, with "*" for the fixed-world comparison row."""
    return f"{result['size']}{'*' if result.get('fixed_world_comparison') else ''}"


def run_size(
    size: int,
    seed: int,
    counts: dict[str, Any],
    gc_off: bool = False,
    *,
    n_sites: int = workload.N_SITES,
    comparison: bool = False,
) -> dict[str, Any]:
    """All measurements for one table size in an ``n_sites`` world; a flat dict of figures.

    A ``comparison`` row measures build, memory, cold and warm only (no naive
    scan, no churn).
    """
    # The whole workload first, so that no measurement includes generating it.
    entries = workload.subscriptions(size, seed, n_sites=n_sites)
    cold_topics = workload.topics(counts["cold_max"], seed, n_sites=n_sites)
    warm_stream = workload.warm_topics(
        counts["warm_max"], seed, hot=counts["hot_topics"], n_sites=n_sites
    )
    run_naive = size <= counts["naive_max_size"] and not comparison
    probes = (
        workload.topics_on_sites(entries, counts["probe_topics"], seed, n_sites=n_sites)
        if run_naive
        else []
    )
    fresh = (
        []
        if comparison
        else workload.subscriptions(
            counts["churn_max"], seed + 1, prefix="churn", broad=False, n_sites=n_sites
        )
    )
    out: dict[str, Any] = {
        "size": size,
        "n_sites": n_sites,
        "subscriptions_per_site": size / n_sites,
        "fixed_world_comparison": comparison,
    }

    # 1. build, and memory per subscription
    table = SubscriptionTable()
    gc.collect()
    before = rss_bytes()
    with gc_mode(gc_off):
        added, seconds, build_worst = timed_ops(table.add, entries, float("inf"))
    gc.collect()
    after = rss_bytes()
    assert added == size and len(table) == size, (added, len(table), size)
    # One prefix question after the build; the prefix names no region, so
    # the answer itself costs nothing.
    with gc_mode(gc_off):
        start = time.perf_counter()
        table.filters_under(PREFIX_QUERY)
        prefix_seconds = time.perf_counter() - start
    stats = table.statistics()
    out.update(
        build_seconds=seconds,
        build_per_second=_rate(size, seconds),
        build_slowest_chunk_seconds=build_worst,
        first_prefix_query_seconds=prefix_seconds,
        rss_delta_bytes=after - before,
        bytes_per_subscription=(after - before) / size,
        subscribers=stats.subscribers,
        distinct_filters=stats.filters,
        trie_nodes=stats.trie_nodes,
    )

    # 2. cold: walk the trie for every topic
    with gc_mode(gc_off):
        done, answers, seconds = timed_matches(
            table.match_uncached, cold_topics, counts["cold_seconds"]
        )
    cold_rate = _rate(done, seconds)
    out.update(
        cold_matches=done,
        cold_distinct_topics=len(set(cold_topics[:done])),
        cold_seconds=seconds,
        cold_matches_per_second=cold_rate,
        cold_mean_answer=answers / done if done else 0.0,
    )

    # 3. naive scan, side by side with the trie, and agreement
    if run_naive:
        naive = naive_matcher(entries)
        naive_topics = cold_topics[: counts["naive_max"]]
        with gc_mode(gc_off):
            done, _, seconds = timed_matches(naive, naive_topics, counts["naive_seconds"])
        broad = {subscriber for _, subscriber, _ in workload.BROAD_FILTERS}
        checked = disagree = nonempty = tenant_hits = 0
        examples = []
        for topic in naive_topics[:done] + probes:
            expected = naive(topic)
            got = table.match_uncached(topic)
            checked += 1
            nonempty += bool(expected)
            tenant_hits += not expected <= broad
            if got != expected:
                disagree += 1
                if len(examples) < 3:
                    examples.append(
                        {"topic": topic, "trie": sorted(got), "naive": sorted(expected)}
                    )
        naive_rate = _rate(done, seconds)
        out.update(
            naive_matches=done,
            naive_seconds=seconds,
            naive_matches_per_second=naive_rate,
            trie_over_naive=cold_rate / naive_rate if naive_rate else None,
            agree=disagree == 0,
            agree_checked=checked,
            agree_probe_topics=len(probes),
            agree_disagreements=disagree,
            agree_nonempty_answers=nonempty,
            agree_tenant_answers=tenant_hits,
            agree_examples=examples,
        )
        del naive
    else:
        out.update(naive_matches_per_second=None, trie_over_naive=None, agree=None)

    # 4. warm: the cached path over the hot-topic stream
    before_stats = table.statistics()
    with gc_mode(gc_off):
        done, answers, seconds = timed_matches(table.match, warm_stream, counts["warm_seconds"])
    after_stats = table.statistics()
    hits = after_stats.cache_hits - before_stats.cache_hits
    misses = after_stats.cache_misses - before_stats.cache_misses
    out.update(
        warm_matches=done,
        warm_seconds=seconds,
        warm_matches_per_second=_rate(done, seconds),
        warm_mean_answer=answers / done if done else 0.0,
        warm_hit_rate=hits / (hits + misses) if hits + misses else 0.0,
        warm_cache_entries=after_stats.cache_entries,
    )

    if comparison:
        out.update(subscribe_per_second=None, unsubscribe_per_second=None)
        return out

    # 5. churn on the warmed table: subscribe K fresh entries, then unsubscribe them
    cache_before = table.statistics()
    with gc_mode(gc_off):
        added, add_seconds, add_worst = timed_ops(table.add, fresh, counts["churn_seconds"])
        assert len(table) == size + added, (len(table), size, added)
        removed, remove_seconds, remove_worst = timed_ops(table.remove, fresh[:added], float("inf"))
    cache_after = table.statistics()
    assert removed == added, (removed, added)
    assert len(table) == size, f"table size {len(table)} after churn, expected {size}"
    out.update(
        churn_ops=added,
        subscribe_seconds=add_seconds,
        subscribe_per_second=_rate(added, add_seconds),
        unsubscribe_seconds=remove_seconds,
        unsubscribe_per_second=_rate(removed, remove_seconds),
        subscribe_slowest_chunk_seconds=add_worst,
        unsubscribe_slowest_chunk_seconds=remove_worst,
        chunk_ops=CHUNK,
        churn_cache_invalidated=cache_after.cache_invalidated - cache_before.cache_invalidated,
        churn_cache_clears=cache_after.cache_clears - cache_before.cache_clears,
        churn_cache_entries_after=cache_after.cache_entries,
    )
    return out


def run_row(
    row: dict[str, Any], args: argparse.Namespace, counts: dict[str, Any]
) -> dict[str, Any]:
    """Measure one planned row in this process."""
    return run_size(
        row["size"],
        args.seed,
        counts,
        args.gc_off,
        n_sites=row["n_sites"],
        comparison=row.get("comparison", False),
    )


def run_isolated(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Run one planned row in a fresh interpreter and return its figures."""
    size = row["size"]
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(size)]
    command += ["--child-sites", str(row["n_sites"])]
    command += ["--child-comparison"] if row.get("comparison") else []
    command += ["--seed", str(args.seed)]
    command += ["--quick"] if args.quick else []
    command += ["--gc-off"] if args.gc_off else []
    proc = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(
            f"size {size} ({row['n_sites']:,} sites): child process failed"
            f" with status {proc.returncode}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- report -------------------------------------------------------------------


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, fmt)


def format_table(results: list[dict[str, Any]]) -> str:
    """The results table; a footnote line follows when it has a comparison row."""
    rows = [[header for header, _, _ in COLUMNS]]
    rows += [
        [row_label(r) if key == "size" else _cell(r.get(key), fmt) for _, key, fmt in COLUMNS]
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(r.get("fixed_world_comparison") for r in results):
        lines.append(FOOTNOTE)
    return "\n".join(lines)


def find_stalls(results: list[dict[str, Any]]) -> list[str]:
    """Chunks of ``CHUNK`` ops that took far longer than the average chunk."""
    lines = []
    for r in results:
        first_query = r.get("first_prefix_query_seconds")
        if first_query is not None and first_query > 0.05:
            lines.append(
                f"S={row_label(r)}: the first prefix question after the build took "
                f"{first_query:.3f} s"
            )
        for what, ops_key, seconds_key in (
            ("build", "size", "build_seconds"),
            ("subscribe", "churn_ops", "subscribe_seconds"),
            ("unsubscribe", "churn_ops", "unsubscribe_seconds"),
        ):
            worst = r.get(f"{what}_slowest_chunk_seconds")
            ops, seconds = r.get(ops_key), r.get(seconds_key)
            if not worst or not ops or not seconds:
                continue
            mean = seconds / ops * min(CHUNK, ops)
            if worst > 0.05 and worst > 10 * mean:
                lines.append(
                    f"S={row_label(r)}: slowest {CHUNK} {what} ops took {worst:.3f} s "
                    f"(mean {mean:.3f} s, {worst / seconds:.0%} of the {seconds:.2f} s total)"
                )
    return lines


def check_goals(results: list[dict[str, Any]], world: str = "scaled") -> list[dict[str, Any]]:
    """The performance goals, each PASS / FAIL / not measured (informational).

    Judged on the rows of the run's ``world``; the fixed-world comparison row
    is left out (see :func:`fixed_world_ratio`).
    """
    by_size = {r["size"]: r for r in results if not r.get("fixed_world_comparison")}

    def value(size: int, key: str) -> float | None:
        r = by_size.get(size)
        return None if r is None else r.get(key)

    def goal(name: str, measured: float | None, target: float, at_least: bool = True):
        if measured is None:
            status = "not measured"
        else:
            status = "PASS" if (measured >= target if at_least else measured <= target) else "FAIL"
        return {"goal": name, "measured": measured, "target": target, "status": status}

    cold_1m = value(1_000_000, "cold_matches_per_second")
    cold_1k = value(1_000, "cold_matches_per_second")
    ratio = cold_1m / cold_1k if cold_1m is not None and cold_1k else None
    sites_1m = value(1_000_000, "n_sites") or world_sites(1_000_000, world)
    if world == "scaled":
        where = f"scaled world, {sites_1m:,} sites at S=1M"
    else:
        where = f"fixed {workload.N_SITES:,}-site world"
    return [
        goal("cold match/s at S=100k >= 100,000", value(100_000, "cold_matches_per_second"), 1e5),
        goal("warm match/s at S=100k >= 1,000,000", value(100_000, "warm_matches_per_second"), 1e6),
        goal(f"cold at S=1M >= 0.5 x cold at S=1k ({where})", ratio, 0.5),
        goal("trie >= 100x naive at S=10k", value(10_000, "trie_over_naive"), 100),
        goal("sub/s at S=100k >= 50,000", value(100_000, "subscribe_per_second"), 5e4),
        goal("unsub/s at S=100k >= 50,000", value(100_000, "unsubscribe_per_second"), 5e4),
        goal(
            "bytes/sub at S=1M <= 1,024",
            value(1_000_000, "bytes_per_subscription"),
            1024,
            at_least=False,
        ),
    ]


def fixed_world_ratio(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Cold at S=1M in the fixed world over cold at S=1k, from the comparison row.

    Informational: in the fixed world the answer per match grows with S, so
    this ratio mixes the cost of S with the cost of larger answers.
    """
    fixed = next((r for r in results if r.get("fixed_world_comparison")), None)
    small = next(
        (r for r in results if r["size"] == 1_000 and not r.get("fixed_world_comparison")), None
    )
    if fixed is None or small is None or small["n_sites"] != fixed["n_sites"]:
        return None
    cold_fixed = fixed.get("cold_matches_per_second")
    cold_small = small.get("cold_matches_per_second")
    return {
        "size": fixed["size"],
        "n_sites": fixed["n_sites"],
        "ratio": cold_fixed / cold_small if cold_fixed is not None and cold_small else None,
        "mean_answer": fixed.get("cold_mean_answer"),
        "mean_answer_at_1k": small.get("cold_mean_answer"),
    }


# -- command line -------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="comma-separated table sizes (default: %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="S=1,000 only, tiny counts")
    parser.add_argument(
        "--world",
        choices=WORLDS,
        default="scaled",
        help="sites per size: scaled = max(20,000, S // 5), fixed = 20,000 (default: %(default)s)",
    )
    parser.add_argument("--json", metavar="PATH", help="write all figures as JSON to PATH")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument("--gc-off", action="store_true", help="disable GC in timed sections")
    parser.add_argument("--in-process", action="store_true", help="run all sizes in this process")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-sites", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-comparison", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.size_list = [1_000] if args.quick else [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not args.size_list or min(args.size_list) < 1:
        parser.error("--sizes needs at least one size, each >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = QUICK if args.quick else FULL
    if args.child is not None:
        n_sites = args.child_sites or world_sites(args.child, args.world)
        result = run_size(
            args.child,
            args.seed,
            counts,
            args.gc_off,
            n_sites=n_sites,
            comparison=args.child_comparison,
        )
        print(json.dumps(result))
        return 0

    plan = plan_rows(args.size_list, args.world)
    isolate = len(plan) > 1 and not args.in_process
    results = []
    for row in plan:
        note = ", fixed-world comparison" if row.get("comparison") else ""
        print(
            f"S={row['size']:,} ({row['n_sites']:,} sites{note}): measuring ...",
            file=sys.stderr,
            flush=True,
        )
        result = run_isolated(row, args) if isolate else run_row(row, args, counts)
        result["world"] = row["world"]
        results.append(result)

    print(format_table(results))
    goals = check_goals(results, args.world)
    comparison = fixed_world_ratio(results)
    stalls = find_stalls(results)
    if stalls:
        print()
        for line in stalls:
            print(f"stall: {line}")
    print()
    print("check against goals (informational):")
    for g in goals:
        measured = "" if g["measured"] is None else f" (measured {g['measured']:,.2f})"
        print(f"  {g['status']:>12}  {g['goal']}{measured}")
    if comparison is not None and comparison["ratio"] is not None:
        print(
            f"  {'info':>12}  cold at S=1M / cold at S=1k in the fixed"
            f" {comparison['n_sites']:,}-site world = {comparison['ratio']:.2f}"
            f" (mean answer {comparison['mean_answer']:.2f} vs"
            f" {comparison['mean_answer_at_1k']:.2f})"
        )
    agree = all(r["agree"] is not False for r in results)
    if not agree:
        for r in results:
            for example in r.get("agree_examples", []):
                print(f"DISAGREE at S={row_label(r)}: {example}", file=sys.stderr)

    if args.json:
        report = {
            "benchmark": "filter_throughput",
            "machine": machine_info(),
            "parameters": {
                "seed": args.seed,
                "sizes": args.size_list,
                "quick": args.quick,
                "gc_off_in_timed_sections": args.gc_off,
                "isolated_processes": isolate,
                "world": args.world,
                "fixed_n_sites": workload.N_SITES,
                "scaled_n_sites": "max(N_SITES, S // SUBSCRIPTIONS_PER_SITE)",
                "subscriptions_per_site": workload.SUBSCRIPTIONS_PER_SITE,
                "n_sites": {str(r["size"]): r["n_sites"] for r in plan if not r.get("comparison")},
                "zipf_s": workload.ZIPF_S,
                "broad_filters": len(workload.BROAD_FILTERS),
                "counts": counts,
            },
            "results": results,
            "goals": goals,
            "fixed_world_comparison": comparison,
            "agree": agree,
        }
        write_report(report, args.json, sort_keys=False)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
