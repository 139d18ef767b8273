"""Where a broker's memory goes: an in-process census of what idle connections and filters hold.

    python bench/memory_breakdown.py [--connections N] [--filters F] [--spread C]
                                     [--top K] [--json PATH] [--quick]

bench/memory.py measures RSS from outside; this says what the bytes are. The broker runs
in this process (``broker.server.run_broker`` on a free 127.0.0.1 port, structlog set up
as ``topiary serve`` does, GC tuned likewise) and a worker process (spawn context,
``bench.memory.holder_main``) opens the connections and subscribes, as bench/memory.py's
scenarios do. Between a "before" and an "after" snapshot, taken with the broker's loop
blocked (so nothing moves), three views of the growth:

1. census: every object the cyclic GC tracks that is new since "before" (by id, the
   baseline objects held alive meanwhile), plus the untracked objects (strings, ints,
   bytes) they reference that are new too, sized with ``sys.getsizeof`` (GC header
   included). Each is labelled by what it is and who holds it: a coroutine by its
   function, a trio Task by its name, an instance ``__dict__`` by its class, and a
   container (dict, set, deque, tuple, Event, CancelScope, str, ...) by the first new
   object found referring to it and the attribute it sits in (``Session._outbox``).
   Containers that existed before and grew (the broker's session dict, the table's
   dicts) are not new objects: the "grown" lines give their ``getsizeof`` growth.
2. tasks: per trio task name, the Task, its Context and the chain of coroutines it is
   suspended in (``cr_await``), in bytes.
3. tracemalloc (with ``--tracemalloc``, off by default as it slows everything): the traced
   growth, the check that the census found most of it; RSS is read too but tracemalloc's
   own tables inflate it.

Scenarios, each on a fresh broker after a warm-up of 20 connections: ``idle`` (N
connections, HELLO/WELCOME only; figures per connection) and ``filters`` (F distinct
workload filters over C connections, one by default; figures per filter, the C
connections included).
"""

from __future__ import annotations

import collections
import gc
import multiprocessing
import sys
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from bench.harness.report import arg_parser, write_report  # noqa: E402
from bench.harness.workers import Worker  # noqa: E402
from bench.memory import WORKER_TIMEOUT, build_plan, holder_main, raise_nofile  # noqa: E402
from broker.commands import tune_gc  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.log import configure_logging  # noqa: E402
from broker.server import Server, run_broker  # noqa: E402

#: Containers an owner label is looked for (other types are labelled by type alone).
_CONTAINERS = (
    dict, set, frozenset, list, tuple, collections.deque, bytes, bytearray, str, int, float,
    type(lambda: None), type(print), type(Server.shutdown.__get__(object())),
)  # fmt: skip


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return 0


def _attr_name(parent: Any, child: Any) -> str | None:
    """The attribute (or dict key, for a parent dict) of ``parent`` that holds ``child``."""
    if parent.__class__ is dict:
        for key, value in parent.items():
            if value is child:
                return f"[{key!r}]" if not isinstance(key, str) else key
            if key is child:
                return "<key>"
        return None
    names: Iterable[str] = ()
    slots = [
        s for cls in type(parent).__mro__ for s in getattr(cls, "__slots__", ()) if s != "__dict__"
    ]
    names = [*slots, *getattr(parent, "__dict__", {})]
    for name in names:
        try:
            if getattr(parent, name) is child:
                return name
        except AttributeError:
            continue
    if getattr(parent, "__dict__", None) is child:
        return "__dict__"
    return None


def _own_label(obj: Any) -> str | None:
    """A label that says what ``obj`` is without looking at who holds it."""
    kind = type(obj)
    if kind.__name__ == "coroutine":
        return f"coroutine {obj.cr_code.co_qualname}"
    if kind.__name__ == "generator":
        return f"generator {obj.gi_code.co_qualname}"
    if kind.__name__ == "Task" and kind.__module__.startswith("trio"):
        return "trio Task"
    if kind is type(sys._getframe()):
        return f"frame {obj.f_code.co_qualname}"
    if isinstance(obj, _CONTAINERS) or kind.__name__ in (
        "Event", "CancelScope", "CancelStatus", "cell", "Context", "method",
    ):  # fmt: skip
        return None
    return f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"


