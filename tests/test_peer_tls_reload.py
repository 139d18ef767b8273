"""SIGHUP's ``server.reload()`` re-reads the context peers are dialled with (``ClientTls``,
registered in ``Server.reloadables`` when a ``tls://`` peer is configured): a replaced CA
file is used by the next dial, and a bad one keeps the old context for every dial after.

Two brokers in one trio loop: "a" serves its native protocol over TLS (a certificate of the
session's test CA), "b" dials it at ``tls://``, its ``[peering] ca`` a file of the test's
own that the test replaces. Between them, where a link must be cut, a FaultProxy.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from broker.security.tls import ClientTls
from broker.server import Server
from tests.certs import Issued, Pki
from tests.conftest import running_broker
from tests.faultproxy import FaultProxy

WAIT = 10.0  # seconds any expected event may take on a loaded machine
FAST = {"peer_keepalive": 0.3, "peer_flush": 0.002, "peer_backoff_max": 0.2}


async def wait_for(predicate: Any, timeout: float = WAIT) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # broker state with no event of its own: poll, bounded
            await trio.sleep(0.01)


def linked(a: Server, b: Server) -> bool:
    return "b" in a.broker.peering.links and "a" in b.broker.peering.links


def unlinked(a: Server, b: Server) -> bool:
    return not a.broker.peering.links and not b.broker.peering.links


def dial_failures(server: Server) -> int:
    return server.broker.peering.counters.tls_dial_failures


@contextlib.asynccontextmanager
async def dialling(
    server_cert: Issued, peer_ca: Path, via: FaultProxy | None = None
) -> AsyncIterator[tuple[Server, Server]]:
    """Broker a (TLS native port) and broker b dialling it with ``[peering] ca = peer_ca``,
    directly or through ``via`` (pointed at a's TLS port once a listens)."""
    listening = {
        "tls_cert": server_cert.cert,
        "tls_key": server_cert.key,
        "tls_listen_native": "127.0.0.1:0",
    }
    async with running_broker(server_id="a", **FAST, **listening) as a:
        host, port = a.tls_addresses["native"][0]
        if via is not None:
            via.target = (host, port)
            via.start()
            port = via.port
        async with running_broker(
            server_id="b", peers=(f"tls://{host}:{port}",), peer_ca=str(peer_ca), **FAST
        ) as b:
            yield a, b


def peering_tls(server: Server) -> ClientTls:
    tls = server.broker.peering.tls
    assert tls is not None and tls in server.reloadables
    return tls


async def test_a_reload_makes_the_next_dial_trust_a_replaced_ca_file(
    pki: Pki, server_cert: Issued, tmp_path: Path
) -> None:
    peer_ca = tmp_path / "peer-ca.crt"
    shutil.copy(Pki(tmp_path / "old", name="the old CA").ca, peer_ca)  # not a's issuer
    async with dialling(server_cert, peer_ca) as (a, b):
        await wait_for(lambda: dial_failures(b) >= 1)
        assert unlinked(a, b)
        shutil.copy(pki.ca, peer_ca)  # the CA that issued a's certificate
        assert b.reload() == {"peering tls": None}
        await wait_for(lambda: linked(a, b))


async def test_a_bad_ca_file_at_reload_keeps_the_old_context_for_later_dials(
    pki: Pki, server_cert: Issued, tmp_path: Path
) -> None:
    peer_ca = tmp_path / "peer-ca.crt"
    shutil.copy(pki.ca, peer_ca)
    with FaultProxy(("127.0.0.1", 1)) as proxy:  # its target is set once a listens
        async with dialling(server_cert, peer_ca, via=proxy) as (a, b):
            await wait_for(lambda: linked(a, b))
            before = peering_tls(b).context
            peer_ca.write_text("not a certificate\n")
            outcome = b.reload()
            assert outcome["peering tls"] is not None
            assert outcome["peering tls"].startswith(f"peering ca {peer_ca}: no PEM certificate")
            assert peering_tls(b).context is before
            await trio.to_thread.run_sync(proxy.cut)  # the link drops: b must dial again
            await wait_for(lambda: unlinked(a, b))
            await trio.to_thread.run_sync(proxy.restore)
            await wait_for(lambda: linked(a, b))  # with the context it kept
            assert dial_failures(b) == 0
