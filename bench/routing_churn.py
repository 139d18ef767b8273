"""Subscribe/unsubscribe throughput of ``routing.SubscriptionTable`` with a cold and a warm cache.

    python bench/routing_churn.py [--sizes 1000,100000] [--ops N] [--cached-topics N]
                                  [--seconds S] [--rounds N] [--seed N] [--quick] [--json PATH]

A subscribe or unsubscribe changes the cached match answers its filter
reaches (``routing/cache.py``), so its cost may depend on how many topics the
cache holds. This measures it, in routing/ alone, for each table size S
(workload: ``bench/workload.py``, in the world of ``workload.scaled_sites(S)``
sites, 20,000 up to S = 100,000):

0. setup   the S workload subscriptions; ``--cached-topics`` (16,384) distinct
           topics, in order of first appearance in the Zipf stream
           ``workload.topics``; N (``--ops``, 20,000) fresh entries,
           ``workload.subscriptions(N, seed + 1, prefix="churn", broad=False)``,
           none of them in the table. Each round (``--rounds``, 3; 1 with
           ``--quick``) builds its own ``SubscriptionTable(cache_size=2 x cached
           topics)`` and runs steps 1-3 on it; the table printed holds the median
           over the rounds, the JSON every round as well.
1. cold    the cache is empty (nothing matched yet): subscribe the N fresh
           entries, then unsubscribe them; ops/s each.
2. warm    match every cached topic (the cache now holds all of them), then
           subscribe the N entries and unsubscribe them again. The cache is kept
           warm throughout: after every chunk of ``CHUNK`` operations, if it holds
           fewer topics than it was warmed with, every cached topic is matched
           again, untimed (with the cache of main, which drops what a change
           reaches, this runs after every chunk; with one that patches answers in
           place, never). Whatever the cache does lazily (indexing the topics put
           since the last change) is timed with the operation that does it; the
           first warm subscribe is also reported on its own.
3. broad   with the cache warm, subscribe each of the ten broad filters
           (``workload.BROAD_FILTERS``: ``beacon/eu/>``, ``beacon/#``, ...) for a
           fresh subscriber, then unsubscribe them; re-warmed as in step 2 after
           every operation; the mean time per operation and the cached answers it
           changed. These reach thousands of cached topics each.

Rates are operations per second of this process's CPU time
(``time.process_time``): on a shared machine, time during which other
programs held the core is not counted, which keeps two runs comparable. The
same loops' wall-clock rates are in the JSON (``*_per_wall_second``). Every
timed loop is bounded by the count N and by ``--seconds`` (10 s, 1 s with
``--quick``) of CPU time; what a subscribe loop did not reach is neither
subscribed nor unsubscribed, what an unsubscribe loop did not reach is removed
untimed, so the table ends at size S. The cyclic GC stays at CPython's
defaults, as in ``bench/filter_throughput.py``, but every timed loop starts
right after a ``gc.collect()``; the full collections that still land in a
timed loop are counted (``*_full_gcs``: one costs ~100 ms with a 100,000-entry
table, so a short loop that meets one says more about the GC than the cache).

Correctness, checked in every round (the exit status is 1 if a check fails):

- fresh:    after the warm subscribes, every cached topic is matched with the
            cache (``match``) and without it (``match_uncached``); the answers
            must be equal (``stale_after_subscribe`` counts those that are not),
            and some must name a fresh subscriber (``answers_with_fresh``), so the
            check is not carried by answers the new filters leave alone; the same
            after the broad subscribes (``stale_after_broad``);
- restored: after the warm unsubscribes and after the broad ones, every cached
            topic's answer equals its answer before (``changed_after_unsubscribe``,
            ``changed_after_broad`` count the others), and the table is back to S
            entries.

The goals (informational): >= 100,000 subscribes/s and >= 100,000
unsubscribes/s with the warm cache at S = 1,000 and S = 100,000.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import workload  # noqa: E402
from bench.harness.report import Goals, arg_parser, machine_info, write_report  # noqa: E402
from routing import SubscriptionTable  # noqa: E402

DEFAULT_SIZES = (1_000, 100_000)
CHUNK = 1024  # operations between clock reads and re-warms
GOAL_OPS = 100_000
FULL: dict[str, Any] = {"ops": 20_000, "cached_topics": 16_384, "seconds": 10.0, "rounds": 3}
QUICK: dict[str, Any] = {"ops": 2_000, "cached_topics": 2_048, "seconds": 1.0, "rounds": 1}
FRESH_PREFIX = "churn"
BROAD_SUBSCRIBER = "churn-broad"
# Per size: the median over the rounds of these, and the sum of the correctness counts.
MEDIANS = (
    "cold_subscribe_per_second",
    "cold_unsubscribe_per_second",
    "warm_subscribe_per_second",
    "warm_unsubscribe_per_second",
    "cold_subscribe_per_wall_second",
    "cold_unsubscribe_per_wall_second",
    "warm_subscribe_per_wall_second",
    "warm_unsubscribe_per_wall_second",
    "warm_first_subscribe_ms",
    "warm_invalidated",
    "broad_subscribe_ms",
    "broad_unsubscribe_ms",
    "broad_invalidated",
)
SUMS = (
    "cold_subscribe_full_gcs",
    "cold_unsubscribe_full_gcs",
    "warm_subscribe_full_gcs",
    "warm_unsubscribe_full_gcs",
    "warm_clears",
    "rewarm_passes",
    "rewarm_misses",
    "stale_after_subscribe",
    "changed_after_unsubscribe",
    "answers_with_fresh",
    "stale_after_broad",
    "changed_after_broad",
    "check_hits",
)

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, result key, format)
    ("S", "size", "d"),
    ("cached", "cached_topics", ",d"),
    ("ops", "ops", ",d"),
    ("sub/s cold", "cold_subscribe_per_second", ",.0f"),
    ("sub/s warm", "warm_subscribe_per_second", ",.0f"),
    ("unsub/s cold", "cold_unsubscribe_per_second", ",.0f"),
    ("unsub/s warm", "warm_unsubscribe_per_second", ",.0f"),
    ("1st warm sub ms", "warm_first_subscribe_ms", ".1f"),
    ("changed", "warm_invalidated", ",.0f"),
    ("re-warms", "rewarm_passes", ",d"),
    ("broad sub ms", "broad_subscribe_ms", ".2f"),
    ("broad unsub ms", "broad_unsubscribe_ms", ".2f"),
    ("correct", "correct", ""),
)

Entry = tuple[str, str, str]


def cached_topic_list(count: int, seed: int, n_sites: int) -> list[str]:
    """``count`` distinct topics, in order of first appearance in ``workload.topics``."""
    draws = 4 * count
    while True:
        found = list(dict.fromkeys(workload.topics(draws, seed, n_sites=n_sites)))
        if len(found) >= count:
            return found[:count]
        draws *= 2


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


class Timed(NamedTuple):
    """What one timed loop did: operations, CPU and wall seconds, the first operation's CPU
    seconds, and the full (generation 2) collections of the cyclic GC inside timed chunks."""

    done: int
    cpu: float
    wall: float
    first: float
    full_gcs: int


def timed_churn(
    op: Callable[[str, str, str], Any],
    entries: list[Entry],
    seconds: float,
    chunk_size: int,
    rewarm: Callable[[], None] | None,
) -> Timed:
    """Apply ``op`` to ``entries`` in chunks of ``chunk_size`` until done or out of time.

    ``rewarm`` runs untimed after every chunk. The first operation is timed on
    its own as well. A ``gc.collect()`` before the loop, untimed, starts every
    loop with the same collector debt (building a 100,000-entry table leaves a
    full collection owed, which would otherwise land in whichever loop comes
    first); the full collections that still land in a timed chunk are counted.
    """
    gc.collect()
    cpu, wall = time.process_time, time.perf_counter
    done = full_gcs = 0
    spent = spent_wall = first = 0.0
    for start in range(0, len(entries), chunk_size):
        chunk = entries[start : start + chunk_size]
        collections = gc.get_stats()[2]["collections"]
        began, began_wall = cpu(), wall()
        if start == 0:
            op(*chunk[0])
            first = cpu() - began
            chunk = chunk[1:]
        for text, subscriber, dialect in chunk:
            op(text, subscriber, dialect)
        spent += cpu() - began
        spent_wall += wall() - began_wall
        full_gcs += gc.get_stats()[2]["collections"] - collections
        done = min(start + chunk_size, len(entries))
        if spent >= seconds:
            break
        if rewarm is not None:
            rewarm()
    return Timed(done, spent, spent_wall, first, full_gcs)


def report(phase: str, sub: Timed, unsub: Timed) -> dict[str, Any]:
    """The figures of one phase's subscribe and unsubscribe loops, keys prefixed ``phase``."""
    out: dict[str, Any] = {}
    for what, timed in (("subscribe", sub), ("unsubscribe", unsub)):
        out[f"{phase}_{what}s"] = timed.done
        out[f"{phase}_{what}_seconds"] = timed.cpu
        out[f"{phase}_{what}_per_second"] = _rate(timed.done, timed.cpu)
        out[f"{phase}_{what}_per_wall_second"] = _rate(timed.done, timed.wall)
        out[f"{phase}_{what}_full_gcs"] = timed.full_gcs
    return out


