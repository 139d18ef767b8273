"""Bad input over real sockets: each gets an ERROR with a code, and the broker keeps serving.

Every test ends by checking that a fresh client can still subscribe, publish and
receive (``assert_healthy``).
"""

from __future__ import annotations

import msgpack
import pytest
import trio

from broker.client import BrokerError, connect
from broker.native import connection as native_connection
from broker.wire.frames import PROTOCOL_VERSION
from tests.conftest import running_broker
from tests.wire import HELLO, RawClient, frame

Address = tuple[str, int]


async def assert_healthy(address: Address) -> None:
    with trio.fail_after(5):
        async with connect(address) as c, c.subscribe("health/>") as sub:
            await c.publish("health/check", b"ok", confirm=True)
            assert (await sub.get()).payload == b"ok"


async def expect_error(raw: RawClient, code: str, *, closes: bool) -> dict:
    with trio.fail_after(5):
        error = await raw.read_until("ERROR")
        assert error["type"] == "ERROR", error
        assert error["code"] == code, error
        assert error["text"]
        if closes:
            assert (await raw.read_frame())["type"] == "EOF"
    return error


async def test_garbage_bytes_get_bad_frame_and_close(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
    await expect_error(raw, "BAD_FRAME", closes=True)
    await assert_healthy(address)


async def test_a_frame_that_is_not_a_map_is_bad(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(frame(msgpack.packb([1, 2, 3])))
    await expect_error(raw, "BAD_FRAME", closes=True)
    await assert_healthy(address)


async def test_truncated_frame_then_eof_is_reported_and_closed(address: Address) -> None:
    raw = await RawClient.open(address)
    whole = frame({"type": "PUB", "topic": "a", "payload": b"x" * 100})
    await raw.send(whole[:20])
    await raw.stream.send_eof()
    error = await expect_error(raw, "BAD_FRAME", closes=True)
    assert "mid-frame" in error["text"]
    await assert_healthy(address)


async def test_frame_over_the_limit_is_refused_from_its_header_alone(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send((64 * 1024 * 1024).to_bytes(4, "big"))  # announce 64 MiB, send none of it
    error = await expect_error(raw, "FRAME_TOO_LARGE", closes=True)
    assert "67108864" in error["text"]
    await assert_healthy(address)


async def test_unknown_frame_type(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(frame({"type": "TELEPORT"}))
    await expect_error(raw, "UNKNOWN_TYPE", closes=True)
    await assert_healthy(address)


@pytest.mark.parametrize(
    "body",
    [
        {"type": "PUB", "topic": 5, "payload": b""},
        {"type": "PUB", "topic": "a", "payload": "text, not bytes"},
        {"type": "SUB", "id": "1", "filter": "a"},
        {"type": "SUB", "id": 1, "filter": "a", "sync": "yes"},
        {"type": "ACK", "seq": -1},
        {"type": "PUB", "topic": "a"},  # payload missing
    ],
)
async def test_wrong_field_types_get_bad_frame(address: Address, body: dict) -> None:
    raw = await RawClient.open(address)
    await raw.send(frame(body))
    await expect_error(raw, "BAD_FRAME", closes=True)
    await assert_healthy(address)


async def test_invalid_topic_is_refused_and_the_connection_stays(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(frame({"type": "PUB", "id": 7, "topic": "a/*/b", "payload": b""}))
    error = await expect_error(raw, "INVALID_TOPIC", closes=False)
    assert error["ref"] == 7
    await raw.send(frame({"type": "PING", "id": 3}))
    assert await raw.read_frame() == {"type": "PONG", "id": 3}
    await assert_healthy(address)


async def test_invalid_filter_is_refused_and_the_connection_stays(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(frame({"type": "SUB", "id": 9, "filter": "a/#/b", "dialect": "mqtt"}))
    error = await expect_error(raw, "INVALID_FILTER", closes=False)
    assert error["ref"] == 9
    await raw.send(frame({"type": "SUB", "id": 10, "filter": "a/#", "dialect": "mqtt"}))
    assert (await raw.read_frame())["type"] == "SUBACK"
    await assert_healthy(address)


async def test_publish_before_hello_is_refused(address: Address) -> None:
    raw = await RawClient.open(address, hello=False)
    await raw.send(frame({"type": "PUB", "topic": "a", "payload": b""}))
    await expect_error(raw, "HELLO_REQUIRED", closes=True)
    await assert_healthy(address)


async def test_second_hello_is_refused(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(HELLO)
    await expect_error(raw, "DUPLICATE_HELLO", closes=True)
    await assert_healthy(address)


async def test_wrong_protocol_version_is_refused(address: Address) -> None:
    raw = await RawClient.open(address, hello=False)
    await raw.send(frame({"type": "HELLO", "version": PROTOCOL_VERSION + 1}))
    await expect_error(raw, "VERSION_MISMATCH", closes=True)
    await assert_healthy(address)


async def test_unknown_subscription_is_refused(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(frame({"type": "UNSUB", "id": 4, "sub": 999}))
    error = await expect_error(raw, "UNKNOWN_SUBSCRIPTION", closes=False)
    assert error["ref"] == 4
    await assert_healthy(address)


async def test_pipelined_subs_and_unsubs_are_answered_in_order(address: Address) -> None:
    """Runs of SUBs and UNSUBs in one write are handled in one pass: replies, refusals
    and the routing they set up must be those of one frame at a time."""
    raw = await RawClient.open(address)
    requests = [
        {"type": "SUB", "id": 1, "filter": "p/a"},
        {"type": "SUB", "id": 2, "filter": "p/+", "dialect": "mqtt"},
        {"type": "SUB", "id": 3, "filter": "p/>/x"},  # refused
        {"type": "SUB", "id": 4, "filter": "p/a"},  # the same filter again: a second id
        {"type": "SUB", "id": 5, "filter": "p/b*"},
        {"type": "PING", "id": 6},
        {"type": "SUB", "id": 7, "filter": "q/>"},
        {"type": "SUB", "id": 8, "filter": "q/>"},
        {"type": "UNSUB", "id": 9, "sub": 1},
        {"type": "UNSUB", "id": 10, "sub": 1},  # gone already
        {"type": "UNSUB", "id": 11, "sub": 4},
        {"type": "UNSUB", "id": 12, "sub": 999},  # never existed
        {"type": "UNSUB", "id": 13, "sub": 6},
    ]
    await raw.send(b"".join(frame(request) for request in requests))
    with trio.fail_after(5):
        replies = [await raw.read_frame() for _ in requests]
    assert [(r["type"], r.get("id", r.get("ref")), r.get("sub")) for r in replies] == [
        ("SUBACK", 1, 1),
        ("SUBACK", 2, 2),
        ("ERROR", 3, None),
        ("SUBACK", 4, 3),
        ("SUBACK", 5, 4),
        ("PONG", 6, None),
        ("SUBACK", 7, 5),
        ("SUBACK", 8, 6),
        ("UNSUBACK", 9, None),
        ("ERROR", 10, None),
        ("UNSUBACK", 11, None),
        ("ERROR", 12, None),
        ("UNSUBACK", 13, None),
    ]
    assert [r["code"] for r in replies if r["type"] == "ERROR"] == [
        "INVALID_FILTER",
        "UNKNOWN_SUBSCRIPTION",
        "UNKNOWN_SUBSCRIPTION",
    ]
    async with connect(address) as client:
        for topic in ("p/a", "p/bb", "q/z"):
            await client.publish(topic, b"x", confirm=True)
        stats = await client.stats()
    # left: p/a (id 3), p/+ mqtt (id 2) and q/> (id 5); one MSG per message and session
    with trio.fail_after(5):
        got = [await raw.read_frame() for _ in range(3)]
    assert [m["topic"] for m in got] == ["p/a", "p/bb", "q/z"]
    assert got[0]["sub"] in (2, 3)
    assert [m["sub"] for m in got[1:]] == [2, 5]
    assert stats["subscribes"] == 6
    assert stats["unsubscribes"] == 3
    assert stats["errors"]["INVALID_FILTER"] == 1
    assert stats["errors"]["UNKNOWN_SUBSCRIPTION"] == 2
    await assert_healthy(address)


async def test_requests_before_a_bad_frame_in_the_same_read_are_answered(
    address: Address,
) -> None:
    """The broker decodes a whole read at once; what came before a frame that breaks the
    stream (or a client's closing ERROR) is still handled and answered first."""
    raw = await RawClient.open(address)
    await raw.send(
        frame({"type": "PING", "id": 1})
        + frame({"type": "SUB", "id": 2, "filter": "a/>"})
        + frame({"type": "SUB", "id": 3, "filter": "b/>"})
        + frame({"type": "STATS", "id": 4})
        + b"\x00\x00\x00\x02\xc1\xc1"  # never valid msgpack
        + frame({"type": "PING", "id": 5})
    )
    with trio.fail_after(5):
        replies = [await raw.read_frame() for _ in range(4)]
    assert [(r["type"], r["id"]) for r in replies] == [
        ("PONG", 1),
        ("SUBACK", 2),
        ("SUBACK", 3),
        ("STATS_REPLY", 4),
    ]
    await expect_error(raw, "BAD_FRAME", closes=True)
    polite = await RawClient.open(address)
    await polite.send(
        frame({"type": "PING", "id": 1})
        + frame({"type": "ERROR", "code": "INTERNAL", "text": "bye"})
        + frame({"type": "PING", "id": 2})
    )
    with trio.fail_after(5):
        assert await polite.read_frame() == {"type": "PONG", "id": 1}
    with trio.move_on_after(0.3):  # nothing after the ERROR is answered
        assert (await polite.read_frame())["type"] == "EOF"
    await polite.aclose()
    await assert_healthy(address)


async def test_ack_of_a_future_sequence_is_refused(address: Address) -> None:
    raw = await RawClient.open(address)
    await raw.send(frame({"type": "ACK", "seq": 5}))
    await expect_error(raw, "INVALID_ACK", closes=False)
    await assert_healthy(address)


async def test_oversized_payload_is_refused_but_not_fatal() -> None:
    async with running_broker(max_payload=1000) as server:
        address = server.addresses[0]
        async with connect(address) as c:
            with pytest.raises(BrokerError) as info:
                await c.publish("a", b"x" * 1001, confirm=True)
            assert info.value.code == "PAYLOAD_TOO_LARGE"
            await c.publish("a", b"x" * 1000, confirm=True)
        await assert_healthy(address)


async def test_wrong_token_is_refused() -> None:
    async with running_broker(auth_token="s3cret") as server:
        address = server.addresses[0]
        with pytest.raises(BrokerError) as info:
            async with connect(address, credentials={"token": "guess"}):
                pass
        assert info.value.code == "AUTH_FAILED"
        async with connect(address, credentials={"token": "s3cret"}) as c:
            await c.ping()


async def test_durable_hello_is_refused_until_sessions_exist(address: Address) -> None:
    raw = await RawClient.open(address, hello=False)
    await raw.send(
        frame({"type": "HELLO", "version": PROTOCOL_VERSION, "client_id": "x", "durable": True})
    )
    await expect_error(raw, "UNSUPPORTED", closes=True)
    await assert_healthy(address)


async def test_silent_client_is_pinged_then_closed() -> None:
    async with running_broker() as server:
        address = server.addresses[0]
        raw = await RawClient.open(address, hello=False)
        await raw.send(frame({"type": "HELLO", "version": PROTOCOL_VERSION, "keepalive": 0.5}))
        assert (await raw.read_frame())["type"] == "WELCOME"
        with trio.fail_after(5):
            assert (await raw.read_frame())["type"] == "PING"
        await expect_error(raw, "IDLE_TIMEOUT", closes=True)
        await assert_healthy(address)


async def test_client_that_never_reads_is_cut_off_without_hurting_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The broker holds the closing ERROR for `stuck` until its socket has room, for
    # ERROR_FLUSH_SECONDS; `stuck` reads only once the flood is over, which on a loaded
    # machine can be more than the default second after the broker gave up on it.
    monkeypatch.setattr(native_connection, "ERROR_FLUSH_SECONDS", 60.0)
    limits = {"outbound_messages": 2000, "outbound_bytes": 16 << 20, "slow_consumer_drops": 200}
    async with running_broker(**limits) as server:
        address = server.addresses[0]
        stuck = await RawClient.open(address)
        await stuck.send(frame({"type": "SUB", "id": 1, "filter": "flood/>"}))
        assert (await stuck.read_frame())["type"] == "SUBACK"
        # `stuck` never reads again; a well-behaved subscriber shares the topic
        async with connect(address) as good, good.subscribe("flood/>", buffer=10_000) as sub:
            total = 5000
            payload = b"p" * 4000
            async with connect(address) as publisher:
                for _ in range(total):
                    # confirmed one at a time: the good subscriber shares this process and
                    # its event loop, and must get its turn to read
                    await publisher.publish("flood/x", payload, confirm=True)
            with trio.fail_after(20):
                for _ in range(total):
                    await sub.get()
            stats = await good.stats()
        assert stats["dropped"] > 0
        assert stats["slow_consumer_disconnects"] == 1
        assert stats["errors"].get("SLOW_CONSUMER") == 1
        error = await expect_error(stuck, "SLOW_CONSUMER", closes=True)
        assert "dropped" in error["text"]
        await assert_healthy(address)


async def test_shutdown_is_clean_with_a_client_that_said_error_and_stayed_connected() -> None:
    """After a client's closing ERROR the broker may send nothing more on that connection,
    not even its own SHUTTING_DOWN: shutting down must still close it quietly."""
    with trio.fail_after(10):
        async with running_broker(shutdown_timeout=2.0) as server:
            raw = await RawClient.open(server.addresses[0])
            await raw.send(frame({"type": "ERROR", "code": "INTERNAL", "text": "bye"}))
            # The broker answers the ERROR with silence, so no round trip can show it was
            # read: poll its side of the connection, which leaves OPEN once it has.
            (connection,) = server.broker.connections
            with trio.fail_after(5):
                while connection.proto.state == "OPEN":
                    await trio.sleep(0.01)
        # Leaving running_broker shut it down, and nothing escaped its nursery.
    with trio.fail_after(5):
        assert (await raw.read_frame())["type"] == "EOF"
    await raw.aclose()
