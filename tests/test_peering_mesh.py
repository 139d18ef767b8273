"""Peering end to end: meshes of real broker processes (tests/mesh.py) on 127.0.0.1.

One mesh runs at a time and is shared by consecutive tests on the same topology (the
order of the tests below keeps them together). Figures (propagation, convergence) are
printed for docs/peering.md; run with ``-s`` to see them.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field

import pytest
import trio

import routing
from broker.client import Client, ConnectionLost, Subscription, connect
from tests.mesh import BrokerDied, Mesh, MeshPool
from tests.test_linkstate import reference_link_copies


@pytest.fixture(scope="module")
def pool(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[MeshPool]:
    meshes = MeshPool(tmp_path_factory.mktemp("mesh"))
    failed = request.session.testsfailed
    try:
        yield meshes
    finally:
        if request.session.testsfailed > failed and meshes.mesh is not None:
            print(meshes.mesh.logs())
        meshes.close()


async def collect(sub: Subscription, into: list[str]) -> None:
    async for message in sub:
        into.append(message.text)


def directed(edges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted({*edges, *((b, a) for a, b in edges)})


async def peer_counters(mesh: Mesh, name: str) -> int:
    """``name`` summed over the mesh's running brokers."""
    total = 0
    for node in mesh.alive():
        total += (await mesh.stats(node)).get("peering", {}).get(name, 0)
    return total


# -- the grid: a synchronous subscribe is in place everywhere when its SUBACK comes --------


async def test_a_sync_subscribe_on_one_corner_gets_an_event_published_at_once_on_the_other(
    pool: MeshPool,
) -> None:
    mesh = await pool.get("grid3x3")
    suback, delivered = [], []
    async with connect(mesh.address("g00")) as near, connect(mesh.address("g22")) as far:
        for i in range(100):
            started = trio.current_time()
            async with near.subscribe(f"sync/{i}", sync=True) as sub:
                acked = trio.current_time()
                await far.publish(f"sync/{i}", f"event {i}".encode())
                with trio.move_on_after(5):
                    message = await sub.get()
                    delivered.append(trio.current_time() - acked)
                assert len(delivered) == i + 1, f"round {i}: the event did not arrive in 5 s"
                assert (message.topic, message.text) == (f"sync/{i}", f"event {i}")
            suback.append(acked - started)
    print(
        f"\nsync SUB on g00 (4 hops from g22), 100 rounds: SUBACK after median "
        f"{statistics.median(suback) * 1000:.1f} ms (max {max(suback) * 1000:.1f}); "
        f"PUB on g22 to delivery on g00 median {statistics.median(delivered) * 1000:.1f} ms "
        f"(max {max(delivered) * 1000:.1f})"
    )


async def test_a_plain_subscribe_reaches_the_far_corner_within_a_bound(pool: MeshPool) -> None:
    """Without sync, how long after SUBACK on g00 events published on g22 start arriving."""
    mesh = await pool.get("grid3x3")
    delays = []
    async with connect(mesh.address("g00")) as near, connect(mesh.address("g22")) as far:
        for k in range(10):
            topic = f"prop/{k}"
            async with trio.open_nursery() as nursery:
                going = trio.Event()

                async def publish(topic: str = topic, going: trio.Event = going) -> None:
                    with trio.move_on_after(5):  # bounded: 5 s at one event per 2 ms
                        for n in range(10**6):
                            await far.publish(topic, str(n).encode())
                            going.set()
                            await trio.sleep(0.002)  # the publishing rate is the workload

                nursery.start_soon(publish)
                await going.wait()  # the publisher is going
                async with near.subscribe(topic) as sub:
                    acked = trio.current_time()
                    with trio.fail_after(3):
                        await sub.get()
                    delays.append(trio.current_time() - acked)
                nursery.cancel_scope.cancel()
    print(
        f"\npropagation without sync, g00 -> g22 (4 hops), SUBACK to first event: "
        f"median {statistics.median(delays) * 1000:.1f} ms, "
        f"min {min(delays) * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms"
    )
    assert max(delays) < 3


# -- every topology: exactly once, and only over the links on the paths ---------------------

FILTERS = {
    "eu": ("t/eu/>", "native"),
    "de": ("t/+/de/#", "mqtt"),
    "star-de": ("t/*/de/*", "native"),
    "na": ("t/na/#", "mqtt"),
    "eu-fr-y": ("t/eu/fr/y", "native"),  # covered by "eu" where both are on one broker
}
TOPICS = ["t/eu/de/x", "t/eu/fr/y", "t/na/de/z", "t/na/us/w", "t/as/jp/v", "t/eu/de/x/deep"]
EVENTS_PER_PUBLISHER = 30