def run_round(
    size: int,
    entries: list[Entry],
    cached: list[str],
    fresh: list[Entry],
    seconds_budget: float,
) -> dict[str, Any]:
    """One round on a freshly built table: cold churn, warm churn, broad filters."""
    table = SubscriptionTable(cache_size=2 * len(cached))
    for text, subscriber, dialect in entries:
        table.add(text, subscriber, dialect)
    assert len(table) == size
    match = table.match
    out: dict[str, Any] = {}

    # 1. cold: nothing cached, so nothing to change in the cache
    assert table.statistics().cache_entries == 0
    sub = timed_churn(table.add, fresh, seconds_budget, CHUNK, None)
    unsub = timed_churn(table.remove, fresh[: sub.done], seconds_budget, CHUNK, None)
    for text, subscriber, dialect in fresh[unsub.done : sub.done]:
        table.remove(text, subscriber, dialect)
    assert len(table) == size and table.statistics().cache_entries == 0
    out.update(report("cold", sub, unsub))

    # 2. warm: every cached topic matched, and matched again whenever some went missing
    before = {topic: match(topic) for topic in cached}
    warmed = table.statistics()
    assert warmed.cache_entries == len(cached) and warmed.cache_clears == 0
    rewarms = {"passes": 0, "misses": 0}

    def rewarm() -> None:
        stats = table.statistics()
        if stats.cache_entries < len(cached):
            for topic in cached:
                match(topic)
            rewarms["passes"] += 1
            rewarms["misses"] += table.statistics().cache_misses - stats.cache_misses

    sub = timed_churn(table.add, fresh, seconds_budget, CHUNK, rewarm)
    rewarm()
    # Fresh answers: the cached answer must equal an uncached walk; some must have changed.
    checking = table.statistics()
    stale = with_fresh = 0
    for topic in cached:
        got = match(topic)
        stale += got != table.match_uncached(topic)
        with_fresh += any(str(s).startswith(FRESH_PREFIX) for s in got)
    checked = table.statistics()
    unsub = timed_churn(table.remove, fresh[: sub.done], seconds_budget, CHUNK, rewarm)
    for text, subscriber, dialect in fresh[unsub.done : sub.done]:
        table.remove(text, subscriber, dialect)
    rewarm()
    after = table.statistics()
    changed = sum(match(topic) != before[topic] for topic in cached)
    assert len(table) == size
    out.update(report("warm", sub, unsub))
    out.update(
        warm_first_subscribe_ms=sub.first * 1e3,
        warm_invalidated=after.cache_invalidated - warmed.cache_invalidated,
        warm_clears=after.cache_clears - warmed.cache_clears,
        warm_evictions=after.cache_evictions - warmed.cache_evictions,
        rewarm_passes=rewarms["passes"],
        rewarm_misses=rewarms["misses"],
        check_hits=checked.cache_hits - checking.cache_hits,
        stale_after_subscribe=stale,
        answers_with_fresh=with_fresh,
        changed_after_unsubscribe=changed,
    )

    # 3. broad filters, one operation at a time, re-warmed after each
    broad = [(text, BROAD_SUBSCRIBER, dialect) for text, _, dialect in workload.BROAD_FILTERS]
    start = table.statistics()
    broad_seconds = timed_churn(table.add, broad, float("inf"), 1, rewarm).cpu
    rewarm()
    stale_broad = sum(match(topic) != table.match_uncached(topic) for topic in cached)
    unbroad_seconds = timed_churn(table.remove, broad, float("inf"), 1, rewarm).cpu
    rewarm()
    end = table.statistics()
    assert len(table) == size
    out.update(
        broad_subscribe_ms=broad_seconds / len(broad) * 1e3,
        broad_unsubscribe_ms=unbroad_seconds / len(broad) * 1e3,
        broad_invalidated=end.cache_invalidated - start.cache_invalidated,
        broad_clears=end.cache_clears - start.cache_clears,
        stale_after_broad=stale_broad,
        changed_after_broad=sum(match(topic) != before[topic] for topic in cached),
    )
    out["correct"] = (
        stale == 0
        and changed == 0
        and with_fresh > 0
        and stale_broad == 0
        and out["changed_after_broad"] == 0
    )
    return out


