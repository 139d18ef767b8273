"""Trusted peers: per-peer secrets and certificates, listed observers, the old shared secret.

Brokers share a trio loop (as in tests/test_peering.py); a fake peer is a raw client sending
hand-made PEER_HELLO and ROUTE frames; the certificate case runs a broker behind a real TLS
listener with certificates made here (``cryptography``).
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bridges.routes import RouteWatcher
from broker.client import tls_context
from broker.config import ConfigError, build_config
from broker.server import Server
from broker.trust import BROKER, OBSERVER, Trust, TrustedPeer
from broker.wire.frames import PROTOCOL_VERSION
from tests.certs import Issued, Pki
from tests.conftest import running_broker
from tests.test_peering import FAST, peer_hello, reachable, server_text, wait_for
from tests.wire import RawClient, frame


def peer(peer_id: str, secret: str | None = None, **fields: str) -> TrustedPeer:
    return TrustedPeer(id=peer_id, role=BROKER, secret=secret, **fields)  # type: ignore[arg-type]


def observer(observer_id: str, secret: str) -> TrustedPeer:
    return TrustedPeer(id=observer_id, role=OBSERVER, secret=secret)


def route_from(origin: str, neighbour: str) -> bytes:
    """A snapshot ROUTE making ``origin`` a two-way neighbour that wants ``stolen/#``."""
    return frame(
        {
            "type": "ROUTE",
            "origin": origin,
            "incarnation": 1,
            "seq": 1,
            "snapshot": True,
            "neighbors": [neighbour],
            "add": [["stolen/#", "mqtt"]],
        }
    )


# -- the configuration ---------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topiary.toml"
    path.write_text(text)
    return path


