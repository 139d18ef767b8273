"""``--server A,B`` and ``TOPIARY_SERVER="A,B"``: the CLI's client commands through a kill -9
of the broker they are on. Real ``topiary serve`` processes that share nothing (there is no
replication yet): the tests check that the client moves and keeps going, and, with one
broker restarted on the same data dir as "the other server", that copies sent again are
dropped."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import trio

from broker.client import connect
from tests.faultproxy import FaultProxy
from tests.test_cli import TOPIARY, free_port, run, start_sub, wait_listening


def spawn(port: int, data_dir: Path | None = None, *extra: str) -> subprocess.Popen:
    if data_dir is not None:
        extra = ("--data-dir", str(data_dir), *extra)
    proc = subprocess.Popen(
        [*TOPIARY, "serve", "--port", str(port), "--log-format", "json", *extra],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    wait_listening(port, proc)
    return proc


@contextlib.contextmanager
def brokers(*data_dirs: Path | None) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    """One ``topiary serve`` per entry, each on its own port; killed at the end."""
    started: list[tuple[str, subprocess.Popen]] = []
    try:
        for data_dir in data_dirs:
            port = free_port()
            started.append((f"127.0.0.1:{port}", spawn(port, data_dir)))
        yield started
    finally:
        for _address, proc in started:
            kill(proc)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def payloads(proc: subprocess.Popen, until: str) -> list[str]:
    """The payloads ``topiary sub`` prints, up to and with ``until`` (its --timeout bounds
    the wait)."""
    assert proc.stdout is not None
    seen: list[str] = []
    while line := proc.stdout.readline():
        seen.append(json.loads(line)["payload"])
        if seen[-1] == until:
            return seen
    raise AssertionError(f"sub ended before {until!r}: {seen}")


def wait_for_session(server: str, client_id: str, flt: str) -> None:
    """Until ``server`` has durable session ``client_id`` with filter ``flt`` (each check a
    round trip to the broker; bounded)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = run("sessions", server=server)
        assert listed.returncode == 0, listed.stderr
        for session in json.loads(listed.stdout):
            if session["client_id"] == client_id and [flt, "native"] in session["filters"]:
                return
    raise AssertionError(f"no session {client_id!r} with {flt!r} on {server}")


