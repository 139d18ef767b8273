"""Failover by the witness, with real processes: two ``topiary serve`` with ``[ha]``
(``failover = "witness"``, the default) and ``topiary witness``; kill -9 of the primary
under confirmed load from publishers given both servers: the standby is promoted by the
witness with no signal, and the durable session on it holds every confirmed message."""

from __future__ import annotations

import random
import signal

import pytest
import trio

from broker.client import BrokerError, ConnectionLost, connect
from tests import hakit
from tests.hakit import (
    Node,
    Witness,
    ha_status,
    hold_session,
    missing_from_session,
    publish_for,
    publish_until,
    until,
)

nodes, witness = hakit.nodes, hakit.witness  # fixtures

PUBLISHERS = 4
SESSION = "autofail-durable"


async def _publish(
    servers: list[str], tag: str, n: int, confirmed: set[str], enough: trio.Event, at: int
) -> None:
    """``n`` confirmed publishes through the server list, failing over as needed."""
    async with connect(servers, reconnect=True, reconnect_timeout=30) as p:
        for i in range(n):
            payload = f"{tag}-{i}"
            await p.publish("ha/t", payload, confirm=True)
            confirmed.add(payload)
            if i + 1 == at:
                enough.set()


def test_kill_9_of_the_primary_the_witness_promotes_the_standby_and_nothing_confirmed_is_lost(
    nodes: list[Node], witness: Witness
) -> None:
    rng = random.Random(20)
    a, b = nodes
    servers = [a.address, b.address]
    confirmed: set[str] = set()
    sent: list[int] = []

    async def main() -> None:
        a.start("primary", b, witness.address)
        b.start("standby", a, witness.address)
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        await hold_session(servers, SESSION)
        enough = trio.Event()
        async with trio.open_nursery() as nursery:
            for number in range(PUBLISHERS):
                at = rng.randint(20, 120)
                sent.append(at + 200)
                nursery.start_soon(_publish, servers, f"p{number}", at + 200, confirmed, enough, at)
            with trio.fail_after(30):
                await enough.wait()
            assert a.proc is not None
            a.proc.send_signal(signal.SIGKILL)  # no signal to b: the witness decides
            a.proc.wait(timeout=10)
        assert b.logged("promoted by the witness") == 1
        missing = await missing_from_session(servers, SESSION, confirmed)
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        assert len(confirmed) == sum(sent)  # every publisher got through, on the standby

    trio.run(main)


def test_a_primary_stopped_past_the_failure_timeout_finds_it_was_replaced_and_accepts_no_writes(
    nodes: list[Node], witness: Witness
) -> None:
    a, b = nodes

    async def main() -> None:
        a.start("primary", b, witness.address)
        b.start("standby", a, witness.address)
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        async with connect(a.address) as old:
            await old.publish("ha/t", "before", confirm=True)
            assert a.proc is not None
            a.proc.send_signal(signal.SIGSTOP)
            try:
                await until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
                with trio.fail_after(5):  # queued in the socket while a is stopped
                    sent = old.publish("ha/t", "while-replaced", confirm=True)
                    a.proc.send_signal(signal.SIGCONT)
                    with pytest.raises((BrokerError, ConnectionLost)):
                        await sent
            finally:
                a.proc.send_signal(signal.SIGCONT)
        await until(lambda: a.logged("stepped down") == 1, "stepped down", 30)
        with pytest.raises(BrokerError) as refused:  # a follows b now: its door refuses
            async with connect(a.address):
                pass
        assert refused.value.code == "NOT_PRIMARY"
        async with connect([a.address, b.address]) as c:
            await c.publish("ha/t", "after", confirm=True)  # b writes

    trio.run(main)


def test_the_witness_lost_changes_nothing_while_both_brokers_are_healthy(
    nodes: list[Node], witness: Witness
) -> None:
    a, b = nodes

    async def main() -> None:
        a.start("primary", b, witness.address)
        b.start("standby", a, witness.address)
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        witness.stop()
        async with connect(a.address) as c:
            # Three leases pass without the witness (what is tested is that passage of
            # time): the standby's acknowledgements keep the primary writing.
            assert await publish_for(c, 3.0) > 10
        assert a.logged("fenced") == 0 and a.logged("stepped down") == 0
        assert b.logged("candidate") == 0 and b.logged("promoted") == 0
        primary, standby = await ha_status([a.address, b.address])
        assert primary["role"] == "primary"
        assert primary["ha_term"] == 1 and primary["fenced"] is False
        assert primary["in_sync"] == 1 and primary["lag_records"] >= 0
        assert primary["seconds_since_witness"] > 2.0  # the witness is gone
        assert standby["role"] == "standby"
        assert standby["ha_term"] == 1 and standby["election"] == "standby"
        assert standby["connected"] == "yes" and standby["seq"] >= 0

    trio.run(main)


def test_the_standby_killed_and_restarted_under_load_catches_up_then_a_primary_kill_loses_nothing(
    nodes: list[Node], witness: Witness
) -> None:
    a, b = nodes
    servers = [a.address, b.address]
    confirmed: set[str] = set()

    async def main() -> None:
        a.start("primary", b, witness.address)
        b.start("standby", a, witness.address)
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        await hold_session(servers, SESSION)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for number in range(PUBLISHERS):
                nursery.start_soon(publish_until, servers, f"p{number}", confirmed, stop)
            await until(lambda: len(confirmed) > 100, "load", 30)
            b.stop()  # kill -9 of the standby: the primary confirms alone meanwhile
            during = len(confirmed)
            await until(lambda: len(confirmed) > during + 100, "the primary goes on", 30)
            b.start("standby", a, witness.address)  # its ha-term file: standby of term 1
            await until(lambda: a.logged("standby in sync") >= 2, "caught up", 30)
            # One publish confirmed from now on waited for the restarted standby's ack:
            # it holds everything before it.
            caught_up = len(confirmed)
            await until(lambda: len(confirmed) > caught_up + 20, "load after catching up", 30)
            a.stop()  # kill -9 of the primary right after: the witness promotes b
            await until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
            failed_over = len(confirmed)
            await until(lambda: len(confirmed) > failed_over + 20, "load on b", 30)
            stop.set()
        missing = await missing_from_session(servers, SESSION, confirmed)
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        assert a.logged("fenced") == 0

    trio.run(main)