def _dict_label(d: dict, parent: dict[int, Any], depth: int = 0) -> str | None:
    """Whose dict ``d`` is: an object's (its ``__dict__``) or an attribute (``Session.refs``),
    found through ``parent`` (id -> the first new object seen referring to it)."""
    owner = parent.get(id(d))
    if owner is None or depth > 3:
        return None
    if getattr(owner, "__dict__", None) is d:
        return _holder_label(owner)
    name = _attr_name(owner, d)
    if name is None:
        return None
    if owner.__class__ is dict:
        outer = _dict_label(owner, parent, depth + 1)
        return f"{outer or 'dict'}.{name}"
    return f"{_holder_label(owner)}.{name}"


def _holder_label(parent: Any) -> str:
    own = _own_label(parent)
    if own is not None:
        return own
    return type(parent).__qualname__


def named_containers(server: Server) -> dict[str, Any]:
    """The long-lived dicts, sets and lists of the broker and of trio's run loop, by name:
    they grow in place (no new object), and the cyclic GC may not track an empty one."""
    runner = trio.lowlevel.current_task()._runner  # type: ignore[attr-defined]
    broker = server.broker
    owners = [broker, broker.registry, broker.table, runner, runner.io_manager]
    found: dict[str, Any] = {}
    for owner in owners:
        names = [
            *getattr(owner, "__dict__", {}),
            *(s for cls in type(owner).__mro__ for s in getattr(cls, "__slots__", ())),
        ]
        for name in names:
            value = getattr(owner, name, None)
            if _is_container(value):
                found[f"{type(owner).__name__}.{name}"] = value
    return found


class Census:
    """Objects alive at "before", to tell the new ones afterwards."""

    def __init__(self, named: dict[str, Any]) -> None:
        gc.collect()
        self.objects = gc.get_objects()
        ids = {id(o) for o in self.objects}
        for o in self.objects:  # the untracked ones they hold (strings, ints, bytes)
            for r in gc.get_referents(o):
                if not gc.is_tracked(r):
                    ids.add(id(r))
        self.named = named
        self.named_sizes = {label: sys.getsizeof(o) for label, o in named.items()}
        self.sizes = {id(o): sys.getsizeof(o) for o in self.objects if _is_container(o)}
        for o in named.values():  # grown, they are reported by name
            self.sizes.pop(id(o), None)
            ids.add(id(o))
        # the census's own tables are not the broker's
        ids.update((id(ids), id(self.sizes), id(self.named_sizes), id(self.__dict__)))
        self.ids = ids

    def diff(self) -> dict[str, Any]:
        """Sizes of what is new, by label; growth of what was there."""
        gc.collect()
        now = gc.get_objects()
        old = self.ids
        new = [o for o in now if id(o) not in old]
        new_ids = {id(o) for o in new}
        untracked: dict[int, Any] = {}
        parent: dict[int, Any] = {}
        for o in new:
            for r in gc.get_referents(o):
                rid = id(r)
                if rid not in parent:
                    parent[rid] = o
                if rid not in old and rid not in new_ids and not gc.is_tracked(r):
                    untracked[rid] = r
        by_label: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for o in [*new, *untracked.values()]:
            label = _own_label(o)
            if label is None:
                p = parent.get(id(o))
                if p is None:
                    label = f"{type(o).__name__} (held by older objects)"
                else:
                    attr = _attr_name(p, o)
                    holder_label = _dict_label(p, parent) if p.__class__ is dict else None
                    if holder_label is None:
                        holder_label = _holder_label(p)
                    if attr == "__dict__":
                        label = f"{holder_label}.__dict__"
                    else:
                        label = f"{type(o).__name__} in {holder_label}"
                        if attr:
                            label += f".{attr}"
            entry = by_label[label]
            entry[0] += 1
            entry[1] += sys.getsizeof(o)
        grown: dict[str, int] = {}
        for o in self.objects:
            before = self.sizes.get(id(o))
            if before is not None:
                growth = sys.getsizeof(o) - before
                if growth > 0:
                    label = f"grown {type(o).__name__} ({len(o):,} items)"  # type: ignore[arg-type]
                    grown[label] = grown.get(label, 0) + growth
        for label, o in self.named.items():
            growth = sys.getsizeof(o) - self.named_sizes[label]
            if growth:
                grown[f"grown {label} ({len(o):,} items)"] = growth
        tasks: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for o in new:
            if type(o).__name__ == "Task" and type(o).__module__.startswith("trio"):
                size = sys.getsizeof(o) + sys.getsizeof(o.context)
                coro = o.coro
                while coro is not None:
                    size += sys.getsizeof(coro)
                    coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
                entry = tasks[o.name.rsplit(".", 2)[-1] if "." in o.name else o.name]
                entry[0] += 1
                entry[1] += size
        del new, untracked, parent, now
        return {"labels": dict(by_label), "grown": grown, "tasks": dict(tasks)}