def test_listed_peers_and_observers_are_read_from_the_config_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [server]
        server_id = "a"
        [[peering.peer]]
        id = "b"
        address = "127.0.0.1:7475"
        secret = "ab"
        [[peering.peer]]
        id = "c"
        cert = "CN=c"
        [[peering.observer]]
        id = "bridge-1"
        secret = "br"
        """,
    )
    config = build_config(path)
    assert config.trusted_peers == (
        peer("b", "ab", address="127.0.0.1:7475"),
        peer("c", cert="CN=c"),
    )
    assert config.trusted_observers == (observer("bridge-1", "br"),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[peering.peer]]\nid = "b"\n', "give it a secret, a cert, or both"),
        ('[[peering.peer]]\nid = "b"\nsecret = "s"\nport = 1\n', "unknown key 'port'"),
        ('[[peering.observer]]\nid = "o"\nsecret = "s"\naddress = "h:1"\n', "unknown key"),
        ('[[peering.peer]]\nsecret = "s"\n', "id is required"),
        ('[[peering.peer]]\nid = "b"\nsecret = ""\n', "secret must be a non-empty string"),
        ('[[peering.peer]]\nid = "b"\nsecret = "s"\naddress = "nowhere"\n', "HOST:PORT"),
        (
            '[[peering.peer]]\nid = "b"\nsecret = "s"\n[[peering.observer]]\nid = "b"\n'
            'secret = "t"\n',
            "listed twice",
        ),
        (
            '[peering]\npeers = ["127.0.0.1:1"]\n[[peering.peer]]\nid = "b"\nsecret = "s"\n',
            "peers cannot be combined",
        ),
        (
            '[peering]\nsecret = "mesh"\n[[peering.peer]]\nid = "b"\nsecret = "s"\n',
            "secret (one secret for the whole mesh) cannot be combined",
        ),
        ('[server]\nserver_id = "a"\n[[peering.peer]]\nid = "a"\nsecret = "s"\n', "own"),
    ],
)
def test_a_bad_peer_entry_stops_start_up_with_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        build_config(write(tmp_path, text))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_trusted_peer_never_shows_its_secret_in_its_repr() -> None:
    assert "hunter2" not in repr(peer("b", "hunter2"))


# -- the decision, against a reference ---------------------------------------------------

IDS = st.sampled_from(["a", "b", "o", "x"])
SECRETS = st.sampled_from([None, "s1", "s2"])
CERTS = st.sampled_from([None, "CN=a", "CN=b"])
ENTRY = st.builds(
    TrustedPeer,
    id=IDS,
    role=st.sampled_from([BROKER, OBSERVER]),
    secret=SECRETS,
    cert=CERTS,
).filter(lambda e: e.secret is not None or e.cert is not None)


def reference(
    entries: list[TrustedPeer], shared: str | None, peer_id: str, role: str, secret, cert
) -> bool:  # type: ignore[no-untyped-def]
    """The rule as docs/security.md states it."""
    brokers_listed = any(e.role == BROKER for e in entries)
    closed = brokers_listed if role == BROKER else bool(entries)
    if not closed:
        return shared is None or secret == shared
    listed = [e for e in entries if e.id == peer_id and e.role == role]
    if not listed:
        return False
    entry = listed[-1]
    return (entry.secret is None or secret == entry.secret) and (
        entry.cert is None or cert == entry.cert
    )


@given(
    entries=st.lists(ENTRY, max_size=4, unique_by=lambda e: e.id),
    shared=SECRETS,
    peer_id=IDS,
    role=st.sampled_from([BROKER, OBSERVER]),
    secret=SECRETS,
    cert=CERTS,
)
def test_who_may_link_follows_the_documented_rule(
    entries: list[TrustedPeer],
    shared: str | None,
    peer_id: str,
    role: str,
    secret: str | None,
    cert: str | None,
) -> None:
    trust = Trust(entries, shared)
    allowed = trust.refusal(peer_id, role, secret, cert) is None
    assert allowed == reference(entries, shared, peer_id, role, secret, cert)


# -- brokers -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def pair(
    a_lists: tuple[TrustedPeer, ...], b_lists_for_a: TrustedPeer, **a_overrides: object
) -> AsyncIterator[tuple[Server, Server]]:
    """Broker b, then broker a dialling it; b lists ``b_lists_for_a``, a lists ``a_lists``
    (addresses filled in with b's port where given as "B")."""
    async with running_broker(server_id="b", trusted_peers=(b_lists_for_a,), **FAST) as b:
        listed = tuple(
            TrustedPeer(e.id, e.role, e.secret, e.cert, server_text(b)) if e.address == "B" else e
            for e in a_lists
        )
        async with running_broker(
            server_id="a", trusted_peers=listed, **{**FAST, **a_overrides}
        ) as a:
            yield a, b


async def test_brokers_that_list_each_other_with_the_same_secret_link() -> None:
    async with pair((peer("b", "ab", address="B"),), peer("a", "ab")) as (a, b):
        await wait_for(lambda: reachable(a) == {"b"} and reachable(b) == {"a"})
        assert a.broker.peering.counters.auth_failures == 0


async def test_a_peer_with_another_pairs_secret_is_refused_and_counted() -> None:
    async with running_broker(server_id="a", trusted_peers=(peer("b", "ab"),), **FAST) as a:
        fake = await peer_hello(a, broker_id="b", secret="not-ab")
        error = await fake.read_frame()
        assert (error["type"], error["code"]) == ("ERROR", "AUTH_FAILED")
        assert "'b'" in error["text"]
        assert (await fake.read_frame())["type"] == "EOF"
        stats = a.broker.peering.stats()
        assert (stats["auth_failures"], stats["links_refused"]) == (1, 1)
        await fake.aclose()


async def test_a_broker_nobody_listed_is_refused_whatever_secret_it_knows() -> None:
    async with running_broker(server_id="a", trusted_peers=(peer("b", "ab"),), **FAST) as a:
        fake = await peer_hello(a, broker_id="mallory", secret="ab")
        error = await fake.read_frame()
        assert (error["code"], error["text"]) == (
            "AUTH_FAILED",
            "'mallory' is not a configured broker",
        )
        await fake.aclose()


async def test_routes_pipelined_behind_a_refused_hello_are_never_applied() -> None:
    async with running_broker(server_id="a", trusted_peers=(peer("b", "ab"),), **FAST) as a:
        fake = await RawClient.open(a.addresses[0], hello=False)
        hello = {
            "type": "PEER_HELLO",
            "version": PROTOCOL_VERSION,
            "broker_id": "b",
            "incarnation": 1,
            "secret": "guess",
        }
        await fake.send(frame(hello) + route_from("b", "a") + route_from("mallory", "b"))
        assert (await fake.read_frame())["code"] == "AUTH_FAILED"
        assert (await fake.read_frame())["type"] == "EOF"  # read to the end: all was handled
        exchange = a.broker.peering.exchange
        assert set(exchange.table.origins) == {"a"}
        assert reachable(a) == set()
        assert exchange.table.wanting("stolen/x") == frozenset()
        await fake.aclose()


async def test_a_listed_peers_address_answering_with_another_id_is_not_linked() -> None:
    # c lists a, so it would take the link; but a dialled "b" there, and refuses c's routes.
    async with running_broker(server_id="c", trusted_peers=(peer("a", "ab"),), **FAST) as c:
        listed = (TrustedPeer("b", BROKER, "ab", None, server_text(c)),)
        async with running_broker(server_id="a", trusted_peers=listed, **FAST) as a:
            await wait_for(lambda: a.broker.peering.counters.auth_failures >= 2)
            assert a.broker.peering.links == {}
            assert set(a.broker.peering.exchange.table.origins) == {"a"}


async def test_the_old_shared_secret_and_peers_list_still_link_brokers() -> None:
    async with running_broker(server_id="b", peer_secret="mesh", **FAST) as b:
        async with running_broker(
            server_id="a", peers=(server_text(b),), peer_secret="mesh", **FAST
        ) as a:
            await wait_for(lambda: reachable(a) == {"b"} and reachable(b) == {"a"})


async def test_with_listed_peers_an_unlisted_observer_is_refused() -> None:
    async with running_broker(server_id="a", trusted_peers=(peer("b", "ab"),), **FAST) as a:
        fake = await peer_hello(a, broker_id="bridge", role="observer", secret="ab")
        assert (await fake.read_frame())["code"] == "AUTH_FAILED"
        await fake.aclose()


# -- observers -----------------------------------------------------------------------------


async def test_a_listed_observer_with_its_secret_follows_the_routes() -> None:
    observers = (observer("bridge-1", "br"),)
    async with running_broker(server_id="a", trusted_observers=observers, **FAST) as a:
        watcher = RouteWatcher(server_text(a), observer_id="bridge-1", secret="br")
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            with trio.fail_after(5):
                await watcher.ready.wait()
            nursery.cancel_scope.cancel()
        assert watcher.counters.refused == 0
        assert a.broker.peering.counters.auth_failures == 0


async def test_an_observer_with_a_wrong_secret_gets_no_routes() -> None:
    observers = (observer("bridge-1", "br"),)
    async with running_broker(server_id="a", trusted_observers=observers, **FAST) as a:
        async with connect_and_subscribe(a, "wanted/#"):
            watcher = RouteWatcher(
                server_text(a), observer_id="bridge-1", secret="wrong", backoff_max=0.1
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(watcher.run)
                await wait_for(lambda: watcher.counters.refused >= 1)
                nursery.cancel_scope.cancel()
        assert not watcher.ready.is_set()
        assert not watcher.wants("wanted/x")
        assert a.broker.peering.counters.auth_failures >= 1


async def test_only_listed_observers_keep_the_brokers_shared_secret_mesh_open() -> None:
    # Observers listed, brokers not: brokers still link with the shared secret.
    async with running_broker(
        server_id="b", peer_secret="mesh", trusted_observers=(observer("o", "os"),), **FAST
    ) as b:
        async with running_broker(
            server_id="a", peers=(server_text(b),), peer_secret="mesh", **FAST
        ) as a:
            await wait_for(lambda: reachable(a) == {"b"} and reachable(b) == {"a"})
        fake = await peer_hello(b, broker_id="o", role="observer", secret="mesh")
        assert (await fake.read_frame())["code"] == "AUTH_FAILED"
        await fake.aclose()


@contextlib.asynccontextmanager
async def connect_and_subscribe(server: Server, flt: str) -> AsyncIterator[None]:
    from broker.client import connect

    async with connect(server_text(server)) as client, client.subscribe(flt):
        yield


# -- mutual TLS ----------------------------------------------------------------------------


def tls_listening(pki: Pki, server_cert: Issued) -> dict[str, object]:
    """Config for a broker whose native TLS port asks for client certificates of ``pki``."""
    return {
        "tls_cert": server_cert.cert,
        "tls_key": server_cert.key,
        "tls_client_ca": pki.ca,
        "tls_listen_native": "127.0.0.1:0",
    }


def client_context(pki: Pki, common_name: str) -> ssl.SSLContext:
    issued = pki.client(common_name)
    return tls_context(pki.ca, issued.cert, issued.key)


def tls_port(server: Server) -> int:
    return server.tls_addresses["native"][0][1]


async def tls_peer_hello(port: int, context: ssl.SSLContext, broker_id: str) -> dict:
    stream = await trio.open_ssl_over_tcp_stream(
        "127.0.0.1", port, ssl_context=context, https_compatible=False
    )
    client = RawClient(stream)  # type: ignore[arg-type]
    body = {"type": "PEER_HELLO", "version": PROTOCOL_VERSION, "broker_id": broker_id}
    await client.send(frame({**body, "incarnation": 1}))
    answer = await client.read_frame()
    await trio.aclose_forcefully(stream)
    return answer


async def test_a_peer_listed_by_certificate_links_with_that_certificate_only(
    pki: Pki, server_cert: Issued
) -> None:
    settings = tls_listening(pki, server_cert)
    trusted = (peer("b", cert="CN=b"),)
    async with running_broker(server_id="a", trusted_peers=trusted, **FAST, **settings) as a:
        welcome = await tls_peer_hello(tls_port(a), client_context(pki, "b"), "b")
        assert welcome["type"] == "PEER_WELCOME"
        refused = await tls_peer_hello(tls_port(a), client_context(pki, "x"), "b")
        assert (refused["code"], refused["text"]) == (
            "AUTH_FAILED",
            "broker 'b' must present certificate 'CN=b', not certificate 'CN=x'",
        )


async def test_brokers_dialling_over_mutual_tls_link_by_certificate_alone(
    pki: Pki, server_cert: Issued
) -> None:
    b_cert = pki.both("b")
    listening = tls_listening(pki, server_cert)
    async with running_broker(
        server_id="a", trusted_peers=(peer("b", cert="CN=b"),), **FAST, **listening
    ) as a:
        address = f"tls://127.0.0.1:{tls_port(a)}"
        async with running_broker(
            server_id="b",
            trusted_peers=(peer("a", address=address),),
            peer_ca=pki.ca,
            peer_cert=b_cert.cert,
            peer_key=b_cert.key,
            **FAST,
        ) as b:
            await wait_for(lambda: reachable(a) == {"b"} and reachable(b) == {"a"})
            assert a.broker.peering.counters.auth_failures == 0
