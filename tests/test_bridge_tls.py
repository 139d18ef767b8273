"""The Kafka bridge and the Spark sink reach the broker over TLS: the ``[broker]`` TLS keys,
the route watcher as an observer listed by certificate alone, the bridge publishing through
the broker's TLS port, and a Spark task's connection built from the sink's options.

Certificates are made in the test (tests/certs.py); brokers listen on 127.0.0.1 with real
TLS; the bridge reads a real Kafka-protocol broker (Tansu).
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from bridges.config import bridge_config_from_dict, load_bridge_config
from bridges.routes import RouteWatcher
from bridges.spark.pipeline import sink_options
from bridges.tansu import Tansu
from broker.client import connect
from broker.config import ConfigError
from broker.security import certificate_subject
from broker.server import Server
from broker.trust import OBSERVER, TrustedPeer
from tests.bridgekit import (
    beacon,
    beacon_topic,
    config_dict,
    json_values,
    produce,
    running_bridge,
    wait_until,
    write_config,
)
from tests.certs import Issued, Pki
from tests.conftest import running_broker
from tests.reference import ref_matches
from tests.test_bridge_config import minimal
from tests.test_cli import run

WAIT = 10.0  # seconds any expected event may take on a loaded machine
FAST = {"peer_keepalive": 0.3, "peer_flush": 0.002, "peer_backoff_max": 0.2}


def with_broker(**keys: Any) -> dict[str, Any]:
    document = minimal()
    document["broker"] |= keys
    return document


# -- the [broker] TLS keys -----------------------------------------------------------------


def test_a_ca_implies_tls_and_the_context_verifies_the_brokers_name(pki: Pki) -> None:
    config = bridge_config_from_dict(with_broker(ca=pki.ca))
    context = config.tls_context()
    assert config.tls is True
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_without_tls_keys_the_bridge_speaks_plain_tcp() -> None:
    config = bridge_config_from_dict(minimal())
    assert (config.tls, config.tls_context()) == (False, None)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"cert": "x.crt"}, r"^\[broker\] cert and key go together: give both or neither$"),
        ({"tls": False, "ca": "ca.crt"}, r"^\[broker\] ca is for TLS, but tls = false$"),
        ({"tls": "yes"}, r"^\[broker\] tls must be bool, got str 'yes'$"),
        ({"ca": ""}, r"^\[broker\] ca must not be empty$"),
    ],
)
def test_inconsistent_tls_keys_are_one_line(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        bridge_config_from_dict(with_broker(**keys))


def test_a_missing_ca_file_stops_start_up_naming_the_toml_and_the_file(tmp_path: Path) -> None:
    document = with_broker(ca=str(tmp_path / "missing.crt"))
    path = write_config(tmp_path / "bridge.toml", document)
    with pytest.raises(ConfigError) as refused:
        load_bridge_config(path)
    assert str(refused.value) == (
        f"{path}: [broker] ca {tmp_path / 'missing.crt'}: cannot read: No such file or directory"
    )


def test_a_key_that_does_not_match_the_certificate_is_named(pki: Pki, alice: Issued) -> None:
    other = pki.client("other")
    with pytest.raises(ConfigError, match=r"^\[broker\] key .* does not match cert .*$") as err:
        bridge_config_from_dict(with_broker(ca=pki.ca, cert=alice.cert, key=other.key))
    assert other.key in str(err.value) and alice.cert in str(err.value)


def test_the_bridge_command_with_a_bad_certificate_file_exits_with_one_line(
    tmp_path: Path, pki: Pki
) -> None:
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate\n")
    issued = pki.client("bridge-1")
    path = write_config(tmp_path / "bridge.toml", with_broker(cert=str(junk), key=issued.key))
    result = run("bridge", "kafka", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"topiary bridge kafka: error: {path}: [broker] cert {junk}: not a PEM certificate"
    )


def test_the_spark_sink_gets_tls_as_file_paths(pki: Pki, alice: Issued) -> None:
    config = bridge_config_from_dict(with_broker(ca=pki.ca, cert=alice.cert, key=alice.key))
    options = sink_options(config)
    assert {k: options[k] for k in ("tls", "ca", "cert", "key")} == {
        "tls": "true",
        "ca": pki.ca,
        "cert": alice.cert,
        "key": alice.key,
    }
    assert "tls" not in sink_options(bridge_config_from_dict(minimal()))


# -- a broker with a TLS native port -------------------------------------------------------


def tls_listening(pki: Pki, issued: Issued, **more: object) -> dict[str, object]:
    """A broker whose native TLS port checks client certificates of ``pki`` when offered."""
    return {
        "tls_cert": issued.cert,
        "tls_key": issued.key,
        "tls_client_ca": pki.ca,
        "tls_listen_native": "127.0.0.1:0",
        **FAST,
        **more,
    }


def listed_by_cert(observer_id: str) -> tuple[TrustedPeer, ...]:
    """The bridge listed as an observer by its certificate's subject only: no secret."""
    return (TrustedPeer(id=observer_id, role=OBSERVER, cert=f"CN={observer_id}"),)


