"""The client library: reconnect, errors, closing."""

from __future__ import annotations

import pytest
import trio

from broker.client import BrokerError, ConnectionLost, connect, parse_server
from broker.config import BrokerConfig
from broker.server import run_broker


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7000", ("127.0.0.1", 7000)),
        ("localhost", ("localhost", 7474)),
        ("[::1]:7001", ("::1", 7001)),
        (("h", 1), ("h", 1)),
    ],
)
def test_parse_server(text, expected) -> None:
    assert parse_server(text) == expected


@pytest.mark.parametrize("text", ["", "h:x", "h:0", ":80", "h:70000"])
def test_parse_server_refuses_bad_addresses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_server(text)


async def test_reconnect_renews_subscriptions_after_a_broker_restart() -> None:
    async with trio.open_nursery() as nursery:
        first = await nursery.start(run_broker, BrokerConfig(port=0))
        port = first.addresses[0][1]
        async with (
            connect(("127.0.0.1", port), reconnect=True, backoff=(0.02, 0.2)) as c,
            c.subscribe("r/>") as sub,
        ):
            await c.publish("r/1", b"before", confirm=True)
            assert (await sub.get()).payload == b"before"
            first.shutdown()
            with trio.fail_after(5):
                while c._connected.is_set():
                    await trio.sleep(0.01)
            second = await nursery.start(run_broker, BrokerConfig(port=port))
            with trio.fail_after(10):
                await c.publish("r/2", b"after", confirm=True)
                assert (await sub.get()).payload == b"after"
            assert c.reconnects == 1
        second.shutdown()


async def test_without_reconnect_a_lost_connection_ends_subscriptions() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(run_broker, BrokerConfig(port=0))
        async with connect(server.addresses[0]) as c, c.subscribe("x") as sub:
            server.shutdown()
            with trio.fail_after(5), pytest.raises(BrokerError) as info:
                await sub.get()
            assert info.value.code == "SHUTTING_DOWN"
            with pytest.raises((BrokerError, ConnectionLost)):
                await c.publish("x", b"late", confirm=True)


async def test_publish_validates_the_topic_before_sending(address) -> None:
    async with connect(address) as c:
        with pytest.raises(ValueError, match="wildcards"):
            await c.publish("a/>", b"")
        await c.ping()
