"""The topiary command, driven as an operator would: real processes, real sockets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.ports import free_port

TOPIARY = [sys.executable, "-m", "broker.cli"]


def wait_listening(port: int, proc: subprocess.Popen, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)  # a real process: poll its port (bounded) until it listens
    raise AssertionError("broker did not start listening")


@contextlib.contextmanager
def serving(*extra: str) -> Iterator[str]:
    """``topiary serve`` on a free port as a real process; stopped with SIGTERM, which must
    exit 0."""
    port = free_port()
    proc = subprocess.Popen(
        [*TOPIARY, "serve", "--port", str(port), "--log-format", "json", *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


@pytest.fixture
def broker() -> Iterator[str]:
    with serving() as server:
        yield server


def run(*args: str, server: str | None = None, stdin: str | None = None, timeout: float = 20):
    env = dict(os.environ)
    if server is not None:
        env["TOPIARY_SERVER"] = server
    return subprocess.run(
        [*TOPIARY, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=env
    )


def start_sub(*args: str, server: str) -> subprocess.Popen:
    env = dict(os.environ, TOPIARY_SERVER=server)
    proc = subprocess.Popen(
        [*TOPIARY, "sub", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "subscribed to ..." once the broker confirmed
    assert line.startswith("subscribed to"), line
    return proc


def test_pub_sub_and_stats_end_to_end(broker: str) -> None:
    sub = start_sub("--count", "3", "--timeout", "10", "beacon/eu/>", server=broker)
    first = run("pub", "--confirm", "beacon/eu/de/s1/cart/view", "hello", server=broker)
    assert first.returncode == 0, first.stderr
    assert run("pub", "beacon/na/us/s2/cart/view", "not for eu", server=broker).returncode == 0
    piped = run("pub", "--confirm", "beacon/eu/fr/s3/home/view", server=broker, stdin="a\nb\n")
    assert piped.returncode == 0, piped.stderr
    out, err = sub.communicate(timeout=15)
    assert sub.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(r["topic"], r["payload"]) for r in lines] == [
        ("beacon/eu/de/s1/cart/view", "hello"),
        ("beacon/eu/fr/s3/home/view", "a"),
        ("beacon/eu/fr/s3/home/view", "b"),
    ]
    assert all(set(r) == {"topic", "payload", "seq", "id"} for r in lines)
    assert [r["seq"] for r in lines] == [1, 2, 3]
    stats = run("stats", server=broker)
    assert stats.returncode == 0
    counters = json.loads(stats.stdout)
    assert counters["messages_in"] == 4
    assert counters["messages_out"] == 3


def test_binary_payload_is_printed_as_base64(broker: str) -> None:
    sub = start_sub("--count", "1", "--timeout", "10", "--dialect", "mqtt", "bin/#", server=broker)
    subprocess.run(
        [*TOPIARY, "pub", "--server", broker, "bin/x"],
        input=b"\xff\xfe\n",
        check=True,
        timeout=20,
    )
    out, _ = sub.communicate(timeout=15)
    record = json.loads(out)
    assert record["encoding"] == "base64"
    assert record["payload"] == "//4="


def test_sub_times_out_with_an_error_when_count_is_not_reached(broker: str) -> None:
    result = run("sub", "--count", "2", "--timeout", "0.5", "quiet/>", server=broker)
    assert result.returncode == 1
    assert "timed out" in result.stderr and "0 of 2" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["pub", "a/*", "x"],
        ["sub", "a/>/b"],
        ["sub", "--dialect", "amqp", "a"],
        ["sub", "--count", "0", "a"],
        ["sub", "--timeout", "-1", "a"],
        ["pub", "--server", "host:notaport", "a", "x"],
        ["serve", "--port", "99999"],
        ["serve", "--log-format", "xml"],
        ["frobnicate"],
    ],
)
def test_invalid_arguments_get_one_line_and_status_2(args: list[str]) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "error" in result.stderr


def test_bad_config_file_is_one_line(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nprot = 1\n")
    result = run("serve", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"topiary serve: error: {path}: unknown key 'prot' in [server] "
        "(known: host, port, data_dir, log_format, server_id)"
    )


def test_unreachable_broker_is_one_line_and_status_1() -> None:
    result = run("pub", "--server", f"127.0.0.1:{free_port()}", "a", "x")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot reach the broker" in result.stderr


def test_serve_stops_cleanly_on_sigint(broker: str) -> None:
    # the fixture sends SIGTERM; here SIGINT on a second broker
    port = free_port()
    proc = subprocess.Popen(
        [*TOPIARY, "serve", "--port", str(port)], stderr=subprocess.PIPE, text=True
    )
    wait_listening(port, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0


def test_durable_sub_gets_what_was_published_while_it_was_away(tmp_path) -> None:
    with serving("--data-dir", str(tmp_path / "data")) as server:
        durable = ["--client-id", "cli-1", "--durable", "--count", "1", "--timeout", "10"]
        first = start_sub(*durable, "away/>", server=server)
        assert run("pub", "--confirm", "away/1", "seen", server=server).returncode == 0
        out, _ = first.communicate(timeout=15)
        assert json.loads(out)["payload"] == "seen"
        assert run("pub", "--confirm", "away/2", "missed", server=server).returncode == 0
        second = run(*["sub", *durable, "away/>"], server=server)
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout)["payload"] == "missed"


def test_durable_sub_needs_a_client_id() -> None:
    result = run("sub", "--durable", "a")
    assert result.returncode == 2
    assert "--client-id" in result.stderr


def test_sessions_and_session_drop(tmp_path) -> None:
    with serving("--data-dir", str(tmp_path / "data")) as server:
        sub = start_sub("--client-id", "op", "--durable", "s/>", server=server)  # subscribed
        sub.send_signal(signal.SIGINT)  # leaves: the durable session stays
        sub.communicate(timeout=10)
        listed = run("sessions", server=server)
        assert listed.returncode == 0
        (info,) = json.loads(listed.stdout)
        assert info["client_id"] == "op" and info["filters"] == [["s/>", "native"]]
        assert run("session", "drop", "op", server=server).returncode == 0
        missing = run("session", "drop", "op", server=server)
        assert missing.returncode == 1
        assert missing.stderr.strip() == "topiary session drop: no durable session 'op'"
        assert json.loads(run("sessions", server=server).stdout) == []


def test_sub_group_members_share_the_messages(tmp_path) -> None:
    with serving("--data-dir", str(tmp_path / "data")) as server:
        members = [
            start_sub("--group", "g", "--count", "2", "--timeout", "10", "g/>", server=server)
            for _ in range(2)
        ]
        piped = run("pub", "--confirm", "g/x", server=server, stdin="1\n2\n3\n4\n")
        assert piped.returncode == 0, piped.stderr
        payloads = []
        for member in members:
            out, err = member.communicate(timeout=15)
            assert member.returncode == 0, err
            payloads += [json.loads(line)["payload"] for line in out.splitlines()]
        assert sorted(payloads) == ["1", "2", "3", "4"]  # each message to one member


def test_a_corrupt_database_stops_serve_with_one_line(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "topiary.db").write_bytes(b"this is not a database" * 100)
    result = run("serve", "--port", str(free_port()), "--data-dir", str(data))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("topiary serve: cannot open ") and "topiary.db" in line
    assert "Traceback" not in result.stderr


# -- peering options (parser only) -------------------------------------------------------


def test_serve_parses_broker_id_peers_and_secret() -> None:
    from broker.cli import build_parser

    args = build_parser().parse_args(
        [
            "serve",
            "--broker-id",
            "broker-a",
            "--peer",
            "10.0.0.2:7474",
            "--peer",
            "[::1]:7475",
            "--peer-secret",
            "s3cr3t",
        ]
    )
    assert args.server_id == "broker-a"
    assert args.peer == ["10.0.0.2:7474", "[::1]:7475"]
    assert args.peer_secret == "s3cr3t"


def test_serve_keeps_server_id_as_an_alias_and_peers_default_to_none() -> None:
    from broker.cli import build_parser

    args = build_parser().parse_args(["serve", "--server-id", "broker-b"])
    assert args.server_id == "broker-b"
    assert args.peer is None and args.peer_secret is None


@pytest.mark.parametrize("peer", ["host", "host:notaport", "host:0", ":7474", "::1", "[::1]"])
def test_serve_refuses_a_peer_that_is_not_host_port(peer: str) -> None:
    from broker.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "--peer", peer])
    assert info.value.code == 2


def test_sub_sync_and_routes_parse() -> None:
    from broker.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["sub", "--sync", "a/>"]).sync is True
    assert parser.parse_args(["sub", "a/>"]).sync is False
    routes = parser.parse_args(["routes", "--server", "127.0.0.1:7000"])
    assert (routes.command, routes.server) == ("routes", "127.0.0.1:7000")


def test_bridge_with_a_bad_config_file_is_one_line(tmp_path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text('[kafka]\n"bootstrap.servers" = "127.0.0.1:1"\n')
    result = run("bridge", "kafka", "--config", str(path))
    assert result.returncode == 2
    expected = f"topiary bridge kafka: error: {path}: [kafka] is missing 'group.id'"
    assert result.stderr.strip() == expected


def test_bridge_needs_a_config_file() -> None:
    result = run("bridge", "kafka")
    assert result.returncode == 2
    assert "--config" in result.stderr


def test_bridge_spark_without_a_checkpoint_is_one_line(tmp_path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(
        '[kafka]\n"bootstrap.servers" = "127.0.0.1:1"\n"group.id" = "g"\n'
        '[source]\ntopic = "t"\ndead_letter_topic = "t.dlq"\n'
        '[mapping]\ntemplate = "a/{b}"\n[broker]\nserver = "127.0.0.1:1"\n'
    )
    result = run("bridge", "spark", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"topiary bridge spark: error: {path}: [spark] checkpoint is required"
    )
