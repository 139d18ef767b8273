"""A hot-spare pair as real processes: ``topiary serve`` twice with ``[ha]`` (manual
failover), confirmed load from several publishers, kill -9 of the primary, SIGUSR1 to the
standby, and an exact check of what the durable session holds on the promoted broker.
The killed broker comes back as the standby of the new primary (a snapshot) and the next
round kills that primary in turn."""

from __future__ import annotations

import random
import signal
import time

import paho.mqtt.client as mqtt
import pytest
import trio
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties

from broker.client import BrokerError, connect
from tests import hakit
from tests.hakit import Node, accepting, hold_session, missing_from_session, until

nodes = hakit.nodes  # fixture

ROUNDS = 3
PUBLISHERS = 4
SESSION = "ha-durable"
NO_WITNESS = "127.0.0.1:1"  # manual failover: never dialled


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


def test_the_standby_refuses_clients_and_names_the_primary(nodes: list[Node]) -> None:
    a, b = nodes
    a.start("primary", b, NO_WITNESS, failover="manual")
    b.start("standby", a, NO_WITNESS, failover="manual")

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
        primary.start("primary", standby, NO_WITNESS, failover="manual")
        await hold_session([primary.address], SESSION)
        for round_no in range(ROUNDS):
            standby.start("standby", primary, NO_WITNESS, failover="manual")
            await until(lambda p=primary: p.logged("standby in sync") >= 1, "in sync")
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
            await accepting(standby.port)
            primary, standby = standby, primary
        # the last promoted broker holds the session: read it all back
        missing = await missing_from_session([primary.address], SESSION, confirmed)
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        assert len(confirmed) >= ROUNDS * 20

    trio.run(main)