def run_size(size: int, seed: int, counts: dict[str, Any]) -> dict[str, Any]:
    """``counts["rounds"]`` rounds at table size ``size``: their median rates, every round's
    figures under "rounds", and the correctness counts summed over the rounds."""
    n_sites = workload.scaled_sites(size)
    entries = workload.subscriptions(size, seed, n_sites=n_sites)
    cached = cached_topic_list(counts["cached_topics"], seed, n_sites)
    fresh = workload.subscriptions(
        counts["ops"], seed + 1, prefix=FRESH_PREFIX, broad=False, n_sites=n_sites
    )
    rounds = []
    for _ in range(counts["rounds"]):
        rounds.append(run_round(size, entries, cached, fresh, counts["seconds"]))
        gc.collect()  # the round's table goes before the next is built
    out: dict[str, Any] = {
        "size": size,
        "n_sites": n_sites,
        "cached_topics": len(cached),
        "cache_size": 2 * len(cached),
    }
    for key in MEDIANS:
        out[key] = statistics.median(r[key] for r in rounds)
    for key in SUMS:
        out[key] = sum(r[key] for r in rounds)
    out["ops"] = min(
        r[f"{phase}_{what}s"]
        for r in rounds
        for phase in ("cold", "warm")
        for what in ("subscribe", "unsubscribe")
    )
    out["correct"] = all(r["correct"] for r in rounds)
    out["rounds"] = rounds
    return out


