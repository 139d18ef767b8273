"""Held writes: what one read's PUBs (or PUBLISHes) queue for an idle subscriber is written
once when the read's frames are all handled, however many turns that takes, and at the
latest every ``HELD_TURNS`` turns of the reader (broker/native/connection.py and
broker/mqtt/connection.py ``_reader``).

Real sockets on 127.0.0.1 against a broker in this process, with a turn so short that it
is always up (every ``turn_frames`` frames end one). The direct writes and the reads are
counted by wrapping the real functions; every MSG is checked, in order, once.
"""

from __future__ import annotations

import pytest
import trio

from broker.core.session import HELD_TURNS
from broker.mqtt import connection as mqtt_connection
from broker.mqtt.codec import encode
from broker.mqtt.outbound import Outbound
from broker.mqtt.packets import Publish, SubAck, Subscribe, Subscription
from broker.native import connection as native_connection
from broker.native.connection import ClientConnection
from tests.conftest import running_broker
from tests.mqttkit import broker_in_thread
from tests.mqttraw import Raw
from tests.wire import RawClient, frame

TURN_FRAMES = 4


def _pubs(start: int, count: int) -> bytes:
    return b"".join(
        frame({"type": "PUB", "topic": "d", "payload": i.to_bytes(4, "big")})
        for i in range(start, start + count)
    )


class Counts:
    """Direct writes and the reads that brought data, counted around the real code."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes = 0
        self.reads = 0
        direct = ClientConnection._direct
        read_now = native_connection._read_now

        def counting_direct(connection: ClientConnection) -> bool:
            self.writes += 1
            return direct(connection)

        def counting_read(fd: int) -> bytes | None:
            data = read_now(fd)
            if data:
                self.reads += 1
            return data

        monkeypatch.setattr(ClientConnection, "_direct", counting_direct)
        monkeypatch.setattr(native_connection, "_read_now", counting_read)

    def reset(self) -> None:
        self.writes = self.reads = 0


async def _read_msgs(sub: RawClient, count: int) -> None:
    """The next ``count`` MSGs, each once, in order, their payloads the PUBs' indexes."""
    with trio.fail_after(30):
        for i in range(count):
            msg = await sub.read_until("MSG")
            assert msg["type"] == "MSG", msg
            assert msg["seq"] == i + 1
            assert msg["payload"] == i.to_bytes(4, "big")


async def _subscribed(address: tuple[str, int]) -> RawClient:
    sub = await RawClient.open(address)
    await sub.send(frame({"type": "SUB", "id": 1, "filter": "d"}))
    assert (await sub.read_until("SUBACK"))["type"] == "SUBACK"
    return sub


async def test_a_read_handled_in_many_turns_is_written_to_a_subscriber_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = TURN_FRAMES * (HELD_TURNS - 1)  # fewer turns than HELD_TURNS: no flush between
    async with running_broker(turn_frames=TURN_FRAMES, turn_time=1e-9) as server:
        address = server.addresses[0]
        counts = Counts(monkeypatch)  # (before the subscriber connects: it binds _direct)
        sub = await _subscribed(address)
        pub = await RawClient.open(address)
        counts.reset()
        yielded = server.broker.counters.turns_yielded
        await pub.send(_pubs(0, count))
        await _read_msgs(sub, count)
        assert server.broker.counters.turns_yielded - yielded >= 1  # it took turns
        assert 1 <= counts.writes <= counts.reads  # one write per read, not per turn
        await pub.aclose()
        await sub.aclose()


async def test_a_subscriber_waits_at_most_held_turns_for_its_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = TURN_FRAMES * HELD_TURNS * 6  # ~6 x HELD_TURNS turns in a read or two
    async with running_broker(turn_frames=TURN_FRAMES, turn_time=1e-9) as server:
        address = server.addresses[0]
        counts = Counts(monkeypatch)  # (before the subscriber connects: it binds _direct)
        sub = await _subscribed(address)
        pub = await RawClient.open(address)
        counts.reset()
        yielded = server.broker.counters.turns_yielded
        await pub.send(_pubs(0, count))
        await _read_msgs(sub, count)
        turns = server.broker.counters.turns_yielded - yielded
        assert turns >= count // TURN_FRAMES - 2 * counts.reads  # (a read ends a turn too)
        # a write every HELD_TURNS turns within a read, and one when a read is handled
        assert turns // HELD_TURNS <= counts.writes <= turns // HELD_TURNS + counts.reads
        await pub.aclose()
        await sub.aclose()


class MqttCounts:
    """The MQTT port's direct writes and the reads that brought data, counted around the
    real code."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes = 0
        self.reads = 0
        direct = Outbound.direct
        receive_from = mqtt_connection.receive_from

        def counting_direct(outbound: Outbound) -> bool:
            self.writes += 1
            return direct(outbound)

        async def counting_read(fd: int) -> bytes:
            data = await receive_from(fd)
            if data:
                self.reads += 1
            return data

        monkeypatch.setattr(Outbound, "direct", counting_direct)
        monkeypatch.setattr(mqtt_connection, "receive_from", counting_read)


def _mqtt_held(monkeypatch: pytest.MonkeyPatch, count: int) -> tuple[MqttCounts, int]:
    """``count`` PUBLISHes in one send to a subscriber that reads every one, in order; the
    counts and the turns the publisher's reader yielded."""
    with broker_in_thread(turn_frames=TURN_FRAMES, turn_time=1e-9) as broker:
        counters = broker.server.broker.counters
        counts = MqttCounts(monkeypatch)  # (before the subscriber connects: it binds direct)
        with Raw(broker.mqtt_port) as sub, Raw(broker.mqtt_port) as pub:
            sub.connect("sub")
            sub.send(Subscribe(1, [Subscription("d", qos=0)]))
            assert isinstance(sub.expect(), SubAck)
            pub.connect("pub")
            counts.writes = counts.reads = 0
            yielded = broker.call(lambda: counters.turns_yielded)
            pub.send_bytes(
                b"".join(encode(Publish("d", i.to_bytes(4, "big")), 5) for i in range(count))
            )
            for i in range(count):
                got = sub.expect()
                assert isinstance(got, Publish) and got.payload == i.to_bytes(4, "big"), got
            turns = broker.call(lambda: counters.turns_yielded) - yielded
    return counts, turns


def test_mqtt_a_read_handled_in_many_turns_is_written_to_a_subscriber_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts, turns = _mqtt_held(monkeypatch, TURN_FRAMES * (HELD_TURNS - 1))
    assert turns >= 1  # it took turns
    assert 1 <= counts.writes <= counts.reads  # one write per read, not per turn


def test_mqtt_a_subscriber_waits_at_most_held_turns_for_its_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = TURN_FRAMES * HELD_TURNS * 6  # ~6 x HELD_TURNS turns in a read or two
    counts, turns = _mqtt_held(monkeypatch, count)
    assert turns >= count // TURN_FRAMES - 2 * counts.reads  # (a read ends a turn too)
    assert turns // HELD_TURNS <= counts.writes <= turns // HELD_TURNS + counts.reads
