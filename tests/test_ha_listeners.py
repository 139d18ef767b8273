"""A broker of a pair binds every port at start and holds it whatever its role: a standby
answers on all of them (refuses clients in their protocol, answers operators on its HTTP
port, closes the other ports at once), and a port taken by another program stops the
start, not a promotion later."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from broker.client import BrokerError, connect, tls_context
from broker.config import BrokerConfig
from broker.ha.follower import FollowerCounters
from broker.ha.standby_http import FOLLOWER_HELP
from broker.listeners import ListenError
from broker.server import run_broker
from tests.certs import Issued, Pki
from tests.test_cli import free_port, run
from tests.test_http import get

WAIT = 10


def _standby(tmp_path: Path, **more: Any) -> BrokerConfig:
    """A standby whose primary never comes (manual failover: nothing promotes it)."""
    return BrokerConfig(
        port=free_port(),
        host="127.0.0.1",
        data_dir=str(tmp_path),
        ha_role="standby",
        ha_partner=f"127.0.0.1:{free_port()}",
        ha_witness="127.0.0.1:1",
        ha_secret="pair-secret",
        ha_failover="manual",
        ha_link_port=free_port(),
        **more,
    )


@asynccontextmanager
async def _running(config: BrokerConfig) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_broker, config)
        with trio.fail_after(WAIT):
            while True:  # the standby says nothing when it listens: dial until it answers
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", config.port)
                except OSError:
                    await trio.sleep(0.01)
                    continue
                await stream.aclose()
                break
        yield
        nursery.cancel_scope.cancel()


async def _closed_at_once(port: int) -> bool:
    """Whether a connection to ``port`` is accepted and then closed by the broker."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        with trio.fail_after(WAIT):
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                return await stream.receive_some(100) == b""
            except trio.BrokenResourceError:  # reset: closed all the same
                return True


async def test_a_standby_refuses_native_clients_over_tls_and_names_the_primary(
    tmp_path: Path, pki: Pki, server_cert: Issued
) -> None:
    tls_port = free_port()
    config = _standby(
        tmp_path,
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tls_listen_native=f"127.0.0.1:{tls_port}",
    )
    async with _running(config):
        with pytest.raises(BrokerError) as refused:
            async with connect(("127.0.0.1", tls_port), tls=tls_context(pki.ca)):
                pass
    assert refused.value.code == "NOT_PRIMARY"
    assert config.ha_partner is not None and config.ha_partner in refused.value.text


async def test_a_standby_holds_its_link_port_and_closes_connections_to_it(
    tmp_path: Path,
) -> None:
    config = _standby(tmp_path)
    assert config.ha_link_port is not None
    async with _running(config):
        assert await _closed_at_once(config.ha_link_port)


async def test_a_standby_is_healthy_but_not_ready_on_its_http_port(tmp_path: Path) -> None:
    http_port = free_port()
    config = _standby(tmp_path, http_listen=f"127.0.0.1:{http_port}")
    async with _running(config):
        assert await get(("127.0.0.1", http_port), "/healthz") == (200, b"ok\n")
        status, body = await get(("127.0.0.1", http_port), "/readyz")
    assert status == 503
    assert body.decode() == f"not ready: standby; the primary is {config.ha_partner}\n"


async def test_a_standby_s_metrics_count_the_clients_it_refused(tmp_path: Path) -> None:
    http_port = free_port()
    config = _standby(tmp_path, http_listen=f"127.0.0.1:{http_port}")
    async with _running(config):
        with pytest.raises(BrokerError):
            async with connect(("127.0.0.1", config.port)):
                pass
        status, body = await get(("127.0.0.1", http_port), "/metrics")
        _, stats = await get(("127.0.0.1", http_port), "/api/stats")
    assert status == 200
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }
    assert samples["topiary_ha_standby"] == 1
    assert samples["topiary_ha_door_refused_native_total"] == 1
    assert samples["topiary_ha_standby_connected"] == 0  # its primary never came
    assert json.loads(stats)["role"] == "standby"


def test_every_follower_counter_has_a_metric() -> None:
    assert set(FOLLOWER_HELP) == {field.name for field in dataclasses.fields(FollowerCounters)}


async def test_a_pair_broker_whose_link_port_is_taken_does_not_start(tmp_path: Path) -> None:
    config = _standby(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", config.ha_link))
        taken.listen()
        with pytest.raises(ListenError) as failed:
            await run_broker(config)
    assert str(failed.value) == (
        f"cannot listen on 127.0.0.1:{config.ha_link} ([ha] link_port): Address already in use"
    )


def test_serve_names_the_port_it_cannot_listen_on_in_one_line(tmp_path: Path) -> None:
    port, link = free_port(), free_port()
    toml = tmp_path / "broker.toml"
    toml.write_text(
        f'[server]\nport = {port}\nhost = "127.0.0.1"\ndata_dir = "{tmp_path}"\n'
        f'[ha]\nrole = "standby"\npartner = "127.0.0.1:1"\nwitness = "127.0.0.1:1"\n'
        f'secret = "s"\nfailover = "manual"\nlink_port = {link}\n'
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", link))
        taken.listen()
        done = run("serve", "--config", str(toml))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"topiary serve: cannot listen on 127.0.0.1:{link} ([ha] link_port): Address already in use"
    )
