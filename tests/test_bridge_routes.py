"""The bridge's route watcher: a read-only peer that knows which topics some broker wants.

No Kafka here: the watcher is attached to real brokers in this process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from bridges.routes import RouteWatcher
from broker.client import connect
from broker.server import Server
from tests.conftest import running_broker
from tests.test_peering import FAST, line, server_text, wait_for


@contextlib.asynccontextmanager
async def watching(server: Server, **options: object) -> AsyncIterator[RouteWatcher]:
    watcher = RouteWatcher(server_text(server), observer_id="bridge-test", **options)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        yield watcher
        nursery.cancel_scope.cancel()


async def test_the_table_is_ready_with_every_filter_the_broker_had() -> None:
    async with running_broker(server_id="a", **FAST) as a:
        async with connect(server_text(a)) as client, client.subscribe("beacon/eu/>"):
            async with watching(a) as watcher:
                with trio.fail_after(5):
                    await watcher.ready.wait()
                assert watcher.wants("beacon/eu/de/site1/home/view")
                assert not watcher.wants("beacon/us/ny/site1/home/view")


async def test_a_filter_on_a_broker_two_hops_away_is_wanted() -> None:
    async with line("a", "b", "c") as (a, _b, c):
        async with watching(a) as watcher:
            await wait_for(watcher.ready.is_set)
            assert not watcher.wants("x/1")
            async with connect(server_text(c)) as client, client.subscribe("x/>"):
                await wait_for(lambda: watcher.wants("x/1"))
            await wait_for(lambda: not watcher.wants("x/1"))  # unsubscribed: withdrawn


async def test_a_broker_cut_off_from_the_attached_one_is_not_wanted() -> None:
    async with line("a", "b") as (a, b):
        async with watching(a) as watcher:
            async with connect(server_text(b)) as client, client.subscribe("x/>"):
                await wait_for(lambda: watcher.wants("x/1"))
                b.broker.peering.shutdown()  # b leaves the mesh but keeps its subscriber
                await wait_for(lambda: not watcher.wants("x/1"))


async def test_the_watcher_survives_pings_crossing_in_both_directions() -> None:
    # Both ends PING every 10 ms, so a PONG and a PING are often due at the same moment.
    async with running_broker(server_id="a", peer_keepalive=0.01, peer_flush=0.002) as a:
        async with watching(a, keepalive=0.01) as watcher:
            await wait_for(watcher.ready.is_set)
            # A stress window over wall-clock time (pings every 10 ms from both ends): a
            # crash here would end the test with BusyResourceError.
            await trio.sleep(1.5)
            # On a loaded machine a 30 ms silence can close the link; it must come back.
            await wait_for(lambda: watcher.connected, timeout=10)


async def test_the_watcher_comes_back_after_a_broker_restart_with_a_fresh_table() -> None:
    async with trio.open_nursery() as nursery:
        from broker.config import BrokerConfig
        from broker.server import run_broker

        first = await nursery.start(run_broker, BrokerConfig(port=0, server_id="a", **FAST))
        port = first.addresses[0][1]
        async with connect(server_text(first)) as client, client.subscribe("old/>"):
            watcher = RouteWatcher(f"127.0.0.1:{port}", observer_id="w", backoff_max=0.2)
            await nursery.start(watcher.run)
            await wait_for(lambda: watcher.wants("old/1"))
            first.shutdown()
        await wait_for(lambda: not watcher.connected)
        second = await nursery.start(run_broker, BrokerConfig(port=port, server_id="a", **FAST))
        async with connect(server_text(second)) as client, client.subscribe("new/>"):
            await wait_for(lambda: watcher.wants("new/1"), timeout=10)
            assert not watcher.wants("old/1")
            assert watcher.counters.links_opened == 2
        second.shutdown()
        nursery.cancel_scope.cancel()


async def test_a_wrong_peer_secret_is_refused_and_nothing_is_wanted() -> None:
    async with running_broker(server_id="a", peer_secret="right", **FAST) as a:
        async with watching(a, secret="wrong", backoff_max=0.1) as watcher:
            await wait_for(lambda: watcher.counters.refused > 0)
            assert not watcher.ready.is_set()
            assert not watcher.wants("anything")
