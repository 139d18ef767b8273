"""Topic ACL cost in the core: fan-out with 1,000 rules and 1,000 clients against no ACLs.

    python bench/acl_core.py [--clients N] [--rules N] [--publishes N] [--rounds N] [--quick]
                             [--json PATH]

(bench/acl.py measures the same question end to end: brokers in their own processes,
clients over sockets, the workload's topics and filters.)

What is measured is what ACLs add to a publish: the publisher's ``may_publish`` check (as
the front ends make it) and the router's fan-out (``Broker.publish``) to N transient
sessions that each hold one filter matching the topic, their queues drained by a trivial
encoder after every 50 publishes (``Session.take_batch``). No sockets: the ACL work is all
in this path, and sockets and encoding would only add the same cost to both sides. Three
cases run in one process, alternating round by round so that a busy machine slows them
alike: ``none`` (no policy), ``acl`` (a policy of ``--rules`` rules: one ``*`` rule granting
``fan/#``, one ``dev/%c/#`` rule, the rest ``user:NAME`` rules for other users, so every
client is compiled from the ones that name it) and ``acl+deny`` (the same plus a ``*``
deny-subscribe rule on ``fan/secret/#``: every delivery takes the checked path). The goal
(issue 19): ``acl`` >= 0.9x ``none``. deliveries/s is the median over the rounds. The
garbage collector is set as ``topiary serve`` sets it (``tune_gc``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness.report import arg_parser, machine_info, write_report  # noqa: E402
from broker.commands import tune_gc  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.core import Broker, Message  # noqa: E402
from broker.security import ANONYMOUS  # noqa: E402
from routing import parse_filter  # noqa: E402
from routing.acl import PUBLISH, SUBSCRIBE, Policy, Rule  # noqa: E402

CASES = ("none", "acl", "acl+deny")
FULL = {"clients": 1000, "rules": 1000, "publishes": 2000, "rounds": 5}
QUICK = {"clients": 50, "rules": 50, "publishes": 100, "rounds": 2}
TOPICS = [f"fan/t{i}" for i in range(20)]
DRAIN_EVERY = 50


def policy(rules: int, deny: bool) -> Policy:
    both = frozenset({PUBLISH, SUBSCRIBE})
    made = [Rule("*", "fan/#", "mqtt", allow=both), Rule("*", "dev/%c/#", "mqtt", allow=both)]
    if deny:
        made.append(Rule("*", "fan/secret/#", "mqtt", deny=frozenset({SUBSCRIBE})))
    made += [Rule(f"user:u{i}", f"users/u{i}/>", allow=both) for i in range(rules - len(made))]
    return Policy(made)


def _encode(parts: list, message: Message, sub_id: int, seq: int) -> int:
    return 0


def build(case: str, counts: dict[str, int]) -> tuple[Broker, list, Any]:
    broker = Broker(BrokerConfig(outbound_messages=1_000_000, outbound_bytes=1 << 34))
    if case != "none":
        broker.set_policy(policy(counts["rules"], deny=case == "acl+deny"))
    flt = parse_filter("fan/#", "mqtt")
    sessions = []
    for i in range(counts["clients"]):
        session = broker.open_session(f"c{i}")
        broker.authorize(session, ANONYMOUS, f"c{i}")
        assert session.acl is None or session.acl.may_subscribe(flt)
        broker.subscribe(session, flt)
        sessions.append(session)
    publisher = broker.open_session("publisher")
    broker.authorize(publisher, ANONYMOUS, "publisher")
    return broker, sessions, publisher.acl


def run_once(case: str, counts: dict[str, int]) -> float:
    """Deliveries per second of one round of ``case``."""
    broker, sessions, acl = build(case, counts)
    payload = b"x" * 100
    publishes = counts["publishes"]
    publish = broker.publish
    started = time.perf_counter()
    for i in range(publishes):
        topic = TOPICS[i % len(TOPICS)]
        if acl is not None and not acl.may_publish(topic):  # as the front ends check it
            raise AssertionError(f"{topic} refused")
        publish(topic, payload)
        if i % DRAIN_EVERY == DRAIN_EVERY - 1:
            for session in sessions:
                session.take_batch(_encode, max_bytes=1 << 30)
    elapsed = time.perf_counter() - started
    delivered = broker.counters.messages_out
    assert delivered == publishes * len(sessions), (delivered, publishes * len(sessions))
    return delivered / elapsed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__, "50 clients, 50 rules, 100 publishes, 2 rounds")
    for key in FULL:
        parser.add_argument(f"--{key}", type=int, help=f"default {FULL[key]:,}")
    args = parser.parse_args(argv)
    counts = dict(QUICK if args.quick else FULL)
    for key in FULL:
        if getattr(args, key) is not None:
            counts[key] = getattr(args, key)
    if min(counts.values()) < 1 or counts["rules"] < 3:
        parser.error("every count must be >= 1, --rules >= 3")
    args.counts = counts
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = args.counts
    tune_gc()  # the garbage collector as `topiary serve` sets it
    rates: dict[str, list[float]] = {case: [] for case in CASES}

    async def rounds() -> None:  # (the router reads trio's clock: it runs in a trio run)
        for _round in range(counts["rounds"]):
            for case in CASES:
                rates[case].append(run_once(case, counts))

    trio.run(rounds)
    base = statistics.median(rates["none"])
    results = [
        {
            "case": case,
            "deliveries_per_s": round(statistics.median(rates[case])),
            "ratio": round(statistics.median(rates[case]) / base, 3),
            "rounds": [round(r) for r in rates[case]],
        }
        for case in CASES
    ]
    print(f"{'case':<10} {'deliveries/s':>14} {'vs none':>8}")
    for row in results:
        print(f"{row['case']:<10} {row['deliveries_per_s']:>14,} {row['ratio']:>8.3f}")
    if args.json:
        report = {
            "benchmark": "acl_core",
            "machine": machine_info(),
            "parameters": {"quick": args.quick, "counts": counts, "topics": len(TOPICS)},
            "results": results,
        }
        write_report(report, args.json, sort_keys=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
