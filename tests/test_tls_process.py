"""TLS through the ``topiary`` command, as an operator runs it: a real ``topiary serve``
process reading [tls] from its config file, SIGHUP to pick up a renewed certificate, and
the client commands' --ca/--cert/--key."""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import signal
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from cryptography import x509

from tests.certs import Issued, Pki
from tests.test_cli import TOPIARY, free_port, run
from tests.wire import HELLO, frame

WAIT = 10.0


@dataclass
class Served:
    proc: subprocess.Popen[str]
    logs: queue.Queue[dict[str, Any]]
    plain: str
    tls: str

    def wait_log(self, event: str, **fields: Any) -> dict[str, Any]:
        """The next JSON log line with ``event`` (and ``fields``): the process's own barrier."""
        while True:
            entry = self.logs.get(timeout=WAIT)
            if entry.get("event") == event and all(entry.get(k) == v for k, v in fields.items()):
                return entry


def _read_logs(stream: Any, into: queue.Queue[dict[str, Any]]) -> None:
    for line in stream:
        with contextlib.suppress(json.JSONDecodeError):
            into.put(json.loads(line))


@contextlib.contextmanager
def serving_tls(config: Path) -> Iterator[Served]:
    """``topiary serve --config`` with a TLS native port; ready once it logs "listening"."""
    plain, secure = free_port(), free_port()
    config.write_text(config.read_text().replace("TLS_PORT", str(secure)))
    proc = subprocess.Popen(
        [*TOPIARY, "serve", "--port", str(plain), "--log-format", "json", "--config", str(config)],
        stderr=subprocess.PIPE,
        text=True,
    )
    logs: queue.Queue[dict[str, Any]] = queue.Queue()
    reader = threading.Thread(target=_read_logs, args=(proc.stderr, logs), daemon=True)
    reader.start()
    served = Served(proc, logs, f"127.0.0.1:{plain}", f"127.0.0.1:{secure}")
    try:
        served.wait_log("listening")
        yield served
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=WAIT) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        reader.join(timeout=WAIT)


def write_config(tmp_path: Path, cert: Issued) -> Path:
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[tls]\ncert = "{cert.cert}"\nkey = "{cert.key}"\nlisten_native = "127.0.0.1:TLS_PORT"\n'
    )
    return config


def hello_over_tls(address: str, ca: str) -> tuple[ssl.SSLSocket, int]:
    """A native session over TLS (HELLO answered): the socket and the serial it was shown."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca)
    raw = socket.create_connection((host, int(port)), timeout=WAIT)
    secure = context.wrap_socket(raw, server_hostname=host)
    secure.sendall(HELLO)
    assert read_frame(secure)["type"] == "WELCOME"
    der = secure.getpeercert(binary_form=True)
    assert der is not None
    return secure, x509.load_der_x509_certificate(der).serial_number


def read_frame(sock: ssl.SSLSocket) -> dict[str, Any]:
    head = _exactly(sock, 4)
    return msgpack.unpackb(_exactly(sock, int.from_bytes(head, "big")), raw=False)


def _exactly(sock: ssl.SSLSocket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def test_sighup_serves_a_renewed_certificate_without_dropping_connections(
    tmp_path: Path, pki: Pki, server_cert: Issued
) -> None:
    cert = Issued(str(tmp_path / "server.crt"), str(tmp_path / "server.key"), server_cert.serial)
    shutil.copy(server_cert.cert, cert.cert)
    shutil.copy(server_cert.key, cert.key)
    with serving_tls(write_config(tmp_path, cert)) as served:
        old, serial = hello_over_tls(served.tls, pki.ca)
        assert serial == server_cert.serial
        renewed = pki.server()
        shutil.copy(renewed.cert, cert.cert)
        shutil.copy(renewed.key, cert.key)
        served.proc.send_signal(signal.SIGHUP)
        served.wait_log("reloaded", part="tls")
        fresh, serial = hello_over_tls(served.tls, pki.ca)
        assert serial == renewed.serial
        fresh.close()
        old.sendall(frame({"type": "PING", "id": 7}))
        assert read_frame(old) == {"type": "PONG", "id": 7}
        old.close()


def test_a_sighup_with_a_broken_key_keeps_serving_the_old_certificate(
    tmp_path: Path, pki: Pki, server_cert: Issued
) -> None:
    cert = Issued(str(tmp_path / "server.crt"), str(tmp_path / "server.key"), server_cert.serial)
    shutil.copy(server_cert.cert, cert.cert)
    shutil.copy(server_cert.key, cert.key)
    with serving_tls(write_config(tmp_path, cert)) as served:
        shutil.copy(pki.client("someone").key, cert.key)  # a key of another certificate
        served.proc.send_signal(signal.SIGHUP)
        failed = served.wait_log("reload failed, kept the old state", part="tls")
        assert failed["error"] == f"tls key {cert.key} does not match cert {cert.cert}"
        sock, serial = hello_over_tls(served.tls, pki.ca)
        assert serial == server_cert.serial
        sock.close()


def test_the_client_commands_speak_tls_with_ca_and_client_certificate(
    tmp_path: Path, pki: Pki, server_cert: Issued, alice: Issued
) -> None:
    with serving_tls(write_config(tmp_path, server_cert)) as served:
        stats = run("stats", "--ca", pki.ca, server=served.tls)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["tls_handshake_failures"] == 0
        pub = run(
            "pub", "--ca", pki.ca, "--cert", alice.cert, "--key", alice.key, "a/b", "hi",
            server=served.tls,
        )  # fmt: skip
        assert pub.returncode == 0, pub.stderr


def test_a_client_command_without_the_ca_fails_with_one_line(
    tmp_path: Path, server_cert: Issued
) -> None:
    with serving_tls(write_config(tmp_path, server_cert)) as served:
        stats = run("stats", "--tls", server=served.tls)  # the system CAs do not know ours
    assert stats.returncode == 1
    assert stats.stderr.startswith("topiary stats: TLS handshake failed: CERTIFICATE_VERIFY")
    assert stats.stderr.count("\n") == 1


def test_serve_with_a_bad_certificate_stops_with_one_line_naming_it(
    tmp_path: Path, server_cert: Issued
) -> None:
    bad = Issued(str(tmp_path / "bad.crt"), server_cert.key, 0)
    Path(bad.cert).write_text("-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n")
    config = write_config(tmp_path, bad)
    config.write_text(config.read_text().replace("TLS_PORT", str(free_port())))
    served = run("serve", "--port", str(free_port()), "--config", str(config))
    assert served.returncode == 2
    assert served.stderr == f"topiary serve: error: tls cert {bad.cert}: not a PEM certificate\n"