# topology -> (subscriptions as (broker, filter key), publishing brokers)
SCENARIOS: dict[str, tuple[list[tuple[str, str]], list[str]]] = {
    "grid3x3": (
        [
            ("g00", "eu"),
            ("g00", "eu-fr-y"),
            ("g22", "de"),
            ("g02", "na"),
            ("g20", "star-de"),
            ("g11", "eu"),
        ],
        ["g12", "g10", "g21"],
    ),
    "line": ([("a", "eu"), ("a", "eu-fr-y"), ("c", "de"), ("c", "star-de")], ["b", "a"]),
    "star5": (
        [("s1", "eu"), ("s1", "eu-fr-y"), ("s2", "de"), ("s3", "na"), ("hub", "star-de")],
        ["s4", "s1"],
    ),
    "ring4": ([("r0", "eu"), ("r1", "star-de"), ("r2", "de"), ("r2", "na")], ["r3", "r1"]),
}


def matches(key: str, topic: str) -> bool:
    text, dialect = FILTERS[key]
    return routing.parse_filter(text, dialect).matches(topic)


@pytest.mark.parametrize("topology", list(SCENARIOS))
async def test_every_subscriber_gets_each_matching_event_once_over_shortest_paths_only(
    pool: MeshPool, topology: str
) -> None:
    mesh = await pool.get(topology)
    subscriptions, publishers = SCENARIOS[topology]
    events = [
        (publisher, TOPICS[i % len(TOPICS)], f"{publisher}/{i}")
        for publisher in publishers
        for i in range(EVENTS_PER_PUBLISHER)
    ]
    expected = {
        (node, key): Counter(payload for _p, topic, payload in events if matches(key, topic))
        for node, key in subscriptions
    }
    expected_links: Counter[tuple[str, str]] = Counter()
    for publisher, topic, _payload in events:
        wanting = {node for node, key in subscriptions if matches(key, topic)}
        expected_links.update(reference_link_copies(mesh.edges, publisher, wanting))
    links = directed(mesh.edges)

    got: dict[tuple[str, str], list[str]] = {sub: [] for sub in subscriptions}
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        for node, key in subscriptions:
            client = await stack.enter_async_context(connect(mesh.address(node)))
            text, dialect = FILTERS[key]
            sub = await stack.enter_async_context(client.subscribe(text, dialect, sync=True))
            nursery.start_soon(collect, sub, got[node, key])
        out_before, in_before = await mesh.fwd_out(), await mesh.fwd_in()
        lost_before = await peer_counters(mesh, "unreachable_dropped") + await peer_counters(
            mesh, "link_dropped"
        )
        pubs: dict[str, Client] = {
            p: await stack.enter_async_context(connect(mesh.address(p))) for p in publishers
        }
        for publisher, topic, payload in events:
            await pubs[publisher].publish(topic, payload.encode())
        with trio.move_on_after(10):
            while any(len(got[s]) < expected[s].total() for s in subscriptions):
                await trio.sleep(0.02)  # deliveries in other processes: poll, bounded
        # Kept: a quiet period in which a duplicate or a stray would show. No marker fits:
        # the filters differ per subscription, and a marker's FWD copies would change the
        # exact per-link counts asserted below.
        await trio.sleep(0.3)
    # (closing the subscriptions ended the collectors)

    for sub in subscriptions:
        assert Counter(got[sub]) == expected[sub], f"subscription {sub}"
    out_after, in_after = await mesh.fwd_out(), await mesh.fwd_in()
    sent = {link: out_after[link] - out_before[link] for link in links}
    received = {link: in_after[link] - in_before[link] for link in links}
    assert sent == {link: expected_links[link] for link in links}
    assert received == sent
    print(
        f"\n{topology}: {len(events)} events, {sum(sent.values())} FWD frames, "
        f"{sum(1 for n in sent.values() if n == 0)} of {len(links)} directed links unused"
    )
    lost_after = await peer_counters(mesh, "unreachable_dropped") + await peer_counters(
        mesh, "link_dropped"
    )
    assert lost_after == lost_before


# -- the ring: a broker fails under load ----------------------------------------------------
# r0 publishes; r2 and r3 subscribe. r0 reaches r2 through r1 (r1 < r3), and r1 has no
# subscriber: the broker on the path that nobody behind wants for itself.


@dataclass
class RingRun:
    published: int = 0  # events confirmed by r0 (so routed there), numbered 0..published-1
    got: dict[str, list[int]] = field(default_factory=lambda: {"r2": [], "r3": []})

    def missing(self, node: str, start: int, end: int) -> list[int]:
        have = set(self.got[node])
        return [n for n in range(start, end) if n not in have]

    def duplicates(self, node: str) -> list[int]:
        return [n for n, c in Counter(self.got[node]).items() if c > 1]


async def ring_publisher(client: Client, run: RingRun, stop: trio.Event) -> None:
    with trio.move_on_after(30):  # bounded: at most ~6,000 events
        while not stop.is_set():
            await client.publish("ring/e", str(run.published).encode(), confirm=True)
            run.published += 1
            await trio.sleep(0.005)  # the publishing rate is the workload