def _is_container(o: Any) -> bool:
    return isinstance(o, (dict, set, list, collections.deque, bytearray))


async def _measure(
    plan: list[list[tuple[str, str]]], use_tracemalloc: bool, ctx: Any
) -> dict[str, Any]:
    configure_logging("json")
    tune_gc()
    config = BrokerConfig(port=0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(run_broker, config)
        port = server.addresses[0][1]
        warmup = build_plan("idle-sub", {"connections": 20}, 1)
        await _hold(ctx, port, warmup, server, close=True)
        if use_tracemalloc:
            tracemalloc.start(1)
        rss_before = _rss_kib()
        census = Census(named_containers(server))
        traced_before = tracemalloc.get_traced_memory()[0] if use_tracemalloc else 0
        worker = await _hold(ctx, port, plan, server, close=False)
        try:
            traced = tracemalloc.get_traced_memory()[0] - traced_before if use_tracemalloc else None
            tracemalloc.stop()
            result = census.diff()
            result["rss_delta_kib"] = _rss_kib() - rss_before
            result["traced_bytes"] = traced
        finally:
            await trio.to_thread.run_sync(worker.stop)
        server.shutdown()
    return result


async def _hold(
    ctx: Any, port: int, plan: list[list[tuple[str, str]]], server: Server, *, close: bool
) -> Worker:
    worker = await trio.to_thread.run_sync(Worker, ctx, holder_main, (port, plan), "holder")
    await trio.to_thread.run_sync(worker.expect, "ready", WORKER_TIMEOUT)
    if close:
        await trio.to_thread.run_sync(worker.stop)
        while server.broker.connections:
            await trio.sleep(0.05)
    await trio.sleep(0.5)  # let the broker's tasks settle into their waits
    return worker


#: Families of labels, for the summary: (family, substrings of a label), first match wins.
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("match trie (nodes, child and holder dicts)", ("routing._Node",)),
    ("Filter (object, levels tuple, text, prefixes)", ("routing.Filter", "routing.Prefix",
                                                       "SubRef.filter", "SubRef.dialect")),
    ("SubRef (and its ids)", ("SubRef",)),
    ("table dicts and pygtrie index", ("SubscriptionTable", "pygtrie", "dict (held by older")),
    ("trio.Event (with its waiter set)", ("Event",)),
    ("Session (dict, deques, dicts)", ("Session",)),
    ("Confirms", ("Confirms",)),
    ("nurseries and cancel scopes", ("CancelScope", "CancelStatus", "Nursery")),
    ("trio task machinery (Task, Context, name, wait trap)", (
        "trio Task", "WaitTaskRescheduled", "wait_task_rescheduled", "_real_async_yield",
        "cell in", "tuple in function", "Runner.tasks")),
    ("coroutine frames of the await chains", ("coroutine", "frame ", "generator")),
    ("registries that grow (connections, sessions, epoll)", ("grown ",)),
    ("socket objects", ("socket", "Socket", "Epoll", "ConflictDetector")),
    ("protocol objects (wire Connection, FrameBuffer, Requests)", (
        "broker.Connection", "FrameBuffer", "Requests")),
    ("ClientConnection, Ending, Opened", ("ClientConnection", "Ending", "Opened")),
)  # fmt: skip


