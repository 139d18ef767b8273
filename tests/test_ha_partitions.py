"""Partitions of the hot-spare pair, with real processes: two ``topiary serve`` with
``[ha]`` (witness failover, default timings) and ``topiary witness``, every link between
them through a fault proxy (tests/faultproxy.py) that the test cuts and restores:

- each broker reaches the witness through its own proxy (``witness`` names the proxy);
- a standby dials its partner's replication link (``[ha] partner_link_port``) through a
  proxy in front of it.

The checks: cut from the witness only, nothing changes while the standby is in sync; cut
from both standby and witness, the primary is fenced (confirmed publishes refused with
FENCED) and the standby promoted, never two primaries writing at once (``topiary ha
status`` on both during the cut); healed, the old primary steps down and the durable
session holds every message confirmed to anyone."""

from __future__ import annotations

import pytest
import trio

from broker.client import BrokerError, ConnectionLost, connect
from tests import hakit
from tests.hakit import (
    Cluster,
    accepting,
    ha_status,
    hold_session,
    missing_from_session,
    publish_for,
    publish_until,
    until,
)

cluster = hakit.cluster  # fixture

SESSION = "partition-durable"


async def _status(cluster: Cluster) -> tuple[dict, dict]:
    """``topiary ha status`` on a and b: one JSON line each."""
    a, b = await ha_status(cluster.servers)
    return a, b


async def _in_sync(cluster: Cluster) -> None:
    await until(lambda: cluster.a.logged("standby in sync") >= 1, "in sync", 30)
    await hold_session(cluster.servers, SESSION)


def test_the_primary_cut_from_the_witness_only_goes_on_writing_while_the_standby_is_in_sync(
    cluster: Cluster,
) -> None:
    async def main() -> None:
        await _in_sync(cluster)
        cluster.a_witness.cut()
        async with connect(cluster.a.address) as c:
            # Three leases without the witness (that passage of time is what is tested):
            # the standby's acknowledgements keep the primary writing.
            assert await publish_for(c, 3.0) > 10
        a, b = await _status(cluster)
        assert a["role"] == "primary" and a["fenced"] is False and a["in_sync"] == 1
        assert a["seconds_since_witness"] > 2.0  # it really was cut off
        assert b["role"] == "standby" and b["election"] == "standby" and b["ha_term"] == 1
        assert cluster.a.logged("fenced") == 0 and cluster.b.logged("candidate") == 0

    trio.run(main)


def test_the_primary_cut_from_standby_and_witness_is_fenced_the_standby_promoted_and_nothing_lost(
    cluster: Cluster,
) -> None:
    a, b = cluster.a, cluster.b
    confirmed: set[str] = set()

    async def main() -> None:
        await _in_sync(cluster)
        async with connect(a.address) as direct:
            await direct.publish("ha/t", "direct-0", confirm=True)
            confirmed.add("direct-0")
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for tag in ("p0", "p1"):
                    nursery.start_soon(publish_until, cluster.servers, tag, confirmed, stop)
                await until(lambda: len(confirmed) > 50, "load", 30)
                cluster.a_witness.cut()
                cluster.to_a_link.cut()
                await until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
                # Both ask now: a is fenced (its lease ran out before b's vote was granted).
                with pytest.raises((BrokerError, ConnectionLost)) as refused:
                    await direct.publish("ha/t", "direct-fenced", confirm=True)
                if isinstance(refused.value, BrokerError):
                    assert refused.value.code == "FENCED"
                status_a, status_b = await _status(cluster)
                assert status_a["fenced"] is True and status_a["role"] == "fenced"
                assert status_b["role"] == "primary" and status_b["ha_term"] == 2
                assert a.logged("stepped down") == 0  # still cut off: it has heard nothing
                cluster.a_witness.restore()
                cluster.to_a_link.restore()
                await until(lambda: a.logged("stepped down") == 1, "stepped down", 30)
                await until(lambda: b.logged("standby in sync") >= 1, "a follows b", 30)
                stop.set()
        status_a, status_b = await _status(cluster)
        assert status_a["role"] == "standby" and status_a["ha_term"] == 2
        assert status_b["role"] == "primary" and status_b["fenced"] is False
        missing = await missing_from_session(cluster.servers, SESSION, confirmed)
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"

    trio.run(main)


def test_the_standby_cut_from_the_witness_only_changes_nothing_while_the_primary_is_healthy(
    cluster: Cluster,
) -> None:
    async def main() -> None:
        await _in_sync(cluster)
        cluster.b_witness.cut()
        async with connect(cluster.a.address) as c:
            alone = (await c.stats())["ha"]["confirms_alone"]
            # Three leases with the standby cut from the witness (that passage of time is
            # what is tested): the standby hears the primary, so it never asks for a vote.
            assert await publish_for(c, 3.0) > 10
            # every one of them waited for the standby's acknowledgement
            assert (await c.stats())["ha"]["confirms_alone"] == alone
        a, b = await _status(cluster)
        assert a["role"] == "primary" and a["fenced"] is False and a["in_sync"] == 1
        assert a["ha_term"] == 1
        assert b["role"] == "standby" and b["election"] == "standby" and b["ha_term"] == 1
        assert b["connected"] == "yes"
        assert cluster.a.logged("fenced") == 0 and cluster.b.logged("candidate") == 0

    trio.run(main)


def test_the_standby_cut_from_the_primary_only_is_refused_a_vote_and_resynchronises_losing_nothing(
    cluster: Cluster,
) -> None:
    """The witness reaches both. The standby, hearing no primary, asks for a vote and is
    refused (the primary's lease holds); the primary confirms alone under leases asked for
    after it lost the standby (docs/ha.md "Confirming alone"). Healed, the standby catches
    up; then the primary is killed and the promoted standby holds every confirmed message."""
    a, b = cluster.a, cluster.b
    confirmed: set[str] = set()

    async def main() -> None:
        await _in_sync(cluster)
        async with connect(a.address) as direct:
            alone = (await direct.stats())["ha"]["confirms_alone"]
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for tag in ("p0", "p1"):
                    nursery.start_soon(publish_until, cluster.servers, tag, confirmed, stop)
                await until(lambda: len(confirmed) > 50, "load", 30)
                cluster.to_a_link.cut()
                await until(lambda: b.logged('"verdict": "refused"') >= 1, "vote refused", 20)
                during = len(confirmed)
                await until(lambda: len(confirmed) > during + 50, "the primary goes on", 20)
                status_a, status_b = await _status(cluster)  # never two primaries
                assert status_a["role"] == "primary" and status_a["fenced"] is False
                assert status_a["in_sync"] == 0 and status_a["ha_term"] == 1
                assert status_b["role"] == "standby" and status_b["ha_term"] == 1
                with pytest.raises(BrokerError) as refused:
                    async with connect(b.address):
                        pass
                assert refused.value.code == "NOT_PRIMARY"
                assert (await direct.stats())["ha"]["confirms_alone"] > alone
                cluster.to_a_link.restore()
                await until(lambda: a.logged("standby in sync") >= 2, "resynchronised", 30)
                stop.set()
            # A batch confirmed now waited for the standby: it has everything before it.
            alone = (await direct.stats())["ha"]["confirms_alone"]
            await direct.publish("ha/t", "after-heal", confirm=True)
            confirmed.add("after-heal")
            assert (await direct.stats())["ha"]["confirms_alone"] == alone
        assert a.logged("fenced") == 0 and b.logged("promoted") == 0
        a.stop()  # kill -9: what b holds is all there is
        await until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
        await accepting(b.port)
        missing = await missing_from_session(cluster.servers, SESSION, confirmed)
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"

    trio.run(main)
