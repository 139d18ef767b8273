"""TLS on the native listener, the HTTP port and peer links: real certificates (made by
tests/certs.py), real handshakes on 127.0.0.1, the broker's own client."""

from __future__ import annotations

import contextlib
import shutil
import ssl
import urllib.request
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from cryptography import x509

from broker.client import BrokerError, ConnectionLost, connect, tls_context
from broker.config import BrokerConfig, ConfigError
from broker.security import certificate_subject
from broker.security.tls import client_context, parse_peer, server_context
from broker.server import Server, run_broker
from tests.certs import Issued, Pki
from tests.conftest import running_broker
from tests.wire import HELLO, RawClient

WAIT = 10.0  # seconds any expected event may take on a loaded machine


@pytest.fixture
def renewable(pki: Pki, server_cert: Issued, tmp_path: Path) -> Iterator[Issued]:
    """A server certificate in files of its own, which a test may overwrite (renewal)."""
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    shutil.copy(server_cert.cert, cert)
    shutil.copy(server_cert.key, key)
    yield Issued(str(cert), str(key), server_cert.serial)


def tls_settings(issued: Issued, **more: Any) -> dict[str, Any]:
    return {
        "tls_cert": issued.cert,
        "tls_key": issued.key,
        "tls_listen_native": "127.0.0.1:0",
        **more,
    }


def native_tls(server: Server) -> tuple[str, int]:
    return server.tls_addresses["native"][0]


def failures(server: Server) -> int:
    return server.broker.counters.tls_handshake_failures


async def open_tls(
    address: tuple[str, int], context: ssl.SSLContext, host: str = "127.0.0.1"
) -> trio.SSLStream[trio.SocketStream]:
    stream = await trio.open_tcp_stream(*address)
    secure = trio.SSLStream(stream, context, server_hostname=host, https_compatible=True)
    await secure.do_handshake()
    return secure


def served_serial(stream: trio.SSLStream[Any]) -> int:
    der = stream.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def wait_for(predicate: Any, timeout: float = WAIT) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # broker state with no event of its own: poll, bounded
            await trio.sleep(0.01)


# -- the native protocol over TLS ----------------------------------------------------------


async def test_a_native_client_publishes_and_receives_over_tls(
    pki: Pki, server_cert: Issued
) -> None:
    async with running_broker(**tls_settings(server_cert)) as server:
        context = tls_context(pki.ca)
        async with connect(native_tls(server), tls=context) as client:
            async with client.subscribe("a/>") as sub:
                await client.publish("a/b", b"over tls", confirm=True)
                with trio.fail_after(WAIT):
                    message = await sub.__anext__()
        assert (message.topic, message.payload) == ("a/b", b"over tls")


async def test_the_plain_port_keeps_serving_plain_clients_beside_the_tls_one(
    server_cert: Issued,
) -> None:
    async with running_broker(**tls_settings(server_cert)) as server:
        assert server.addresses[0] != native_tls(server)
        async with connect(server.addresses[0]) as client:
            await client.ping()


async def test_the_server_sees_the_client_certificates_subject(
    pki: Pki, server_cert: Issued, alice: Issued
) -> None:
    settings = tls_settings(server_cert, tls_client_ca=pki.ca)
    async with running_broker(**settings) as server:
        context = tls_context(pki.ca, alice.cert, alice.key)
        async with connect(native_tls(server), client_id="alice-1", tls=context) as client:
            await client.ping()
            (connection,) = [
                c for c in server.broker.connections if c.session.client_id == "alice-1"
            ]
            assert certificate_subject(connection.stream) == "CN=alice,O=example"


async def test_without_a_client_certificate_the_subject_is_none(
    pki: Pki, server_cert: Issued
) -> None:
    settings = tls_settings(server_cert, tls_client_ca=pki.ca)  # optional, not required
    async with running_broker(**settings) as server:
        async with connect(native_tls(server), client_id="nobody", tls=tls_context(pki.ca)) as c:
            await c.ping()
            (connection,) = list(server.broker.connections)
            assert certificate_subject(connection.stream) is None


async def test_a_required_client_certificate_that_is_missing_costs_only_that_connection(
    pki: Pki, server_cert: Issued, alice: Issued
) -> None:
    settings = tls_settings(server_cert, tls_client_ca=pki.ca, tls_require_client_cert=True)
    async with running_broker(**settings) as server:
        with_cert = tls_context(pki.ca, alice.cert, alice.key)
        async with connect(native_tls(server), tls=with_cert) as staying:
            await staying.ping()
            # TLS 1.3: the client's handshake ends before the server has checked its
            # certificate, so the refusal arrives on the first read (WELCOME).
            with pytest.raises((trio.BrokenResourceError, ConnectionLost, BrokerError)):
                async with connect(native_tls(server), tls=tls_context(pki.ca)):
                    pass
            await wait_for(lambda: failures(server) == 1)
            await staying.ping()
            async with connect(native_tls(server), tls=with_cert) as another:
                await another.ping()