def family(label: str) -> str:
    for name, keys in FAMILIES:
        if any(key in label for key in keys):
            return name
    return "other"


def families(result: dict[str, Any]) -> dict[str, int]:
    """Bytes by family (``FAMILIES``), census and growth together."""
    out: dict[str, int] = collections.Counter()
    for label, (_count, size) in result["labels"].items():
        out[family(label)] += size
    for label, size in result["grown"].items():
        out[family(label)] += size
    return dict(out)


def report_lines(title: str, result: dict[str, Any], per: int, top: int) -> list[str]:
    labels = result["labels"]
    total = sum(size for _count, size in labels.values()) + sum(result["grown"].values())
    lines = [
        f"{title}: census {total / per:,.0f} B per item"
        + (f", traced {result['traced_bytes'] / per:,.0f} B" if result["traced_bytes"] else "")
        + f", RSS {result['rss_delta_kib'] * 1024 / per:,.0f} B"
    ]
    for name, size in sorted(families(result).items(), key=lambda kv: -kv[1]):
        lines.append(f"  {size / per:9,.1f} B  {name}")
    lines.append("  by label (bytes, objects per item):")
    rows = sorted(labels.items(), key=lambda kv: -kv[1][1])
    shown = 0
    for label, (count, size) in rows[:top]:
        shown += size
        lines.append(f"  {size / per:9,.1f} B  {count / per:6.2f} x  {label}")
    rest = sum(size for _c, size in labels.values()) - shown
    lines.append(f"  {rest / per:9,.1f} B            (other labels)")
    for label, size in sorted(result["grown"].items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"  {size / per:9,.1f} B            {label}")
    if result["tasks"]:
        lines.append("  trio tasks (Task + Context + the coroutine chain it waits in):")
        for name, (count, size) in sorted(result["tasks"].items(), key=lambda kv: -kv[1][1]):
            lines.append(f"  {size / per:9,.1f} B  {count / per:6.2f} x  task {name}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(__doc__, quick="200 connections, 5,000 filters")
    parser.add_argument("--connections", type=int, default=1_000)
    parser.add_argument("--filters", type=int, default=50_000)
    parser.add_argument("--spread", type=int, default=1, help="connections holding the filters")
    parser.add_argument("--top", type=int, default=40, help="labels shown per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true", help="also trace allocations")
    args = parser.parse_args(argv)
    if args.quick:
        args.connections, args.filters = 200, 5_000
    raise_nofile(args.connections + 64)
    ctx = multiprocessing.get_context("spawn")
    report: dict[str, Any] = {"benchmark": "memory_breakdown", "parameters": vars(args)}
    idle = trio.run(_measure, build_plan("idle", {"connections": args.connections}, 0),
                    args.tracemalloc, ctx)  # fmt: skip
    idle["families"] = families(idle)
    report["idle"] = idle
    plan = build_plan("filters-spread", {"filters": args.filters, "spread": args.spread}, args.seed)
    filters = trio.run(_measure, plan, args.tracemalloc, ctx)
    filters["families"] = families(filters)
    report["filters"] = filters
    for line in report_lines(f"per idle connection ({args.connections:,})", idle,
                             args.connections, args.top):  # fmt: skip
        print(line)
    print()
    for line in report_lines(
        f"per filter ({args.filters:,} over {args.spread:,} connections)",
        filters,
        args.filters,
        args.top,
    ):
        print(line)
    write_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
