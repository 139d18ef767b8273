"""The client library: reconnect, errors, closing."""

from __future__ import annotations

import pytest
import trio

from broker.client import BrokerError, ConnectionLost, connect, parse_server, worth_retrying
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
                while c._connected.is_set():  # the client has no "disconnected" event: poll
                    await trio.sleep(0.01)
            second = await nursery.start(run_broker, BrokerConfig(port=port))
            with trio.fail_after(10):
                await c.publish("r/2", b"after", confirm=True)
                assert (await sub.get()).payload == b"after"
            assert c.reconnects == 1
        second.shutdown()


async def test_a_reconnect_refused_for_good_fails_the_client_instead_of_retrying() -> None:
    """A broker back on the same port with another token answers AUTH_FAILED: waiting will
    not change that, so the client fails with the refusal (it used to retry forever)."""
    async with trio.open_nursery() as nursery:
        first = await nursery.start(run_broker, BrokerConfig(port=0, auth_token="one"))
        port = first.addresses[0][1]
        async with (
            connect(
                ("127.0.0.1", port), credentials={"token": "one"}, reconnect=True,
                backoff=(0.02, 0.2),
            ) as c,
            c.subscribe("r/>") as sub,
        ):  # fmt: skip
            first.shutdown()
            await first.stopped.wait()  # its listener is closed: the port is free again
            second = await nursery.start(run_broker, BrokerConfig(port=port, auth_token="two"))
            with trio.fail_after(10), pytest.raises(BrokerError) as info:
                await sub.get()
            assert info.value.code == "AUTH_FAILED"
            with trio.fail_after(5), pytest.raises(BrokerError) as info:
                await c.publish("r/1", b"late", confirm=True)
            assert info.value.code == "AUTH_FAILED"
            assert c.reconnects == 0
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


# -- confirmed batches ----------------------------------------------------------------------


async def test_a_confirmed_batch_is_delivered_in_order_and_every_message_confirmed(
    address,
) -> None:
    async with connect(address) as c, c.subscribe("b/>") as sub:
        batch = [(f"b/{i % 3}", f"m{i}".encode(), None) for i in range(500)]
        assert await c.publish_confirmed(batch) == [None] * 500
        with trio.fail_after(5):
            got = [(await sub.get()).payload for _ in range(500)]
        assert got == [payload for _topic, payload, _id in batch]


async def test_a_refused_message_in_a_batch_is_reported_in_its_place() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(run_broker, BrokerConfig(port=0, max_payload=100))
        async with connect(server.addresses[0]) as c, c.subscribe("b/>") as sub:
            results = await c.publish_confirmed(
                [("b/1", b"small", None), ("b/2", b"x" * 101, None), ("b/3", b"also", None)]
            )
            assert results[0] is None and results[2] is None
            assert results[1] is not None and results[1].code == "PAYLOAD_TOO_LARGE"
            with trio.fail_after(5):
                assert [(await sub.get()).topic for _ in range(2)] == ["b/1", "b/3"]
        server.shutdown()


async def test_a_repeated_message_id_in_a_batch_is_confirmed_but_delivered_once(address) -> None:
    async with connect(address) as c, c.subscribe("b/>") as sub:
        batch = [("b/1", b"one", "id-1"), ("b/1", b"one", "id-1"), ("b/2", b"two", "id-2")]
        assert await c.publish_confirmed(batch) == [None, None, None]
        with trio.fail_after(5):
            assert [(await sub.get()).payload for _ in range(2)] == [b"one", b"two"]
        stats = await c.stats()
        assert stats["duplicates_dropped"] == 1


async def test_an_empty_confirmed_batch_returns_at_once(address) -> None:
    async with connect(address) as c:
        assert await c.publish_confirmed([]) == []


async def test_a_confirmed_batch_without_reconnect_raises_when_the_broker_goes() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(run_broker, BrokerConfig(port=0))
        async with connect(server.addresses[0]) as c:
            server.shutdown()
            with trio.fail_after(5), pytest.raises((BrokerError, ConnectionLost)):
                while True:  # until the client has seen the broker go
                    # each call is a round trip to the broker: no pacing needed
                    await c.publish_confirmed([("b/1", b"late", None)])


def test_a_read_of_pubacks_resolves_their_waiters_and_leaves_the_rest() -> None:
    """The reader's PUBACK fast path: every id width msgpack has, in the broker's encoding;
    it stops at the first other frame (or partial frame) and returns the rest untouched."""
    from broker.client import Client
    from broker.client.waiters import Waiter as _Waiter
    from broker.wire.codec import encode_frame, encode_puback
    from broker.wire.frames import Pong

    client = Client(
        "127.0.0.1:1", client_id=None, credentials=None, keepalive=30, reconnect=False,
        backoff=(1, 1),
    )  # fmt: skip
    ids = [0, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**64 - 1]
    waiters = {rid: _Waiter(None) for rid in [*ids, 7]}
    client._waiters.update(waiters)
    pong = encode_frame(Pong(id=1))
    rest = len(pong).to_bytes(4, "big") + pong + encode_puback(7)
    data = b"".join(encode_puback(rid) for rid in ids) + rest
    assert client._take_pubacks(data) == rest
    assert all(waiters[rid].resolved for rid in ids)
    assert not waiters[7].resolved and list(client._waiters) == [7]
    partial = encode_puback(7)[:-1]
    assert client._take_pubacks(partial) == partial  # not whole: left to the protocol
    assert client._take_pubacks(b"") == b""


@pytest.mark.parametrize(
    ("error", "worth"),
    [
        (OSError("refused"), True),
        (ConnectionLost("closed during the handshake"), True),
        (trio.BrokenResourceError("reset"), True),
        (BrokerError("SHUTTING_DOWN", "bye"), True),
        (BrokerError("AUTH_FAILED", "bad token"), False),
        (BrokerError("VERSION_MISMATCH", "v9"), False),
        (ValueError("a bug"), False),
    ],
)
def test_only_failures_of_the_moment_are_worth_connecting_again(
    error: BaseException, worth: bool
) -> None:
    assert worth_retrying(error) is worth