def client_connections(server: Server, client_id: str | None) -> list[Any]:
    """The connections of clients (not peer links, which have no session) with this id."""
    return [
        c
        for c in server.broker.connections
        if c.session is not None and c.session.client_id == client_id
    ]


def tls_server(server: Server) -> str:
    host, port = server.tls_addresses["native"][0]
    return f"{host}:{port}"


def plain_server(server: Server) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"


def bridge_tls(pki: Pki, issued: Issued) -> dict[str, str]:
    """The ``[broker]`` TLS keys of a bridge presenting ``issued``."""
    return {"ca": pki.ca, "cert": issued.cert, "key": issued.key}


@contextlib.asynccontextmanager
async def watching(watcher: RouteWatcher) -> AsyncIterator[RouteWatcher]:
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        yield watcher
        nursery.cancel_scope.cancel()


async def wait_for(predicate: Any, timeout: float = WAIT) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # counters have no event of their own: poll, bounded
            await trio.sleep(0.01)


# -- the route watcher over TLS ------------------------------------------------------------


async def test_the_route_watcher_links_over_tls_as_an_observer_listed_by_certificate_alone(
    pki: Pki, server_cert: Issued
) -> None:
    settings = tls_listening(pki, server_cert, trusted_observers=listed_by_cert("bridge-1"))
    async with (
        running_broker(server_id="a", **settings) as a,
        connect(plain_server(a)) as subscriber,
        subscriber.subscribe("wanted/>"),
    ):
        config = bridge_config_from_dict(
            with_broker(
                server=tls_server(a),
                observer_id="bridge-1",
                **bridge_tls(pki, pki.client("bridge-1")),
            )
        )
        watcher = RouteWatcher(config.server, observer_id="bridge-1", tls=config.tls_context())
        async with watching(watcher):
            with trio.fail_after(WAIT):
                await watcher.ready.wait()
            assert watcher.wants("wanted/x") and not watcher.wants("other/x")
            link = a.broker.peering.links["bridge-1"]
            assert certificate_subject(link.stream) == "CN=bridge-1"
        assert (watcher.counters.refused, watcher.counters.tls_failures) == (0, 0)
        assert a.broker.peering.counters.auth_failures == 0


async def test_the_route_watcher_with_another_certificate_is_refused(
    pki: Pki, server_cert: Issued
) -> None:
    settings = tls_listening(pki, server_cert, trusted_observers=listed_by_cert("bridge-1"))
    async with running_broker(server_id="a", **settings) as a:
        intruder = pki.client("intruder")
        context = bridge_config_from_dict(with_broker(**bridge_tls(pki, intruder))).tls_context()
        watcher = RouteWatcher(tls_server(a), observer_id="bridge-1", tls=context, backoff_max=0.1)
        async with watching(watcher):
            await wait_for(lambda: watcher.counters.refused >= 1)
        assert not watcher.ready.is_set()
        assert a.broker.peering.links == {}
        assert a.broker.peering.counters.auth_failures >= 1


