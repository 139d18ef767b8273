"""A hot-spare pair in the mesh and behind the Kafka bridge, with real processes: two
``topiary serve`` with ``[ha]`` and ``topiary witness`` (as tests/test_ha_autofail.py),
a third broker C peered with the pair through one entry listing both brokers, and a
bridge given both as its server list. kill -9 of the primary: C sees the pair's one
broker id come back from the promoted standby (its routes replaced, one entry), and
the bridge keeps publishing into the pair."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from bridges.tansu import Tansu
from broker.client import Client, connect
from broker.ha.pairid import pair_id
from tests.bridgekit import beacon, bridge_config, json_values, produce, running_bridge, wait_until
from tests.hakit import accepting, until
from tests.test_cli import TOPIARY, free_port, wait_listening

SECRET = "mesh-pair-secret"
#: Quick links for a test: PING after 0.3 s of silence, redial within 0.3 s.
PEERING = "keepalive = 0.3\nflush = 0.005\nbackoff_max = 0.3\n"


class Proc:
    """One ``topiary serve``: its ports, data directory, config and log."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self.port = free_port()
        self.link_port = free_port()
        self.data_dir = tmp_path / name
        self.data_dir.mkdir()
        self.log = tmp_path / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, config: str) -> None:
        path = self.data_dir.parent / f"{self.name}.toml"
        path.write_text(
            f'[server]\nport = {self.port}\nhost = "127.0.0.1"\ndata_dir = "{self.data_dir}"\n'
            + config
        )
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*TOPIARY, "serve", "--config", str(path), "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_listening(self.port, self.proc)

    def start_in_pair(self, role: str, partner: Proc, witness: str, extra: str = "") -> None:
        self.start(
            f'[ha]\nrole = "{role}"\npartner = "{partner.address}"\nwitness = "{witness}"\n'
            f'secret = "{SECRET}"\nlink_port = {self.link_port}\n'
            f"partner_link_port = {partner.link_port}\n" + extra
        )

    def logged(self, text: str) -> int:
        return self.log.read_text().count(text)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [*TOPIARY, "witness", "--port", str(port), "--data-dir", str(tmp_path / "witness"),
         "--secret", SECRET],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_listening(port, proc)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[tuple[Proc, Proc, Proc]]:
    started = (Proc("a", tmp_path), Proc("b", tmp_path), Proc("c", tmp_path))
    yield started
    for proc in started:
        proc.kill()


async def _origin(client: Client, origin: str, flt: str | None = None) -> dict[str, Any]:
    """Wait (bounded) until ``client``'s broker reaches ``origin`` (with ``flt`` among its
    filters, if given); its entry in the route table."""
    with trio.fail_after(15):
        while True:  # another process's table: poll it
            entry = (await client.routes())["origins"].get(origin)
            wanted = entry is not None and (flt is None or [flt, "native"] in entry["filters"])
            if wanted and entry["reachable"]:  # type: ignore[index]
                return entry  # type: ignore[return-value]
            await trio.sleep(0.05)


async def _payload(sub: Any) -> str:
    with trio.fail_after(10):
        return (await sub.get()).payload.decode()  # type: ignore[no-any-return]


