"""A hot-spare pair as real processes: ``topiary serve`` twice with ``[ha]`` (manual
failover), confirmed load from several publishers, kill -9 of the primary, SIGUSR1 to the
standby, and an exact check of what the durable session holds on the promoted broker.
The killed broker comes back as the standby of the new primary (a snapshot) and the next
round kills that primary in turn."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import trio
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties

from broker.client import BrokerError, ConnectionLost, connect
from tests.test_crash import free_port

ROUNDS = 3
PUBLISHERS = 4
SESSION = "ha-durable"


@dataclass
class Node:
    name: str
    port: int
    mqtt_port: int
    link_port: int  # its own (a pair on one host cannot share one)
    data_dir: Path
    log: Path
    proc: subprocess.Popen | None = None
    starts: list[int] = field(default_factory=list)

    def config(self, role: str, partner: Node) -> Path:
        path = self.data_dir.parent / f"{self.name}.toml"
        path.write_text(
            f'[server]\nport = {self.port}\nhost = "127.0.0.1"\ndata_dir = "{self.data_dir}"\n'
            f'[mqtt]\nlisten = "127.0.0.1:{self.mqtt_port}"\n'
            f'[ha]\nrole = "{role}"\npartner = "127.0.0.1:{partner.port}"\n'
            f'witness = "127.0.0.1:1"\nsecret = "pair-secret"\nfailover = "manual"\n'
            f"link_port = {self.link_port}\npartner_link_port = {partner.link_port}\n"
        )
        return path

    def start(self, role: str, partner: Node) -> None:
        config = self.config(role, partner)
        with self.log.open("ab") as log:
            self.starts.append(self.log.stat().st_size)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker.cli", "serve", "--config", str(config),
                 "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait_listening(self.port, self.proc)

    def logged(self, text: str) -> int:
        """How often ``text`` is in this run's log (since the last start)."""
        return self.log.read_text()[self.starts[-1] :].count(text)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _wait_listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc.poll() is not None:
                raise AssertionError("the broker exited at start-up") from None
            time.sleep(0.05)  # a real process: poll its port (bounded) until it listens
    raise AssertionError("the broker did not start")


async def _until(check, what: str, seconds: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(seconds):
        while not check():
            await trio.sleep(0.05)  # polling a log file of another process (bounded)
    assert check(), what


async def _accepting(port: int) -> None:
    """Wait (bounded) until ``port`` serves clients (a promoted standby's door is gone)."""
    with trio.fail_after(20):
        while True:
            try:
                async with connect(("127.0.0.1", port)) as c:
                    await c.ping()
                    return
            except (BrokerError, ConnectionLost, OSError, trio.BrokenResourceError):
                await trio.sleep(0.05)


async def _publish(port: int, tag: str, confirmed: set[str], enough: trio.Event, n: int) -> None:
    try:
        async with connect(("127.0.0.1", port)) as p:
            for i in range(100_000):
                payload = f"{tag}-{i}"
                await p.publish("ha/t", payload, confirm=True)
                confirmed.add(payload)
                if i + 1 == n:
                    enough.set()
    except Exception:
        return  # the primary was killed


@pytest.fixture
def nodes(tmp_path: Path):  # type: ignore[no-untyped-def]
    pair = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        pair.append(
            Node(
                name,
                free_port(),
                free_port(),
                free_port(),
                tmp_path / name,
                tmp_path / f"{name}.log",
            )
        )
    yield pair
    for node in pair:
        node.stop()


def test_the_standby_refuses_clients_and_names_the_primary(nodes: list[Node]) -> None:
    a, b = nodes
    a.start("primary", b)
    b.start("standby", a)

    async def native() -> None:
        with pytest.raises(BrokerError) as refused:
            async with connect(("127.0.0.1", b.port)):
                pass
        assert refused.value.code == "NOT_PRIMARY"
        assert f"127.0.0.1:{a.port}" in refused.value.text

    trio.run(native)
    # paho reports 3.1.1's return code 3 (Server unavailable) as the 5.0 code 0x88
    for version, expected in ((mqtt.MQTTv5, 0x9C), (mqtt.MQTTv311, 0x88)):
        got: list[tuple[int, object]] = []
        client = mqtt.Client(CallbackAPIVersion.VERSION2, "door", protocol=version)
        client.on_connect = lambda _c, _u, _f, rc, props, got=got: got.append((rc.value, props))
        client.connect("127.0.0.1", b.mqtt_port)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            client.loop(0.1)
        client.disconnect()
        assert got and got[0][0] == expected
        if version == mqtt.MQTTv5:
            props = got[0][1]
            assert isinstance(props, Properties)
            assert props.ServerReference == f"127.0.0.1:{a.port}"


def test_kill_9_of_the_primary_loses_no_confirmed_message_after_promotion(
    nodes: list[Node],
) -> None:
    rng = random.Random(20)
    confirmed: set[str] = set()

    async def main() -> None:
        primary, standby = nodes
        primary.start("primary", standby)
        async with connect(("127.0.0.1", primary.port), client_id=SESSION, durable=True) as c:
            async with c.subscribe("ha/>"):
                await c.ping()  # the session holds the filter: it stores from now on
        for round_no in range(ROUNDS):
            standby.start("standby", primary)
            await _until(lambda p=primary: p.logged("standby in sync") >= 1, "in sync")
            enough = trio.Event()
            with trio.CancelScope() as load:
                async with trio.open_nursery() as nursery:
                    for number in range(PUBLISHERS):
                        tag = f"r{round_no}-p{number}"
                        kill_after = rng.randint(20, 120)
                        nursery.start_soon(
                            _publish, primary.port, tag, confirmed, enough, kill_after
                        )
                    with trio.fail_after(30):
                        await enough.wait()
                    assert primary.proc is not None
                    primary.proc.send_signal(signal.SIGKILL)
                    primary.proc.wait(timeout=10)
                    load.deadline = trio.current_time() + 5
            assert standby.proc is not None
            standby.proc.send_signal(signal.SIGUSR1)
            await _accepting(standby.port)
            primary, standby = standby, primary
        # the last promoted broker holds the session: read it all back
        received: set[str] = set()
        async with (
            connect(("127.0.0.1", primary.port), client_id=SESSION, durable=True) as c,
            c.subscribe("ha/>") as sub,
        ):
            with trio.move_on_after(20):
                while not confirmed <= received:
                    received.add((await sub.get()).payload.decode())
        missing = confirmed - received
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        assert len(confirmed) >= ROUNDS * 20

    trio.run(main)
