"""Route propagation under load, on a line of three broker processes: a subscription storm,
and summarization as an operator sees it with ``topiary routes``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio

from tests.mesh import LINE, Mesh
from tests.test_cli import TOPIARY
from tests.wire import RawClient, frame

STORM = 50_000
BATCH = 2_000
PING_BOUND = 0.1


async def pipelined(client: RawClient, frames: list[dict], reply: str) -> list[dict]:
    """Send ``frames`` in batches and collect one ``reply`` frame for each."""
    replies: list[dict] = []
    for start in range(0, len(frames), BATCH):
        chunk = frames[start : start + BATCH]
        await client.send(b"".join(frame(f) for f in chunk))
        for _ in chunk:
            got = await client.read_frame()
            assert got["type"] == reply, got
            replies.append(got)
    return replies


class Pinger:
    """``tests/pinger.py`` in a process of its own, PINGing one broker until stopped."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.pinger", host, port],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> dict:
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out.strip().splitlines()[-1])


async def remote_filters(mesh: Mesh, node: str) -> int:
    """Filters of other brokers in ``node``'s table (from stats: cheap to ask often)."""
    return (await mesh.stats(node))["peering"]["remote_filters"]


async def wait_count(mesh: Mesh, nodes: list[str], count: int) -> None:
    with trio.fail_after(60):
        for node in nodes:
            while await remote_filters(mesh, node) != count:
                await trio.sleep(0.05)  # another process's table: poll its stats


async def test_a_subscription_storm_converges_and_the_other_brokers_keep_answering_pings(
    tmp_path: Path,
) -> None:
    async with Mesh(*LINE, tmp_path) as mesh:
        pingers = {node: Pinger(mesh.address(node)) for node in ("b", "c")}
        try:
            host, port = mesh.address("a").rsplit(":", 1)
            storm = await RawClient.open((host, int(port)))
            subs = [{"type": "SUB", "id": i, "filter": f"storm/{i}/x/>"} for i in range(STORM)]
            acks = await pipelined(storm, subs, "SUBACK")
            await wait_count(mesh, ["b", "c"], STORM)
            unsubs = [{"type": "UNSUB", "id": i, "sub": ack["sub"]} for i, ack in enumerate(acks)]
            await pipelined(storm, unsubs, "UNSUBACK")
            await wait_count(mesh, ["b", "c"], 0)
            await storm.aclose()
        finally:
            results = {node: pinger.stop() for node, pinger in pingers.items()}
        for node in ("b", "c"):
            assert (await mesh.routes(node))["origins"]["a"]["filter_count"] == 0
        print(f"PING round trips during the storm: {results}")
        for result in results.values():
            assert result["count"] > 50  # it kept pinging throughout
            assert result["worst"] < PING_BOUND


async def test_only_the_covering_filter_reaches_the_peers_route_tables(tmp_path: Path) -> None:
    async with Mesh(*LINE, tmp_path) as mesh:
        host, port = mesh.address("a").rsplit(":", 1)
        client = await RawClient.open((host, int(port)))
        subs = [{"type": "SUB", "id": 0, "filter": "beacon/eu/>"}] + [
            {"type": "SUB", "id": i, "filter": f"beacon/eu/c{i % 50}/site{i}/*"}
            for i in range(1, 10_001)
        ]
        await pipelined(client, subs, "SUBACK")
        await wait_count(mesh, ["c"], 1)
        printed = subprocess.run(
            [*TOPIARY, "routes", "--server", mesh.address("c")],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        routes = json.loads(printed.stdout)
        assert routes["origins"]["a"]["filters"] == [["beacon/eu/>", "native"]]
        assert routes["remote_filters"] == 1
        own = (await mesh.routes("a"))["summary"]
        assert (own["local"], own["advertised"]) == (10_001, 1)
        await client.aclose()