def test_pub_confirm_moves_to_the_next_server_when_its_broker_is_killed() -> None:
    with brokers(None, None) as [(a, first), (b, _second)]:
        on_a = start_sub("--count", "1", "--timeout", "20", "f/>", server=a)
        on_b = start_sub("--timeout", "30", "f/>", server=b)
        pub = subprocess.Popen(
            [*TOPIARY, "pub", "--confirm", "--server", f"{a},{b}", "f/x"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert pub.stdin is not None and pub.stderr is not None
        pub.stdin.write("1\n")
        pub.stdin.flush()
        assert payloads(on_a, "1") == ["1"]  # the first broker has routed it
        kill(first)
        pub.stdin.write("2\n3\n4\n")
        pub.stdin.close()
        assert pub.wait(30) == 0, pub.stderr.read()
        assert "failed over" in pub.stderr.read()
        done = run("pub", "--confirm", "f/x", "end", server=b)
        assert done.returncode == 0, done.stderr
        got = payloads(on_b, "end")
        on_b.kill()
        on_b.wait(10)
        on_a.wait(10)
    # "1" comes again when its PUBACK had not arrived before the kill
    assert got in (["2", "3", "4", "end"], ["1", "2", "3", "4", "end"])


def test_sub_durable_moves_to_the_next_server_and_resumes_there(tmp_path: Path) -> None:
    with brokers(tmp_path / "a", tmp_path / "b") as [(a, first), (b, _second)]:
        servers = f"{a},{b}"
        sub = start_sub(
            "--durable", "--client-id", "d1", "--count", "2", "--timeout", "30", "d/>",
            server=servers,
        )  # fmt: skip
        assert run("pub", "--confirm", "d/x", "m1", server=a).returncode == 0
        assert payloads(sub, "m1") == ["m1"]
        kill(first)
        wait_for_session(b, "d1", "d/>")  # the sub has moved and subscribed there
        assert run("pub", "--confirm", "d/x", "m2", server=b).returncode == 0
        assert payloads(sub, "m2") == ["m2"]
        assert sub.wait(10) == 0
        # Away now: what comes meanwhile waits in the session on the second broker, and a
        # new `sub` finds it there, the first server being dead; m2 was acknowledged.
        assert run("pub", "--confirm", "d/x", "m3", server=b).returncode == 0
        again = run(
            "sub", "--durable", "--client-id", "d1", "--count", "1", "--timeout", "20", "d/>",
            server=servers,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert [json.loads(line)["payload"] for line in again.stdout.splitlines()] == ["m3"]


def test_a_publish_sent_again_to_the_restarted_broker_is_dropped_as_a_duplicate(
    tmp_path: Path,
) -> None:
    """The first broker stores a line but its PUBACK is held (proxy) when it is killed; the
    same data dir serves again on the second address, where ``pub`` sends that line again
    with its id: the durable session holds every line once."""
    data = tmp_path / "data"
    first_port, second_port = free_port(), free_port()
    first = spawn(first_port, data)
    second: subprocess.Popen | None = None
    keeper = ("keeper", "k/>")

    async def open_session() -> list[str]:
        """Resume (or create) the keeper's session; read its first message, ack nothing."""
        async with connect(f"127.0.0.1:{first_port}", client_id=keeper[0], durable=True) as c:
            async with c.subscribe(keeper[1]) as sub:
                if not c.session_present:
                    return []
                with trio.fail_after(10):
                    return [(await sub.get()).text]

    try:
        assert trio.run(open_session) == []
        with FaultProxy(("127.0.0.1", first_port)) as proxy:
            pub = subprocess.Popen(
                [*TOPIARY, "pub", "--confirm", "--server",
                 f"127.0.0.1:{proxy.port},127.0.0.1:{second_port}", "k/x"],
                stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert pub.stdin is not None and pub.stderr is not None
            pub.stdin.write("0\n")
            pub.stdin.flush()
            assert trio.run(open_session) == ["0"]  # pub is connected: its WELCOME passed
            proxy.hold_replies()
            pub.stdin.write("1\n")
            pub.stdin.flush()
            # A PUBACK is held: of "0" (then "1" waits in pub's input), or of "1" once
            # stored. Either way one stored line is unconfirmed when the broker dies.
            assert proxy.holding.wait(20)
            kill(first)
            proxy.cut()
        http = free_port()
        second = spawn(second_port, data, "--http", f"127.0.0.1:{http}")
        pub.stdin.write("2\n")
        pub.stdin.close()
        assert pub.wait(30) == 0, pub.stderr.read()
        server = f"127.0.0.1:{second_port}"
        assert run("pub", "--confirm", "k/x", "end", server=server).returncode == 0
        read = run(
            "sub", "--durable", "--client-id", "keeper", "--count", "4", "--timeout", "20",
            "k/>", server=server,
        )  # fmt: skip
        assert read.returncode == 0, read.stderr
        lines = [json.loads(line)["payload"] for line in read.stdout.splitlines()]
        assert lines == ["0", "1", "2", "end"]
        listed = json.loads(run("sessions", server=server).stdout)
        assert [(s["client_id"], s["pending"]) for s in listed] == [("keeper", 0)]
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as page:
            metrics = page.read().decode()
        # The restarted broker's duplicate window starts from the ids its store kept, so it
        # dropped the copy before it reached the store (or any transient subscriber).
        assert re.search(r"^topiary_duplicates_dropped_total 1\.0$", metrics, re.MULTILINE)
        assert re.search(r"^topiary_store_duplicates_total 0\.0$", metrics, re.MULTILINE)
    finally:
        kill(first)
        if second is not None:
            kill(second)


def test_topiary_server_may_list_servers_and_a_dead_first_one_is_skipped() -> None:
    with brokers(None) as [(live, _proc)]:
        result = run("stats", server=f"127.0.0.1:{free_port()},{live}")
        assert result.returncode == 0, result.stderr
        assert "messages_in" in json.loads(result.stdout)


def test_a_bad_server_list_is_one_line_and_status_2() -> None:
    flag = run("pub", "--server", "127.0.0.1:1,,127.0.0.1:2", "t", "x")
    assert flag.returncode == 2
    assert flag.stderr == (
        "topiary pub: error: argument --server: server 2 of '127.0.0.1:1,,127.0.0.1:2' is empty\n"
    )
    env = run("stats", server="127.0.0.1:1,127.0.0.1:1")
    assert env.returncode == 2
    assert env.stderr == (
        "topiary stats: error: TOPIARY_SERVER: server 127.0.0.1:1 is listed twice in "
        "'127.0.0.1:1,127.0.0.1:1'\n"
    )


def test_when_no_listed_server_answers_the_command_fails_with_one_line() -> None:
    result = run("stats", "--server", f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert result.stderr.startswith("topiary stats: cannot reach the broker")
    assert result.stderr.count("\n") == 1
