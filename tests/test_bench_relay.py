"""bench/harness/relay.py: the reference relays route like the broker and stop cleanly.

Each relay runs as its own process on 127.0.0.1 (``peers.start``), spoken to with the
benchmarks' native client; a PING round trip is the barrier before an absence is checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from bench.harness import peers
from bench.harness.clients.shell import LeanClient


async def _until_pong(client: LeanClient) -> list[tuple[str, bytes]]:
    """PING, then read to its PONG: the messages written to ``client`` before it."""
    target = client.pongs + 1
    await client._send(client.codec.ping())
    messages: list[tuple[str, bytes]] = []
    for _ in range(100):  # a few reads at most: all of it is a few hundred bytes
        if client.pongs >= target:
            return messages
        _, got = await client.receive()
        messages.extend(got)
    raise AssertionError("no PONG within 100 reads")


async def _route(port: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """Publish to ``a/b`` then ``c/d``: what a subscriber of ``a/>`` and one of ``a/*`` and
    ``a/b`` (two filters of one connection matching one topic) read."""
    with trio.fail_after(20):
        wide = await LeanClient.connect("native", port, "wide")
        both = await LeanClient.connect("native", port, "both")
        pub = await LeanClient.connect("native", port, "pub")
        try:
            await wide.subscribe(["a/>"])
            await both.subscribe(["a/*", "a/b"])
            pub.publish("a/b", b"one")
            pub.publish("c/d", b"two")
            await pub.flush()
            await _until_pong(pub)  # the relay has handled both publishes
            return await _until_pong(wide), await _until_pong(both)
        finally:
            for client in (wide, both, pub):
                await client.aclose()


@pytest.mark.parametrize("kind", peers.RELAY_KINDS)
def test_a_relay_delivers_once_per_matching_connection(kind: str, tmp_path: Path) -> None:
    relay = peers.start(kind, tmp_path, kind)
    try:
        wide, both = trio.run(_route, relay.port)
    finally:
        stopped = peers.stop(relay)
    assert wide == [("a/b", b"one")]
    assert both == [("a/b", b"one")]  # once, though two of its filters match
    assert stopped["exit_status"] == 0 and stopped["killed"] is False


async def _unsubscribed(port: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """A connection subscribes ``a/>`` and ``a/b``, then unsubscribes both (the storm
    connection's ``unsubscribe_all``); another keeps ``a/b``: what each reads of ``a/b``
    published after that."""
    with trio.fail_after(20):
        gone = await LeanClient.connect("native", port, "gone")
        kept = await LeanClient.connect("native", port, "kept")
        pub = await LeanClient.connect("native", port, "pub")
        try:
            await gone.subscribe(["a/>", "a/b"])
            await kept.subscribe(["a/b"])
            timing = await gone.unsubscribe_all()
            assert timing.count == 2 and timing.refused == 0
            pub.publish("a/b", b"after")
            await pub.flush()
            await _until_pong(pub)  # the relay has handled the publish
            return await _until_pong(gone), await _until_pong(kept)
        finally:
            for client in (gone, kept, pub):
                await client.aclose()


@pytest.mark.parametrize("kind", peers.RELAY_KINDS)
def test_a_relay_stops_delivering_what_a_connection_unsubscribed(kind: str, tmp_path: Path) -> None:
    relay = peers.start(kind, tmp_path, kind)
    try:
        gone, kept = trio.run(_unsubscribed, relay.port)
    finally:
        peers.stop(relay)
    assert gone == []
    assert kept == [("a/b", b"after")]  # another connection's same filter is untouched
