"""The route exchange and forwarding decisions, on in-memory meshes (tests/meshsim.py)."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import routing
from routing.exchange import BROKER, RouteAck, RouteExchange
from routing.linkstate import ROUTE_BATCH, Outcome, RouteTable, Update
from tests.meshsim import SimMesh, build
from tests.topologies import GRID3, LINE, RING4, TOPOLOGIES

# -- an independent reference: distances by BFS on the graph itself ------------------------


def distances(edges: list[tuple[str, str]], source: str) -> dict[str, int]:
    adjacency: dict[str, set[str]] = {}
    for a, b in edges:
        adjacency.setdefault(a, set()).add(b)
        adjacency.setdefault(b, set()).add(a)
    dist = {source: 0}
    queue = deque([source])
    while queue:
        node = queue.popleft()
        for other in adjacency.get(node, ()):
            if other not in dist:
                dist[other] = dist[node] + 1
                queue.append(other)
    return dist


def reference_next_hop(edges: list[tuple[str, str]], node: str, dest: str) -> str:
    """Lowest-id neighbour one step closer to ``dest``."""
    to_dest = distances(edges, dest)
    neighbours = {b for a, b in edges if a == node} | {a for a, b in edges if b == node}
    return min(n for n in neighbours if to_dest[n] == to_dest[node] - 1)


def reference_link_copies(
    edges: list[tuple[str, str]], source: str, dests: set[str]
) -> dict[tuple[str, str], int]:
    """Links the copies of one event cross: the union of each destination's hop-by-hop path."""
    used: set[tuple[str, str]] = set()
    for dest in dests - {source}:
        node = source
        while node != dest:
            hop = reference_next_hop(edges, node, dest)
            used.add((node, hop))
            node = hop
    return dict.fromkeys(used, 1)