async def test_a_client_certificate_from_another_ca_is_refused(
    pki: Pki, server_cert: Issued, tmp_path: Path
) -> None:
    stranger = Pki(tmp_path, "another CA").client("mallory")
    settings = tls_settings(server_cert, tls_client_ca=pki.ca, tls_require_client_cert=True)
    async with running_broker(**settings) as server:
        context = tls_context(pki.ca, stranger.cert, stranger.key)
        with pytest.raises((trio.BrokenResourceError, ConnectionLost, BrokerError)):
            async with connect(native_tls(server), tls=context):
                pass
        await wait_for(lambda: failures(server) == 1)


async def test_a_plain_text_client_on_the_tls_port_is_counted_and_others_are_served(
    pki: Pki, server_cert: Issued
) -> None:
    async with running_broker(**tls_settings(server_cert)) as server:
        async with connect(native_tls(server), tls=tls_context(pki.ca)) as staying:
            plain = await RawClient.open(native_tls(server), hello=False)
            await plain.send(HELLO)
            with trio.fail_after(WAIT):
                answer = await plain.read_frame()
            assert answer == {"type": "EOF"}
            await plain.aclose()
            assert failures(server) == 1  # counted before the socket was closed
            await staying.ping()


async def test_a_silent_client_on_the_tls_port_blocks_nobody_and_times_out(
    pki: Pki, server_cert: Issued
) -> None:
    async with running_broker(**tls_settings(server_cert, hello_timeout=1.0)) as server:
        silent = await trio.open_tcp_stream(*native_tls(server))  # no ClientHello, ever
        async with connect(native_tls(server), tls=tls_context(pki.ca)) as client:
            await client.ping()  # handshaken while the silent one holds its own task
        with trio.fail_after(WAIT):
            assert await silent.receive_some(100) == b""  # closed after hello_timeout
        assert failures(server) == 1
        await silent.aclose()


async def test_shutdown_does_not_wait_for_a_handshake_in_progress(server_cert: Issued) -> None:
    config = BrokerConfig(port=0, **tls_settings(server_cert, hello_timeout=60.0))
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(run_broker, config)
        silent = await trio.open_tcp_stream(*native_tls(server))
        await wait_for(lambda: len(server._handshaking) == 1)  # its task is in the handshake
        server.shutdown()
        with trio.fail_after(WAIT):  # not hello_timeout's 60 s
            await server.stopped.wait()
    await silent.aclose()


async def test_a_failed_handshake_is_logged_with_the_clients_address(server_cert: Issued) -> None:
    with structlog.testing.capture_logs() as logs:
        async with running_broker(**tls_settings(server_cert)) as server:
            plain = await RawClient.open(native_tls(server), hello=False)
            await plain.send(HELLO)
            await plain.read_frame()  # EOF: the broker gave up on it
            host, port = plain.stream.socket.getsockname()[:2]
            await plain.aclose()
    (failed,) = [entry for entry in logs if entry["event"] == "tls handshake failed"]
    assert failed["peer"] == f"{host}:{port}"
    assert failed["log_level"] == "info"


async def test_a_client_trusting_another_ca_refuses_the_broker(
    server_cert: Issued, tmp_path: Path
) -> None:
    other = Pki(tmp_path, "not the broker's CA")
    async with running_broker(**tls_settings(server_cert)) as server:
        with pytest.raises(trio.BrokenResourceError) as refused:
            async with connect(native_tls(server), tls=tls_context(other.ca)):
                pass
        assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
        await wait_for(lambda: failures(server) == 1)  # the broker saw it fail too


async def test_a_client_dialling_a_name_the_certificate_lacks_refuses_the_broker(
    pki: Pki, tmp_path: Path
) -> None:
    only_localhost = pki.server(hosts=("localhost",))
    async with running_broker(**tls_settings(only_localhost)) as server:
        with pytest.raises(trio.BrokenResourceError) as refused:
            async with connect(native_tls(server), tls=tls_context(pki.ca)):  # 127.0.0.1
                pass
        assert "IP address mismatch" in str(refused.value.__cause__)


async def test_tls_1_1_is_refused(pki: Pki, server_cert: Issued) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1 at all
        old.minimum_version = ssl.TLSVersion.TLSv1_1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.load_verify_locations(pki.ca)
    with structlog.testing.capture_logs() as logs:
        async with running_broker(**tls_settings(server_cert)) as server:
            with pytest.raises(trio.BrokenResourceError):
                await open_tls(native_tls(server), old)
            await wait_for(lambda: failures(server) == 1)
    (refusal,) = [entry for entry in logs if entry["event"] == "tls handshake failed"]
    assert refusal["error"] == "UNSUPPORTED_PROTOCOL"  # the broker's refusal, not the client's


