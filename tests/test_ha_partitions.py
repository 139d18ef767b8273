"""Partitions of the hot-spare pair, with real processes: two ``topiary serve`` with
``[ha]`` (witness failover, default timings) and ``topiary witness``, every link between
them through a fault proxy (tests/faultproxy.py) that the test cuts and restores:

- each broker reaches the witness through its own proxy (``witness`` names the proxy);
- a standby dials its partner's replication port (partner port + 1) through a proxy: each
  broker's ``partner`` names a proxy's port - 1, so the link runs through it.

The checks: cut from the witness only, nothing changes while the standby is in sync; cut
from both standby and witness, the primary is fenced (confirmed publishes refused with
FENCED) and the standby promoted, never two primaries writing at once (``topiary ha
status`` on both during the cut); healed, the old primary steps down and the durable
session holds every message confirmed to anyone."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, ConnectionLost, connect
from tests.faultproxy import FaultProxy
from tests.test_cli import TOPIARY, free_port, run, wait_listening
from tests.test_ha_pair import _until

SECRET = "pair-secret"
SESSION = "partition-durable"


class Broker:
    """One broker of the pair, wired to its partner and the witness through proxies."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self.port = free_port()
        self.link_port = free_port()
        self.data_dir = tmp_path / name
        self.data_dir.mkdir()
        self.config = tmp_path / f"{name}.toml"
        self.log = tmp_path / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(
        self, role: str, partner: Broker, partner_link: FaultProxy, witness: FaultProxy
    ) -> None:
        # The standby dials the proxy in front of the partner's link.
        self.config.write_text(
            f'[server]\nport = {self.port}\nhost = "127.0.0.1"\ndata_dir = "{self.data_dir}"\n'
            f'[ha]\nrole = "{role}"\npartner = "{partner.address}"\n'
            f'witness = "127.0.0.1:{witness.port}"\nsecret = "{SECRET}"\n'
            f"link_port = {self.link_port}\npartner_link_port = {partner_link.port}\n"
        )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*TOPIARY, "serve", "--config", str(self.config), "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_listening(self.port, self.proc)

    def logged(self, text: str) -> int:
        return self.log.read_text().count(text)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Cluster:
    """Witness, brokers a (primary at first start) and b, and the four proxies."""

    def __init__(self, tmp_path: Path) -> None:
        port = free_port()
        self.witness = subprocess.Popen(
            [*TOPIARY, "witness", "--port", str(port), "--data-dir", str(tmp_path / "witness"),
             "--secret", SECRET],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_listening(port, self.witness)
        self.a, self.b = Broker("a", tmp_path), Broker("b", tmp_path)
        self.a_witness = FaultProxy(("127.0.0.1", port))
        self.b_witness = FaultProxy(("127.0.0.1", port))
        self.to_a_link = FaultProxy(("127.0.0.1", self.a.link_port))  # b (standby) dials a
        self.to_b_link = FaultProxy(("127.0.0.1", self.b.link_port))  # a (standby) dials b
        self.proxies = [self.a_witness, self.b_witness, self.to_a_link, self.to_b_link]
        for proxy in self.proxies:
            proxy.start()
        self.a.start("primary", self.b, self.to_b_link, self.a_witness)
        self.b.start("standby", self.a, self.to_a_link, self.b_witness)

    @property
    def servers(self) -> list[str]:
        return [self.a.address, self.b.address]

    def close(self) -> None:
        for broker in (self.a, self.b):
            broker.stop()
        for proxy in self.proxies:
            proxy.close()
        self.witness.kill()
        self.witness.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    pair = Cluster(tmp_path)
    yield pair
    pair.close()


async def _status(cluster: Cluster) -> tuple[dict, dict]:
    """``topiary ha status`` on a and b: one JSON line each."""
    done = await trio.to_thread.run_sync(
        partial(run, "ha", "status", "--server", ",".join(cluster.servers))
    )
    a, b = (json.loads(line) for line in done.stdout.splitlines())
    assert a["server"] == cluster.a.address and b["server"] == cluster.b.address
    return a, b


async def _in_sync(cluster: Cluster) -> None:
    await _until(lambda: cluster.a.logged("standby in sync") >= 1, "in sync", 30)
    async with connect(cluster.servers, client_id=SESSION, durable=True) as c:
        async with c.subscribe("ha/>"):
            await c.ping()  # the session holds the filter: it stores from now on


def test_the_primary_cut_from_the_witness_only_goes_on_writing_while_the_standby_is_in_sync(
    cluster: Cluster,
) -> None:
    async def main() -> None:
        await _in_sync(cluster)
        cluster.a_witness.cut()
        async with connect(cluster.a.address) as c:
            # Three leases without the witness (that passage of time is what is tested):
            # the standby's acknowledgements keep the primary writing.
            deadline = trio.current_time() + 3.0
            count = 0
            while trio.current_time() < deadline:
                await c.publish("ha/t", f"m{count}", confirm=True)
                count += 1
                await trio.sleep(0.05)
            assert count > 10
        a, b = await _status(cluster)
        assert a["role"] == "primary" and a["fenced"] is False and a["in_sync"] == 1
        assert a["seconds_since_witness"] > 2.0  # it really was cut off
        assert b["role"] == "standby" and b["election"] == "standby" and b["ha_term"] == 1
        assert cluster.a.logged("fenced") == 0 and cluster.b.logged("candidate") == 0

    trio.run(main)


async def _publish(servers: list[str], tag: str, confirmed: set[str], stop: trio.Event) -> None:
    """Confirmed publishes through the server list until ``stop``, failing over as needed:
    one the fenced primary refuses (FENCED) is sent again to the new primary, so every
    publish is confirmed in the end."""
    async with connect(servers, reconnect=True, reconnect_timeout=30) as p:
        i = 0
        while not stop.is_set():
            await p.publish("ha/t", f"{tag}-{i}", confirm=True)
            confirmed.add(f"{tag}-{i}")
            i += 1


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
                for number in range(2):
                    nursery.start_soon(_publish, cluster.servers, f"p{number}", confirmed, stop)
                await _until(lambda: len(confirmed) > 50, "load", 30)
                cluster.a_witness.cut()
                cluster.to_a_link.cut()
                await _until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
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
                await _until(lambda: a.logged("stepped down") == 1, "stepped down", 30)
                await _until(lambda: b.logged("standby in sync") >= 1, "a follows b", 30)
                stop.set()
        status_a, status_b = await _status(cluster)
        assert status_a["role"] == "standby" and status_a["ha_term"] == 2
        assert status_b["role"] == "primary" and status_b["fenced"] is False
        received: set[str] = set()
        async with (
            connect(cluster.servers, client_id=SESSION, durable=True) as c,
            c.subscribe("ha/>") as sub,
        ):
            with trio.move_on_after(20):
                while not confirmed <= received:
                    received.add((await sub.get()).payload.decode())
        missing = confirmed - received
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"

    trio.run(main)
