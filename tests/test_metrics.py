"""/metrics after real traffic over real sockets, read with Prometheus' own parser: per-session
lag series (top N + "other"), the store commit and delivery latency histograms, connections
by front end."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from broker.client import connect
from broker.config import BrokerConfig, ConfigError
from broker.server import Server
from tests.conftest import running_broker
from tests.streams import take

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@asynccontextmanager
async def broker(tmp_path: Path | None = None, **overrides: object) -> AsyncIterator[Server]:
    data = {} if tmp_path is None else {"data_dir": str(tmp_path)}
    async with running_broker(http_listen="127.0.0.1:0", **data, **overrides) as server:
        yield server


async def scrape(server: Server) -> Samples:
    """GET /metrics, parsed: (sample name, sorted labels) -> value."""
    assert server.http is not None
    stream = await trio.open_tcp_stream(*server.http.addresses[0])
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        chunks = []
        with trio.fail_after(10):
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    families = list(text_string_to_metric_families(body.decode()))
    names = [family.name for family in families]
    assert len(names) == len(set(names)), "a metric family twice: Prometheus would refuse it"
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }


def session(samples: Samples, name: str, client_id: str) -> float:
    return samples[(f"topiary_session_{name}", (("session", client_id),))]


async def test_a_durable_sessions_lag_pending_delivered_and_acked(tmp_path: Path) -> None:
    async with broker(tmp_path) as server:
        address = server.addresses[0]
        async with connect(address, client_id="svc-lag", durable=True) as c:
            async with c.subscribe("lag/>") as sub:
                before = trio.current_time()
                async with connect(address) as p:
                    for i in range(3):
                        await p.publish(f"lag/{i}", b"x", confirm=True)
                got = await take(sub, 3)
                samples = await scrape(server)
                after = trio.current_time()
                assert session(samples, "pending_messages", "svc-lag") == 3
                assert (
                    0 < session(samples, "oldest_pending_age_seconds", "svc-lag") <= after - before
                )
                assert session(samples, "delivered_total", "svc-lag") == 3
                assert session(samples, "acked_total", "svc-lag") == 0

                await c.ack(got[1].seq)
                await c.ping()  # the ack was handled before the PONG
                samples = await scrape(server)
                assert session(samples, "pending_messages", "svc-lag") == 1
                assert session(samples, "acked_total", "svc-lag") == 2
                assert session(samples, "oldest_pending_age_seconds", "svc-lag") > 0

                await c.ack(got[2].seq)
                await c.ping()
                samples = await scrape(server)
                assert session(samples, "pending_messages", "svc-lag") == 0
                assert session(samples, "oldest_pending_age_seconds", "svc-lag") == 0
                assert session(samples, "acked_total", "svc-lag") == 3
                assert samples[("topiary_frontend_connections", (("frontend", "native"),))] == 1
        commits = samples[("topiary_store_commit_duration_seconds_count", ())]
        assert commits > 0
        assert samples[("topiary_store_commit_duration_seconds_bucket", (("le", "+Inf"),))] == (
            commits
        )
        assert samples[("topiary_store_commit_duration_seconds_sum", ())] > 0


async def test_a_shared_groups_pending_delivered_and_acked(tmp_path: Path) -> None:
    async with broker(tmp_path) as server:
        address = server.addresses[0]
        async with connect(address, group="workers") as member:
            async with member.subscribe("jobs/>") as sub:
                async with connect(address) as p:
                    for i in range(2):
                        await p.publish(f"jobs/{i}", b"job", confirm=True)
                got = await take(sub, 2)
                samples = await scrape(server)
                assert session(samples, "pending_messages", "$group/workers") == 2
                assert session(samples, "delivered_total", "$group/workers") == 2
                assert session(samples, "oldest_pending_age_seconds", "$group/workers") > 0
                for message in got:
                    await member.ack(message.seq, single=True)
                await member.ping()
                samples = await scrape(server)
                assert session(samples, "pending_messages", "$group/workers") == 0
                assert session(samples, "acked_total", "$group/workers") == 2
                assert samples[("topiary_groups", ())] == 1
                assert samples[("topiary_group_members", ())] == 1


async def test_top_sessions_by_lag_and_the_rest_as_other(tmp_path: Path) -> None:
    async with broker(tmp_path, http_top_sessions=1) as server:
        address = server.addresses[0]
        async with (
            connect(address, client_id="old", durable=True) as old,
            old.subscribe("a/>"),
            connect(address, client_id="new", durable=True) as new,
            new.subscribe("b/>"),
            connect(address) as p,
        ):
            await p.publish("a/1", b"first", confirm=True)
            await trio.sleep(0.01)  # so that "old"'s pending message is strictly older
            for i in range(3):
                await p.publish(f"b/{i}", b"later", confirm=True)
            samples = await scrape(server)
    sessions = {labels for name, labels in samples if name == "topiary_session_pending_messages"}
    assert sessions == {(("session", "old"),), (("session", "other"),)}
    assert session(samples, "pending_messages", "old") == 1
    assert session(samples, "pending_messages", "other") == 3  # "new"'s
    assert session(samples, "oldest_pending_age_seconds", "old") > session(
        samples, "oldest_pending_age_seconds", "other"
    )
    assert samples[("topiary_session_other_sessions", ())] == 1


async def test_the_delivery_latency_histogram_counts_one_message_in_n() -> None:
    async with broker() as server:
        every = server.broker.latency_sample_every
        address = server.addresses[0]
        async with (
            connect(address) as s1,
            s1.subscribe("fan/>") as sub1,
            connect(address) as s2,
            s2.subscribe("fan/>") as sub2,
            connect(address) as p,
        ):
            count = 2 * every + every // 2
            for i in range(count):
                await p.publish(f"fan/{i}", b"x")
            await take(sub1, count)
            await take(sub2, count)
            samples = await scrape(server)
    # every N-th routed message is timed, once per subscriber it is sent to
    timed = samples[("topiary_delivery_latency_seconds_count", ())]
    assert timed == 2 * (count // every)
    assert samples[("topiary_delivery_latency_seconds_bucket", (("le", "+Inf"),))] == timed
    assert samples[("topiary_delivery_latency_seconds_sum", ())] > 0


async def test_no_per_session_series_without_a_store() -> None:
    async with broker() as server:
        samples = await scrape(server)
    assert not any(name.startswith("topiary_session_") for name, _ in samples)
    assert samples[("topiary_frontend_connections", (("frontend", "native"),))] == 0


@pytest.mark.parametrize("value", [-1, 1001])
def test_top_sessions_out_of_range_is_a_config_error(value: int) -> None:
    with pytest.raises(ConfigError, match=r"http top_sessions must be in 0\.\.1000"):
        BrokerConfig(http_top_sessions=value)


async def test_a_backlog_restored_at_start_up_counts_its_age_from_the_restore(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path) as server:
        address = server.addresses[0]
        async with connect(address, client_id="away", durable=True) as c:
            async with c.subscribe("r/>"):
                await c.ping()
        async with connect(address) as p:
            for i in range(4):
                await p.publish(f"r/{i}", b"x", confirm=True)
    before = trio.current_time()
    async with broker(tmp_path) as server:
        samples = await scrape(server)
        after = trio.current_time()
    assert session(samples, "pending_messages", "away") == 4
    assert 0 < session(samples, "oldest_pending_age_seconds", "away") <= after - before
    assert session(samples, "delivered_total", "away") == 0


async def test_peer_links_have_series_of_their_own() -> None:
    async with running_broker(server_id="a") as a:
        host, port = a.addresses[0]
        async with broker(server_id="b", peers=(f"{host}:{port}",)) as b:
            with trio.fail_after(10):
                while not b.broker.peering.stats().get("links"):
                    await trio.sleep(0.01)
            samples = await scrape(b)
    assert samples[("topiary_peer_links", ())] == 1
    assert samples[("topiary_peer_link_routes_out_total", (("peer", "a"),))] >= 1
    assert samples[("topiary_peer_link_bytes_out_total", (("peer", "a"),))] > 0
    assert samples[("topiary_peer_link_fwd_dropped_total", (("peer", "a"),))] == 0
    assert samples[("topiary_peer_link_dropped_total", ())] == 0