async def test_tls_1_2_is_accepted(pki: Pki, server_cert: Issued) -> None:
    context = tls_context(pki.ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    async with running_broker(**tls_settings(server_cert)) as server:
        async with connect(native_tls(server), tls=context) as client:
            await client.ping()
            (connection,) = list(server.broker.connections)
            assert connection.stream.version() == "TLSv1.2"


# -- reloading renewed certificates --------------------------------------------------------


async def test_a_reload_serves_a_renewed_certificate_to_new_connections_only(
    pki: Pki, renewable: Issued
) -> None:
    async with running_broker(**tls_settings(renewable)) as server:
        context = tls_context(pki.ca)
        async with connect(native_tls(server), tls=context) as old:
            renewed = pki.server()
            shutil.copy(renewed.cert, renewable.cert)
            shutil.copy(renewed.key, renewable.key)
            assert server.reload() == {"tls": None}
            fresh = await open_tls(native_tls(server), context)
            assert served_serial(fresh) == renewed.serial != renewable.serial
            await fresh.aclose()
            await old.ping()  # the connection made before the reload goes on


async def test_a_reload_with_a_bad_certificate_keeps_the_old_one(
    pki: Pki, renewable: Issued
) -> None:
    async with running_broker(**tls_settings(renewable)) as server:
        Path(renewable.cert).write_text("not a certificate\n")
        outcome = server.reload()
        assert outcome["tls"] == f"tls cert {renewable.cert}: not a PEM certificate"
        fresh = await open_tls(native_tls(server), tls_context(pki.ca))
        assert served_serial(fresh) == renewable.serial
        await fresh.aclose()


# -- bad files and settings stop start-up --------------------------------------------------


def test_a_missing_certificate_file_is_one_line_naming_it(tmp_path: Path, alice: Issued) -> None:
    missing = str(tmp_path / "nope.crt")
    with pytest.raises(ConfigError) as error:
        server_context(missing, alice.key)
    assert str(error.value) == f"tls cert {missing}: cannot read: No such file or directory"


def test_a_key_that_does_not_match_the_certificate_is_named(
    server_cert: Issued, alice: Issued
) -> None:
    with pytest.raises(ConfigError) as error:
        server_context(server_cert.cert, alice.key)
    assert str(error.value) == f"tls key {alice.key} does not match cert {server_cert.cert}"


def test_a_key_file_that_is_not_a_key_is_named(server_cert: Issued, tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnonsense\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError) as error:
        server_context(server_cert.cert, str(bad))
    assert str(error.value).startswith(f"tls key {bad}: not a PEM private key")


def test_a_client_ca_without_certificates_is_named(server_cert: Issued, tmp_path: Path) -> None:
    empty = tmp_path / "empty.crt"
    empty.write_text("")
    with pytest.raises(ConfigError) as error:
        server_context(server_cert.cert, server_cert.key, str(empty))
    assert str(error.value).startswith(f"tls client_ca {empty}: no PEM certificate in it")


def test_a_peering_ca_that_is_missing_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "ca.crt")
    with pytest.raises(ConfigError) as error:
        client_context(missing, what="peering")
    assert str(error.value).startswith(f"peering ca {missing}: cannot read")


