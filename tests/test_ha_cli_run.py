"""The hot spare driven only through the command line, as an operator would: ``topiary
pub --confirm --server A,B`` reading lines from stdin while the primary is killed -9, then
every line read back from the durable session with ``topiary sub --server A,B``."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import trio

from broker.client import connect
from tests import hakit
from tests.hakit import Node, Witness, hold_session, until
from tests.test_cli import TOPIARY

nodes, witness = hakit.nodes, hakit.witness  # fixtures

LINES = 200
SESSION = "cli-durable"


def test_kill_9_under_topiary_pub_confirm_loses_no_line_read_back_through_the_server_list(
    nodes: list[Node], witness: Witness
) -> None:
    a, b = nodes
    servers = f"{a.address},{b.address}"
    lines = [f"line-{i}" for i in range(LINES)]
    env = dict(os.environ, TOPIARY_SERVER=servers)

    async def main() -> None:
        a.start("primary", b, witness.address)
        b.start("standby", a, witness.address)
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        await hold_session([a.address, b.address], SESSION)
        pub = subprocess.Popen(
            [*TOPIARY, "pub", "--confirm", "ha/lines"],
            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert pub.stdin is not None
        async with connect(a.address) as watch, watch.subscribe("ha/lines") as seen:
            for line in lines[: LINES // 2]:
                pub.stdin.write(line + "\n")
            pub.stdin.flush()
            with trio.fail_after(20):  # the primary is busy with the first half: kill it
                while (await seen.get()).payload != lines[LINES // 4].encode():
                    pass
            assert a.proc is not None
            a.proc.send_signal(signal.SIGKILL)
        for line in lines[LINES // 2 :]:
            pub.stdin.write(line + "\n")
        pub.stdin.close()
        await trio.to_thread.run_sync(lambda: pub.wait(timeout=60))
        assert pub.stderr is not None
        assert pub.returncode == 0, pub.stderr.read()
        assert b.logged("promoted by the witness") == 1
        read_back = [*TOPIARY, "sub", "--durable", "--client-id", SESSION, "ha/>"]
        read_back += ["--count", str(LINES), "--timeout", "30"]
        sub = await trio.to_thread.run_sync(
            lambda: subprocess.run(read_back, capture_output=True, text=True, env=env, timeout=60)
        )
        assert sub.returncode == 0, sub.stderr
        read = [json.loads(out)["payload"] for out in sub.stdout.splitlines()]
        assert sorted(read) == sorted(lines)  # every line once: none lost, none twice

    trio.run(main)
