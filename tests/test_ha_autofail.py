"""Failover by the witness, with real processes: two ``topiary serve`` with ``[ha]``
(``failover = "witness"``, the default) and ``topiary witness``; kill -9 of the primary
under confirmed load from publishers given both servers: the standby is promoted by the
witness with no signal, and the durable session on it holds every confirmed message."""

from __future__ import annotations

import json
import random
import signal
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, ConnectionLost, connect
from tests.test_cli import TOPIARY, free_port, run, wait_listening
from tests.test_ha_pair import _until

PUBLISHERS = 4
SESSION = "autofail-durable"
SECRET = "pair-secret"


class Node:
    """One broker of the pair: its ports, data directory and log."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self.port = free_port()
        self.link_port = free_port()
        self.data_dir = tmp_path / name
        self.data_dir.mkdir()
        self.log = tmp_path / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._start_at = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, role: str, partner: Node, witness: str) -> None:
        config = self.data_dir.parent / f"{self.name}.toml"
        # link ports of their own (not port + 1, which nothing reserved for the test)
        config.write_text(
            f'[server]\nport = {self.port}\nhost = "127.0.0.1"\ndata_dir = "{self.data_dir}"\n'
            f'[ha]\nrole = "{role}"\npartner = "{partner.address}"\n'
            f'witness = "{witness}"\nsecret = "{SECRET}"\nlink_port = {self.link_port}\n'
            f"partner_link_port = {partner.link_port}\n"
        )
        with self.log.open("ab") as log:
            self._start_at = self.log.stat().st_size
            self.proc = subprocess.Popen(
                [*TOPIARY, "serve", "--config", str(config), "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_listening(self.port, self.proc)  # (a standby's door listens too)

    def logged(self, text: str) -> int:
        return self.log.read_text()[self._start_at :].count(text)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def witness(tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    proc = subprocess.Popen(
        [*TOPIARY, "witness", "--port", str(port), "--data-dir", str(tmp_path / "witness"),
         "--secret", SECRET, "--log-format", "json"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_listening(port, proc)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def nodes(tmp_path: Path):  # type: ignore[no-untyped-def]
    pair = [Node("a", tmp_path), Node("b", tmp_path)]
    yield pair
    for node in pair:
        node.stop()


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
    nodes: list[Node], witness: str
) -> None:
    rng = random.Random(20)
    a, b = nodes
    servers = [a.address, b.address]
    confirmed: set[str] = set()
    sent: list[int] = []

    async def main() -> None:
        a.start("primary", b, witness)
        b.start("standby", a, witness)
        await _until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        async with connect(servers, client_id=SESSION, durable=True) as c:
            async with c.subscribe("ha/>"):
                await c.ping()  # the session holds the filter: it stores from now on
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
        received: set[str] = set()
        async with (
            connect(servers, client_id=SESSION, durable=True) as c,
            c.subscribe("ha/>") as sub,
        ):
            with trio.move_on_after(20):
                while not confirmed <= received:
                    received.add((await sub.get()).payload.decode())
        missing = confirmed - received
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        assert len(confirmed) == sum(sent)  # every publisher got through, on the standby

    trio.run(main)


def test_a_primary_stopped_past_the_failure_timeout_finds_it_was_replaced_and_accepts_no_writes(
    nodes: list[Node], witness: str
) -> None:
    a, b = nodes

    async def main() -> None:
        a.start("primary", b, witness)
        b.start("standby", a, witness)
        await _until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        async with connect(a.address) as old:
            await old.publish("ha/t", "before", confirm=True)
            assert a.proc is not None
            a.proc.send_signal(signal.SIGSTOP)
            try:
                await _until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
                with trio.fail_after(5):  # queued in the socket while a is stopped
                    sent = old.publish("ha/t", "while-replaced", confirm=True)
                    a.proc.send_signal(signal.SIGCONT)
                    with pytest.raises((BrokerError, ConnectionLost)):
                        await sent
            finally:
                a.proc.send_signal(signal.SIGCONT)
        await _until(lambda: a.logged("stepped down") == 1, "stepped down", 30)
        with pytest.raises(BrokerError) as refused:  # a follows b now: its door refuses
            async with connect(a.address):
                pass
        assert refused.value.code == "NOT_PRIMARY"
        async with connect([a.address, b.address]) as c:
            await c.publish("ha/t", "after", confirm=True)  # b writes

    trio.run(main)


def test_the_witness_lost_changes_nothing_while_both_brokers_are_healthy(
    nodes: list[Node], tmp_path: Path
) -> None:
    a, b = nodes
    port = free_port()
    witness = subprocess.Popen(
        [*TOPIARY, "witness", "--port", str(port), "--data-dir", str(tmp_path / "witness"),
         "--secret", SECRET],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_listening(port, witness)

    async def main() -> None:
        a.start("primary", b, f"127.0.0.1:{port}")
        b.start("standby", a, f"127.0.0.1:{port}")
        await _until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        witness.kill()
        witness.wait(timeout=10)
        async with connect(a.address) as c:
            # Three leases pass without the witness (what is tested is that passage of
            # time): the standby's acknowledgements keep the primary writing.
            deadline = trio.current_time() + 3.0
            count = 0
            while trio.current_time() < deadline:
                await c.publish("ha/t", f"m{count}", confirm=True)
                count += 1
                await trio.sleep(0.05)
            assert count > 10
        assert a.logged("fenced") == 0 and a.logged("stepped down") == 0
        assert b.logged("candidate") == 0 and b.logged("promoted") == 0
        status = await trio.to_thread.run_sync(
            partial(run, "ha", "status", "--server", f"{a.address},{b.address}")
        )
        assert status.returncode == 0, status.stderr
        primary, standby = (json.loads(line) for line in status.stdout.splitlines())
        assert primary["server"] == a.address and primary["role"] == "primary"
        assert primary["ha_term"] == 1 and primary["fenced"] is False
        assert primary["in_sync"] == 1 and primary["lag_records"] >= 0
        assert primary["seconds_since_witness"] > 2.0  # the witness is gone
        assert standby["server"] == b.address and standby["role"] == "standby"
        assert standby["ha_term"] == 1 and standby["election"] == "standby"
        assert standby["connected"] == "yes" and standby["seq"] >= 0

    try:
        trio.run(main)
    finally:
        witness.kill()
        witness.wait(timeout=10)