# -- report -------------------------------------------------------------------


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, fmt)


def format_table(results: list[dict[str, Any]]) -> str:
    rows = [[header for header, _, _ in COLUMNS]]
    rows += [[_cell(r.get(key), fmt) for _, key, fmt in COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def check_goals(results: list[dict[str, Any]]) -> Goals:
    """Warm-cache subscribe and unsubscribe rates at S = 1,000 and 100,000 (informational)."""
    by_size = {r["size"]: r for r in results}
    goals = Goals()
    for size in DEFAULT_SIZES:
        for what, key in (("sub/s", "subscribe"), ("unsub/s", "unsubscribe")):
            row = by_size.get(size)
            value = None if row is None else row[f"warm_{key}_per_second"]
            goals.add(
                f"warm {what} at S={size:,} >= {GOAL_OPS:,}",
                value,
                None if value is None else value >= GOAL_OPS,
            )
    return goals


# -- command line -------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__, "S=1,000 only, 2,000 ops, 2,048 cached topics, one round")
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="comma-separated table sizes (default: %(default)s; --quick: 1000)",
    )
    parser.add_argument("--ops", type=int, help="subscribes (then unsubscribes) per loop")
    parser.add_argument("--cached-topics", type=int, help="distinct topics in the warm cache")
    parser.add_argument("--seconds", type=float, help="CPU-time budget per timed loop")
    parser.add_argument("--rounds", type=int, help="rounds per size, medians reported")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    args = parser.parse_args(argv)
    counts = dict(QUICK if args.quick else FULL)
    for key in ("ops", "cached_topics", "seconds", "rounds"):
        if getattr(args, key) is not None:
            counts[key] = getattr(args, key)
    args.counts = counts
    try:
        args.size_list = [1_000] if args.quick else [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not args.size_list or min(args.size_list) < 1:
        parser.error("--sizes needs at least one size, each >= 1")
    if min(counts["ops"], counts["cached_topics"], counts["rounds"]) < 1 or counts["seconds"] <= 0:
        parser.error("--ops, --cached-topics and --rounds must be >= 1, --seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    for size in args.size_list:
        print(f"S={size:,}: measuring ...", file=sys.stderr, flush=True)
        results.append(run_size(size, args.seed, args.counts))
    print(format_table(results))
    goals = check_goals(results)
    print()
    print("check against goals (informational):")
    for g in goals:
        value = "" if g["value"] is None else f" (measured {g['value']:,.0f})"
        print(f"  {g['status']:>12}  {g['goal']}{value}")
    correct = all(r["correct"] for r in results)
    for r in results:
        if not r["correct"]:
            print(
                f"CHECK FAILED at S={r['size']:,}: stale {r['stale_after_subscribe']}"
                f" (broad {r['stale_after_broad']}), changed {r['changed_after_unsubscribe']}"
                f" (broad {r['changed_after_broad']}), {r['answers_with_fresh']} answers"
                " with a fresh subscriber",
                file=sys.stderr,
            )
    if args.json:
        report = {
            "benchmark": "routing_churn",
            "machine": machine_info(),
            "parameters": {
                "seed": args.seed,
                "sizes": args.size_list,
                "quick": args.quick,
                "counts": args.counts,
                "chunk": CHUNK,
                "cache_size": "2 x cached_topics",
                "clock": "process_time (CPU); *_per_wall_second: perf_counter",
                "rewarm": "after every chunk, when the cache lost topics",
                "broad_filters": [text for text, _, _ in workload.BROAD_FILTERS],
            },
            "results": results,
            "goals": goals,
            "correct": correct,
        }
        write_report(report, args.json, sort_keys=False)
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
