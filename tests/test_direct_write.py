"""Direct writes (``Session.direct``): what a read's PUBs queue for an idle subscriber is
written by the publisher's reader in one non-blocking send, and when the socket takes only
part of it the writer sends the rest first, from where it stopped: every MSG arrives whole,
once, in order."""

from __future__ import annotations

import time

import pytest
import trio

from broker.mqtt.codec import encode
from broker.mqtt.outbound import Outbound
from broker.mqtt.packets import Publish, SubAck, Subscribe, Subscription
from broker.native.connection import ClientConnection
from tests.mqttkit import broker_in_thread
from tests.mqttraw import Raw
from tests.wire import RawClient, frame

SIZE = 4096
COUNT = 2001  # 8 MiB in all: within the outbound bounds, past any socket buffer
PER_READ = 50


def _pub(i: int) -> bytes:
    payload = i.to_bytes(4, "big") * (SIZE // 4)
    return frame({"type": "PUB", "topic": "d", "payload": payload})


async def test_direct_writes_keep_every_msg_whole_and_in_order(
    address: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"all": 0, "partial": 0}
    direct = ClientConnection._direct

    def counting(self: ClientConnection) -> bool:
        calls["all"] += 1
        done = direct(self)
        if self._unsent:
            calls["partial"] += 1
        return done

    monkeypatch.setattr(ClientConnection, "_direct", counting)
    sub = await RawClient.open(address)
    await sub.send(frame({"type": "SUB", "id": 1, "filter": "d"}))
    assert (await sub.read_until("SUBACK"))["type"] == "SUBACK"
    pub = await RawClient.open(address)
    # One message first, the subscriber reading: written directly, whole.
    await pub.send(_pub(0))
    first = await sub.read_until("MSG")
    assert first["seq"] == 1 and first["payload"] == _pub(0)[-SIZE:]
    assert calls["all"] >= 1 and calls["partial"] == 0
    # Then many while the subscriber reads nothing: the socket fills mid-write.
    for start in range(1, COUNT, PER_READ):
        await pub.send(b"".join(_pub(i) for i in range(start, min(start + PER_READ, COUNT))))
        await trio.sleep(0.002)  # a read each: the subscriber's writer parks between them
    with trio.fail_after(30):
        for i in range(1, COUNT):
            msg = await sub.read_until("MSG")
            assert msg["type"] == "MSG", msg
            assert msg["seq"] == i + 1
            assert msg.get("discarded", 0) == 0
            assert msg["payload"] == i.to_bytes(4, "big") * (SIZE // 4)
    assert calls["partial"] >= 1  # the writer finished a direct write
    await pub.aclose()
    await sub.aclose()


@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_direct_writes_keep_every_publish_whole_and_in_order(
    version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"all": 0, "partial": 0}
    direct = Outbound.direct

    def counting(self: Outbound) -> bool:
        calls["all"] += 1
        done = direct(self)
        if self._unsent:
            calls["partial"] += 1
        return done

    monkeypatch.setattr(Outbound, "direct", counting)

    def publish(i: int) -> bytes:
        return encode(Publish("d", i.to_bytes(4, "big") * (SIZE // 4)), version)

    with broker_in_thread() as broker, Raw(broker.mqtt_port, version) as sub:
        sub.connect("sub")
        sub.send(Subscribe(1, [Subscription("d", qos=0)]))
        assert isinstance(sub.expect(), SubAck)
        with Raw(broker.mqtt_port, version) as pub:
            pub.connect("pub")
            pub.send_bytes(publish(0))
            first = sub.expect()
            assert isinstance(first, Publish) and first.payload == bytes(SIZE)
            assert calls["all"] >= 1 and calls["partial"] == 0
            for start in range(1, COUNT, PER_READ):  # the subscriber reads nothing meanwhile
                pub.send_bytes(b"".join(publish(i) for i in range(start, start + PER_READ)))
                time.sleep(0.002)
            for i in range(1, COUNT):
                got = sub.expect()
                assert isinstance(got, Publish), got
                assert got.payload == i.to_bytes(4, "big") * (SIZE // 4)
    assert calls["partial"] >= 1  # the writer finished a direct write