def test_a_peer_of_the_pair_follows_the_primary_through_a_kill_9_with_one_entry_for_it(
    procs: tuple[Proc, Proc, Proc], witness: str
) -> None:
    a, b, c = procs
    pair = pair_id(SECRET)  # neither broker sets server_id: the pair's id is derived
    to_c = f'[peering]\npeers = ["{c.address}"]\n{PEERING}'

    async def main() -> None:
        a.start_in_pair("primary", b, witness, to_c)
        b.start_in_pair("standby", a, witness, to_c)
        c.start(f'server_id = "c"\n[peering]\npeers = ["{a.address},{b.address}"]\n{PEERING}')
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        async with connect(c.address) as at_c, at_c.subscribe("mesh/>") as sub_c:
            before = await _origin(at_c, pair)
            async with connect(a.address) as at_a:
                await _origin(at_a, "c", "mesh/>")  # the primary has C's filter
                await at_a.publish("mesh/x", "from-a", confirm=True)
            assert await _payload(sub_c) == "from-a"
            stats = (await at_c.stats())["peering"]
            assert list(stats["links"]) == [pair]
            assert stats["links_refused"] == 0  # the standby never dialled C: it has no mesh

            a.kill()
            await until(lambda: b.logged("promoted by the witness") == 1, "promoted", 20)
            await accepting(b.port)  # (its door refuses until it serves)
            async with connect([a.address, b.address]) as at_b:
                after = await _origin(at_c, pair)
                assert after["incarnation"] > before["incarnation"]  # the same id, replaced
                routes = await at_c.routes()
                assert sorted(routes["origins"]) == sorted(["c", pair])  # one entry
                assert list((await at_c.stats())["peering"]["links"]) == [pair]

                await _origin(at_b, "c", "mesh/>")  # C's routes propagated to b again
                await at_b.publish("mesh/x", "from-b", confirm=True)
                assert await _payload(sub_c) == "from-b"

                async with at_b.subscribe("back/>", sync=True) as sub_b:  # acked by C
                    await at_c.publish("back/x", "from-c", confirm=True)
                    assert await _payload(sub_b) == "from-c"

    trio.run(main)


def _paced(numbers: range, interval: float) -> Iterator[bytes]:
    """Beacon values, one every ``interval`` seconds (a steady stream into Kafka)."""
    for value in json_values(beacon(i) for i in numbers):
        time.sleep(interval)  # pacing a producer thread, not synchronising the test
        yield value


async def test_the_bridge_keeps_publishing_into_the_pair_through_a_kill_9_of_the_primary(
    procs: tuple[Proc, Proc, Proc], witness: str, tansu: Tansu, topic_name: str
) -> None:
    a, b, _c = procs
    servers = [a.address, b.address]
    session = "bridge-durable"
    a.start_in_pair("primary", b, witness)
    b.start_in_pair("standby", a, witness)
    await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
    async with connect(servers, client_id=session, durable=True) as client:
        async with client.subscribe("beacon/>"):
            await client.ping()  # the session stores from now on, and its filter is wanted
    tansu.create_topic(topic_name, 2)
    await trio.to_thread.run_sync(
        lambda: produce(tansu, topic_name, json_values(beacon(i) for i in range(200)))
    )
    config = bridge_config(  # the server list as a TOML list: [broker] server = [A, B]
        tansu, a.address, topic_name, broker={"server": servers}, bridge={"backoff_max": 0.3}
    )
    assert config.server == f"{a.address},{b.address}"
    stream = threading.Thread(
        target=produce, args=(tansu, topic_name, _paced(range(200, 800), 0.002)), daemon=True
    )
    async with running_bridge(config) as bridge:
        await wait_until(lambda: bridge.counters.published >= 200, what="first records")
        stream.start()
        await wait_until(lambda: bridge.counters.published >= 400, what="the stream flowing")
        await trio.to_thread.run_sync(a.kill)  # mid-stream
        await trio.to_thread.run_sync(stream.join, 30)
        await wait_until(lambda: bridge.counters.published >= 800, 20, "every record")
        watcher = bridge.watcher  # attached again, to b (its table renewed meanwhile)
        await wait_until(lambda: watcher.connected and watcher.counters.links_opened >= 2)
        assert watcher.address == (b.address.split(":")[0], b.port)
    assert b.logged("promoted by the witness") == 1
    got: set[int] = set()
    async with (
        connect(servers, client_id=session, durable=True) as client,
        client.subscribe("beacon/>") as sub,
    ):
        with trio.move_on_after(20):
            while len(got) < 800:
                got.add(json.loads((await sub.get()).payload)["n"])
    assert sorted(set(range(800)) - got) == []
