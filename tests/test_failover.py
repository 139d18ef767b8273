"""The client over a server list: connect skips a server that is down or refuses for good,
a lost connection moves to the next, unconfirmed publishes go again with their ids."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from broker.address import format_address
from broker.client import BrokerError, Message, Subscription, connect, parse_servers
from broker.config import BrokerConfig
from broker.errors import ProtocolError
from broker.net import receive_frame, send_error
from broker.server import Server, run_broker
from broker.wire import frames
from broker.wire.connection import Connection, Role
from tests.conftest import running_broker
from tests.faultproxy import FaultProxy
from tests.ports import free_port

FAST = (0.02, 0.2)  # reconnect backoff: first wait, limit


def where(server: Server) -> str:
    host, port = server.addresses[0]
    return f"{host}:{port}"


@asynccontextmanager
async def refusing(code: str = "VERSION_MISMATCH") -> AsyncIterator[str]:
    """A fake broker that answers every HELLO with a closing ERROR ``code``."""

    async def answer(stream: trio.SocketStream) -> None:
        proto = Connection(Role.SERVER)
        await receive_frame(proto, stream.receive_some)
        await send_error(stream, proto, ProtocolError(code, "this fake speaks no version"))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
        try:
            yield f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        finally:
            nursery.cancel_scope.cancel()


async def take(sub: Subscription, count: int) -> list[Message]:
    with trio.fail_after(10):
        return [await sub.get() for _ in range(count)]


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ("a:1,b:2", [("a", 1), ("b", 2)]),
        (" a:1 , [::1]:2 ", [("a", 1), ("::1", 2)]),
        (["a:1", ("b", 2)], [("a", 1), ("b", 2)]),
        (("h", 1), [("h", 1)]),
        ("h", [("h", 7474)]),
    ],
)
def test_a_server_list_parses_in_its_order(servers, expected) -> None:
    assert parse_servers(servers) == expected


@pytest.mark.parametrize(
    ("servers", "problem"),
    [
        ("", "the server list is empty"),
        ([], "the server list is empty"),
        ("a:1,,b:2", "server 2 of 'a:1,,b:2' is empty"),
        ("a:1,", "server 2 of 'a:1,' is empty"),
        ("a:1,b:x", "server 2 of 'a:1,b:x': bad port 'x'"),
        ("a,a:7474", "server a:7474 is listed twice"),
        ("a:70000", "port must be in 1..65535"),
    ],
)
def test_a_bad_server_list_is_one_line_naming_the_entry(servers, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_servers(servers)
    assert problem in str(info.value) and "\n" not in str(info.value)


_hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
    st.ip_addresses().map(str),
)


@given(st.lists(st.tuples(_hosts, st.integers(1, 65535)), min_size=1, max_size=5, unique=True))
def test_a_server_list_written_out_parses_back_to_itself(servers) -> None:
    text = ",".join(format_address(address) for address in servers)
    assert parse_servers(text) == servers
    assert parse_servers([format_address(address) for address in servers]) == servers


async def test_connect_refuses_a_bad_server_list_before_dialling() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        async with connect("127.0.0.1:1,127.0.0.1:1"):
            pass


# -- connecting ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["list", "string"])
async def test_connect_skips_a_dead_first_server(server: Server, form: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    servers = [dead, where(server)] if form == "list" else f"{dead},{where(server)}"
    async with connect(servers) as client:
        assert client.address == server.addresses[0]
        await client.publish("t/1", b"x", confirm=True)


async def test_a_refusal_for_good_from_the_first_server_moves_on_to_the_second(
    server: Server,
) -> None:
    """Credentials the first broker refuses (it has another token): the second, which asks
    for none, accepts them."""
    async with running_broker(auth_token="theirs") as guarded:
        async with connect([where(guarded), where(server)], credentials={"token": "ours"}) as c:
            assert c.address == server.addresses[0]


async def test_version_mismatch_from_the_first_server_moves_on_to_the_second(
    server: Server,
) -> None:
    async with refusing("VERSION_MISMATCH") as fake, connect([fake, where(server)]) as c:
        assert c.address == server.addresses[0]


async def test_when_every_server_refuses_for_good_connect_raises_the_last_refusal() -> None:
    async with running_broker(auth_token="theirs") as guarded, refusing() as fake:
        with pytest.raises(BrokerError) as info:
            async with connect([where(guarded), fake], credentials={"token": "ours"}):
                pass
        assert info.value.code == "VERSION_MISMATCH"
        with pytest.raises(BrokerError) as info:
            async with connect([fake, where(guarded)], credentials={"token": "ours"}):
                pass
        assert info.value.code == "AUTH_FAILED"


async def test_when_no_server_answers_connect_raises_the_last_failure() -> None:
    with pytest.raises(OSError, match=str(last := free_port())):
        async with connect([f"127.0.0.1:{free_port()}", f"127.0.0.1:{last}"]):
            pass


# -- failing over ----------------------------------------------------------------------------


async def test_a_lost_connection_fails_over_to_the_next_server_and_renews_subscriptions() -> None:
    async with running_broker(server_id="one") as first, running_broker(server_id="two") as second:
        async with (
            connect([where(first), where(second)], reconnect=True, backoff=FAST) as c,
            c.subscribe("r/>") as sub,
        ):
            await c.publish("r/1", b"before", confirm=True)
            assert [m.payload for m in await take(sub, 1)] == [b"before"]
            first.shutdown()
            await first.stopped.wait()  # what is published now reaches the second broker
            with trio.fail_after(10):
                await c.publish("r/2", b"after", confirm=True)
            after = await take(sub, 1)
            assert [m.payload for m in after] == [b"after"]
            assert c.address == second.addresses[0]
            assert (c.reconnects, c.failovers) == (1, 1)
            assert after[0].server == c.server_id == "two"


async def test_a_reconnect_refused_for_good_by_every_server_fails_with_the_last_refusal() -> None:
    async with trio.open_nursery() as nursery, refusing() as fake:
        first = await nursery.start(run_broker, BrokerConfig(port=0, auth_token="one"))
        port = first.addresses[0][1]
        async with (
            connect(
                [f"127.0.0.1:{port}", fake], credentials={"token": "one"}, reconnect=True,
                backoff=FAST,
            ) as c,
            c.subscribe("r/>") as sub,
        ):  # fmt: skip
            first.shutdown()
            await first.stopped.wait()  # its port is free: it comes back with another token
            again = await nursery.start(run_broker, BrokerConfig(port=port, auth_token="two"))
            with trio.fail_after(10), pytest.raises(BrokerError) as info:
                await sub.get()
            assert info.value.code == "AUTH_FAILED"  # the fake was tried first, then this
            assert c.reconnects == 0
        again.shutdown()


async def test_reconnect_timeout_ends_the_search_with_the_last_failure() -> None:
    async with running_broker() as only:
        dead = f"127.0.0.1:{free_port()}"
        async with (
            connect([where(only), dead], reconnect=True, backoff=FAST, reconnect_timeout=0.3) as c,
            c.subscribe("r/>") as sub,
        ):
            only.shutdown()
            with trio.fail_after(10), pytest.raises(OSError):
                await sub.get()


async def test_a_durable_client_moves_to_the_other_server_and_acks_only_there(
    tmp_path: Path,
) -> None:
    """Brokers that share nothing (no replication yet): the session starts afresh on the
    second, with the client's subscription, and an ack of a seq the first broker gave is
    not sent to the second (its seqs count other messages)."""
    async with (
        running_broker(server_id="one", data_dir=str(tmp_path / "one")) as first,
        running_broker(server_id="two", data_dir=str(tmp_path / "two")) as second,
    ):
        async with (
            connect(
                [where(first), where(second)], client_id="d1", durable=True, reconnect=True,
                backoff=FAST,
            ) as c,
            c.subscribe("d/>") as sub,
            connect(where(first)) as on_first,
            connect(where(second)) as on_second,
        ):  # fmt: skip
            for n in range(3):
                await on_first.publish("d/x", f"a{n}".encode(), confirm=True)
            old = await take(sub, 3)
            await c.ack(old[0].seq, server=old[0].server)
            first.shutdown()
            await first.stopped.wait()
            with trio.fail_after(10):
                await c.ping()  # answered after the renewed SUB: the session is there
            assert c.address == second.addresses[0]
            await on_second.publish("d/x", b"b0", confirm=True)
            new = await take(sub, 1)
            assert new[0].payload == b"b0" and new[0].server == "two"
            await c.ack(old[2].seq, server=old[2].server)  # A's seq 3: not for B
            await c.ping()
            (session,) = await on_second.sessions()
            assert (session["client_id"], session["pending"]) == ("d1", 1)
            await c.ack(new[0].seq, server=new[0].server)
            await c.ping()
            (session,) = await on_second.sessions()
            assert session["pending"] == 0


# -- confirmed publishes across a lost connection ------------------------------------------


async def test_unconfirmed_publishes_are_sent_again_with_their_ids_and_delivered_once(
    tmp_path: Path,
) -> None:
    """The PUBACKs are held at the proxy while the broker routes every PUB; the link is
    cut; the client sends them all again with the same ids and the duplicate window drops
    each copy: the durable subscriber has every message exactly once."""
    count = 50
    async with running_broker(data_dir=str(tmp_path)) as server:
        with FaultProxy(server.addresses[0]) as proxy:
            async with (
                connect(where(server), client_id="keeper", durable=True) as keeper,
                keeper.subscribe("k/>") as sub,
                connect(f"127.0.0.1:{proxy.port}", reconnect=True, backoff=FAST) as publisher,
                trio.open_nursery() as nursery,
            ):
                proxy.hold_replies()
                confirmed = trio.Event()

                async def publish_all() -> None:
                    batch = [("k/x", f"m{n}".encode(), None) for n in range(count)]
                    assert await publisher.publish_confirmed(batch) == [None] * count
                    confirmed.set()

                nursery.start_soon(publish_all)
                first = await take(sub, count)  # the broker has routed every one
                assert not confirmed.is_set()
                proxy.cut()
                proxy.restore()
                with trio.fail_after(10):
                    await confirmed.wait()
                await publisher.publish("k/x", b"end", confirm=True)
                rest = await take(sub, 1)
                stats = await keeper.stats()
    got = first + rest
    assert [m.payload for m in got] == [f"m{n}".encode() for n in range(count)] + [b"end"]
    assert len({m.id for m in got}) == count + 1
    assert all(m.id.startswith(publisher._msg_id_prefix) for m in got)
    assert publisher.reconnects == 1
    assert stats["duplicates_dropped"] == count


async def test_publishes_sent_again_after_a_failover_keep_their_order_before_new_ones() -> None:
    """The second broker never saw the batch: it gets the copies, in order, then the
    publish made after the connection was lost."""
    count = 30
    async with running_broker() as first, running_broker() as second:
        with FaultProxy(first.addresses[0]) as proxy:
            async with (
                connect(where(first)) as watcher,
                watcher.subscribe("o/>") as on_first,
                connect(where(second)) as listener,
                listener.subscribe("o/>") as on_second,
                connect(
                    [f"127.0.0.1:{proxy.port}", where(second)], reconnect=True, backoff=FAST
                ) as publisher,
                trio.open_nursery() as nursery,
            ):
                proxy.hold_replies()
                batch = [("o/x", f"m{n}".encode(), None) for n in range(count)]
                nursery.start_soon(publisher.publish_confirmed, batch)
                await take(on_first, count)
                proxy.cut()  # for good: the first broker is gone for this client
                with trio.fail_after(10):
                    await publisher.publish("o/x", b"new", confirm=True)
                got = await take(on_second, count + 1)
    assert [m.payload for m in got] == [p for _t, p, _i in batch] + [b"new"]
    assert publisher.failovers == 1


async def test_confirmed_publishes_in_flight_are_bounded_by_max_in_flight(server: Server) -> None:
    limit, total = 3, 10
    with FaultProxy(server.addresses[0]) as proxy:
        async with (
            connect(where(server)) as watcher,
            watcher.subscribe("f/>") as sub,
            connect(
                f"127.0.0.1:{proxy.port}", reconnect=True, backoff=FAST, max_in_flight=limit
            ) as publisher,
            trio.open_nursery() as nursery,
        ):
            proxy.hold_replies()
            for n in range(total):
                nursery.start_soon(publisher.publish, "f/x", f"m{n}", None, True)
            await take(sub, limit)
            await trio.testing.wait_all_tasks_blocked()
            assert publisher._in_flight.count == limit
            assert len(publisher._waiters) == limit  # the others wait before sending
            proxy.cut()
            proxy.restore()
            got = await take(sub, total - limit)
            await watcher.ping()
            stats = await watcher.stats()
    assert publisher._in_flight.count == 0
    assert stats["duplicates_dropped"] == limit
    assert len({m.id for m in got}) == total - limit


@asynccontextmanager
async def fenced() -> AsyncIterator[str]:
    """A fake primary that welcomes a client, then answers its first confirmed PUB with
    ERROR FENCED (as a hot-spare primary that lost its place does) and closes."""

    async def answer(stream: trio.SocketStream) -> None:
        proto = Connection(Role.SERVER)
        hello = await receive_frame(proto, stream.receive_some)
        assert isinstance(hello, frames.Hello)
        welcome = frames.Welcome(
            version=frames.PROTOCOL_VERSION,
            client_id=hello.client_id or "c",
            server_id="fenced",
            max_frame=1 << 20,
            keepalive=30.0,
        )
        await stream.send_all(proto.send(welcome))
        while True:
            frame = await receive_frame(proto, stream.receive_some)
            if frame is None:
                return
            if isinstance(frame, frames.Pub) and frame.id is not None:
                await send_error(
                    stream, proto, ProtocolError("FENCED", "fenced: replaced", ref=frame.id)
                )
                return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
        try:
            yield f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        finally:
            nursery.cancel_scope.cancel()


async def test_a_publish_a_fenced_primary_refuses_is_sent_again_to_the_next_server(
    server: Server,
) -> None:
    async with (
        fenced() as old_primary,
        connect(where(server)) as watcher,
        watcher.subscribe("f/>") as sub,
        connect([old_primary, where(server)], reconnect=True, backoff=FAST) as publisher,
    ):
        with trio.fail_after(10):
            await publisher.publish("f/x", b"once", confirm=True)  # confirmed by the next
        got = await take(sub, 1)
        assert got[0].payload == b"once"
        assert publisher.failovers == 1