async def test_a_certificate_from_another_ca_is_refused_by_the_broker_and_said_so(
    pki: Pki, server_cert: Issued, tmp_path: Path
) -> None:
    stranger = Pki(tmp_path / "other", name="another CA").client("bridge-1")
    settings = tls_listening(pki, server_cert, trusted_observers=listed_by_cert("bridge-1"))
    with structlog.testing.capture_logs() as logs:
        async with running_broker(server_id="a", **settings) as a:
            context = bridge_config_from_dict(
                with_broker(**bridge_tls(pki, stranger))
            ).tls_context()
            watcher = RouteWatcher(
                tls_server(a), observer_id="bridge-1", tls=context, backoff_max=0.1
            )
            async with watching(watcher):
                await wait_for(lambda: a.broker.counters.tls_handshake_failures >= 2)
            assert a.broker.peering.links == {}
    assert not watcher.ready.is_set()
    assert watcher.counters.links_opened == 0
    # TLS 1.3: our half of the handshake ended first, so we see the broker hang up.
    said = [entry for entry in logs if entry["event"] == "route link got no welcome"]
    assert said and "client certificate" in said[0]["hint"]


async def test_the_route_watcher_refuses_a_broker_whose_certificate_names_another_host(
    pki: Pki,
) -> None:
    elsewhere = pki.server(hosts=("broker-a.example",))
    async with running_broker(server_id="a", **tls_listening(pki, elsewhere)) as a:
        context = bridge_config_from_dict(with_broker(ca=pki.ca)).tls_context()
        watcher = RouteWatcher(tls_server(a), observer_id="bridge-1", tls=context, backoff_max=0.1)
        async with watching(watcher):
            await wait_for(lambda: watcher.counters.tls_failures >= 2)  # it tried, and again
        assert not watcher.ready.is_set()
        assert watcher.counters.links_opened == 0
        assert a.broker.peering.links == {}


async def test_a_broker_port_that_never_answers_the_handshake_is_a_timed_out_tls_failure(
    pki: Pki,
) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    held: list[trio.SocketStream] = []
    context = bridge_config_from_dict(with_broker(ca=pki.ca)).tls_context()
    watcher = RouteWatcher(
        f"127.0.0.1:{port}", observer_id="bridge-1", tls=context, backoff_max=0.1,
        handshake_timeout=0.2,
    )  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:

            async def accept_and_say_nothing() -> None:
                while True:
                    held.append(await listeners[0].accept())

            nursery.start_soon(accept_and_say_nothing)
            async with watching(watcher):
                await wait_for(lambda: watcher.counters.tls_failures >= 1)
            nursery.cancel_scope.cancel()
    for stream in held:
        await trio.aclose_forcefully(stream)
    await listeners[0].aclose()
    failed = [entry for entry in logs if entry["event"] == "route link tls failed"]
    assert failed[0]["error"] == "no TLS handshake within 0.2 s"
    assert not watcher.ready.is_set()


async def test_the_spark_drivers_route_feed_follows_the_broker_over_tls(
    pki: Pki, server_cert: Issued
) -> None:
    from bridges.spark.routes import RouteFeed

    settings = tls_listening(pki, server_cert, trusted_observers=listed_by_cert("spark-1"))
    async with (
        running_broker(server_id="a", **settings) as a,
        connect(plain_server(a)) as subscriber,
        subscriber.subscribe("wanted/>"),
    ):
        issued = pki.client("spark-1")
        config = bridge_config_from_dict(
            with_broker(server=tls_server(a), observer_id="spark-1", **bridge_tls(pki, issued))
        )
        feed = await trio.to_thread.run_sync(RouteFeed.of(config).start)  # its own thread
        try:
            assert await trio.to_thread.run_sync(feed.wait_ready, WAIT)
            wanted = await trio.to_thread.run_sync(feed.snapshot)
        finally:
            await trio.to_thread.run_sync(feed.stop)
    assert [f.text for f in wanted.filters] == ["wanted/>"]