async def test_a_bad_certificate_stops_the_broker_before_it_listens(
    renewable: Issued,
) -> None:
    Path(renewable.cert).write_text("garbage")
    config = BrokerConfig(port=0, **tls_settings(renewable))
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        await run_broker(config)  # raises before it listens or starts a task


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tls_listen_native": "127.0.0.1:0"}, "tls listen_native needs tls cert and key"),
        ({"tls_cert": "a.crt"}, "tls cert and key go together: set both or neither"),
        (
            {"tls_cert": "a.crt", "tls_key": "a.key", "tls_require_client_cert": True},
            "tls require_client_cert needs tls client_ca to verify them with",
        ),
        (
            {"tls_cert": "a.crt", "tls_key": "a.key", "tls_listen_mqtt": "8883"},
            "tls listen_mqtt must be HOST:PORT, got '8883'",
        ),
        ({"tls_require_client_cert": "yes"}, "tls_require_client_cert must be bool"),
        ({"peers": ("tls://nowhere",)}, "peers must be HOST:PORT or tls://HOST:PORT strings"),
        ({"peer_cert": "p.crt"}, "peering cert and key go together: set both or neither"),
    ],
)
def test_inconsistent_tls_settings_are_one_line(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        BrokerConfig(**settings)
    assert str(error.value).startswith(message)


def test_a_peer_entry_says_tls_with_its_scheme() -> None:
    assert parse_peer("tls://10.0.0.2:7443") == parse_peer("10.0.0.2:7443").__class__(
        "10.0.0.2", 7443, True
    )
    assert parse_peer("10.0.0.2:7474") is not None
    assert not parse_peer("10.0.0.2:7474").tls  # type: ignore[union-attr]
    assert parse_peer("tls://10.0.0.2") is None


# -- the operators' HTTP port over TLS -----------------------------------------------------


async def test_metrics_are_served_over_https_and_count_failed_handshakes(
    pki: Pki, server_cert: Issued
) -> None:
    settings = tls_settings(server_cert, tls_listen_http="127.0.0.1:0")
    async with running_broker(**settings) as server:
        plain = await RawClient.open(native_tls(server), hello=False)
        await plain.send(HELLO)
        await plain.read_frame()  # EOF: the broker gave up on it
        await plain.aclose()
        host, port = server.tls_addresses["http"][0]
        context = tls_context(pki.ca)
        body = await trio.to_thread.run_sync(
            lambda: urllib.request.urlopen(
                f"https://{host}:{port}/metrics", context=context, timeout=WAIT
            ).read()
        )
        assert b"topiary_tls_handshake_failures_total 1.0" in body


async def test_plain_http_on_the_https_port_is_a_failed_handshake(server_cert: Issued) -> None:
    settings = tls_settings(server_cert, tls_listen_http="127.0.0.1:0")
    async with running_broker(**settings) as server:
        stream = await trio.open_tcp_stream(*server.tls_addresses["http"][0])
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(WAIT):
            while await stream.receive_some(4096):  # whatever alert bytes, then EOF
                pass
        await stream.aclose()
        assert failures(server) == 1


# -- peer links over TLS -------------------------------------------------------------------

FAST = {"peer_keepalive": 0.3, "peer_flush": 0.002, "peer_backoff_max": 0.2}


@contextlib.asynccontextmanager
async def two_brokers(
    listener: dict[str, Any], dialler: dict[str, Any]
) -> AsyncIterator[tuple[Server, Server]]:
    """Broker "a" with a TLS native port; broker "b" dials it at tls://127.0.0.1:PORT."""
    async with running_broker(server_id="a", **FAST, **listener) as a:
        host, port = native_tls(a)
        async with running_broker(
            server_id="b", peers=(f"tls://{host}:{port}",), **FAST, **dialler
        ) as b:
            yield a, b


async def test_a_peer_link_over_tls_carries_events(pki: Pki, server_cert: Issued) -> None:
    async with two_brokers(tls_settings(server_cert), {"peer_ca": pki.ca}) as (a, b):
        await wait_for(lambda: "a" in b.broker.peering.links and "b" in a.broker.peering.links)
        async with (
            connect(a.addresses[0]) as subscriber,
            subscriber.subscribe("x/>", sync=True) as sub,
            connect(b.addresses[0]) as publisher,
        ):
            await wait_for(lambda: b.broker.peering.wanting("x/y") == {"a"})
            await publisher.publish("x/y", b"across", confirm=True)
            with trio.fail_after(WAIT):
                message = await sub.__anext__()
        assert message.payload == b"across"
        link = a.broker.peering.links["b"]
        assert isinstance(link.stream, trio.SSLStream)


async def test_a_peer_whose_certificate_names_another_host_is_not_linked(pki: Pki) -> None:
    elsewhere = pki.server(hosts=("broker-a.example",))
    async with two_brokers(tls_settings(elsewhere), {"peer_ca": pki.ca}) as (a, b):
        counters = b.broker.peering.counters
        await wait_for(lambda: counters.tls_dial_failures >= 2)  # it tried, and again
        assert b.broker.peering.links == {}
        assert a.broker.peering.links == {}


async def test_a_peer_dialling_with_a_client_certificate_is_seen_by_its_subject(
    pki: Pki, server_cert: Issued
) -> None:
    b_cert = pki.client("broker-b", "mesh")
    listener = tls_settings(server_cert, tls_client_ca=pki.ca, tls_require_client_cert=True)
    dialler = {"peer_ca": pki.ca, "peer_cert": b_cert.cert, "peer_key": b_cert.key}
    async with two_brokers(listener, dialler) as (a, _b):
        await wait_for(lambda: "b" in a.broker.peering.links)
        assert certificate_subject(a.broker.peering.links["b"].stream) == "CN=broker-b,O=mesh"


async def test_a_peer_without_the_required_client_certificate_is_not_linked(
    pki: Pki, server_cert: Issued
) -> None:
    listener = tls_settings(server_cert, tls_client_ca=pki.ca, tls_require_client_cert=True)
    async with two_brokers(listener, {"peer_ca": pki.ca}) as (a, b):
        await wait_for(lambda: failures(a) >= 2)
        assert a.broker.peering.links == {}
        assert b.broker.peering.links == {}
