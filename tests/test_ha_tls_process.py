"""The pair's links over mutual TLS with real processes: two ``topiary serve`` with
``[ha] ca, cert, key`` and ``topiary witness --ca --cert --key``; kill -9 of the primary,
the witness (over TLS) promotes the standby, and the durable session holds every confirmed
message. Also the command-line errors for missing or partial TLS files."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broker.client import connect
from tests.certs import Pki
from tests.hakit import SECRET, Node, until
from tests.test_cli import TOPIARY, free_port, run

SESSION = "tls-durable"


class TlsNode(Node):
    """A broker of the pair whose [ha] links are mutual TLS with its own certificate."""

    def __init__(self, name: str, tmp_path: Path, pki: Pki) -> None:
        super().__init__(name, tmp_path)
        self.pki = pki
        self.issued = pki.both(name)  # names 127.0.0.1: the partner dials that
        self.tls_port = free_port()

    def start(self, role: str, partner: Node, witness: str) -> None:  # type: ignore[override]
        files = f'cert = "{self.issued.cert}"\nkey = "{self.issued.key}"\n'
        tls = f'ca = "{self.pki.ca}"\n{files}'  # [ha]: the pair's links
        tls += f'[tls]\n{files}listen_native = "127.0.0.1:{self.tls_port}"\n'  # clients'
        super().start(role, partner, witness, more_ha=tls)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


@pytest.fixture
def tls_witness(tmp_path: Path, pki: Pki) -> Iterator[tuple[str, Path]]:
    port = free_port()
    issued = pki.server()
    log = tmp_path / "witness.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*TOPIARY, "witness", "--port", str(port), "--data-dir", str(tmp_path / "witness"),
             "--secret", SECRET, "--ca", pki.ca, "--cert", issued.cert, "--key", issued.key,
             "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    # (not wait_listening: its probe would be a failed TLS handshake, counted and logged)
    deadline = time.monotonic() + 10
    while "witness listening" not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the witness did not start"
        time.sleep(0.02)  # polling another process' log (bounded)
    yield f"127.0.0.1:{port}", log
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def nodes(tmp_path: Path, pki: Pki) -> Iterator[list[TlsNode]]:
    pair = [TlsNode("a", tmp_path, pki), TlsNode("b", tmp_path, pki)]
    yield pair
    for node in pair:
        node.stop()


def _status(a: Node, b: Node) -> list[dict[str, object]]:
    status = run("ha", "status", "--server", f"{a.address},{b.address}")
    return [json.loads(line) for line in status.stdout.splitlines()]


def test_over_tls_kill_9_of_the_primary_promotes_the_standby_and_nothing_confirmed_is_lost(
    nodes: list[TlsNode], tls_witness: tuple[str, Path]
) -> None:
    a, b = nodes
    witness, witness_log = tls_witness
    servers = [a.address, b.address]
    confirmed: list[str] = []

    async def main() -> None:
        a.start("primary", b, witness)
        b.start("standby", a, witness)
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        async with connect(servers, client_id=SESSION, durable=True) as c:
            async with c.subscribe("ha/>"):
                await c.ping()  # the session holds the filter: it stores from now on
        async with connect(servers) as p:
            for i in range(200):
                await p.publish("ha/t", f"m{i}", confirm=True)  # each on b's disk too
                confirmed.append(f"m{i}")
        primary, standby = await trio.to_thread.run_sync(_status, a, b)
        assert primary["role"] == "primary" and primary["in_sync"] == 1
        assert standby["role"] == "standby" and standby["connected"] == "yes"
        assert a.proc is not None
        a.proc.send_signal(signal.SIGKILL)  # no signal to b: the witness decides, over TLS
        a.proc.wait(timeout=10)
        await until(lambda: b.logged("promoted by the witness") == 1, "promoted", 30)
        received: list[str] = []
        async with (
            connect(servers, client_id=SESSION, durable=True) as c,
            c.subscribe("ha/>") as sub,
        ):
            with trio.fail_after(20):
                while len(received) < len(confirmed):
                    received.append((await sub.get()).payload.decode())
        assert received == confirmed
        gone, promoted = await trio.to_thread.run_sync(_status, a, b)
        assert "unreachable" in str(gone["error"])
        assert promoted["role"] == "primary" and promoted["ha_term"] == 2

    trio.run(main)
    for node in (a, b):
        assert _refused_handshakes(node.log.read_text()) == [], node.log.read_text()[-2000:]
    assert _refused_handshakes(witness_log.read_text()) == []


def _refused_handshakes(log: str) -> list[str]:
    """The log's failed TLS handshakes other than the far end closing during one: the
    certificates were refused. (A dial that meets a port whose owner is still starting or
    stopping, or another test's process on a reused free port, ends in an EOF mid-handshake
    and is retried; that is not a certificate failure.)"""
    return [
        line
        for line in log.splitlines()
        if "TLS handshake failed" in line and "EOF" not in json.loads(line).get("reason", "")
    ]


def test_sighup_reloads_the_link_certificates_on_primary_and_standby(
    nodes: list[TlsNode], tls_witness: tuple[str, Path]
) -> None:
    a, b = nodes
    witness, _ = tls_witness

    async def main() -> None:
        a.start("primary", b, witness)
        b.start("standby", a, witness)
        await until(lambda: a.logged("standby in sync") >= 1, "in sync", 30)
        for node in (a, b):
            assert node.proc is not None
            node.proc.send_signal(signal.SIGHUP)
        await until(lambda: a.logged('"part": "ha tls"') == 1, "primary reloaded", 20)
        await until(lambda: b.logged('"part": "ha tls"') == 1, "standby reloaded", 20)
        for node in (a, b):  # and the client ports' certificate, held by the standby too
            await until(lambda n=node: n.logged('"part": "tls"') == 1, "client tls reloaded")
        assert a.proc is not None and b.proc is not None
        assert a.proc.poll() is None and b.proc.poll() is None  # SIGHUP ends neither
        async with connect([a.address, b.address]) as p:
            await p.publish("ha/t", "after", confirm=True)

    trio.run(main)


# -- command-line errors -------------------------------------------------------------------


def test_the_witness_wants_ca_cert_and_key_together(tmp_path: Path, pki: Pki) -> None:
    issued = pki.server()
    done = run("witness", "--data-dir", str(tmp_path), "--secret", "s", "--cert", issued.cert)
    assert done.returncode == 2
    assert "--ca, --cert and --key go together" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_witness_with_a_missing_key_file_stops_with_one_line_naming_it(
    tmp_path: Path, pki: Pki
) -> None:
    issued = pki.server()
    missing = tmp_path / "nope.key"
    done = run("witness", "--data-dir", str(tmp_path), "--secret", "s", "--ca", pki.ca,
               "--cert", issued.cert, "--key", str(missing))  # fmt: skip
    assert done.returncode == 2
    assert f"witness key {missing}: cannot read" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_serve_with_a_missing_ha_cert_stops_with_one_line_naming_it(
    tmp_path: Path, pki: Pki
) -> None:
    issued = pki.both("a")
    missing = tmp_path / "nope.crt"
    config = tmp_path / "a.toml"
    config.write_text(
        f'[server]\nport = {free_port()}\nhost = "127.0.0.1"\ndata_dir = "{tmp_path / "a"}"\n'
        f'[ha]\nrole = "primary"\npartner = "127.0.0.1:1"\nwitness = "127.0.0.1:2"\n'
        f'secret = "s"\nca = "{pki.ca}"\ncert = "{missing}"\nkey = "{issued.key}"\n'
    )
    done = run("serve", "--config", str(config))
    assert done.returncode == 2
    assert f"ha cert {missing}: cannot read" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_serve_with_only_an_ha_cert_is_a_config_error(tmp_path: Path, pki: Pki) -> None:
    issued = pki.both("a")
    config = tmp_path / "a.toml"
    config.write_text(
        f'[server]\ndata_dir = "{tmp_path / "a"}"\n[ha]\nrole = "primary"\n'
        f'partner = "127.0.0.1:1"\nwitness = "127.0.0.1:2"\nsecret = "s"\n'
        f'cert = "{issued.cert}"\n'
    )
    done = run("serve", "--config", str(config))
    assert done.returncode == 2
    assert "ha ca, cert and key go together" in done.stderr
