"""Peer links between brokers in one process: handshake rules, forwarding, sync, observers.

The topologies with separate broker processes are in tests/test_peering_mesh.py; here the
brokers share a trio loop, so each rule is tested quickly and on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from functools import partial

import msgpack
import pytest
import trio

from broker.client import BrokerError, connect
from broker.server import Server
from broker.wire.frames import PROTOCOL_VERSION
from tests.conftest import running_broker
from tests.streams import quiet
from tests.wire import RawClient, frame

FAST = {"peer_keepalive": 0.3, "peer_flush": 0.002, "peer_backoff_max": 0.2}


def server_text(server: Server) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"


async def wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while not predicate():  # for broker state that has no event: poll, bounded
            await trio.sleep(0.01)


def reachable(server: Server) -> set[str]:
    return server.broker.peering.table.reachable()


@contextlib.asynccontextmanager
async def line(*ids: str, **overrides: object) -> AsyncIterator[list[Server]]:
    """Brokers ``ids`` in a line, each dialling the previous one; converged on entry."""
    settings = {**FAST, **overrides}
    async with contextlib.AsyncExitStack() as stack:
        servers: list[Server] = []
        for broker_id in ids:
            peers = (server_text(servers[-1]),) if servers else ()
            servers.append(
                await stack.enter_async_context(
                    running_broker(server_id=broker_id, peers=peers, **settings)
                )
            )
        everyone = set(ids)
        for server in servers:
            await wait_for(lambda s=server: reachable(s) == everyone - {s.broker.server_id})
        yield servers


async def peer_hello(server: Server, **fields: object) -> RawClient:
    client = await RawClient.open(server.addresses[0], hello=False)
    body = {
        "type": "PEER_HELLO",
        "version": PROTOCOL_VERSION,
        "broker_id": "fake",
        "incarnation": 1,
        **fields,
    }
    await client.send(frame(body))
    return client


# -- forwarding ----------------------------------------------------------------------------


async def test_an_event_published_on_one_broker_reaches_a_subscriber_two_hops_away() -> None:
    async with line("a", "b", "c") as (a, _b, c):
        async with connect(server_text(c)) as sub_client, connect(server_text(a)) as pub:
            async with sub_client.subscribe("x/>", sync=True) as sub:
                await pub.publish("x/y", b"hello")
                with trio.fail_after(5):
                    message = await sub.get()
        assert (message.topic, message.payload) == ("x/y", b"hello")


async def test_an_event_nobody_wants_never_leaves_its_broker() -> None:
    async with line("a", "b") as (a, b):
        async with connect(server_text(a)) as pub:
            await pub.publish("nobody/wants", b"x", confirm=True)
        assert a.broker.peering.counters.fwd_out == 0
        assert b.broker.peering.counters.fwd_in == 0


async def test_routes_name_each_origin_with_its_next_hop_and_distance() -> None:
    async with line("a", "b", "c") as (a, _b, c):
        async with connect(server_text(c)) as client:
            async with client.subscribe("far/>", sync=True):
                async with connect(server_text(a)) as operator:
                    routes = await operator.routes()
        origin = routes["origins"]["c"]
        assert (origin["next_hop"], origin["distance"], origin["reachable"]) == ("b", 2, True)
        assert origin["filters"] == [["far/>", "native"]]
        assert routes["links"].keys() == {"b"}


async def test_a_sync_subscribe_without_peers_is_answered_at_once() -> None:
    async with running_broker() as server, connect(server_text(server)) as client:
        with trio.fail_after(2):
            async with client.subscribe("x", sync=True):
                pass


async def test_a_peer_that_never_acknowledges_turns_a_sync_subscribe_into_an_error() -> None:
    async with running_broker(server_id="a", sync_timeout=0.3, **FAST) as a:
        fake = await peer_hello(a, broker_id="mute")
        welcome = await fake.read_frame()
        assert welcome["type"] == "PEER_WELCOME"
        # Make itself reachable (a two-way link), then never acknowledge anything.
        await fake.send(
            frame(
                {
                    "type": "ROUTE",
                    "origin": "mute",
                    "incarnation": 1,
                    "seq": 1,
                    "snapshot": True,
                    "neighbors": ["a"],
                }
            )
        )
        await wait_for(lambda: reachable(a) == {"mute"})
        async with connect(server_text(a)) as client:
            with pytest.raises(BrokerError) as refused:
                async with client.subscribe("never/acked", sync=True):
                    pass
            assert refused.value.code == "SYNC_TIMEOUT"
        assert a.broker.table.match("never/acked") == frozenset()
        await fake.aclose()


# -- handshake rules ---------------------------------------------------------------------


async def test_a_peer_claiming_the_listeners_own_id_is_refused() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        client = await peer_hello(a, broker_id="a")
        error = await client.read_frame()
        assert (error["type"], error["code"]) == ("ERROR", "BROKER_ID_CLASH")
        await client.aclose()


async def test_a_peer_with_the_wrong_secret_is_refused() -> None:
    async with running_broker(server_id="a", peer_secret="s3cret", **FAST) as a:
        client = await peer_hello(a, secret="guess")
        error = await client.read_frame()
        assert (error["type"], error["code"]) == ("ERROR", "AUTH_FAILED")
        await client.aclose()
        assert a.broker.peering.links == {}


async def test_brokers_with_the_same_secret_link() -> None:
    async with line("a", "b", peer_secret="s3cret") as (a, _b):
        assert reachable(a) == {"b"}


async def test_two_brokers_dialling_each_other_keep_one_link() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        async with running_broker(server_id="b", peers=(server_text(a),), **FAST) as b:
            # a also dials b: a second link between the same pair
            async with running_broker(
                server_id="c", peers=(server_text(a), server_text(b)), **FAST
            ) as c:
                await wait_for(lambda: reachable(c) == {"a", "b"})
                await wait_for(lambda: set(a.broker.peering.links) == {"b", "c"})
                # Every configured dial has its link (a broker dials no one else), so no
                # dial is left that could open a second link between a pair.
                await wait_for(lambda: set(b.broker.peering.links) == {"a", "c"})
                for server in (a, b, c):
                    assert len(server.broker.peering.links) == 2


async def test_a_broker_restarted_under_the_same_id_is_linked_again() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        for _ in range(2):
            async with running_broker(server_id="b", peers=(server_text(a),), **FAST) as b:
                await wait_for(lambda b=b: reachable(b) == {"a"})
            await wait_for(lambda: reachable(a) == set())


# -- observers -----------------------------------------------------------------------------


async def test_an_observer_receives_every_origins_filters_and_is_nobodys_neighbour() -> None:
    async with line("a", "b") as (a, b):
        async with connect(server_text(b)) as client, client.subscribe("seen/>", sync=True):
            observer = await peer_hello(a, broker_id="bridge", role="observer")
            assert (await observer.read_frame())["type"] == "PEER_WELCOME"
            routes = {}
            with trio.fail_after(5):
                while set(routes) != {"a", "b"}:
                    got = await observer.read_until("ROUTE")
                    routes[got["origin"]] = got
            assert routes["b"]["add"] == [["seen/>", "native"]]
            # No nap needed: a registers a link before it sends ROUTE frames on it, so
            # the ROUTEs read above come after any neighbour change the observer caused.
            assert "bridge" not in a.broker.peering.table.origins["a"].neighbors
            await observer.aclose()


async def test_the_first_observers_welcome_digest_already_covers_existing_filters() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        async with connect(server_text(a)) as client, client.subscribe("seen/>"):
            observer = await peer_hello(a, broker_id="bridge", role="observer")
            welcome = await observer.read_frame()
            assert welcome["type"] == "PEER_WELCOME"
            incarnation, seq = welcome["digest"]["a"]
            added = []
            with trio.fail_after(5):
                while True:
                    got = await observer.read_until("ROUTE")
                    added += got["add"]
                    if (got["incarnation"], got["seq"]) >= (incarnation, seq):
                        break
            assert added == [["seen/>", "native"]]
            await observer.aclose()


async def test_an_observer_that_sends_routes_is_disconnected() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        observer = await peer_hello(a, broker_id="bridge", role="observer")
        assert (await observer.read_frame())["type"] == "PEER_WELCOME"
        route = {"type": "ROUTE", "origin": "bridge", "incarnation": 1, "seq": 1}
        await observer.send(frame(route))
        error = await observer.read_until("ERROR")
        assert error["code"] == "NOT_A_PEER"
        await observer.aclose()


# -- events from peers -----------------------------------------------------------------------


async def fake_peer(server: Server, broker_id: str = "p") -> RawClient:
    """A hand-driven broker linked to ``server``; returns once its link is two-way."""
    peer = await peer_hello(server, broker_id=broker_id)
    assert (await peer.read_frame())["type"] == "PEER_WELCOME"
    own = server.broker.server_id
    route = {
        "type": "ROUTE",
        "origin": broker_id,
        "incarnation": 1,
        "seq": 1,
        "snapshot": True,
        "neighbors": [own],
    }
    await peer.send(frame(route))
    await wait_for(lambda: broker_id in reachable(server))
    return peer


def fwd(dests: list[str], **fields: object) -> bytes:
    body = {
        "type": "FWD",
        "topic": "t/x",
        "payload": b"p",
        "msg_id": "m-1",
        "dests": dests,
        "hops": 1,
        "source": "p",
        **fields,
    }
    return frame(msgpack.packb(body, use_bin_type=True))


async def test_a_forwarded_event_with_a_publisher_id_is_delivered_once_however_often_it_comes() -> (
    None
):
    async with running_broker(server_id="a", **FAST) as a:
        peer = await fake_peer(a)
        async with connect(server_text(a)) as client, client.subscribe("t/>") as sub:
            for _ in range(3):
                await peer.send(fwd(["a"], dedup=True, msg_id="pub-7"))
            with trio.fail_after(5):
                first = await sub.get()
            assert first.id == "pub-7"
            assert await quiet(sub)
        assert a.broker.peering.counters.duplicates_dropped == 2
        await peer.aclose()


async def test_a_forwarded_event_past_the_hop_limit_is_dropped_and_counted() -> None:
    async with line("a", "b", hop_limit=2) as (a, b):
        peer = await fake_peer(a)
        await peer.send(fwd(["b"], hops=2))
        await wait_for(lambda: a.broker.peering.counters.hop_limit_dropped == 1)
        assert b.broker.peering.counters.fwd_in == 0
        await peer.aclose()


async def test_an_event_for_an_unreachable_broker_is_dropped_and_counted() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        peer = await fake_peer(a)
        await peer.send(fwd(["ghost"]))
        await wait_for(lambda: a.broker.peering.counters.unreachable_dropped == 1)
        await peer.aclose()


async def test_a_durable_sessions_filter_stays_advertised_while_its_client_is_away(
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    async with line("a") as (a,):
        async with running_broker(
            server_id="b", peers=(server_text(a),), data_dir=str(tmp_path), **FAST
        ) as b:
            await wait_for(lambda: reachable(a) == {"b"})
            async with connect(server_text(b), client_id="svc", durable=True) as client:
                async with client.subscribe("orders/>", sync=True):
                    pass
            # Barrier: b has seen svc go, then a sync SUB on b returns once a has b's route
            # changes up to it, so a withdrawal of orders/> would have reached a by now.
            await wait_for(lambda: b.broker.durable["svc"].connection is None)
            async with connect(server_text(b)) as marker:
                async with marker.subscribe("marker/>", sync=True):
                    pass
            assert a.broker.peering.table.wanting("orders/1") == {"b"}
            async with connect(server_text(a)) as pub:
                await pub.publish("orders/1", b"while away")
            await wait_for(lambda: b.broker.peering.counters.delivered_from_peers == 1)
            async with connect(server_text(b), client_id="svc", durable=True) as client:
                async with client.subscribe("orders/>") as sub:
                    with trio.fail_after(5):
                        message = await sub.get()
            assert message.payload == b"while away"


async def test_shutting_down_a_broker_takes_its_routes_out_of_its_peers_tables() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        async with running_broker(server_id="b", peers=(server_text(a),), **FAST) as b:
            async with connect(server_text(b)) as client, client.subscribe("gone/>", sync=True):
                await wait_for(lambda: a.broker.peering.table.wanting("gone/x") == {"b"})
        await wait_for(lambda: reachable(a) == set())
        split = a.broker.peering.table.split(a.broker.peering.table.wanting("gone/x"))
        assert split.by_hop == {}


async def test_a_link_the_peer_closed_with_an_error_is_forgotten_before_its_socket_closes() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        peer = await fake_peer(a)
        error = {"type": "ERROR", "code": "IDLE_TIMEOUT", "text": "nothing heard"}
        await peer.send(frame(error))  # and keep the socket open
        await wait_for(lambda: "p" not in a.broker.peering.links)
        async with connect(server_text(a)) as client:
            async with client.subscribe("after/close"):  # a route change to flood
                await wait_for(lambda: not a.broker.peering.exchange.dirty)  # flushed
            assert (await client.stats())["connections"] >= 1  # still serving
        await peer.aclose()


async def test_a_broker_that_only_receives_on_a_link_still_pings_so_its_peer_hears_it() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        peer = await fake_peer(a)
        pinged = trio.Event()

        async def watch() -> None:
            while (await peer.read_frame())["type"] not in ("PING", "EOF"):
                pass
            pinged.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with trio.move_on_after(2):
                while not pinged.is_set():  # the broker hears us all the time
                    await peer.send(fwd(["a"]))
                    await trio.sleep(0.03)  # keepalive over wall-clock time: keep talking
            nursery.cancel_scope.cancel()
        assert pinged.is_set()
        await peer.aclose()


async def test_a_peer_that_answers_peer_hello_with_garbage_does_not_stop_the_broker() -> None:
    """A configured peer address whose listener breaks the protocol is logged and dialled
    again later; the broker keeps serving its clients (it used to crash)."""
    answered = 0
    two_answers = trio.Event()

    async def garbage(stream: trio.SocketStream) -> None:
        nonlocal answered
        async with stream:
            await stream.receive_some(65536)  # the PEER_HELLO
            await stream.send_all(frame({"type": "PEER_WELCOME", "version": "one"}))
            answered += 1
            if answered == 2:
                two_answers.set()
            with contextlib.suppress(trio.BrokenResourceError):
                while await stream.receive_some(65536):
                    pass

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, garbage, 0, host="127.0.0.1"))
        host, port = listener.socket.getsockname()[:2]
        async with running_broker(server_id="a", peers=(f"{host}:{port}",), **FAST) as a:
            with trio.fail_after(10):
                await two_answers.wait()  # the dial loop survived the first answer
                async with connect(a.addresses[0]) as client, client.subscribe("t/>") as sub:
                    await client.publish("t/1", b"ok", confirm=True)
                    assert (await sub.get()).payload == b"ok"
        nursery.cancel_scope.cancel()
