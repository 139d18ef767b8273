"""Disk full on either side of a hot-spare pair, with real processes (two ``topiary serve``
with ``[ha]`` and ``topiary witness``): a broker's files may not grow past a limit set on
its running process (RLIMIT_FSIZE through prlimit, ``Node.fill_disk``: unprivileged, and
what SQLite then meets is a write the disk refuses, as with a full one).

- The primary's disk full: each confirmed publish it cannot store is refused with
  STORE_FULL, never confirmed; its record, sent to the standby before the commit, is
  withdrawn and the standby stays in sync (not dropped, no snapshot); the broker goes on
  serving; once space is freed it writes again; after a kill -9 of the primary the
  promoted standby holds exactly what was confirmed (the refused ones were stored nowhere).
- The standby's disk full: it acknowledges nothing it could not write; it tells the
  primary (FAULT), which drops it and confirms alone under its lease (docs/ha.md, "Disk
  full"); once space is freed it catches up, and after a kill -9 of the primary it holds
  every confirmed message.
"""

from __future__ import annotations

import trio

from broker.client import BrokerError, Client, connect
from tests import hakit
from tests.hakit import (
    Node,
    Witness,
    accepting,
    hold_session,
    missing_from_session,
    read_session,
    until,
)

nodes, witness = hakit.nodes, hakit.witness  # fixtures

SESSION = "disk-full-durable"
FILLER = "x" * 60_000  # each publish grows the store by more than a dozen pages
TRIES = 200  # publishes until the limit is met (bounded)


def _big(tag: str) -> str:
    return f"{tag}:{FILLER}"


async def _start_pair(a: Node, b: Node, witness: Witness) -> None:
    a.start("primary", b, witness.address)
    b.start("standby", a, witness.address)
    await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
    await hold_session([a.address, b.address], SESSION)


async def _fail_over(a: Node, b: Node) -> None:
    """kill -9 of a; b promoted by the witness and serving."""
    a.stop()
    await until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
    await accepting(b.port)


async def _ha(client: Client, key: str) -> int:
    return int((await client.stats())["ha"][key])


def test_a_primary_whose_disk_is_full_refuses_confirmed_publishes_and_confirms_nothing_unstored(
    nodes: list[Node], witness: Witness
) -> None:
    a, b = nodes
    confirmed: set[str] = set()

    async def main() -> None:
        await _start_pair(a, b, witness)
        async with connect(a.address) as p, connect(a.address) as other:
            await p.publish("ha/t", "before", confirm=True)
            confirmed.add("before")
            before = (await other.stats())["ha"]
            a.fill_disk()
            refused = None
            for i in range(TRIES):
                try:
                    await p.publish("ha/t", _big(f"full-{i}"), confirm=True)
                except BrokerError as exc:
                    refused = (_big(f"full-{i}"), exc)
                    break
                confirmed.add(_big(f"full-{i}"))
            assert refused is not None, f"{TRIES} publishes fitted under the limit"
            payload, error = refused
            assert error.code == "STORE_FULL", error
            assert "disk I/O error" in error.text or "disk is full" in error.text
            await p.ping()  # the publisher's connection goes on
            async with other.subscribe("other/>") as sub:  # and the others are served
                await other.publish("other/t", "live", confirm=True)
                assert (await sub.get()).payload == b"live"
            stats = await other.stats()
            assert stats["store_full"] >= 1 and stats["ha"]["role"] == "primary"
            a.free_disk()
            await p.publish("ha/t", "after", confirm=True)  # space again: stored, confirmed
            confirmed.add("after")
            # The refused batches' records were withdrawn: the standby stayed, in sync,
            # with no snapshot, and nothing was confirmed without it.
            after = (await other.stats())["ha"]
            assert after["records_discarded"] > before["records_discarded"]
            for key in ("standby_dropped", "snapshots_sent", "confirms_alone"):
                assert after[key] == before[key], key
            assert after["in_sync"] == 1
        assert a.logged("store full: writes refused") >= 1
        assert a.logged("store writes again") >= 1
        await _fail_over(a, b)
        received = await read_session([a.address, b.address], SESSION, confirmed)
        assert confirmed <= received, f"lost: {sorted(p[:12] for p in confirmed - received)}"
        assert payload not in received  # refused: stored nowhere

    trio.run(main)


def test_a_standby_whose_disk_is_full_is_not_counted_as_writing_and_catches_up_when_freed(
    nodes: list[Node], witness: Witness
) -> None:
    a, b = nodes
    confirmed: set[str] = set()

    async def main() -> None:
        await _start_pair(a, b, witness)
        async with connect(a.address) as p:
            await p.publish("ha/t", "before", confirm=True)
            confirmed.add("before")
            alone = await _ha(p, "confirms_alone")
            b.fill_disk()
            for i in range(TRIES):
                await p.publish("ha/t", _big(f"full-{i}"), confirm=True)  # the primary goes on
                confirmed.add(_big(f"full-{i}"))
                if await _ha(p, "standby_faults") >= 1:
                    break
            else:
                raise AssertionError(f"the standby took {TRIES} publishes under its limit")
            # What the standby could not write was confirmed on the primary alone, never
            # on its behalf.
            await until(lambda: b.logged("standby store full") >= 1, "the standby says so", 10)
            await p.publish("ha/t", "while-full", confirm=True)
            confirmed.add("while-full")
            assert await _ha(p, "confirms_alone") > alone
            b.free_disk()
            # Caught up: a publish that waited for the standby's acknowledgement (not
            # confirmed alone) means it holds everything before it.
            with trio.fail_after(20):
                for i in range(10_000):
                    alone = await _ha(p, "confirms_alone")
                    await p.publish("ha/t", f"freed-{i}", confirm=True)
                    confirmed.add(f"freed-{i}")
                    if await _ha(p, "confirms_alone") == alone:
                        break
                    await trio.sleep(0.05)  # the standby dials again within a second
        assert a.logged("the standby cannot store the records") >= 1
        await _fail_over(a, b)
        missing = await missing_from_session([a.address, b.address], SESSION, confirmed)
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:3]}"

    trio.run(main)