# -- convergence -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_every_broker_ends_up_with_the_same_database(name: str) -> None:
    ids, edges = TOPOLOGIES[name]
    mesh = build(ids, edges)
    mesh.subscribe(ids[0], "beacon/eu/>")
    mesh.subscribe(ids[-1], "beacon/*/de/#", "mqtt")
    mesh.run()
    digests = [node.table.digest() for node in mesh.nodes.values()]
    assert all(d == digests[0] for d in digests)
    assert set(digests[0]) == set(ids)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_next_hops_are_the_lowest_id_on_a_shortest_path(name: str) -> None:
    ids, edges = TOPOLOGIES[name]
    mesh = build(ids, edges)
    for node in ids:
        paths = mesh.nodes[node].table.paths()
        assert set(paths) == set(ids) - {node}
        for dest, (hop, distance) in paths.items():
            assert distance == distances(edges, node)[dest]
            assert hop == reference_next_hop(edges, node, dest)


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_each_event_reaches_each_wanting_broker_once_over_the_links_on_its_paths(
    name: str,
) -> None:
    ids, edges = TOPOLOGIES[name]
    mesh = build(ids, edges)
    wanting = {ids[0], ids[len(ids) // 2], ids[-1]}
    for node in wanting:
        mesh.subscribe(node, f"t/{node}/>")
        mesh.subscribe(node, "all/*")
    mesh.run()
    expected_frames: dict[tuple[str, str], int] = {}
    event = 0
    for publisher in ids:
        for topic, dests in [("all/x", wanting), (f"t/{ids[-1]}/y", {ids[-1]}), ("none/z", set())]:
            event += 1
            mesh.publish(publisher, event, topic)
            mesh.run()
            for link, count in reference_link_copies(edges, publisher, dests).items():
                expected_frames[link] = expected_frames.get(link, 0) + count
    for node in ids:
        got = [e for e, _topic in mesh.delivered[node]]
        assert len(got) == len(set(got)), f"{node} got a duplicate"
    all_x = [e for e, topic in mesh.delivered[ids[-1]] if topic == "all/x"]
    assert len(all_x) == len(ids) - 1  # from every other broker
    for node in set(ids) - wanting:
        assert mesh.delivered[node] == []
    assert mesh.frames == expected_frames
    assert mesh.lost == 0


def test_a_filter_covered_by_another_of_the_same_broker_is_not_propagated() -> None:
    mesh = build(*LINE)
    mesh.subscribe("a", "beacon/eu/>")
    for i in range(50):
        mesh.subscribe("a", f"beacon/eu/c{i}/site{i}/*")
    mesh.run()
    far = mesh.nodes["c"].table
    assert far.origins["a"].filters == {routing.parse_filter("beacon/eu/>")}
    assert len(far.remote) == 1


def test_withdrawing_the_covering_filter_propagates_what_it_covered() -> None:
    mesh = build(*LINE)
    mesh.subscribe("a", "beacon/eu/>")
    mesh.subscribe("a", "beacon/eu/de/*")
    mesh.run()
    mesh.unsubscribe("a", "beacon/eu/>")
    mesh.run()
    assert mesh.nodes["c"].table.origins["a"].filters == {routing.parse_filter("beacon/eu/de/*")}


def test_an_unsubscribe_removes_the_route_everywhere() -> None:
    mesh = build(*RING4)
    mesh.subscribe("r0", "x/>")
    mesh.run()
    mesh.unsubscribe("r0", "x/>")
    mesh.run()
    for node in mesh.nodes.values():
        assert node.table.wanting("x/y") == frozenset()


# -- failures ----------------------------------------------------------------------------


def test_a_cut_link_in_a_ring_reroutes_the_long_way_round() -> None:
    ids, edges = RING4
    mesh = build(ids, edges)
    mesh.subscribe("r1", "x/>")
    mesh.run()
    assert mesh.nodes["r0"].table.next_hop("r1") == "r1"
    mesh.cut("r0", "r1")
    mesh.run()
    assert mesh.nodes["r0"].table.paths()["r1"] == ("r3", 3)
    mesh.publish("r0", 1, "x/y")
    mesh.run()
    assert mesh.delivered["r1"] == [(1, "x/y")]


def test_a_restored_link_is_used_again_once_both_ends_list_it() -> None:
    mesh = build(*RING4)
    mesh.cut("r0", "r1")
    mesh.run()
    mesh.connect("r0", "r1")
    mesh.run()
    assert mesh.nodes["r0"].table.paths()["r1"] == ("r1", 1)


def test_a_restarted_broker_replaces_what_the_mesh_remembered_of_it() -> None:
    mesh = build(*RING4)
    mesh.subscribe("r2", "old/>")
    mesh.run()
    neighbours = mesh.kill("r2")
    mesh.run()
    assert "r2" not in mesh.nodes["r0"].table.reachable()
    mesh.start("r2")
    mesh.subscribe("r2", "new/>")
    for other in neighbours:
        mesh.connect("r2", other)
    mesh.run()
    table = mesh.nodes["r0"].table
    assert table.wanting("new/x") == {"r2"}
    assert table.wanting("old/x") == frozenset()
    assert table.origins["r2"].incarnation == 2


def test_a_restarted_broker_learns_everyone_elses_routes_on_connect() -> None:
    mesh = build(*LINE)
    mesh.subscribe("a", "from/a")
    mesh.run()
    mesh.kill("c")
    mesh.run()
    mesh.start("c")
    mesh.connect("b", "c")
    mesh.run()
    assert mesh.nodes["c"].table.wanting("from/a") == {"a"}


def test_an_unreachable_broker_is_not_sent_events_and_the_loss_is_counted() -> None:
    mesh = build(*LINE)
    mesh.subscribe("c", "x")
    mesh.run()
    mesh.cut("b", "c")
    mesh.run()
    split = mesh.nodes["a"].table.split(mesh.nodes["a"].table.wanting("x"))
    assert split.by_hop == {}
    assert split.unreachable == ("c",)


def test_a_partition_heals_and_both_sides_learn_what_changed_meanwhile() -> None:
    mesh = build(*LINE)
    mesh.cut("a", "b")
    mesh.run()
    mesh.subscribe("a", "left/>")
    mesh.subscribe("c", "right/>")
    mesh.run()
    mesh.connect("a", "b")
    mesh.run()
    assert mesh.nodes["a"].table.wanting("right/x") == {"c"}
    assert mesh.nodes["c"].table.wanting("left/x") == {"a"}


# -- the exchange in detail ----------------------------------------------------------------


def filters(*texts: str) -> tuple[routing.Filter, ...]:
    return tuple(routing.parse_filter(t) for t in texts)


def test_a_delta_that_skips_a_sequence_number_is_a_gap_and_asks_for_a_snapshot() -> None:
    node = RouteExchange("me", 1)
    node.link_up("p", BROKER, {})
    node.receive_update("p", Update("o", 5, 1, snapshot=True, neighbors=frozenset()))
    out = node.receive_update("p", Update("o", 5, 3, add=filters("x")))
    assert [(peer, type(m).__name__, m.origin) for peer, m in out] == [("p", "RouteRequest", "o")]
    assert node.table.wanting("x") == frozenset()


def test_an_older_or_repeated_update_stops_there() -> None:
    table = RouteTable("me", 1)
    first = Update("o", 5, 1, snapshot=True, neighbors=frozenset(), add=filters("x"))
    assert table.apply(first, "p")[0] is Outcome.APPLIED
    assert table.apply(first, "q")[0] is Outcome.STALE
    older = Update("o", 4, 9, snapshot=True, neighbors=frozenset())
    assert table.apply(older, "p")[0] is Outcome.STALE


def test_a_snapshot_larger_than_one_frame_goes_in_parts_and_applies_at_the_last() -> None:
    source = RouteTable("o", 1)
    many = [routing.parse_filter(f"f/{i}") for i in range(ROUTE_BATCH * 2 + 5)]
    source.own_updates(add=many, neighbors=frozenset({"me"}))
    parts = source.snapshot("o")
    assert len(parts) == 3
    assert [p.more for p in parts] == [True, True, False]
    target = RouteTable("me", 1)
    outcomes = [target.apply(part, "o")[0] for part in parts]
    assert outcomes == [Outcome.PART, Outcome.PART, Outcome.APPLIED]
    assert target.origins["o"].filters == set(many)


def test_a_big_local_change_is_split_into_several_numbered_deltas() -> None:
    table = RouteTable("me", 1)
    count = ROUTE_BATCH * 2 + 1
    updates = table.own_updates(add=[routing.parse_filter(f"f/{i}") for i in range(count)])
    assert [u.seq for u in updates] == [1, 2, 3]
    assert sum(len(u.add) for u in updates) == count


def test_an_update_claiming_our_own_id_under_a_newer_incarnation_is_a_clash() -> None:
    node = RouteExchange("me", 1)
    node.link_up("p", BROKER, {})
    assert node.receive_update("p", Update("me", 2, 1, snapshot=True, neighbors=frozenset())) == []
    assert node.counters.id_clashes == 1


def test_acknowledgements_from_every_broker_settle_a_sync_wait() -> None:
    ids, edges = GRID3
    mesh = build(ids, edges)
    subscriber = mesh.nodes["g00"]
    subscriber.local_add(routing.parse_filter("sync/x"))
    mesh._send("g00", subscriber.flush())
    wait = subscriber.sync_wait()
    assert wait.waiting == set(ids) - {"g00"}
    assert not subscriber.sync_settled(wait)
    mesh.run()
    assert subscriber.sync_settled(wait)
    assert mesh.nodes["g22"].table.wanting("sync/x") == {"g00"}


def test_a_sync_wait_does_not_wait_for_a_broker_that_became_unreachable() -> None:
    mesh = build(*LINE)
    node = mesh.nodes["a"]
    node.local_add(routing.parse_filter("s"))
    mesh._send("a", node.flush())
    wait = node.sync_wait()
    mesh.cut("b", "c")  # c never hears of it
    mesh.run()
    assert node.sync_settled(wait)


def test_acks_for_an_older_incarnation_of_us_are_ignored() -> None:
    node = RouteExchange("me", 7)
    node.receive_ack("p", RouteAck("me", 6, 99, "p", 1))
    assert node.acked == {}


def test_an_observer_gets_every_state_but_is_not_a_neighbour() -> None:
    mesh = build(*LINE)
    mesh.subscribe("c", "x/>")
    mesh.run()
    b = mesh.nodes["b"]
    out = b.link_up("bridge", "observer", {})
    assert {m.origin for _peer, m in out} == {"a", "b", "c"}
    b.flush()
    assert "bridge" not in b.table.origins["b"].neighbors


# -- a randomized check: any connected graph, any subscriptions --------------------------


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(2, 8))
def test_random_meshes_deliver_exactly_once_along_shortest_paths(seed: int, size: int) -> None:
    rng = random.Random(seed)
    ids = [f"n{i}" for i in range(size)]
    edges = [(ids[i], ids[rng.randrange(i)]) for i in range(1, size)]  # a random tree
    for _ in range(rng.randrange(size)):  # plus a few chords
        a, b = rng.sample(ids, 2)
        if (a, b) not in edges and (b, a) not in edges:
            edges.append((a, b))
    mesh = SimMesh(ids)
    order = edges[:]
    rng.shuffle(order)
    for a, b in order:
        mesh.connect(a, b)
        if rng.random() < 0.5:
            mesh.run()
    topics = ["k/a", "k/b", "k/c/d"]
    wants: dict[str, set[str]] = {t: set() for t in topics}
    for node in ids:
        for topic in rng.sample(topics, rng.randrange(len(topics) + 1)):
            mesh.subscribe(node, topic)
            wants[topic].add(node)
        if rng.random() < 0.3:
            mesh.subscribe(node, "k/>")
            for topic in topics:
                wants[topic].add(node)
    mesh.run()
    expected: dict[tuple[str, str], int] = {}
    event = 0
    for publisher in ids:
        for topic in topics:
            event += 1
            mesh.publish(publisher, event, topic)
            for link in reference_link_copies(edges, publisher, wants[topic]):
                expected[link] = expected.get(link, 0) + 1
    mesh.run()
    for node in ids:
        got = sorted(e for e, _topic in mesh.delivered[node])
        should = sorted(
            e
            for e, (publisher, topic) in enumerate(((p, t) for p in ids for t in topics), start=1)
            if node in wants[topic] and publisher != node
        )
        assert got == should
    assert mesh.frames == expected
