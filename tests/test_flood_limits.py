"""Limits against floods: each refuses with its protocol's code, is counted, and leaves the
other clients alone.

Native clients share the test's trio loop with the broker, so the rate tests run on a frozen
``MockClock`` and move time by hand: a bucket refills exactly when the test says. MQTT tests
use paho-mqtt (and the raw client where the exact 3.1.1 code matters) against a broker in a
thread; their rates are so slow (one token per 1,000 s) that nothing refills during a test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from broker.client import BrokerError, connect
from broker.config import ConfigError, build_config
from broker.mqtt import reasons as R
from broker.mqtt.packets import Publish, SubAck, Subscribe, Subscription
from broker.security.floods import TokenBucket, burst_of
from broker.server import Server
from tests.conftest import running_broker
from tests.mqttkit import Paho, Running, broker_in_thread
from tests.mqttraw import Raw
from tests.test_http import get, http_address
from tests.test_peering import peer_hello, server_text
from tests.wire import RawClient, frame

SLOW = 0.001  # tokens per second: nothing refills within a test


def refused(server: Server) -> dict[str, int]:
    return dict(server.broker.counters.limit_refused)


# -- the token bucket ----------------------------------------------------------------------

GAPS = st.lists(st.floats(min_value=0, max_value=3, allow_nan=False), max_size=60)


@given(
    rate=st.floats(min_value=0.1, max_value=100),
    burst=st.integers(min_value=1, max_value=20),
    gaps=GAPS,
)
def test_a_bucket_never_lets_more_through_than_its_burst_plus_its_rate(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate, burst, 0.0)
    now = 0.0
    taken = 0
    for gap in gaps:
        now += gap
        taken += bucket.take(now)
        assert taken <= burst + rate * now + 1e-9


@given(
    rate=st.floats(min_value=0.1, max_value=100),
    burst=st.integers(min_value=1, max_value=20),
    gaps=GAPS,
)
def test_a_bucket_lets_through_whatever_keeps_to_its_rate(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate, burst, 0.0)
    now = 0.0
    for gap in gaps:
        now += max(gap, 1.0 / rate) * (1 + 1e-9)
        assert bucket.take(now)


def test_a_bucket_starts_full_and_a_burst_of_zero_means_one_seconds_worth() -> None:
    assert burst_of(50.0, 0) == 50.0
    assert burst_of(0.5, 0) == 1.0
    assert burst_of(50.0, 7) == 7.0
    bucket = TokenBucket(10.0, 3, 100.0)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(100.25)  # a quarter of a second at 10 per second: a token again


# -- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_connections = -1", "max_connections must be in 0..1000000000"),
        ("connection_rate = -0.5", "connection_rate must be in [0, 1e9]"),
        ("publish_rate = nan", "publish_rate must be in [0, 1e9]"),
        ("publish_burst = -2", "publish_burst must be in"),
        ("max_subscriptions = 1.5", "max_subscriptions must be int"),
        ("connection_rate = true", "connection_rate must be int or float"),
    ],
)
def test_a_bad_limit_stops_start_up_with_one_line_naming_it(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "topiary.toml"
    path.write_text(f"[limits]\n{line}\n")
    with pytest.raises(ConfigError) as bad:
        build_config(path)
    assert message in str(bad.value)


def test_the_limits_are_read_from_the_limits_table(tmp_path: Path) -> None:
    path = tmp_path / "topiary.toml"
    path.write_text(
        "[limits]\nmax_connections = 500\nconnection_rate = 50\nconnection_burst = 100\n"
        "publish_rate = 1000.0\npublish_burst = 2000\nmax_subscriptions = 10\n"
    )
    config = build_config(path)
    assert (config.max_connections, config.connection_rate, config.connection_burst) == (
        500,
        50,
        100,
    )
    assert (config.publish_rate, config.publish_burst, config.max_subscriptions) == (
        1000.0,
        2000,
        10,
    )


# -- native clients ------------------------------------------------------------------------


async def test_a_connection_past_max_connections_is_refused_and_the_others_carry_on() -> None:
    async with running_broker(max_connections=2) as server:
        address = server_text(server)
        async with connect(address) as first, connect(address) as second:
            with pytest.raises(BrokerError) as over:
                async with connect(address):
                    pass
            assert over.value.code == "LIMIT_EXCEEDED"
            assert "max_connections" in str(over.value)
            async with first.subscribe("still/>") as sub:
                await second.publish("still/here", b"x", confirm=True)
                with trio.fail_after(5):
                    assert (await sub.get()).payload == b"x"
            assert refused(server) == {"max_connections": 1}
        # both gone: room again (their server side ends after the client closes)
        with trio.fail_after(5):
            while server.broker.guard.connections:
                await trio.sleep(0.01)  # the connections' own tasks end: no event to wait on
        async with connect(address) as third:
            await third.publish("x", b"", confirm=True)


async def test_a_peer_link_is_not_refused_by_the_client_connection_limit() -> None:
    async with running_broker(server_id="a", max_connections=1) as server:
        async with connect(server_text(server)):
            fake = await peer_hello(server, broker_id="b")
            assert (await fake.read_frame())["type"] == "PEER_WELCOME"
            await fake.aclose()


async def test_new_connections_past_the_rate_are_refused_until_the_bucket_refills(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with running_broker(connection_rate=1, connection_burst=2) as server:
        address = server_text(server)
        async with connect(address), connect(address):
            with pytest.raises(BrokerError) as over:
                async with connect(address):
                    pass
            assert over.value.code == "RATE_LIMITED"
            mock_clock.jump(1.0)
            async with connect(address) as later:
                await later.publish("x", b"", confirm=True)
        assert refused(server) == {"connection_rate": 1}


async def test_a_pub_past_the_publish_rate_is_refused_and_the_connection_stays(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with running_broker(publish_rate=1, publish_burst=3) as server:
        async with connect(server_text(server)) as watcher, connect(server_text(server)) as pub:
            async with watcher.subscribe("rate/>") as sub:
                for n in range(3):
                    await pub.publish(f"rate/{n}", b"", confirm=True)
                with pytest.raises(BrokerError) as over:
                    await pub.publish("rate/3", b"", confirm=True)
                assert over.value.code == "RATE_LIMITED"
                mock_clock.jump(1.0)
                await pub.publish("rate/4", b"", confirm=True)
                with trio.fail_after(5):
                    topics = [(await sub.get()).topic for _ in range(4)]
        # rate/4 came after rate/3 would have: its arrival shows rate/3 was never routed
        assert topics == ["rate/0", "rate/1", "rate/2", "rate/4"]
        assert refused(server) == {"publish_rate": 1}


async def test_the_publish_rate_is_per_connection() -> None:
    async with running_broker(publish_rate=SLOW, publish_burst=1) as server:
        async with connect(server_text(server)) as one, connect(server_text(server)) as two:
            await one.publish("a", b"", confirm=True)
            await two.publish("b", b"", confirm=True)
            with pytest.raises(BrokerError):
                await one.publish("a", b"", confirm=True)


async def test_a_sub_past_max_subscriptions_is_refused_and_nothing_is_subscribed() -> None:
    async with running_broker(max_subscriptions=2) as server:
        async with connect(server_text(server)) as client:
            async with client.subscribe("a"), client.subscribe("b") as b:
                with pytest.raises(BrokerError) as over:
                    async with client.subscribe("c"):
                        pass
                assert over.value.code == "LIMIT_EXCEEDED"
                assert server.broker.table.match("c") == frozenset()
                await b.unsubscribe()
                async with client.subscribe("c"):  # room again
                    pass
        assert refused(server) == {"max_subscriptions": 1}


async def test_pipelined_subs_past_the_limit_are_each_refused_in_order() -> None:
    async with running_broker(max_subscriptions=2) as server:
        client = await RawClient.open(server.addresses[0])
        subs = b"".join(frame({"type": "SUB", "id": n, "filter": f"f/{n}"}) for n in range(1, 5))
        await client.send(subs)
        replies = [await client.read_frame() for _ in range(4)]
        assert [(r["type"], r.get("id", r.get("ref"))) for r in replies] == [
            ("SUBACK", 1),
            ("SUBACK", 2),
            ("ERROR", 3),
            ("ERROR", 4),
        ]
        assert {r.get("code") for r in replies[2:]} == {"LIMIT_EXCEEDED"}
        await client.send(frame({"type": "PING", "id": 9}))  # the connection is still served
        assert (await client.read_frame())["type"] == "PONG"
        assert server.broker.table.match("f/3") == frozenset()
        await client.aclose()


async def test_refusals_show_in_stats_and_metrics_by_limit() -> None:
    async with running_broker(max_subscriptions=1, http_listen="127.0.0.1:0") as server:
        async with connect(server_text(server)) as client, client.subscribe("a"):
            with pytest.raises(BrokerError):
                async with client.subscribe("b"):
                    pass
            stats = await client.stats()
        status, body = await get(http_address(server), "/metrics")
    assert stats["limit_refused"] == {"max_subscriptions": 1}
    assert status == 200
    text = body.decode()
    assert 'topiary_limit_refused_total{limit="max_subscriptions"} 1.0' in text
    assert 'topiary_limit_refused_total{limit="publish_rate"} 0.0' in text


# -- MQTT ----------------------------------------------------------------------------------


def count(running: Running, limit: str) -> int:
    return running.call(lambda: running.server.broker.counters.limit_refused[limit])


def test_an_mqtt5_connection_past_max_connections_gets_quota_exceeded() -> None:
    with broker_in_thread(max_connections=1) as running:
        first = Paho(running.mqtt_port, "first")
        assert first.connect()[1] == 0
        second = Paho(running.mqtt_port, "second")
        assert second.connect()[1] == R.QUOTA_EXCEEDED
        first.subscribe("ok/#", qos=1)
        first.publish("ok/1", b"fine", qos=1)
        assert first.receive().payload == b"fine"
        assert count(running, "max_connections") == 1
        first.disconnect()


def test_an_mqtt311_connection_past_max_connections_gets_server_unavailable() -> None:
    with broker_in_thread(max_connections=1) as running:
        with Raw(running.mqtt_port, version=5) as first:
            assert first.connect("first").reason_code == 0
            with Raw(running.mqtt_port, version=4) as second:
                assert second.connect("second").reason_code == R.V3_SERVER_UNAVAILABLE
                assert second.expect_closed() == []


def test_an_mqtt5_connection_past_the_rate_gets_connection_rate_exceeded() -> None:
    with broker_in_thread(connection_rate=SLOW, connection_burst=1) as running:
        first = Paho(running.mqtt_port, "first")
        assert first.connect()[1] == 0
        second = Paho(running.mqtt_port, "second")
        assert second.connect()[1] == R.CONNECTION_RATE_EXCEEDED
        assert count(running, "connection_rate") == 1
        first.disconnect()


def test_an_mqtt5_publisher_past_its_rate_is_disconnected_with_message_rate_too_high() -> None:
    with broker_in_thread(publish_rate=SLOW, publish_burst=2) as running:
        watcher = Paho(running.mqtt_port, "watcher")
        watcher.connect()
        watcher.subscribe("r/#", qos=1)
        fast = Paho(running.mqtt_port, "fast")
        fast.connect()
        fast.publish("r/1", b"", qos=1)
        fast.publish("r/2", b"", qos=1)
        fast.client.publish("r/3", b"", qos=1)
        assert fast.disconnects.get(timeout=10) == R.MESSAGE_RATE_TOO_HIGH
        assert [watcher.receive().topic for _ in range(2)] == ["r/1", "r/2"]
        watcher.ping()  # everything before it was handled: r/3 never came
        assert watcher.messages.empty()
        assert count(running, "publish_rate") == 1
        watcher.disconnect()


def test_an_mqtt311_publisher_past_its_rate_is_closed() -> None:
    with broker_in_thread(publish_rate=SLOW, publish_burst=1) as running:
        with Raw(running.mqtt_port, version=4) as fast:
            assert fast.connect("fast").reason_code == 0
            fast.send(Publish(topic="r/1", payload=b"", qos=0))
            fast.send(Publish(topic="r/2", payload=b"", qos=0))
            assert fast.expect_closed() == []  # 3.1.1 has no DISCONNECT from a server
        assert count(running, "publish_rate") == 1


def test_an_mqtt5_subscription_past_the_limit_gets_quota_exceeded_in_its_suback() -> None:
    with broker_in_thread(max_subscriptions=1) as running:
        client = Paho(running.mqtt_port, "c")
        client.connect()
        assert client.subscribe("a/#", qos=1) == [1]
        assert client.subscribe("a/#", qos=0) == [0]  # the same filter again: replaced
        assert client.subscribe([("b/#", 1), ("$share/g/c/#", 1)]) == [0x97, 0x97]
        assert count(running, "max_subscriptions") == 2
        client.disconnect()


def test_an_mqtt311_subscription_past_the_limit_gets_failure_in_its_suback() -> None:
    with broker_in_thread(max_subscriptions=1) as running:
        with Raw(running.mqtt_port, version=4) as client:
            assert client.connect("c").reason_code == 0
            flts = [Subscription("a/#", qos=0), Subscription("b/#", qos=0)]
            client.send(Subscribe(packet_id=1, subscriptions=flts))
            suback = client.expect()
            assert isinstance(suback, SubAck)
            assert suback.reason_codes == [0, 0x80]