# -- the bridge publishing over TLS (Tansu) ------------------------------------------------

N = 300
FILTER = "beacon/eu/>"


async def test_the_bridge_publishes_over_tls_and_the_events_reach_a_subscriber(
    pki: Pki, server_cert: Issued, tansu: Tansu, topic_name: str
) -> None:
    tansu.create_topic(topic_name, 2)
    records = [beacon(i) for i in range(N)]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, json_values(records)))
    expected = sorted(r["n"] for r in records if ref_matches(FILTER, "native", beacon_topic(r)))
    issued = pki.client("bridge-1")
    settings = tls_listening(
        pki, server_cert, trusted_observers=listed_by_cert("bridge-1"), tls_require_client_cert=True
    )
    async with (
        running_broker(server_id="a", **settings) as a,
        connect(plain_server(a)) as subscriber,
        subscriber.subscribe(FILTER) as sub,
    ):
        config = bridge_config_from_dict(
            config_dict(
                tansu.bootstrap,
                tls_server(a),
                topic_name,
                broker={"observer_id": "bridge-1", **bridge_tls(pki, issued)},
            )
        )
        got: list[int] = []
        async with running_bridge(config) as bridge:
            with trio.fail_after(20):
                while len(got) < len(expected):
                    got.append(json.loads((await sub.get()).payload)["n"])
            await wait_until(lambda: bridge.counters.records_in == N)
            (publisher,) = client_connections(a, "bridge-1-publisher")
            assert certificate_subject(publisher.stream) == "CN=bridge-1"
            stats = await subscriber.stats()
        assert sorted(got) == expected
        assert bridge.counters.published == len(expected)
        assert bridge.watcher.counters.tls_failures == 0
        assert stats["messages_in"] == len(expected)


# -- a Spark task's connection (sink._connect, no Spark) -----------------------------------


async def test_a_spark_task_connects_over_tls_from_the_sink_options(
    pki: Pki, server_cert: Issued
) -> None:
    from bridges.spark.sink import _connect

    settings = tls_listening(pki, server_cert, tls_require_client_cert=True)
    async with running_broker(**settings) as a:
        config = bridge_config_from_dict(
            with_broker(server=tls_server(a), **bridge_tls(pki, pki.client("spark-task")))
        )
        options = sink_options(config)  # strings only, as Spark hands them to a task
        with trio.fail_after(WAIT):
            async with AsyncExitStack() as stack:
                client = await _connect(stack, options, 0.2)
                await client.ping()
                (connection,) = client_connections(a, client.client_id)
                assert certificate_subject(connection.stream) == "CN=spark-task"


# -- a Spark write over TLS (the session is shared with the other Spark tests) -------------


async def test_a_spark_write_publishes_over_tls_with_each_tasks_own_context(
    spark: Any, pki: Pki, server_cert: Issued
) -> None:
    from tests.test_spark_sink import rows, take, write

    settings = tls_listening(pki, server_cert, tls_require_client_cert=True)
    async with (
        running_broker(**settings) as a,
        connect(plain_server(a)) as subscriber,
        subscriber.subscribe("beacon/>") as sub,
    ):
        config = bridge_config_from_dict(
            with_broker(server=tls_server(a), **bridge_tls(pki, pki.client("spark-task")))
        )
        options = {k: v for k, v in sink_options(config).items() if not k.startswith("kafka.")}
        data = rows(40)
        await trio.to_thread.run_sync(lambda: write(spark, data, **options))
        got = await take(sub, 40)
    assert sorted(json.loads(m.payload)["n"] for m in got) == list(range(40))