async def ring_collect(sub: Subscription, into: list[int]) -> None:
    with suppress(ConnectionLost):  # (its broker crashed: see CLOSING_CRASH)
        async for message in sub:
            into.append(int(message.text))


async def wait_all(run: RingRun, nodes: list[str], start: int, end: int) -> None:
    with trio.move_on_after(5):
        while any(run.missing(node, start, end) for node in nodes):
            await trio.sleep(0.02)  # deliveries in other processes: poll, bounded
    for node in nodes:
        missing = run.missing(node, start, end)
        assert not missing, f"{node} lacks {len(missing)} events of {start}..{end - 1}: {missing}"


async def flowing(run: RingRun, nodes: list[str], since: int, count: int = 20) -> None:
    """Wait (bounded; wait_all asserts later) until each node got ``count`` events
    numbered ``since`` or later: events flow to it now, however loaded the machine."""
    with trio.move_on_after(10):
        while any(sum(n >= since for n in run.got[node]) < count for node in nodes):
            await trio.sleep(0.01)  # deliveries in other processes: poll, bounded


async def ring_failure(pool: MeshPool, victim: str, how: str) -> None:
    """``how``: "kill" (SIGKILL, then restart) or "stop" (SIGSTOP, then SIGCONT)."""
    mesh = await pool.get("ring4")
    run = RingRun()
    stop = trio.Event()
    baseline = await mesh.stats("r0")
    crashed: BrokerDied | None = None
    async with (
        connect(mesh.address("r0")) as publisher,
        connect(mesh.address("r2")) as c2,
        connect(mesh.address("r3")) as c3,
        c2.subscribe("ring/>", sync=True) as s2,
        c3.subscribe("ring/#", "mqtt", sync=True) as s3,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(ring_collect, s2, run.got["r2"])
        nursery.start_soon(ring_collect, s3, run.got["r3"])
        nursery.start_soon(ring_publisher, publisher, run, stop)
        await flowing(run, ["r2", "r3"], 0)  # steady flow first
        try:
            if how == "kill":
                mesh.kill(victim)
            else:
                mesh.stop(victim)
            outage = await mesh.wait_converged(
                mesh.expected_reachable(), 10, edges=mesh.edges, poll=0.01
            )
            print(f"\nring4: {how} {victim}: converged {outage * 1000:.0f} ms later")
            after_outage = run.published
            await flowing(run, [n for n in ("r2", "r3") if n != victim], after_outage)  # around
            before_recovery = run.published
            if how == "kill":
                # in a thread, so that the flow goes on while it starts; returns once it listens
                await trio.to_thread.run_sync(mesh.restart, victim)
            else:
                mesh.cont(victim)
            recovery = await mesh.wait_converged(
                mesh.expected_reachable(), 10, edges=mesh.edges, poll=0.01
            )
        except BrokerDied as exc:
            crashed = exc
            nursery.cancel_scope.cancel()
        else:
            after_recovery = run.published
            await flowing(run, ["r2", "r3"], after_recovery)  # through the mended ring
            stop.set()
            with trio.fail_after(5):
                while run.published == after_recovery:  # (never: flowing saw 20 events)
                    await trio.sleep(0.01)
            end = run.published
            live = ["r2", "r3"]
            hole = [node for node in live if node != victim]
            await wait_all(run, hole, after_outage, before_recovery)  # routed around the hole
            await wait_all(run, live, after_recovery, end)  # and through the ring again
            # Kept: a quiet period for a late duplicate, which could come along another
            # path than any marker we could send after it.
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()

    for node in ("r2", "r3"):
        assert run.duplicates(node) == [], f"{node} got duplicates"
    if crashed is not None:
        raise crashed
    stats = await mesh.stats("r0")
    counters = {
        name: stats["peering"][name] - baseline["peering"][name]
        for name in ("unreachable_dropped", "link_dropped")
    }
    lost = {node: len(run.missing(node, 0, end)) for node in ("r2", "r3")}
    verb = {"kill": ("SIGKILL", "restart"), "stop": ("SIGSTOP", "SIGCONT")}[how]
    print(
        f"\nring4, {verb[0]} {victim} under {end} events: converged {outage * 1000:.0f} ms after "
        f"{verb[0]}, {recovery * 1000:.0f} ms after {verb[1]}"
        f"{' (once listening)' if how == 'kill' else ''}; lost {lost} while converging; "
        f"r0 counters {counters}"
    )


async def test_ring_kill_9_of_a_broker_on_the_path_loses_no_flow_after_convergence_and_no_dup(
    pool: MeshPool,
) -> None:
    await ring_failure(pool, "r1", "kill")


async def test_ring_sigstop_of_a_broker_on_the_path_reroutes_after_keepalive_without_dups(
    pool: MeshPool,
) -> None:
    await ring_failure(pool, "r1", "stop")


async def test_ring_sigstop_of_a_subscribers_broker_resumes_its_flow_without_dups(
    pool: MeshPool,
) -> None:
    await ring_failure(pool, "r3", "stop")
